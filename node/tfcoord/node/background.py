"""A node that lives in the background of its Spark executor, so its task slot is free again.

TensorFlowOnSpark's users run N executors x 1 core for an N-node cluster. In
InputMode.SPARK the feeding tasks need those same slots, so a node cannot keep its Spark
task for its whole life, as it does in InputMode.TENSORFLOW: TensorFlowOnSpark
(``TFSparkNode.run(background=True)``) starts the node's process in the background of the
executor and returns the task. tfcoord does the same, and keeps what TensorFlowOnSpark
lost by doing so: liveness stays with the coordinator (heartbeats and pushed stops), so a
background node that dies fails the job at once, and its error text still reaches the
driver and the feeding tasks.

How it works: the Spark task forks twice, so the node's supervisor is a process of its
own (not a child the Python worker would have to reap), and blocks on a pipe until the
supervisor says ``running`` (map_fun has started: the task returns), ``stopped`` (the job
ended before it could start) or ``failed`` with the error (the task raises it, so Spark
shows it too). The supervisor then runs the node to its end, exactly as a foreground one.

The supervisor dies with its executor, never outlives it: it stays in the executor's
process group, which PySpark's daemon sends SIGHUP when the executor stops, and it
watches the process that started its Python worker (that daemon, or the executor JVM
without one) through a pidfd, so an executor killed outright takes it along too.
map_fun's process and TensorBoard die with the supervisor (:mod:`tfcoord.node.pdeath`).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import traceback
from collections.abc import Callable

#: What the supervisor writes on the pipe: one line, then (failed) the error text.
RUNNING, STOPPED, FAILED = b"running", b"stopped", b"failed"
#: A failure's text is bounded: it travels in a Spark task error.
MAX_ERROR_BYTES = 64 * 1024


class BackgroundNodeFailed(RuntimeError):
    """The background node failed before its map_fun started; the message is its error."""


def run_in_background(run: Callable[[Callable[[], None]], None]) -> bool:
    """Fork ``run(started)`` off as a background process; return once it calls ``started()``.

    Returns True then, or False when ``run`` returned without starting (the job stopped).

    Raises:
        BackgroundNodeFailed: ``run`` raised before ``started()`` (the message is its
            traceback), or the process died without a word.
    """
    owner = os.getppid()  # PySpark's daemon, or the executor JVM: lives as long as the executor
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked processes
        code = 0
        try:
            os.close(r)
            if os.fork() != 0:
                os._exit(0)  # the intermediate: reaped at once below, so no zombie is left
            code = _supervise(run, w, owner)
        finally:
            os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        head = f.readline().strip()
        rest = f.read(MAX_ERROR_BYTES) if head == FAILED else b""
    if head in (RUNNING, STOPPED):
        return head == RUNNING
    if head == FAILED:
        raise BackgroundNodeFailed(rest.decode("utf-8", "replace"))
    raise BackgroundNodeFailed(
        "the background node process ended before its map_fun started, without "
        "saying why (killed? see the executor's stderr)"
    )


def _supervise(run: Callable[[Callable[[], None]], None], w: int, owner: int) -> int:  # pragma: no cover
    """The background process: detach from the Python worker, run, say how the start went."""
    _detach(w)
    told = threading.Event()

    def say(line: bytes, text: str = "") -> None:
        if told.is_set():
            return
        told.set()
        try:
            os.write(w, line + b"\n" + text.encode("utf-8", "replace")[-MAX_ERROR_BYTES:])
        except OSError:
            pass  # the Spark task is gone (cancelled): nobody to tell
        finally:
            os.close(w)

    # Processes the node forks (map_fun's) must not hold the pipe: the task reads it to its end.
    def close_in_child() -> None:
        if not told.is_set():
            _close(w)

    os.register_at_fork(after_in_child=close_in_child)
    _watch_executor(owner)
    try:
        run(lambda: say(RUNNING))
    except BaseException:
        error = traceback.format_exc()
        say(FAILED, error)
        print(f"tfcoord background node failed:\n{error}", file=sys.stderr, flush=True)
        return 1
    say(STOPPED)
    return 0


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _detach(keep: int) -> None:  # pragma: no cover - runs in the forked process
    """Let go of the Python worker's descriptors (its socket to the executor JVM above all).

    Each is pointed at /dev/null rather than closed: Python objects of the worker still
    own those numbers, and a closed number would be reused by our own sockets and then
    closed under them when such an object is collected.
    """
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        if fd > 2 and fd not in (keep, null):
            try:
                os.dup2(null, fd)
            except OSError:
                pass  # the directory's own descriptor, closed by now
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # PySpark's daemon says "executor stopping" so


def _watch_executor(owner: int) -> None:  # pragma: no cover - runs in the forked process
    """SIGHUP ourselves (as PySpark's daemon would) when the executor's process ``owner`` ends."""
    try:
        fd = os.pidfd_open(owner)
    except (OSError, AttributeError):
        return  # gone already (then SIGHUP came too), or no pidfds here: the daemon's SIGHUP remains

    def wait() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGHUP)

    threading.Thread(target=wait, name="tfcoord-executor-watch", daemon=True).start()
