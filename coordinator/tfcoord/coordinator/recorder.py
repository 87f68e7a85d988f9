"""An embedded coordinator's run records, written as it goes (see :mod:`tfcoord.client.runrecords`).

A thread of the driver process asks the coordinator's loop, about every second, for the jobs
that changed since (their version, progress reports or output moved) and writes each one's
record outside the loop, so file I/O never delays a node's reply. The last records are
written when the coordinator stops; a driver killed outright leaves records at most
:data:`RECORD_INTERVAL_S` old.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tfcoord.client import runrecords

from .state.machine import CoordinatorState

log = logging.getLogger("tfcoord.coordinator")
_T = TypeVar("_T")

#: How old a record may be when its driver is killed outright: one small write per changed
#: job per interval.
RECORD_INTERVAL_S = 1.0

Snapshot = list[tuple[str, dict[str, Any], dict[str, Any]]]


class RunRecorder:
    """Writes the run records of one embedded coordinator's jobs into ``runtime_dir``."""

    def __init__(
        self,
        runtime_dir: Path,
        call: Callable[[Callable[[], Snapshot]], Snapshot],
        state: Callable[[], CoordinatorState],
    ) -> None:
        self._dir = runtime_dir
        self._call = call
        self._state = state
        self._seen: dict[str, tuple[int, int, int]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="tfcoord-run-records", daemon=True)

    def start(self) -> RunRecorder:
        self._thread.start()
        return self

    def _snapshot(self) -> Snapshot:
        """On the loop: the changed jobs' status and newest output."""
        state = self._state()
        out: Snapshot = []
        for job in list(state.jobs.values()):
            key = (job.version, job.reports, job.log_seq)
            if self._seen.get(job.id) == key:
                continue
            self._seen[job.id] = key
            since = max(0, job.log_seq - runrecords.RECORD_LOG_LINES)
            out.append(
                (job.id, state.status(job.id), state.logs(job.id, -1, since, runrecords.RECORD_LOG_LINES))
            )
        return out

    def flush(self) -> None:
        """Write the records of the jobs that changed (one writer at a time)."""
        with self._lock:
            if self._failed:
                return
            try:
                changed = self._call(self._snapshot)
            except RuntimeError:  # the loop has ended
                return
            for job, status, logs in changed:
                try:
                    runrecords.write(self._dir, job, os.getpid(), time.time(), status, logs)
                except runrecords.RunRecordError as e:
                    # Said once: tfcoord status/logs will not have this run after the driver ends.
                    log.warning("no run records (tfcoord status/logs end with this driver): %s", e)
                    self._failed = True
                    return

    def _run(self) -> None:
        while not self._stop.wait(RECORD_INTERVAL_S):
            self.flush()

    def stop(self) -> None:
        """Write the last records, then end the thread."""
        self._stop.set()
        self._thread.join(timeout=RECORD_INTERVAL_S * 10)
        self.flush()
