"""A subprocess's output read as it comes, so a test waits on the line it needs, never a sleep."""

from __future__ import annotations

import re
import signal
import threading
import time
from typing import IO


def as_from_a_terminal() -> None:
    """``preexec_fn`` of a process a test interrupts as Ctrl-C does: SIGINT back to its default.

    A shell that starts a job in the background without job control (``make test &`` in a
    script, some CI runners) starts it with SIGINT ignored, every child inherits that, and
    Python then installs no KeyboardInterrupt handler: the test's SIGINT would do nothing.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Lines:
    """A process's stream read line by line in a thread, so a test waits on the line it needs
    (an event) rather than a sleep, and reads the rest once the process ended."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._stream = stream
        self._changed = threading.Condition()
        self._eof = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with self._stream:
            for line in self._stream:
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout_s: float = 120.0) -> str:
        """The first line matching the regular expression ``pattern``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                found = next((ln for ln in self.lines if re.search(pattern, ln)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    raise AssertionError(f"no line matching {pattern!r}:\n{''.join(self.lines)[-3000:]}")
                self._changed.wait(left)

    def text(self) -> str:
        """Everything, once the stream ended (the process exited)."""
        self._thread.join(timeout=60)
        return "".join(self.lines)
