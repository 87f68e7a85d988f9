"""``tfcoord serve --state-dir`` keeps its jobs' node output: after the driver, after a restart.

Real processes: ``tfcoord serve`` with a state directory, ``tfcoord submit --engine local``
against it (two node processes, each printing more lines than the coordinator keeps per
node), then ``tfcoord logs`` and ``tfcoord status`` as subprocesses once the driver has
exited, again after the coordinator was stopped and started on the same state directory,
and once more after a restart whose retention rules forget the job: its lines leave the
database with it.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from tfcoord.coordinator.journal import FILENAME
from tfcoord.coordinator.state.telemetry import LOG_LINES_PER_NODE

from .served import Served

pytestmark = pytest.mark.timeout(240)

#: More than a node's bound, so the bound and its "dropped" marker survive the restart too.
LINES = LOG_LINES_PER_NODE + 500
PRINTER = (
    "import os, sys\n"
    "n = os.environ['TFCOORD_ROLE'] + ':' + os.environ['TFCOORD_TASK_INDEX']\n"
    f"for i in range({LINES}):\n"
    "    print(f'line {i} of {n}')\n"
    "print(f'last words of {n}', file=sys.stderr, flush=True)\n"
)


def _kept_rows(state: Path, job: str) -> int:
    with sqlite3.connect(f"file:{state / FILENAME}?mode=ro", uri=True) as db:
        rows: int = db.execute("SELECT count(*) FROM output WHERE job = ?", (job,)).fetchone()[0]
        return rows


def test_logs_and_status_of_a_served_job_after_its_driver_and_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    served = Served(tmp_path, state_dir=state)
    try:
        out = served.cli(
            "submit", "--engine", "local", "--workers", "2", "--json", "--", sys.executable, "-c", PRINTER
        )
        assert out.returncode == 0, out.stdout + out.stderr
        job = json.loads(out.stdout)["job"]
        before = served.cli("logs", job)
        assert before.returncode == 0, before.stderr
    finally:
        assert served.stop() == 0, served.log
    # The driver and the coordinator are gone; a new coordinator on the same state directory.
    served = Served(tmp_path, port=served.port, state_dir=state)
    try:
        after = served.cli("logs", job)
        assert after.returncode == 0, after.stderr
        assert after.stdout == before.stdout  # every line, marker and order as before
        lines = after.stdout.splitlines()
        for w in ("worker:0", "worker:1"):
            # LINES + 1 lines a node (stdout and stderr are two pipes: their order varies),
            # the newest LOG_LINES_PER_NODE kept.
            assert f"[501 earlier lines of {w} dropped: the coordinator keeps the last ones]" in lines
            assert f"{w} | line {LINES - 1} of {w}" in lines
            assert f"{w} | line 499 of {w}" not in lines  # beyond the node's bound, gone as before
        one = served.cli("logs", job, "--node", "worker:1", "--json")
        rows = [json.loads(x) for x in one.stdout.splitlines()]
        assert {r["node"] for r in rows} == {"worker:1"} and len([r for r in rows if "text" in r]) == 2000
        assert {r["stream"] for r in rows if r.get("text", "").startswith("line ")} == {"stdout"}
        assert {r["stream"] for r in rows if r.get("text") == "last words of worker:1"} <= {"stderr"}
        status = served.cli("status", job)
        assert status.returncode == 0, status.stderr
        assert f"job {job} SUCCEEDED" in status.stdout, status.stdout
        # Both nodes' last lines are kept: the bound, not the whole output.
        assert _kept_rows(state, job) == 2 * LOG_LINES_PER_NODE
    finally:
        assert served.stop() == 0, served.log
    # Retention forgets the job (finished longer ago than 0.1 s): its lines go with it.
    served = Served(tmp_path, "--keep-finished-days", "0.000001", port=served.port, state_dir=state)
    try:
        gone = served.cli("logs", job)
        assert gone.returncode != 0 and job in gone.stderr, gone.stdout + gone.stderr
    finally:
        assert served.stop() == 0, served.log
    assert _kept_rows(state, job) == 0
