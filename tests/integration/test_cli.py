"""`tfcoord serve` as a real process: port file, SIGTERM, status/stop commands, restart from its journal."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfcoord.client import DriverClient, JobSpec, NodeClient, RequestRejected, auth, make_roles, tls

from .rawwire import wait_until
from .served import START_TIMEOUT_S, TFCOORD, Served


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    yield s
    s.stop()


def test_serve_writes_port_file_and_stops_cleanly_on_sigterm(served):
    assert oct(served.secret_file.stat().st_mode & 0o777) == "0o600"
    # READY=1 came after the port file was written, and names the same port.
    assert served.port_file.read_text() == f"{served.port}\n"
    assert served.ready["STATUS"] == f"listening on 127.0.0.1:{served.port}"
    with DriverClient(served.address, served.secret) as d:
        assert d.status() == {"jobs": []}
    assert served.stop() == 0
    assert "shutting down" in served.log


def test_a_coordinator_that_exits_during_start_up_is_reported_at_once(tmp_path):
    """The helper watches the process beside the notify socket: no wait for its deadline."""
    t0 = time.monotonic()
    with pytest.raises(
        AssertionError, match=r"(?s)exited with 2 before READY=1:\n.*--tls-cert and --tls-key go together"
    ):
        Served(tmp_path, "--tls-cert", str(tmp_path / "cert.pem"))
    assert time.monotonic() - t0 < START_TIMEOUT_S / 2


def test_status_and_stop_commands(served):
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2), name="nightly"))
        with NodeClient(served.address, d.job_token(job), job, 0).connect() as n:
            n.register("10.0.0.7", 2222, gpus=["GPU-1"])
            table = served.cli("status")
            assert table.returncode == 0
            assert job in table.stdout and "RESERVING" in table.stdout and "1/2" in table.stdout
            one = served.cli("status", job)
            assert "registered 1/2 (waiting for worker:1)" in one.stdout
            assert "10.0.0.7:2222" in one.stdout and "GPU-1" in one.stdout
            assert json.loads(served.cli("status", job, "--json").stdout)["nodes"][0]["host"] == "10.0.0.7"
            dry = served.cli("stop", job, "--dry-run")
            assert "would stop 1 node(s)" in dry.stdout and "dry run" in dry.stdout
            assert d.status(job)["state"] == "RESERVING"
            real = served.cli("stop", job)
            assert real.returncode == 0 and "stopping 1 node(s)" in real.stdout
            assert n.await_stop(10)
            n.report("stopped")
        assert d.await_job(job, 10, raise_on_failure=False)["state"] == "STOPPED"
    unknown = served.cli("stop", "no-such-job")
    assert unknown.returncode == 1 and "no job 'no-such-job'" in unknown.stderr


def test_status_shows_a_node_that_reported_an_error_of_blanks(served):
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2)))
        with NodeClient(served.address, d.job_token(job), job, 0).connect() as n:
            n.register("127.0.0.1", 7600)
            # Stopping unasked fails the node; blanks are no error text, so the coordinator
            # says what happened instead (as for a failure report of blanks).
            n.report("stopped", error=" \n\t \n")
        assert d.status(job)["nodes"][0]["error"] == "stopped although no stop was requested"
    one = served.cli("status", job)
    assert one.returncode == 0, one.stderr
    (row,) = [ln for ln in one.stdout.splitlines() if ln.startswith("0 ")]
    assert row.split()[1:3] == ["worker:0", "FAILED"] and row.endswith(
        "stopped although no stop was requested"
    )


def test_serve_that_cannot_bind_http_exits_and_leaves_no_port_file(tmp_path):
    """A failed start must not leave a --port-file pointing at a coordinator that is gone."""
    port_file, http_port_file = tmp_path / "port", tmp_path / "http-port"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http_port = taken.getsockname()[1]
        out = subprocess.run(
            [
                *TFCOORD,
                "serve",
                "--plaintext",
                "--port",
                "0",
                "--port-file",
                str(port_file),
                "--secret-file",
                str(tmp_path / "s"),
                "--http-port",
                str(http_port),
                "--http-port-file",
                str(http_port_file),
                "--http-token-file",
                str(tmp_path / "token"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2, out.stderr
    assert f"cannot serve HTTP on 127.0.0.1:{http_port}" in out.stderr and "did not start" in out.stderr
    assert not port_file.exists() and not http_port_file.exists()


def test_serve_refuses_the_secret_as_http_token(tmp_path):
    secret = tmp_path / "secret"
    auth.write_secret(secret)
    copy = tmp_path / "copy-of-secret"
    auth.write_secret(copy, auth.read_secret(secret))
    link = tmp_path / "link-to-secret"
    link.symlink_to(secret)
    base = [*TFCOORD, "serve", "--plaintext", "--port", "0", "--secret-file", str(secret), "--http-port", "0"]
    for token_file, says in [
        (secret, "is the coordinator secret file"),
        (link, "is the coordinator secret file"),
        (copy, "holds the coordinator secret"),
    ]:
        out = subprocess.run(
            [*base, "--http-token-file", str(token_file)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2, out.stderr
        assert says in out.stderr and "travels in browser URLs" in out.stderr, out.stderr


def test_serve_forgets_finished_jobs_after_keep_finished_days_even_across_a_restart(tmp_path):
    state = tmp_path / "state"
    owner = auth.new_owner_key()  # the same driver before and after the restart
    served = Served(tmp_path, "--keep-finished-days", "0.00002", state_dir=state)  # 1.7 s
    try:
        with DriverClient(served.address, served.secret, owner_key=owner) as d:
            done = d.submit(JobSpec(roles=make_roles(1)))
            live = d.submit(JobSpec(roles=make_roles(1)))
            with NodeClient(served.address, d.job_token(done), done, 0) as n:
                n.register("127.0.0.1", 5000)
                n.report("succeeded")
            assert d.status(done)["state"] == "SUCCEEDED"
            wait_until(lambda: done not in {j["job"] for j in d.status()["jobs"]}, what="the job forgotten")
            with pytest.raises(RequestRejected, match="unknown_job"):
                d.status(done)
            assert d.status(live)["state"] == "SUBMITTED"  # unfinished jobs are never forgotten
    finally:
        served.stop()
    served = Served(tmp_path, port=served.port, state_dir=state)  # its journal records went too
    try:
        with DriverClient(served.address, served.secret, owner_key=owner) as d:
            assert [j["job"] for j in d.status()["jobs"]] == [live]
    finally:
        served.stop()


def test_serve_refuses_a_retention_of_nothing(tmp_path):
    out = subprocess.run(
        [*TFCOORD, "serve", "--keep-finished-jobs", "0"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "--keep-finished-jobs must be at least 1" in out.stderr


def test_client_commands_explain_missing_configuration(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCOORD_")}
    env["TFCOORD_RUNTIME_DIR"] = str(tmp_path / "run")  # no embedded coordinator of ours to fall back on
    out = subprocess.run([*TFCOORD, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "TFCOORD_ADDRESS" in out.stderr
    loose = tmp_path / "loose"
    loose.write_text("x" * 40)
    loose.chmod(0o644)
    out = subprocess.run(
        [*TFCOORD, "serve", "--plaintext", "--secret-file", str(loose)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and f"chmod 600 {loose}" in out.stderr


def test_restart_from_journal_loses_nothing(tmp_path):
    """kill -9 mid-reservation; a restart on the same state dir and port resumes the job."""
    state = tmp_path / "state"
    first = Served(tmp_path, state_dir=state)
    d = DriverClient(first.address, first.secret).connect()
    job = d.submit(JobSpec(roles=make_roles(2), reservation_timeout_s=120))
    early = NodeClient(first.address, d.job_token(job), job, 0).connect()
    early.register("127.0.0.1", 4000)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    second = Served(tmp_path, port=first.port, state_dir=state)
    try:
        late = NodeClient(second.address, d.job_token(job), job, 1).connect()
        late.register("127.0.0.1", 4001)
        # The early node's client reconnects on its own and its wait resolves.
        info = early.await_cluster(30)
        assert info.cluster == {"worker": ["127.0.0.1:4000", "127.0.0.1:4001"]}
        assert early.reconnects >= 1
        for n in (early, late):
            n.report("succeeded")
        assert d.await_job(job, 30)["state"] == "SUCCEEDED"
        for c in (early, late, d):
            c.close()
    finally:
        assert second.stop() == 0


def test_foreign_state_dir_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.sqlite3").write_bytes(b"this is not sqlite" * 100)
    out = subprocess.run(
        [
            *TFCOORD,
            "serve",
            "--plaintext",
            "--port",
            "0",
            "--secret-file",
            str(tmp_path / "s"),
            "--state-dir",
            str(state),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "not a readable tfcoord journal" in out.stderr


def test_logs_of_a_real_two_node_local_job(served):
    code = (
        "import os, sys\n"
        "n = os.environ['TFCOORD_ROLE'] + ':' + os.environ['TFCOORD_TASK_INDEX']\n"
        "print('hello from', n, flush=True)\n"
        "print('\\x1b[31mwarning from', n, file=sys.stderr, flush=True)\n"
    )
    out = served.cli(
        "submit", "--engine", "local", "--workers", "2", "--json", "--", sys.executable, "-c", code
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job = json.loads(out.stdout)["job"]
    every = served.cli("logs", job)
    assert every.returncode == 0, every.stderr
    lines = every.stdout.splitlines()
    assert sorted(lines) == sorted(
        [
            "worker:0 | hello from worker:0",
            "worker:0 ! \\x1b[31mwarning from worker:0",
            "worker:1 | hello from worker:1",
            "worker:1 ! \\x1b[31mwarning from worker:1",
        ]
    ), every.stdout
    one = served.cli("logs", job, "--node", "worker:1", "--json")
    assert [json.loads(x)["text"] for x in one.stdout.splitlines()] == [
        "hello from worker:1",
        "\\x1b[31mwarning from worker:1",
    ] or sorted(json.loads(x)["text"] for x in one.stdout.splitlines()) == [
        "\\x1b[31mwarning from worker:1",
        "hello from worker:1",
    ]
    assert served.cli("logs", job, "--follow").stdout == every.stdout  # the job has ended: no waiting
    bad = served.cli("logs", job, "--node", "worker:7")
    assert bad.returncode == 2 and "its nodes are worker:0-1" in bad.stderr and "Traceback" not in bad.stderr


def test_stop_finds_an_embedded_coordinator_of_this_user_without_flags(tmp_path):
    """A Spark driver's embedded coordinator (TLS with its own certificate, random credentials)
    writes a connection file only its user can read; another shell stops a job through it with
    `tfcoord stop JOB`, or TensorFlowOnSpark's utils/stop_streaming.py HOST PORT."""
    from tfcoord.coordinator.embedded import EmbeddedCoordinator

    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCOORD_")}
    env["TFCOORD_RUNTIME_DIR"] = str(run)
    root = Path(__file__).resolve().parents[2]
    coord = EmbeddedCoordinator(host="0.0.0.0", connection_dir=run).start()
    try:
        (path,) = run.iterdir()
        assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(run.stat().st_mode & 0o777) == "0o700"
        context = tls.client_context(ca_pem=coord.ca_pem)
        with DriverClient(coord.address, coord.secret, ssl_context=context) as d:
            first, second = d.submit(JobSpec(roles=make_roles(1))), d.submit(JobSpec(roles=make_roles(1)))
            stop = subprocess.run(
                [*TFCOORD, "stop", first], capture_output=True, text=True, timeout=60, env=env
            )
            assert stop.returncode == 0 and f"job {first}" in stop.stdout, stop.stderr
            assert d.status(first)["state"] == "STOPPED"  # no node had registered: stopped at once
            assert not d.status(second).terminal  # only the job named was stopped
            # TensorFlowOnSpark's script, unchanged, with the host and port the driver logs.
            host = coord.address.rpartition(":")[0]
            script = subprocess.run(
                [
                    sys.executable,
                    str(root / "examples" / "utils" / "stop_streaming.py"),
                    host,
                    str(coord.port),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )
            assert script.returncode == 0, script.stderr
            assert d.status(second)["state"] == "STOPPED"
            assert "stop_streaming.py" in d.status(second)["stop_reason"]
    finally:
        coord.stop()
    assert list(run.glob("coordinator-*.json")) == []  # removed when the coordinator stopped
    assert len(list((run / "runs").glob("*.json"))) == 2  # the jobs' run records stay
    gone = subprocess.run([*TFCOORD, "stop", "job-x"], capture_output=True, text=True, timeout=60, env=env)
    assert gone.returncode == 2 and "no coordinator address" in gone.stderr and str(run) in gone.stderr
    assert "Traceback" not in gone.stderr


def _lines_until(stream, want: set[str]) -> list[str]:
    """Read ``stream`` line by line until every line of ``want`` came (or it ended)."""
    got: list[str] = []
    while not want <= set(got):
        line = stream.readline()
        if not line:
            break
        got.append(line.rstrip("\n"))
    return got


def test_logs_follow_prints_a_running_jobs_lines_as_they_come_and_ends_with_the_job(served, tmp_path):
    """Each node prints a line, then waits on its own FIFO (the test's go), prints another
    and ends: ``logs --follow`` shows the first lines while the job runs, the second ones
    once they are printed, and exits 0 when the job ends. Every wait is a blocking read."""
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    follow = None
    try:
        job = None
        while job is None:  # its first line says "job J submitted: ..."
            line = submit.stderr.readline()
            assert line, "tfcoord submit ended before it submitted"
            job = re.search(r"job (\S+) submitted", line)
        follow = subprocess.Popen(
            [*TFCOORD, "logs", job[1], "--follow"], env=served.env, stdout=subprocess.PIPE, text=True
        )
        early = _lines_until(follow.stdout, {"worker:0 | before 0", "worker:1 | before 1"})
        assert sorted(early) == ["worker:0 | before 0", "worker:1 | before 1"]
        assert follow.poll() is None  # still following: the job runs
        for i in range(2):
            (tmp_path / f"go-{i}").write_text("go")
        late = follow.stdout.read().splitlines()  # to its end: it exits once the job has ended
        assert sorted(late) == ["worker:0 | after 0", "worker:1 | after 1"]
        assert follow.wait(30) == 0
        submit.stderr.read()
        assert submit.wait(60) == 0
    finally:
        for p in (submit, follow):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
            if p is not None:
                for f in (p.stdout, p.stderr):
                    if f is not None:
                        f.close()
