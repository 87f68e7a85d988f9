"""The one way the driver side waits on a job: watch until a condition holds, or a deadline.

Every wait of a driver (the Spark API's readiness, shutdown and feeding checks, ``tfcoord
submit``'s progress, the Mesos driver, the tfmesos2 layer) is :func:`watch_until` with a
condition on the job's status. Each round is one ``watch_job`` request, which the
coordinator answers the moment the job's version moves past the one we last saw (push,
not poll), or after ``slice_s`` so the caller's own deadline is checked; ``on_change``
sees every new version, which is how progress lines and timelines are printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from .jobreplies import JobStatus
from .messages import MAX_TIMEOUT_S

#: Each watch waits at most this long on the server before coming back to check the
#: caller's own deadline; changes themselves arrive the moment the job changes.
WATCH_SLICE_S = 60.0
#: Following a job "until it ends": the longest wait the protocol allows (a week).
FOREVER_S = MAX_TIMEOUT_S


class Watchable(Protocol):
    """What :func:`watch_until` needs of a client (``DriverClient`` has it)."""

    def watch(
        self, job: str, version: int, timeout_s: float, *, brief: bool = False, reports: int = -1
    ) -> JobStatus: ...


def ended(status: JobStatus) -> bool:
    """The job reached SUCCEEDED, FAILED or STOPPED."""
    return status.terminal


def watch_until(
    driver: Watchable,
    job: str,
    until: Callable[[JobStatus], bool] = ended,
    *,
    timeout_s: float,
    brief: bool = False,
    on_change: Callable[[JobStatus], None] | None = None,
    since: JobStatus | None = None,
    slice_s: float = WATCH_SLICE_S,
) -> JobStatus:
    """Block until ``until(status)`` holds or ``timeout_s`` has passed; returns the last status.

    The caller tells the two apart by asking ``until`` again. ``since`` is a status
    already in hand: it is checked first and the watch starts after its version.
    ``brief`` watches carry no nodes, history or timeline (their size does not grow with
    the job). Errors of the client (the coordinator gone, a deadline of its own) propagate.
    """
    deadline = time.monotonic() + max(0.0, timeout_s)
    status, version = since, since.version if since is not None else 0
    while True:
        if status is not None and until(status):
            return status
        left = deadline - time.monotonic()
        if status is not None and left <= 0:
            return status
        status = driver.watch(job, version, max(0.0, min(slice_s, left)), brief=brief)
        if on_change is not None and status.version != version:
            on_change(status)
        version = status.version
