"""Following a job from the driver side: one line per visible change, pushed, not polled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .client import DriverClient
from .vocab import FORMED_JOB, RESERVING_JOB, TERMINAL_JOB, NodeState

#: Each watch waits at most this long on the server before coming back to check the
#: caller's own deadline; progress itself arrives the moment the job changes.
WATCH_SLICE_S = 60.0


def describe(status: dict[str, Any]) -> str:
    """A one-line summary of a job (full or brief status): state, registrations and who is
    still missing."""
    state, size, reg = status["state"], status["size"], status["registered"]
    line = f"job {status['job']} {state}"
    if state in RESERVING_JOB:
        line += f": registered {reg}/{size}"
        missing = [m.split(":", 2)[0] + ":" + m.split(":", 2)[1].split(" ")[0] for m in status["missing"]]
        count = status.get("missing_count", len(missing))
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {count - 8} more" if count > 8 else "")
            line += f" (waiting for {shown})"
    elif state in FORMED_JOB:
        running = status.get("running")
        if running is None:
            running = sum(1 for n in status["nodes"] if n["state"] == NodeState.RUNNING)
        line += f": {running}/{size} nodes running"
    return line


def follow(driver: DriverClient, job: str, emit: Callable[[str], None], timeout_s: float) -> dict[str, Any]:
    """Emit a line whenever the job's summary changes, until it ends; returns its final
    (full) status. The watches are brief: their size does not grow with the job."""
    import time

    deadline = time.monotonic() + timeout_s
    version, last = 0, ""
    while True:
        left = deadline - time.monotonic()
        status = driver.watch(job, version, max(0.0, min(WATCH_SLICE_S, left)), brief=True)
        version = status["version"]
        line = describe(status)
        if line != last:
            emit(line)
            last = line
        if status["state"] in TERMINAL_JOB or left <= 0:
            return driver.status(job)
