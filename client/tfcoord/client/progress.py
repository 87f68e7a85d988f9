"""Showing a job's progress on the driver side: one line per visible change.

Used as the ``on_change`` of :func:`~tfcoord.client.watcher.watch_until`: the watcher
pushes each new status, these turn it into lines for people.
"""

from __future__ import annotations

from collections.abc import Callable

from .jobreplies import JobStatus
from .terminal import printable
from .vocab import FORMED_JOB

#: Progress lines name at most this many missing slots, then how many more.
SHOWN_MISSING = 8


def restart_line(status: JobStatus) -> str:
    """The newest restart of a job's cluster, for people: ``restart 1/3: worker:1 (executor 1,
    ...) was killed by SIGKILL; restarting the cluster from its last checkpoint``."""
    r = status.restarts[-1]
    return (
        f"restart {status.restart_count}/{status.max_restarts}: {r.node} {r.cause}; "
        "restarting the cluster from its last checkpoint"
    )


def describe(status: JobStatus) -> str:
    """A one-line summary of a job (full or brief status): state, registrations and who is
    still missing; safe to print (a missing slot's text may hold a node's task id)."""
    line = f"job {status.job} {status.state}"
    if status.state.reserving:
        line += f": registered {status.registered}/{status.size}"
        # Each missing line starts "role:index (executor N)": show the slot names.
        missing = [m.split(" ", 1)[0].rstrip(":") for m in status.missing]
        count = status.missing_count
        if missing:
            more = f" and {count - SHOWN_MISSING} more" if count > SHOWN_MISSING else ""
            line += f" (waiting for {', '.join(missing[:SHOWN_MISSING])}{more})"
    elif status.state in FORMED_JOB:
        line += f": {status.running}/{status.size} nodes running"
    return printable(line)


class ProgressLines:
    """Emit :func:`describe`'s line whenever it changes (optionally not once the job ended:
    the caller then says how it ended, with the why). ``after``: the lines another
    ProgressLines already showed of the job (its :attr:`last` and :attr:`restarts`), so
    following on where it stopped repeats neither."""

    def __init__(
        self, emit: Callable[[str], None], *, final: bool = True, after: ProgressLines | None = None
    ) -> None:
        self._emit = emit
        self._final = final
        self._last = after.last if after else ""
        self._restarts = after.restarts if after else 0

    @property
    def last(self) -> str:
        """The line emitted last ("" before the first)."""
        return self._last

    @property
    def restarts(self) -> int:
        """The restarts already said."""
        return self._restarts

    def __call__(self, status: JobStatus) -> None:
        if status.restart_count > self._restarts and status.restarts:
            self._restarts = status.restart_count
            self._emit(printable(restart_line(status)))
        if status.terminal and not self._final:
            return
        line = describe(status)
        if line != self._last:
            self._emit(line)
            self._last = line


class TimelineLines:
    """Emit each new line of a job's timeline (full statuses carry it), safe to print: a
    line may quote a node's error text."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._seen = 0

    def __call__(self, status: JobStatus) -> None:
        for _, text in status.events[self._seen :]:
            self._emit(printable(text))
        self._seen = len(status.events)
