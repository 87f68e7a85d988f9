"""Progress figures from a node's work to its supervisor: ``ctx.report(step=..., loss=...)``.

The work (a forked ``map_fun`` or a command) writes one JSON line per report to a pipe
whose write end it inherits (its number is in ``TFCOORD_REPORT_FD``); the supervisor reads
them, keeps only the latest, and sends that to the coordinator at most once per
``interval_s`` (a :class:`~tfcoord.client.messages.Progress` request). So a training loop
may call ``report`` every step: the call is a non-blocking write, skipped when the pipe is
full or the last write was under ``MIN_WRITE_INTERVAL_S`` ago, and never raises for lack of
a supervisor (outside a node it does nothing).

A command reports the same way: ``from tfcoord.node.reporting import report``.

Beside the work's figures the supervisor sends what it measured of the work's processes
(CPU, resident memory; see :mod:`tfcoord.node.usage`) every ``usage_interval_s``, as the
report's ``usage``: the dashboard's CPU and memory per node.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping

from tfcoord.client import LocalProtocolError
from tfcoord.client import messages as m

from .usage import ProcessUsage

log = logging.getLogger("tfcoord.node")

#: Where the work finds the pipe's write end.
REPORT_FD_ENV = "TFCOORD_REPORT_FD"
#: The work writes at most this often; reports in between are dropped (the supervisor
#: sends one a second or so anyway, so nothing a chart would show is lost).
MIN_WRITE_INTERVAL_S = 0.05
#: A report line longer than this is not ours (or is abuse): it is skipped.
MAX_LINE = 4096
#: The work's CPU and memory are measured and sent this often: a dashboard's figure, not a
#: profiler's; at a heartbeat's cost, less often than heartbeats.
USAGE_INTERVAL_S = 5.0

Figures = dict[str, int | float]

_last_write = 0.0
_fd: int | None = None
_fd_checked = False


def check_figures(figures: Mapping[str, object]) -> Figures:
    """The figures as the wire takes them, or ValueError saying what is wrong."""
    clean: Figures = {}
    for k, v in figures.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            try:  # numpy scalars, tensors with .item()
                v = v.item()  # type: ignore[attr-defined]
            except AttributeError:
                raise ValueError(f"report figure {k} must be a number, not {type(v).__name__}") from None
        if isinstance(v, float) and not math.isfinite(v):
            continue  # a NaN loss is not a point on a chart
        clean[k] = v
    try:
        m.Progress(id=0, job="x", executor_id=0, attempt=0, figures=clean)
    except LocalProtocolError as e:
        raise ValueError(str(e).replace("progress.figures", "report figures")) from None
    return clean


def report(**figures: int | float) -> bool:
    """Report progress figures (``step=120, loss=0.31, examples_per_s=850``); True if written.

    Up to 16 figures, names a letter then letters, digits, ``_`` or ``.``. Raises ValueError
    for a bad name or value (a programming error); NaN and infinities are skipped.
    """
    global _last_write, _fd, _fd_checked
    if not _fd_checked:
        _fd_checked = True
        raw = os.environ.get(REPORT_FD_ENV, "")
        _fd = int(raw) if raw.isdigit() else None
    clean = check_figures(figures)
    if _fd is None or not clean:
        return False
    now = time.monotonic()
    if now - _last_write < MIN_WRITE_INTERVAL_S:
        return False
    line = (json.dumps(clean, separators=(",", ":")) + "\n").encode()
    try:
        os.write(_fd, line)  # below PIPE_BUF: atomic, whole or not at all
    except BlockingIOError:
        return False  # the supervisor is behind: this report is dropped, the next one goes
    except OSError:
        _fd = None  # the supervisor is gone; stop trying
        return False
    _last_write = now
    return True


class ReportPipe:
    """The supervisor's end: reads the work's reports, sends the latest one per interval,
    and (once :meth:`measure` names the work's process) its CPU and memory use.

    ``send(figures, usage)`` gets either or both non-empty.
    """

    def __init__(
        self,
        send: Callable[[Figures, Figures], None],
        interval_s: float = 1.0,
        usage_interval_s: float = USAGE_INTERVAL_S,
    ) -> None:
        self._send = send
        self._interval_s = interval_s
        self._usage_interval_s = usage_interval_s
        self._usage: ProcessUsage | None = None
        self._usage_due = 0.0
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # the work never blocks on a report
        self._latest: Figures | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()  # the reader saw EOF: every write end is closed
        self._stop = threading.Event()  # the work ended: send what is left and finish
        self._reader = threading.Thread(target=self._read, name="tfcoord-report-read", daemon=True)
        self._sender = threading.Thread(target=self._forward, name="tfcoord-report-send", daemon=True)

    def env(self) -> dict[str, str]:
        return {REPORT_FD_ENV: str(self.write_fd)}

    def measure(self, pid: int) -> None:
        """Measure process ``pid`` and its descendants (the work) from now on."""
        self._usage = ProcessUsage(pid)

    def start(self) -> None:
        """Call once the work has its copy of the write end; ours is closed here."""
        os.close(self.write_fd)
        self._reader.start()
        self._sender.start()

    def _read(self) -> None:
        with os.fdopen(self.read_fd, "rb", buffering=0) as f:
            buf = b""
            while True:
                chunk = f.read(65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                if len(buf) > MAX_LINE:
                    buf = b""
                for line in lines:
                    self._take(line)
        self._closed.set()

    def _take(self, line: bytes) -> None:
        if not line or len(line) > MAX_LINE:
            return
        try:
            figures = json.loads(line)
            if not isinstance(figures, dict):
                raise ValueError("not a map")
            figures = check_figures(figures)
        except ValueError as e:
            log.debug("skipped a malformed progress report: %s", e)
            return
        with self._lock:
            self._latest = figures

    def _forward(self) -> None:
        while True:
            ended = self._stop.wait(self._interval_s)
            with self._lock:
                figures, self._latest = self._latest, None
            usage: Figures = {}
            now = time.monotonic()
            if self._usage is not None and not ended and now >= self._usage_due:
                self._usage_due = now + self._usage_interval_s
                usage = self._usage.sample()
            if figures or usage:
                try:
                    self._send(figures or {}, usage)
                except Exception as e:  # the coordinator is away: the next report may reach it
                    log.debug("progress report not sent: %s", e)
            if ended:
                return

    def close(self, timeout_s: float = 5.0) -> None:
        """After the work ended: the last figures are sent before this returns.

        A process the work left behind may still hold the write end; its reports after
        this are read and dropped.
        """
        if self._stop.is_set():
            return
        if (
            not self._reader.is_alive() and not self._closed.is_set()
        ):  # never started: nobody reads, so close both ends here
            self._stop.set()
            for fd in (self.read_fd, self.write_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            return
        self._closed.wait(1.0)
        self._stop.set()
        self._sender.join(timeout_s)
