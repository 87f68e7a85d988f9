"""The nodes' own output on the Spark driver's stderr while the job runs (issue 27 item 2).

On the real standalone cluster: two nodes print on stdout and stderr, then wait on a gate
the test holds. Their lines reach the driver's stderr, prefixed ``[worker:I]`` as under the
local engine, while they still wait (the job RUNNING); the line each prints once released
is there when ``shutdown()`` returns. With ``quiet=True`` none is printed.
"""

from __future__ import annotations

import io
import socket
import sys
import threading

import pytest

from tfcoord.client.vocab import JobState
from tfcoord.driver import spark as tfs

from . import mapfuns
from .mapfuns import args_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class _Stderr(io.TextIOBase):
    """The driver's stderr for the test: keeps what is written, and sets ``seen`` once every
    ``wanted`` line is among it."""

    def __init__(self, *wanted: str) -> None:
        self.lines: list[str] = []
        self.wanted = set(wanted)
        self.seen = threading.Event()
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        with self._lock:
            self.lines += s.splitlines()
            if self.wanted <= set(self.lines):
                self.seen.set()
        return len(s)

    def writable(self) -> bool:
        return True


def _gate() -> socket.socket:
    gate = socket.socket()
    gate.bind(("127.0.0.1", 0))
    gate.listen(8)  # never accepted: closing it resets the nodes' connections
    return gate


def test_spark_nodes_output_reaches_the_driver_stderr_while_they_run(sc, tmp_path, monkeypatch):
    monkeypatch.delenv("TFCOORD_QUIET", raising=False)
    wanted = [f"[worker:{i}] line {j} of worker:{i}" for i in (0, 1) for j in range(3)]
    wanted += [f"[worker:{i}] a warning from worker:{i}" for i in (0, 1)]
    err = _Stderr(*wanted)
    monkeypatch.setattr(sys, "stderr", err)
    gate = _gate()
    try:
        cluster = tfs.run(
            sc, mapfuns.print_then_wait_for_gate, args_for(tmp_path, gate=gate.getsockname()[1]), 2, 0
        )
        assert err.seen.wait(60), err.lines
        # Shown while the nodes still wait on the gate: streamed, not printed at the end.
        assert cluster.driver.status(cluster.job).state == JobState.RUNNING
    finally:
        gate.close()
    status = cluster.shutdown()
    assert status["state"] == "SUCCEEDED"
    for i in (0, 1):
        assert f"[worker:{i}] released worker:{i}" in err.lines  # the last lines, before shutdown returns


def test_a_quiet_spark_driver_prints_no_node_output(sc, tmp_path, monkeypatch):
    err = _Stderr()
    monkeypatch.setattr(sys, "stderr", err)
    # No gate: the nodes print and end at once.
    cluster = tfs.run(sc, mapfuns.print_then_wait_for_gate, args_for(tmp_path, gate=None), 2, 0, quiet=True)
    assert cluster.shutdown()["state"] == "SUCCEEDED"
    assert not [line for line in err.lines if line.startswith("[worker:")], err.lines
