"""TensorBoard beside a node: started with the cluster, advertised, stopped with the node.

TensorBoard binds ``TENSORBOARD_PORT`` when set, else a port of its own choosing
(``--port 0``); either way its URL is read from the line it prints once serving,
so there is no reserve-then-close race and the URL always answers.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from . import pdeath

_URL = re.compile(r"TensorBoard \S+ at (http://\S+?:(\d+))/")
#: TensorBoard imports TensorFlow (~6 s) before it serves; a minute is ample.
START_TIMEOUT_S = 60.0


class TensorBoard:
    """A TensorBoard process serving ``logdir``.

    Args:
        host: the address to advertise (TensorBoard binds every interface).
        on_url: called once, from a background thread, with the URL when it answers.
    """

    def __init__(
        self, logdir: str, host: str, port: int = 0, on_url: Callable[[str], object] | None = None
    ) -> None:
        self.logdir = logdir
        self.url: str | None = None
        self._ready = threading.Event()
        self._on_url = on_url
        self._host = host
        # Dies with the thread that starts it (the node's), also when that is SIGKILLed.
        self.proc = pdeath.popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port), "--bind_all"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.url is None and (found := _URL.search(line)):
                self.url = f"http://{self._host}:{found.group(2)}"
                self._ready.set()
                if self._on_url is not None:
                    self._on_url(self.url)
        self._ready.set()

    def wait_url(self, timeout_s: float = START_TIMEOUT_S) -> str | None:
        self._ready.wait(timeout_s)
        return self.url

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
