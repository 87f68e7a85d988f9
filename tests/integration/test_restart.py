"""``tfcoord serve --state-dir`` killed with SIGKILL at the worst moments, and restarted.

A hundred real blocking NodeClients (threads: each is a socket and a reader thread)
ride through two kills on the same state directory and port: one while half of them
have registered, one while the job runs. Each client reconnects on its own with
backoff and resends what was pending; every node gets the one cluster spec and the
job completes as if nothing happened. Meta keys the journal keeps for engines (the
Mesos framework id) survive the same way.

Drivers and followers ride out a kill too: ``tfcoord submit`` (local engine),
``tfcoord status --follow``, ``tfcoord logs --follow`` and a DriverClient made as the Spark
driver makes it each see the job to its end across a kill -9 and a restart a second later,
while a first connection to a port nothing listens on still fails within seconds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tfcoord.client import ClusterInfo, DriverClient, JobSpec, NodeClient, auth, make_roles
from tfcoord.coordinator.journal import SqliteJournal
from tfcoord.coordinator.mesos.engine import FRAMEWORK_ID_META

from .served import TFCOORD, Served

NODES = 100
#: Each phase below is a few seconds of work; a loaded CI machine gets ten times that.
PHASE_TIMEOUT_S = 120.0


class _Node(threading.Thread):
    """One node doing what the node runtime does: register, heartbeat, wait, run, finish."""

    def __init__(
        self,
        address: str,
        token: bytes,
        job: str,
        executor_id: int,
        run: threading.Event,
        finish: threading.Event,
    ) -> None:
        super().__init__(name=f"node-{executor_id}", daemon=True)
        self.args = (address, token, job, executor_id)
        self.run_now, self.finish_now = run, finish
        self.info: ClusterInfo | None = None
        self.error: BaseException | None = None
        self.reconnects = 0

    def run(self) -> None:
        try:
            with NodeClient(*self.args) as n:
                executor_id = self.args[3]
                n.register("127.0.0.1", 20000 + executor_id)
                n.start_heartbeats()
                self.info = n.await_cluster(PHASE_TIMEOUT_S)
                assert self.run_now.wait(PHASE_TIMEOUT_S)
                n.report("running")
                assert self.finish_now.wait(PHASE_TIMEOUT_S)
                n.report("succeeded")
                self.reconnects = n.reconnects
        except BaseException as e:
            self.error = e


def _wait_for(driver: DriverClient, job: str, done, what: str) -> dict:
    """Watch the job (pushed changes, no polling) until ``done(status)``."""
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    version = 0
    while True:
        st = driver.watch(job, version, 10.0)
        if done(st):
            return st
        assert time.monotonic() < deadline, f"{what}: job is {st['state']}, {st['registered']} registered"
        version = st["version"]


def test_a_hundred_nodes_survive_kill_9_while_reserving_and_while_running(tmp_path: Path):
    state = tmp_path / "state"
    served = Served(tmp_path, state_dir=state)
    driver = DriverClient(served.address, served.secret).connect()
    job = driver.submit(JobSpec(roles=make_roles(NODES), reservation_timeout_s=600, name="restart"))
    token = driver.job_token(job)
    run, finish = threading.Event(), threading.Event()
    nodes = [_Node(served.address, token, job, i, run, finish) for i in range(NODES)]
    try:
        for n in nodes[: NODES // 2]:
            n.start()
        _wait_for(driver, job, lambda st: st["registered"] == NODES // 2, "half the nodes registering")

        assert served.stop(signal.SIGKILL) == -signal.SIGKILL  # mid-reservation
        served = Served(tmp_path, port=served.port, state_dir=state)
        assert "journal events replayed" in served.log
        for n in nodes[NODES // 2 :]:
            n.start()
        _wait_for(driver, job, lambda st: st["state"] == "READY", "the cluster forming after a restart")
        run.set()
        _wait_for(driver, job, lambda st: st["state"] == "RUNNING", "every node running")

        assert served.stop(signal.SIGKILL) == -signal.SIGKILL  # mid-run
        served = Served(tmp_path, port=served.port, state_dir=state)
        finish.set()
        final = driver.await_job(job, PHASE_TIMEOUT_S)
        for n in nodes:
            n.join(PHASE_TIMEOUT_S)
    finally:
        run.set()
        finish.set()
        driver.close()
        assert served.stop() == 0
    assert [n.error for n in nodes] == [None] * NODES
    expected = {"worker": [f"127.0.0.1:{20000 + i}" for i in range(NODES)]}
    assert all(n.info is not None and n.info.cluster == expected for n in nodes)
    assert [(n.info.role, n.info.index) for n in nodes] == [("worker", i) for i in range(NODES)]  # type: ignore[union-attr]
    assert final["state"] == "SUCCEEDED"
    assert {(x["state"], x["attempt"]) for x in final["nodes"]} == {("SUCCEEDED", 0)}
    assert final["history"] == []  # no node was lost or replaced along the way
    # every node rode through at least the second kill on its own connection
    assert all(n.reconnects >= 1 for n in nodes)


def test_journal_meta_survives_kill_9_and_restarts(tmp_path: Path):
    """What an engine keeps in the journal's meta table (the Mesos framework id, so a
    restarted coordinator re-registers as the same framework) outlives the coordinator."""
    state = tmp_path / "state"
    owner = auth.new_owner_key()  # the same driver before and after every restart
    served = Served(tmp_path, state_dir=state)
    with DriverClient(served.address, served.secret, owner_key=owner) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
    assert served.stop() == 0
    journal = SqliteJournal(state)  # as the framework does on SUBSCRIBED, in its own transaction
    journal.set_meta(FRAMEWORK_ID_META, "5e1c-f00d-0001")
    journal.close()
    for _ in range(2):
        served = Served(tmp_path, port=served.port, state_dir=state)
        with DriverClient(served.address, served.secret, owner_key=owner) as d:
            assert d.status(job)["state"] == "SUBMITTED"
            d.submit(JobSpec(roles=make_roles(1)))  # more journal writes on top
        assert served.stop(signal.SIGKILL) == -signal.SIGKILL
    journal = SqliteJournal(state)
    try:
        assert journal.get_meta(FRAMEWORK_ID_META) == "5e1c-f00d-0001"
        assert sum(1 for _ in journal.replay()) == 3  # three submits, nothing lost or doubled
    finally:
        journal.close()


# -- drivers and followers ride out a restart ---------------------------------------------
#
# ``tfcoord serve`` killed with SIGKILL under a running command and started again on the
# same state directory and port a second later: a client that was connected keeps
# reconnecting (jittered backoff) until its deadline, where it used to give up at the first
# refused reconnect ("cannot reach the tfcoord coordinator ... connection refused", exit 3).
# A first connection to an address where nothing listens still fails within seconds.

#: The outage of these tests: the coordinator stays dead this long before it is started again.
OUTAGE_S = 1.0
#: A refused first connection is reported in well under this (tests/integration/test_newcomer.py).
REFUSED_WITHIN_S = 3.0


def _kill_and_restart(served: Served, state: Path) -> Served:
    """SIGKILL, a second of nothing listening on the port, then the same coordinator again."""
    assert served.stop(signal.SIGKILL) == -signal.SIGKILL
    time.sleep(OUTAGE_S)  # the outage itself, not a wait for anything
    return Served(served.secret_file.parent, port=served.port, state_dir=state)


def _open_gate(fifo: Path) -> None:
    """Let the node blocked reading ``fifo`` go on (nothing happens if none reads it any more)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader, the node is gone
        return
    try:
        os.write(fd, b"go")
    finally:
        os.close(fd)


def _reap(*procs: subprocess.Popen | None) -> None:
    for p in procs:
        if p is None:
            continue
        if p.poll() is None:
            p.kill()
            p.wait()
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()


def test_tfcoord_submit_rides_out_its_coordinator_killed_and_restarted(tmp_path: Path):
    """The issue's reproduction: local engine, TFCOORD_ADDRESS, kill -9 while the job runs,
    restart a second later. The nodes reconnect and the job ends SUCCEEDED, and so does the
    driver now: exit 0, where it exited 3 at once."""
    state = tmp_path / "state"
    served = Served(tmp_path, state_dir=state)
    for i in range(2):
        os.mkfifo(tmp_path / f"go-{i}")
    code = (
        "import os\n"
        "i = os.environ['TFCOORD_TASK_INDEX']\n"
        "print('before', i, flush=True)\n"
        f"open({str(tmp_path)!r} + '/go-' + i).read()\n"
        "print('after', i, flush=True)\n"
    )
    submit = subprocess.Popen(
        [*TFCOORD, "submit", "--engine", "local", "--workers", "2", "--", sys.executable, "-c", code],
        env=served.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job = None
        while job is None:  # its first line says "job J submitted: ..."
            line = submit.stderr.readline()
            assert line, "tfcoord submit ended before it submitted"
            job = re.search(r"job (\S+) submitted", line)
        running = set()
        while running != {"[worker:0] before 0", "[worker:1] before 1"}:  # both commands run
            line = submit.stdout.readline()
            assert line, f"tfcoord submit ended early: {submit.stderr.read()}"
            running.add(line.strip())

        served = _kill_and_restart(served, state)
        assert submit.poll() is None, f"the driver gave up: {submit.stderr.read()}"
        for i in range(2):
            _open_gate(tmp_path / f"go-{i}")
        rest_out, rest_err = submit.communicate(timeout=PHASE_TIMEOUT_S)
        assert submit.returncode == 0, rest_err
        assert "cannot reach" not in rest_err and "could not reach" not in rest_err
        # (the nodes' own output also says they lost the coordinator and reconnected)
        assert {"[worker:0] after 0", "[worker:1] after 1"} <= set(rest_out.splitlines())
        assert f"job {job[1]} SUCCEEDED" in rest_err
    finally:
        _reap(submit)
        served.stop()


class _Member(threading.Thread):
    """One node of the followed job: registers, runs, writes a line, then (when told) writes
    another and succeeds, riding out the restart on its own connection."""

    def __init__(self, address: str, token: bytes, job: str, executor_id: int) -> None:
        super().__init__(name=f"member-{executor_id}", daemon=True)
        self.args = (address, token, job, executor_id)
        self.running, self.finish = threading.Event(), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with NodeClient(*self.args) as n:
                i = self.args[3]
                n.register("127.0.0.1", 21000 + i)
                n.start_heartbeats()
                n.await_cluster(PHASE_TIMEOUT_S)
                n.report("running")
                n.send_logs("stdout", [f"before {i}"])
                self.running.set()
                assert self.finish.wait(PHASE_TIMEOUT_S)
                n.send_logs("stdout", [f"after {i}"])
                n.report("succeeded")
        except BaseException as e:
            self.error = e
            self.running.set()


def _until_line(stream, pattern: str) -> list[str]:
    """Lines of ``stream`` up to and including the first that matches ``pattern``."""
    got: list[str] = []
    while not (got and re.search(pattern, got[-1])):
        line = stream.readline()
        assert line, f"ended before a line matching {pattern!r}: {got}"
        got.append(line.rstrip("\n"))
    return got


def test_status_follow_logs_follow_and_the_spark_driver_ride_out_a_restart(tmp_path: Path):
    """Three followers of one running job across kill -9 and restart: ``tfcoord status JOB
    --follow``, ``tfcoord logs JOB --follow`` (real processes), and a DriverClient made the way
    the Spark driver makes it (``CoordinatorLink(...).connect().connect()``) blocked in
    ``watch_until``. Each sees the job end SUCCEEDED; logs --follow prints every line once,
    the ones written after the restart too (a restarted coordinator numbers its lines from 0)."""
    from tfcoord.client.watcher import watch_until
    from tfcoord.driver.session import CoordinatorLink

    state = tmp_path / "state"
    served = Served(tmp_path, state_dir=state)
    driver = CoordinatorLink(served.address, served.secret).connect().connect()  # as run(sc, ...) does
    job = driver.submit(JobSpec(roles=make_roles(2), name="followed"))
    members = [_Member(served.address, driver.job_token(job), job, i) for i in range(2)]
    outcome: list = []
    watcher = threading.Thread(
        target=lambda: outcome.append(watch_until(driver, job, timeout_s=PHASE_TIMEOUT_S)), daemon=True
    )
    status = logs = None
    try:
        for m in members:
            m.start()
        for m in members:
            assert m.running.wait(PHASE_TIMEOUT_S) and m.error is None, m.error
        watcher.start()
        status = subprocess.Popen(
            [*TFCOORD, "status", job, "--follow"], env=served.env, stdout=subprocess.PIPE, text=True
        )
        logs = subprocess.Popen(
            [*TFCOORD, "logs", job, "--follow"], env=served.env, stdout=subprocess.PIPE, text=True
        )
        _until_line(status.stdout, r"^timeline:")  # the full status is out: it follows now
        before = [_until_line(logs.stdout, r"before") for _ in range(2)]
        assert sorted(x[-1] for x in before) == ["worker:0 | before 0", "worker:1 | before 1"]

        served = _kill_and_restart(served, state)
        assert status.poll() is None and logs.poll() is None  # still following, not exit 3
        for m in members:
            m.finish.set()
        for m in members:
            m.join(PHASE_TIMEOUT_S)
            assert m.error is None, m.error
        watcher.join(PHASE_TIMEOUT_S)

        after = logs.stdout.read().splitlines()  # to its end: it exits once the job has ended
        assert logs.wait(PHASE_TIMEOUT_S) == 0
        assert sorted(after) == ["worker:0 | after 0", "worker:1 | after 1"]  # each once
        rest = status.stdout.read().splitlines()
        assert status.wait(PHASE_TIMEOUT_S) == 0
        assert rest[-1] == f"job {job} SUCCEEDED", rest
        assert [st.state for st in outcome] == ["SUCCEEDED"]
        assert driver.reconnects >= 1
    finally:
        for m in members:
            m.finish.set()
        _reap(status, logs)
        driver.close()
        served.stop()


def test_a_first_connection_where_nothing_listens_still_fails_within_seconds(tmp_path: Path):
    """Riding out a restart is for a client that was connected: submit and the followers,
    pointed at a port nothing listens on, exit 3 at once, saying so."""
    import socket

    held = socket.socket()  # bound, never listening: refused, and no one else takes the port
    held.bind(("127.0.0.1", 0))
    secret = tmp_path / "secret"
    auth.write_secret(secret)
    auth.write_secret(tmp_path / "secret.admin")
    env = dict(
        os.environ, TFCOORD_ADDRESS=f"127.0.0.1:{held.getsockname()[1]}", TFCOORD_SECRET_FILE=str(secret)
    )
    try:
        for command in (
            ["submit", "--engine", "local", "--workers", "1", "--", sys.executable, "-c", "pass"],
            ["status", "some-job", "--follow"],
            ["logs", "some-job", "--follow"],
        ):
            t0 = time.monotonic()
            out = subprocess.run([*TFCOORD, *command], env=env, capture_output=True, text=True, timeout=60)
            took = time.monotonic() - t0
            assert out.returncode == 3, (command, out.stderr)
            assert "connection refused" in out.stderr and "Traceback" not in out.stderr
            assert took < REFUSED_WITHIN_S + 2.0, (command, took)  # + the interpreter's start-up
    finally:
        held.close()
