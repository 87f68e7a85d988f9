"""A job that outlives its nodes: real processes killed with SIGKILL mid-run, the cluster
restarted as a new generation, the work resumed from its checkpoint (issue 25).

The work (``restart_work/steps.py``) checkpoints each of its ten steps; worker 1 holds at a
step, hands the test its pid through a FIFO and is killed there; the local engine starts the
dead node again, every node rejoins generation 1 and resumes from its checkpoint. No sleeps:
the test waits on the FIFO and on the processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = Path(__file__).with_name("restart_work") / "steps.py"
TFCOORD = [sys.executable, "-m", "tfcoord"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCOORD_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _submit(tmp_path: Path, *flags: str, hold_at: int = 5) -> subprocess.Popen[str]:
    for name in ("hold", "never"):
        os.mkfifo(tmp_path / name)
    return subprocess.Popen(
        [
            *TFCOORD,
            "submit",
            "--engine",
            "local",
            "--workers",
            "2",
            "--json",
            *flags,
            "--",
            sys.executable,
            str(STEPS),
            str(tmp_path),
            "--hold-at",
            str(hold_at),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )


def _kill_the_held_worker(tmp_path: Path) -> int:
    with open(tmp_path / "hold") as fifo:  # returns once worker 1 wrote its pid
        pid = int(fifo.read())
    os.kill(pid, signal.SIGKILL)
    return pid


def _communicate(proc: subprocess.Popen[str]) -> tuple[str, str]:
    with proc:
        return proc.communicate(timeout=150)


def test_a_worker_killed_mid_run_restarts_the_cluster_and_the_job_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    proc = _submit(tmp_path, "--max-restarts", "2", "--restart-backoff", "0.2")
    _kill_the_held_worker(tmp_path)
    stdout, stderr = _communicate(proc)
    assert proc.returncode == 0, stderr[-4000:]
    status = json.loads(stdout)
    assert status["state"] == "SUCCEEDED" and status["generation"] == 1
    [restart] = status["restarts"]
    assert restart["cause"] == "was killed by SIGKILL" and restart["node"].startswith("worker:1")
    assert restart["exit_code"] == -signal.SIGKILL
    assert "restart 1/2: worker:1 (executor 1" in stderr and "was killed by SIGKILL" in stderr
    # Both workers ran again in generation 1, each from its own checkpoint: worker 1 from the
    # step it was killed at (5), worker 0 from wherever it had got to when it was told to stop.
    assert "[worker:1] generation 1: resumed at step 5, finished step 10" in stderr
    assert re.search(r"\[worker:0\] generation 1: resumed at step (\d+), finished step 10", stderr)
    assert all(n["generation"] == 1 and n["state"] == "SUCCEEDED" for n in status["nodes"])


def test_without_restarts_left_the_kill_fails_the_job_naming_the_cause(tmp_path: Path) -> None:
    proc = _submit(tmp_path)  # --max-restarts 0: today's behaviour
    _kill_the_held_worker(tmp_path)
    stdout, _stderr = _communicate(proc)
    assert proc.returncode == 1
    status = json.loads(stdout)
    assert status["state"] == "FAILED" and status["reason"] == "node_failed" and status["restarts"] == []
    assert "killed by signal 9" in status["error"]


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fault_tolerance"
EPOCH_LINE = re.compile(r"^\[worker:1\] worker:1 pid (\d+) generation 0: epoch 2/6 done")


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("example", "state_flag"), [("keras_fit.py", "--backup-dir"), ("custom_loop.py", "--checkpoint-dir")]
)
def test_mwms_training_survives_a_killed_worker_and_trains_the_same_epochs(
    tmp_path: Path, example: str, state_flag: str
) -> None:
    """The fault-tolerance examples, for real: two TensorFlow workers in MultiWorkerMirroredStrategy
    (Keras ``fit`` with BackupAndRestore; a custom loop with a CheckpointManager), worker 1
    SIGKILLed after its second epoch; the cluster restarts, training resumes, and both workers
    end with 6 epochs x 8 steps, as an undisturbed run does."""
    command = [sys.executable, str(EXAMPLES / example), state_flag, str(tmp_path / "state"), "--epochs", "6"]
    proc = subprocess.Popen(
        [*TFCOORD, "submit", "--engine", "local", "--workers", "2", "--max-restarts", "1", "--", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    lines = []
    with proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # the nodes' output as it comes: kill worker 1 after epoch 2
            lines.append(line)
            if found := EPOCH_LINE.match(line):
                os.kill(int(found.group(1)), signal.SIGKILL)
        proc.wait(timeout=60)
    out = "".join(lines)
    assert proc.returncode == 0, out[-4000:]
    assert "restart 1/1: worker:1 (executor 1, host 127.0.0.1) was killed by SIGKILL" in out
    for worker in ("worker:0", "worker:1"):
        assert f"[{worker}] {worker} generation 1: trained 48 steps in all (6 epochs x 8)" in out
    # Generation 1 resumed where the last save was (epoch 2 or 3, depending on when worker 0
    # stopped), not from the start.
    assert not re.search(r"generation 1: epoch 1/6 done", out)
