"""The node entry point for processes launched outside Spark: the local engine, Mesos tasks.

``python -m tfcoord.node --address A --job J --executor-id I -- COMMAND...``
reserves a port (``TENSORFLOW_PORT`` or a free one), registers with the
coordinator, blocks for the cluster, then runs COMMAND with ``TF_CONFIG`` set,
heartbeating meanwhile. When the coordinator says stop (the job failed elsewhere,
a stop was requested, or the job succeeded and this is a ps), the command is
terminated. The outcome is reported, with the tail of the command's stderr as the
error text, and becomes this process's exit code.

With ``--server-mode`` the command is :mod:`tfcoord.node.tfserver`, a
``tf.distribute.Server`` for the node's role that serves until the node is told to stop
(tfmesos2's model); the node reports RUNNING once that server listens.

The job token comes from the environment (``TFCOORD_TOKEN``, hex), never from the
command line, so it does not show in process listings; the command does not see it.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field

from tfcoord.client import NodeClient, TfcoordError
from tfcoord.client.messages import MAX_ERROR_LEN

from . import pdeath
from .gpus import select_gpus
from .ports import PortReservation

#: A command told to stop gets this long to exit after SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0
TOKEN_ENV = "TFCOORD_TOKEN"
#: Server mode: the file descriptor on which the server child writes READY_LINE once it listens.
READY_FD_ENV = "TFCOORD_READY_FD"
READY_LINE = b"serving\n"


@dataclass(frozen=True)
class NodeConfig:
    address: str
    token: bytes
    job: str
    executor_id: int
    command: tuple[str, ...]
    attempt: int = 0
    task_id: str = ""
    #: Address other nodes dial; default: the local address of our connection to the coordinator.
    host: str | None = None
    port: int = 0
    wait_timeout_s: float = 24 * 3600.0
    heartbeat_interval_s: float = 2.0
    gpus: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    #: Instead of a command, serve the node's role with a ``tf.distribute.Server`` until told
    #: to stop (tfmesos2's model: a client outside the cluster drives it).
    server_mode: bool = False
    #: TLS toward a coordinator that serves it (``tfcoord.client.tls.client_context``).
    ssl_context: ssl.SSLContext | None = None


class _Tail:
    """Pass a stream through while keeping its last bytes (the traceback) for the report."""

    def __init__(self, src, dst, limit: int = MAX_ERROR_LEN) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._limit = limit
        self._thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
        self._thread.start()

    def _pump(self, src, dst) -> None:
        for line in iter(src.readline, b""):
            dst.write(line)
            dst.flush()
            self._chunks.append(line)
            self._size += len(line)
            while self._size > self._limit and len(self._chunks) > 1:
                self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        self._thread.join(timeout=5)
        return b"".join(self._chunks).decode("utf-8", "replace")


def run_node(cfg: NodeConfig) -> int:
    """Run one node to its end; returns the process exit code."""
    # An explicit port (TENSORFLOW_PORT) is one a scheduler granted this node: a Mesos offer's.
    ports = PortReservation(cfg.port, granted=cfg.port != 0)
    # GPUs granted to this task (a Mesos offer) are used whole; otherwise the CPU.
    gpus = select_gpus(0, mesos_gpus=list(cfg.gpus) or None)
    client = NodeClient(
        cfg.address, cfg.token, cfg.job, cfg.executor_id, cfg.attempt, ssl_context=cfg.ssl_context
    ).connect()
    child: subprocess.Popen | None = None
    lock = threading.Lock()
    stopping = threading.Event()

    def on_stop(reason: str) -> None:
        stopping.set()
        with lock:
            if child is not None and child.poll() is None:
                print(f"tfcoord: stopping: {reason.splitlines()[0] if reason else 'stop requested'}",
                      file=sys.stderr, flush=True)  # fmt: skip
                _terminate(child)

    try:
        host = cfg.host or client.local_host()
        client.register(host, ports.port, gpus=gpus.uuids, task_id=cfg.task_id, meta={"pid": os.getpid()})
        client.start_heartbeats(cfg.heartbeat_interval_s, on_stop=on_stop)
        info = client.await_cluster(cfg.wait_timeout_s)
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        env.update(cfg.extra_env)
        env["TF_CONFIG"] = info.tf_config_json()
        env.update(gpus.env())  # always set: a node never grabs every GPU by accident
        env["TFCOORD_JOB"], env["TFCOORD_ROLE"], env["TFCOORD_TASK_INDEX"] = (
            cfg.job,
            info.role,
            str(info.index),
        )
        ports.release()  # the command's TensorFlow server binds it next
        with lock:
            if stopping.is_set():
                client.report("stopped")
                return 0
            if cfg.server_mode:
                # The server says on this pipe when it listens: "running" then means servable.
                ready_r, ready_w = os.pipe()
                env[READY_FD_ENV] = str(ready_w)
                try:
                    child = pdeath.popen(cfg.command, env=env, stderr=subprocess.PIPE, pass_fds=(ready_w,))
                finally:
                    os.close(ready_w)
            else:
                # Killed with this runner (a SIGKILLed Mesos executor, an interrupted local
                # engine): the command never outlives the node that reports on it.
                child = pdeath.popen(cfg.command, env=env, stderr=subprocess.PIPE)
        tail = _Tail(child.stderr, sys.stderr.buffer)
        if not cfg.server_mode or _serving(ready_r):
            client.report("running", meta={"child_pid": child.pid})
        rc = child.wait()
        err = tail.text()
        if stopping.is_set():
            client.report("stopped")
            return 0
        if rc == 0:
            client.report("succeeded")
            return 0
        why = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
        client.report("failed", error=f"command {cfg.command[0]} ended with {why}\n{err}")
        return rc if rc > 0 else 1
    except TfcoordError as e:
        if child is not None and child.poll() is None:
            _terminate(child)
        print(f"tfcoord node: {e}", file=sys.stderr, flush=True)
        return 2
    except BaseException as e:
        if child is not None and child.poll() is None:
            _terminate(child)
        try:
            client.report("failed", error=f"tfcoord node runner: {type(e).__name__}: {e}")
        except Exception:
            pass
        raise
    finally:
        ports.release()
        client.close()


def server_command() -> tuple[str, ...]:
    """The command of a node in server mode (see :mod:`tfcoord.node.tfserver`)."""
    return (sys.executable, "-m", "tfcoord.node.tfserver")


def _serving(ready_fd: int) -> bool:
    """Block until the server child reports that it listens (True) or exits first (False)."""
    with os.fdopen(ready_fd, "rb") as ready:
        return ready.readline().strip() == READY_LINE.strip()


def _terminate(child: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after the grace period, without blocking the caller."""
    try:
        child.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        return

    def reap() -> None:
        try:
            child.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()

    threading.Thread(target=reap, daemon=True).start()
