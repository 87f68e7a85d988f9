"""After the driver: ``tfcoord status`` and ``tfcoord logs`` read an ended run's record.

Real processes: ``tfcoord submit --engine local`` runs an embedded coordinator and two node
processes; it writes each job's run record into this user's runtime directory as the job
goes. Once the driver exited, or was killed with SIGKILL mid-job, ``status`` and ``logs``
(the CLI as a subprocess, no address) show the job's state, timeline and its nodes' output
from that record. A runtime directory that is not this user's alone (open to others, or a
record others may write) is refused in one line, exit 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfcoord.client import runrecords

from .served import TFCOORD

pytestmark = pytest.mark.timeout(180)

PRINTER = (
    "import sys, time\n"
    "for i in range(5):\n"
    "    print(f'step {i}', flush=True)\n"
    "print('a warning on stderr', file=sys.stderr, flush=True)\n"
    "if len(sys.argv) > 1:\n"
    "    print('waiting to be killed', flush=True)\n"
    "    time.sleep(120)\n"
)


def _env(run: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TFCOORD_ADDRESS", "TFCOORD_SECRET_FILE")}
    env["TFCOORD_RUNTIME_DIR"] = str(run)
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TFCOORD, *args], capture_output=True, text=True, timeout=120, env=env)


def _job_of(stderr: str) -> str:
    return stderr.split("job ", 1)[1].split(" ", 1)[0]


def test_status_and_logs_of_a_job_whose_driver_has_exited(tmp_path):
    run = tmp_path / "run"
    env = _env(run)
    out = subprocess.run(
        [*TFCOORD, "submit", "--engine", "local", "--workers", "2", "--", sys.executable, "-c", PRINTER],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    job = _job_of(out.stderr)
    assert (run / "runs" / f"{job}.json").is_file()
    assert (run / "runs").stat().st_mode & 0o777 == 0o700
    assert (run / "runs" / f"{job}.json").stat().st_mode & 0o777 == 0o600

    status = _cli(env, "status", job)
    assert status.returncode == 0, status.stderr
    assert f"job {job} SUCCEEDED" in status.stdout
    assert (
        f"the driver of job {job}" in status.stderr and "has ended: this is its run record" in status.stderr
    )

    logs = _cli(env, "logs", job)
    assert logs.returncode == 0, logs.stderr
    for w in ("worker:0", "worker:1"):
        assert f"{w} | step 4" in logs.stdout, logs.stdout
        assert f"{w} ! a warning on stderr" in logs.stdout
    one = _cli(env, "logs", job, "--node", "worker:1")
    assert "worker:1 | step 0" in one.stdout and "worker:0" not in one.stdout
    as_json = _cli(env, "status", job, "--json")
    assert json.loads(as_json.stdout)["state"] == "SUCCEEDED"


def test_a_driver_killed_mid_job_leaves_its_record(tmp_path):
    run = tmp_path / "run"
    env = _env(run)
    proc = subprocess.Popen(
        [
            *TFCOORD,
            "submit",
            "--engine",
            "local",
            "--workers",
            "2",
            "--",
            sys.executable,
            "-c",
            PRINTER,
            "wait",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its node processes are killed with it
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        job = _job_of(proc.stderr.readline())  # "job ID submitted: ..."
        seen = 0
        for line in proc.stdout:  # both nodes are waiting to be killed: their lines went out
            seen += "waiting to be killed" in line
            if seen == 2:
                break
        # The record is rewritten about every second while the job's output grows: wait (on
        # the driver, which must not exit meanwhile) until it holds both nodes' last line.
        record = run / "runs" / f"{job}.json"
        deadline = time.monotonic() + 30
        while not (record.is_file() and record.read_text().count("waiting to be killed") == 2):
            assert time.monotonic() < deadline, "the run record never caught up with the output"
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert job is not None
    status = _cli(env, "status", job)
    assert status.returncode == 0, status.stderr
    assert f"job {job} RUNNING" in status.stdout
    assert "the driver ended while the job was RUNNING, so it never finished" in status.stderr
    logs = _cli(env, "logs", job)
    assert logs.stdout.count("waiting to be killed") == 2, logs.stdout


def test_a_runtime_directory_or_record_others_may_write_is_refused(tmp_path):
    run = tmp_path / "run"
    runrecords.write(run, "job-x", 1, 0.0, {}, {})  # pid 1: not a driver of ours, so "ended"
    env = _env(run)
    record = run / "runs" / "job-x.json"
    record.chmod(0o666)
    for cmd in ("status", "logs"):
        out = _cli(env, cmd, "job-x")
        assert out.returncode == 2 and "Traceback" not in out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert "may be written by other users (mode 666)" in line and "remove it" in line
    record.chmod(0o600)
    (run / "runs").chmod(0o777)  # as a directory another user could have made or entered
    out = _cli(env, "status", "job-x")
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "open to other users (mode 777): chmod 700" in line
    (run / "runs").chmod(0o700)
    run.chmod(0o755)
    out = _cli(env, "logs", "job-x")
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "open to other users (mode 755)" in line


KILLED = (
    "import json, os, signal\n"
    "for i in range(30):\n"
    "    print(f'loading shard {i}', flush=True)\n"
    "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "print('done', flush=True)\n"
)


def test_a_killed_nodes_last_lines_are_in_its_failure(tmp_path):
    env = _env(tmp_path / "run")
    out = subprocess.run(
        [*TFCOORD, "submit", "--engine", "local", "--workers", "2", "--", sys.executable, "-c", KILLED],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert out.returncode == 1, out.stderr
    # the driver's error: the signal, then the node's last 20 lines (10 to 29), not earlier ones
    assert "its last 20 lines of output:\nloading shard 10\n" in out.stderr, out.stderr
    assert "loading shard 29" in out.stderr and "loading shard 9\n" not in out.stderr
    status = _cli(env, "status", _job_of(out.stderr), "--json")
    (killed,) = [n for n in json.loads(status.stdout)["nodes"] if n["state"] == "FAILED"]
    assert killed["error"].endswith(
        "its last 20 lines of output:\n" + "\n".join(f"loading shard {i}" for i in range(10, 30))
    )


def _row(stdout: str, job: str) -> list[str]:
    (row,) = [line.split() for line in stdout.splitlines() if line.startswith(job + " ")]
    return row


def test_status_without_a_job_lists_ended_runs_beside_the_live_driver(tmp_path):
    run = tmp_path / "run"
    env = _env(run)
    done = _cli(env, "submit", "--engine", "local", "--workers", "2", "--", sys.executable, "-c", PRINTER)
    assert done.returncode == 0, done.stderr
    first = _job_of(done.stderr)
    # No driver runs: the ended run alone (was: "no coordinator address", exit 2).
    alone = _cli(env, "status")
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines()[0].split()[-1] == "DRIVER"
    row = _row(alone.stdout, first)
    assert row[3] == "SUCCEEDED" and row[-3:-1] == ["ended", "(pid"], alone.stdout

    proc = subprocess.Popen(
        [
            *TFCOORD,
            "submit",
            "--engine",
            "local",
            "--workers",
            "2",
            "--",
            sys.executable,
            "-c",
            PRINTER,
            "wait",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        second = _job_of(proc.stderr.readline())
        seen = 0
        for line in proc.stdout:  # both nodes run: the job is RUNNING on the live driver
            seen += "waiting to be killed" in line
            if seen == 2:
                break
        both = _cli(env, "status")
        assert both.returncode == 0, both.stderr
        assert _row(both.stdout, second)[3] == "RUNNING" and _row(both.stdout, second)[-1] == "running"
        assert _row(both.stdout, first)[3] == "SUCCEEDED" and "ended" in _row(both.stdout, first)
        as_json = json.loads(_cli(env, "status", "--json").stdout)
        assert [j["job"] for j in as_json["jobs"]] == [second]
        assert [(r["job"], r["state"]) for r in as_json["ended_runs"]] == [(first, "SUCCEEDED")]
        # The record must hold the running job before its driver is killed (written each second).
        record = run / "runs" / f"{second}.json"
        deadline = time.monotonic() + 30
        while not (record.is_file() and record.read_text().count("waiting to be killed") == 2):
            assert time.monotonic() < deadline, "the run record never caught up with the output"
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    # Its driver killed: both are ended runs, the newest first, the second as last recorded.
    after = _cli(env, "status")
    assert after.returncode == 0, after.stderr
    jobs = [line.split()[0] for line in after.stdout.splitlines()[1:]]
    assert jobs == [second, first], after.stdout
    assert _row(after.stdout, second)[3] == "RUNNING" and "ended" in _row(after.stdout, second)
