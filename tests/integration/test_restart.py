"""``tfcoord serve --state-dir`` killed with SIGKILL at the worst moments, and restarted.

A hundred real blocking NodeClients (threads: each is a socket and a reader thread)
ride through two kills on the same state directory and port: one while half of them
have registered, one while the job runs. Each client reconnects on its own with
backoff and resends what was pending; every node gets the one cluster spec and the
job completes as if nothing happened. Meta keys the journal keeps for engines (the
Mesos framework id) survive the same way.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from tfcoord.client import ClusterInfo, DriverClient, JobSpec, NodeClient, auth, make_roles
from tfcoord.coordinator.journal import SqliteJournal
from tfcoord.coordinator.mesos.engine import FRAMEWORK_ID_META

from .served import Served

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
