"""A node's output, to the coordinator: its work's stdout and stderr, line by line.

The supervisor gives the work a pipe for each stream (a forked ``map_fun`` has them as
its fds 1 and 2; a command as its stdout and its stderr's destination). A thread per
stream reads it, passes every byte on to where the output went before (the supervisor's
own fd 1 or 2: the Spark executor's log, the local engine's prefixed lines), and queues
each line as a terminal would show it (:class:`ShownLine`: a progress bar redrawn in place
with ``\\r`` or ``\\b`` is kept as its last state), escaped (no control characters: a line
can neither forge another line nor drive a terminal) and cut at ``MAX_LOG_LINE`` characters.
A sender sends the queue to the coordinator in batches every ``interval_s``. The queue is bounded (``MAX_QUEUED``): while
the coordinator is slow or away the oldest lines go, and the next batch says how many.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence

from tfcoord.client import messages as m

log = logging.getLogger("tfcoord.node")

#: Lines a node holds for the coordinator at most; beyond, the oldest are dropped (counted).
MAX_QUEUED = 10_000
#: A line longer than this (in characters, as shown) is cut; the rest of it is dropped.
MAX_READ_LINE = 64 * 1024
#: The last lines kept for the node's failure: a work killed by a signal left no traceback,
#: and its last output is what says where it was (each line at most ``MAX_LOG_LINE``).
TAIL_LINES = 20

Send = Callable[[str, Sequence[str], int], None]


def escape(text: str) -> str:
    """One shown line as the wire takes it: control characters as ``\\xNN``, cut."""
    text = m.LOG_CONTROL_RE.sub(lambda c: f"\\x{ord(c.group()):02x}", text)
    if len(text) > m.MAX_LOG_LINE:
        text = text[: m.MAX_LOG_LINE - 3] + "..."
    return text


#: What moves a terminal's cursor back within its line: carriage return and backspace.
_CURSOR = re.compile(r"([\r\b]+)")


class ShownLine:
    """One stream's text as a terminal shows it, line by line: pure, fed decoded text.

    Progress bars redraw their line in place: Keras's Progbar writes backspaces and a
    carriage return before each step's bar, tqdm a carriage return. Kept byte for byte, an
    epoch's progress is one line of every redraw (tens of kilobytes of ``\\x08``) and its
    last state lies past the cut; kept as shown, it is the bar where the epoch ended. A
    carriage return moves to the start of the line and a backspace one character back; what
    is written then overwrites, as on a terminal (``\\r\\n`` line ends come out bare). A line
    longer than ``limit`` characters is cut there and the rest of it dropped.
    """

    def __init__(self, limit: int = MAX_READ_LINE) -> None:
        self._limit = limit
        self._shown = ""
        self._at = 0  # the cursor's column in _shown
        self._cut = False  # past the limit: drop until the line ends

    def feed(self, text: str) -> list[str]:
        """The lines ``text`` ended (without their ``\\n``), as shown."""
        *ended, rest = text.split("\n")
        lines = []
        for piece in ended:
            self._write(piece)
            if not self._cut:  # a cut line was sent when it reached the limit
                lines.append(self._shown[: self._limit])
            self._shown, self._at, self._cut = "", 0, False
        self._write(rest)
        if len(self._shown) > self._limit and not self._cut:
            lines.append(self._shown[: self._limit])
            self._shown, self._at, self._cut = "", 0, True
        return lines

    def end(self) -> str | None:
        """What is left of the last line, when the stream ended without a line break."""
        shown, self._shown, self._at = self._shown, "", 0
        return shown or None

    def _write(self, text: str) -> None:
        if self._cut:
            return
        if "\r" not in text and "\b" not in text:  # the common case: one write
            self._put(text)
            return
        for i, part in enumerate(_CURSOR.split(text)):
            if i % 2 == 0:
                self._put(part)
            else:
                for c in part:
                    self._at = 0 if c == "\r" else max(0, self._at - 1)

    def _put(self, text: str) -> None:
        at = self._at
        if at == len(self._shown):  # appending, as a line without redraws always is
            self._shown += text
        elif text:
            self._shown = self._shown[:at] + text + self._shown[at + len(text) :]
        self._at = at + len(text)


def as_shown(line: str) -> str:
    """One line (without its ``\\n``) as a terminal shows it; see :class:`ShownLine`."""
    shown = ShownLine(limit=len(line))  # nothing to cut: the whole line is here
    return (shown.feed(line) or [shown.end() or ""])[0]


class OutputLog:
    """Both streams of one node's work; see the module's docstring."""

    STREAMS = (("stdout", 1), ("stderr", 2))

    def __init__(self, send: Send, interval_s: float = 0.5) -> None:
        self._send = send
        self._interval_s = interval_s
        self._queue: deque[tuple[str, str]] = deque()
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._dropped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pipes = {name: os.pipe() for name, _ in self.STREAMS}
        self._readers = [
            threading.Thread(target=self._read, args=(name, fd), name=f"tfcoord-log-{name}", daemon=True)
            for name, fd in self.STREAMS
        ]
        self._sender = threading.Thread(target=self._forward, name="tfcoord-log-send", daemon=True)
        self._started = False

    @property
    def stdout_fd(self) -> int:
        return self._pipes["stdout"][1]

    @property
    def stderr_fd(self) -> int:
        return self._pipes["stderr"][1]

    def start(self) -> None:
        """Call once the work holds its copies of the write ends; ours are closed here."""
        for _, w in self._pipes.values():
            os.close(w)
        self._started = True
        for t in self._readers:
            t.start()
        self._sender.start()

    def _read(self, name: str, to_fd: int) -> None:
        r = self._pipes[name][0]
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character may span reads
        shown = ShownLine()
        with os.fdopen(r, "rb", buffering=0) as f:
            while True:
                chunk = f.read(65536)
                if not chunk:
                    break
                try:
                    os.write(to_fd, chunk)  # where the output went before tfcoord kept it too
                except OSError:
                    pass
                lines = shown.feed(decoder.decode(chunk))
                if lines:
                    self._take(name, lines)
            last = shown.feed(decoder.decode(b"", final=True))
            if (rest := shown.end()) is not None:
                last.append(rest)
            if last:
                self._take(name, last)

    def _take(self, name: str, lines: list[str]) -> None:
        with self._lock:
            for shown in lines:
                text = escape(shown)
                self._queue.append((name, text))
                self._tail.append(text)
            over = len(self._queue) - MAX_QUEUED
            for _ in range(max(0, over)):
                self._queue.popleft()
                self._dropped += 1

    def _batches(self) -> list[tuple[str, list[str], int]]:
        with self._lock:
            items, self._queue = list(self._queue), deque()
            dropped, self._dropped = self._dropped, 0
        batches: list[tuple[str, list[str], int]] = []
        for name, text in items:
            if batches and batches[-1][0] == name and len(batches[-1][1]) < m.MAX_LOG_LINES:
                batches[-1][1].append(text)
            else:
                batches.append((name, [text], 0))
        if dropped:
            if batches:
                batches[0] = (batches[0][0], batches[0][1], dropped)
            else:
                with self._lock:
                    self._dropped += dropped
        return batches

    def _forward(self) -> None:
        while True:
            ended = self._stop.wait(self._interval_s)
            for name, lines, dropped in self._batches():
                try:
                    self._send(name, lines, dropped)
                except Exception as e:  # the coordinator is away: these lines are lost, counted
                    log.debug("node output not sent: %s", e)
                    with self._lock:
                        self._dropped += len(lines) + dropped
            if ended:
                return

    def tail(self) -> list[str]:
        """The last :data:`TAIL_LINES` lines of both streams, oldest first (complete after :meth:`close`)."""
        with self._lock:
            return list(self._tail)

    def close(self, timeout_s: float = 5.0) -> None:
        """After the work ended: what it wrote is sent before this returns.

        A process it left behind may hold the pipes still; its output is then read for a
        second and the rest is not sent.
        """
        if self._stop.is_set():
            return
        self._stop.set() if not self._started else None
        if not self._started:
            for r, w in self._pipes.values():
                for fd in (r, w):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            return
        for t in self._readers:
            t.join(1.0)
        self._stop.set()
        self._sender.join(timeout_s)
