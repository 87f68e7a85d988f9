"""The nodes' own output on the driver's stderr while a Spark job runs.

Under the local engine a node is a child of ``tfcoord submit``, whose output it prints with
the node's name in front (:mod:`.local`). On Spark a node runs in an executor, whose stdout
and stderr end in that executor's log files on another machine: the user at the driver saw
nothing of ``map_fun``'s prints or tracebacks. Every node's supervisor already ships its
lines to the coordinator (``node_logs``); the driver follows that stream the way
``tfcoord logs --follow`` does (``get_logs`` from the next line on, every
:data:`POLL_S`) and prints each line as ``[worker:0] text``, as the local engine does.

Not when the driver is quiet (``run(quiet=True)``, ``spark.tfcoord.quiet``,
``TFCOORD_QUIET``, see :mod:`.console`), and not where the executors' output already reaches
this stderr (:func:`executors_print_here`). A node's lines arrive at the coordinator within a
fraction of a second of being written, so they reach the driver at most about a second after.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from tfcoord.client import DriverClient
from tfcoord.client.errors import TfcoordError
from tfcoord.client.messages import MAX_LOGS_REPLY
from tfcoord.client.terminal import printable

from .capacity import executor_in_driver_jvm

log = logging.getLogger("tfcoord.spark")

#: How often the coordinator is asked for new lines (``tfcoord logs --follow``'s pace).
POLL_S = 0.5
#: How long :meth:`NodeOutput.stop` waits for the last read (a coordinator that stopped
#: answering must not hold the driver's exit).
STOP_WAIT_S = 30.0


def executors_print_here(master: str) -> bool:
    """Whether the executors' own output already reaches this process's stderr, so that
    following it from the coordinator would print every line twice.

    On ``local`` and ``local[N]`` the executor is this JVM, which starts the Python workers
    with their output on its own stderr: the driver's fd 2. When ``sys.stderr`` is that fd
    (a terminal, a pipe, a file), the nodes' prints are already there. A notebook replaces
    ``sys.stderr`` with its cell's stream, which the JVM does not write to, so there the
    nodes' output is still followed. ``local-cluster[...]`` executors are JVMs of their own
    writing to their work directories, as on any cluster.
    """
    if not executor_in_driver_jvm(master):
        return False
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a stream with no descriptor: a notebook's
        return False


def _stderr(line: str) -> None:
    # The current sys.stderr at each line: a notebook replaces it per cell.
    print(line, file=sys.stderr, flush=True)


class NodeOutput:
    """Prints a job's node output as it comes, from :meth:`start` until :meth:`stop`."""

    def __init__(self, driver: DriverClient, job: str, write: Callable[[str], None] = _stderr) -> None:
        self.driver = driver
        self.job = job
        self.write = write
        #: The number of the next line to ask for.
        self.since = 0
        self._warned: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfcoord-node-output", daemon=True)

    def start(self) -> NodeOutput:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                while self._fetch():
                    pass  # a full reply: more lines wait
            except TfcoordError as e:
                if stopping:
                    return
                # The client reconnects by itself; the lines stay at the coordinator.
                log.debug("job %s: reading its nodes' output failed: %s", self.job, e)
            if stopping:
                return  # one last read after stop(): the lines of the job's end
            self._stop.wait(POLL_S)

    def _fetch(self) -> bool:
        """Print the lines from ``since`` on; True when the reply was full (more wait)."""
        got = self.driver.logs(self.job, since=self.since)
        names = {n["executor_id"]: f"{n['role']}:{n['index']}" for n in got["nodes"]}
        for n in got["nodes"]:
            if n["dropped"] and n["executor_id"] not in self._warned:
                self._warned.add(n["executor_id"])
                self._line(
                    names[n["executor_id"]], f"({n['dropped']} earlier lines dropped by the coordinator)"
                )
        lines: list[Any] = got["lines"]
        for _, _, eid, _, text in lines:
            self._line(names.get(eid, str(eid)), text)
        more = got["next"] > self.since and len(lines) >= MAX_LOGS_REPLY
        self.since = got["next"]
        return more

    def _line(self, node: str, text: str) -> None:
        # Escaped (a node's line cannot drive the terminal or forge another); tabs are the program's.
        self.write(f"[{printable(node)}] {printable(text, keep=chr(9))}")

    def stop(self) -> None:
        """Print what the nodes wrote up to now, then end (before the driver's client closes)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)
