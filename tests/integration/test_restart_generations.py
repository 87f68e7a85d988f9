"""A coordinator killed with SIGKILL in the middle of a generation change (issue 25).

A local job with ``--max-restarts 1`` runs against ``tfcoord serve --state-dir``; worker 1 is
killed mid-run, the coordinator restarts the cluster as generation 1 and journals why; before
the nodes have rejoined, the coordinator itself is killed and started again on the same state
directory and port. The journal replays the restart, the nodes and the driver reconnect, the
new generation forms and the job ends SUCCEEDED, each node resumed from its checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tfcoord.client import DriverClient
from tfcoord.client.watcher import watch_until

from .served import TFCOORD, Served

STEPS = Path(__file__).resolve().parents[1] / "e2e" / "restart_work" / "steps.py"
#: A few seconds of work on a quiet machine; a loaded CI machine gets ten times that.
PHASE_TIMEOUT_S = 120.0

pytestmark = pytest.mark.timeout(240)


def test_a_coordinator_killed_during_a_generation_change_still_brings_the_job_to_success(tmp_path: Path):
    state = tmp_path / "state"
    served = Served(tmp_path, state_dir=state)
    for name in ("hold", "never"):
        os.mkfifo(tmp_path / name)
    submit = subprocess.Popen(
        [
            *TFCOORD,
            "submit",
            "--engine",
            "local",
            "--workers",
            "2",
            "--json",
            "--name",
            "gens",
            "--max-restarts",
            "1",
            "--restart-backoff",
            "8",
            "--",
            sys.executable,
            str(STEPS),
            str(tmp_path),
            "--hold-at",
            "5",
        ],
        env=dict(served.env, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        with open(tmp_path / "hold") as fifo:
            os.kill(int(fifo.read()), signal.SIGKILL)
        # An admin's view (tfcoord serve keeps the admin secret beside the secret file).
        admin = (tmp_path / "secret.admin").read_bytes().strip()
        with DriverClient(served.address, admin, role="admin") as d:
            [job] = [j.job for j in d.status().jobs]
            st = watch_until(d, job, lambda st: st.generation == 1, timeout_s=PHASE_TIMEOUT_S)
            assert st.generation == 1 and st.state == "RESERVING", st.wire
        # The nodes wait out their 8 s backoff before they rejoin (a loaded machine may take
        # seconds to get here): the coordinator dies now, with the restart journaled.
        assert served.stop(signal.SIGKILL) == -signal.SIGKILL
        served = Served(tmp_path, port=served.port, state_dir=state)
        assert "journal events replayed" in served.log
        stdout, stderr = submit.communicate(timeout=PHASE_TIMEOUT_S)
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.communicate()
        served.stop()
    assert submit.returncode == 0, stderr[-4000:]
    status = json.loads(stdout)
    assert status["state"] == "SUCCEEDED" and status["generation"] == 1
    assert [r["cause"] for r in status["restarts"]] == ["was killed by SIGKILL"]
    assert "[worker:1] generation 1: resumed at step 5, finished step 10" in stderr
