"""The node entry point for processes launched outside Spark: the local engine, Mesos tasks.

The node is a :class:`~tfcoord.node.supervisor.NodeSupervisor` whose child is a command
(:class:`Command`) or, in server mode, a TensorFlow server (:class:`ServerCommand`).

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
import ssl
import sys
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from tfcoord.client import TfcoordError
from tfcoord.client.auth import TOKEN_ENV
from tfcoord.client.client import DEFAULT_REQUEST_TIMEOUT_S
from tfcoord.client.messages import MAX_ERROR_LEN

from .supervisor import (
    STOP_GRACE_S,
    Child,
    ChildExit,
    GpuRequest,
    Launch,
    NodeSupervisor,
    SupervisorConfig,
    killed_by,
)

if TYPE_CHECKING:
    import subprocess

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
    #: How long one request to the coordinator (not a wait) may take to be answered.
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S


class _Tail:
    """Pass a stream through while keeping its last bytes (the traceback) for the report."""

    def __init__(
        self, src: IO[bytes], dst: IO[bytes], limit: int = MAX_ERROR_LEN, close_dst: bool = False
    ) -> None:
        self._close_dst = close_dst
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._limit = limit
        self._thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
        self._thread.start()

    def _pump(self, src: IO[bytes], dst: IO[bytes]) -> None:
        for line in iter(src.readline, b""):
            try:
                dst.write(line)
                dst.flush()
            except OSError:
                pass
            self._chunks.append(line)
            self._size += len(line)
            while self._size > self._limit and len(self._chunks) > 1:
                self._size -= len(self._chunks.popleft())
        if self._close_dst:  # the node's output log sees the end of the stream
            dst.close()

    def text(self) -> str:
        self._thread.join(timeout=5)
        return b"".join(self._chunks).decode("utf-8", "replace")


def _tail(stderr: IO[bytes] | None, launch: Launch) -> _Tail:
    """The command's stderr: kept for its error text, and passed on to the node's output log."""
    assert stderr is not None  # the command was started with stderr=PIPE
    if launch.stderr_fd < 0:
        return _Tail(stderr, sys.stderr.buffer)
    return _Tail(stderr, os.fdopen(os.dup(launch.stderr_fd), "wb"), close_dst=True)


class Command(Child):
    """A command as the node's child: its stderr passes through, its tail is the error text."""

    def __init__(self, command: tuple[str, ...], extra_env: Mapping[str, str] | None = None) -> None:
        self.command = command
        self.extra_env = dict(extra_env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._tail: _Tail | None = None

    def _env(self, launch: Launch) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        # A Python command that crashes in native code prints its stack to the stderr whose
        # tail the node's failure carries (unless the user chose otherwise).
        env.setdefault("PYTHONFAULTHANDLER", "1")
        env.update(self.extra_env)
        env.update(launch.env)  # CUDA_VISIBLE_DEVICES always set: a node never grabs every GPU by accident
        return env

    def launch(self, launch: Launch) -> int:
        import subprocess

        # pdeath (ctypes) and subprocess load once the cluster is known, not before the node
        # registers: a Mesos task's registration waits on every import before it.
        from . import pdeath

        launch.port.release()  # the command's TensorFlow server binds it next
        # Killed with this node (a SIGKILLed Mesos executor, an interrupted local engine):
        # the command never outlives the node that reports on it.
        self._proc = pdeath.popen(
            self.command,
            env=self._env(launch),
            stdout=launch.stdout_fd if launch.stdout_fd >= 0 else None,
            stderr=subprocess.PIPE,
            pass_fds=launch.pass_fds,
        )
        self._tail = _tail(self._proc.stderr, launch)
        return self._proc.pid

    def wait(self) -> ChildExit:
        assert self._proc is not None and self._tail is not None
        rc = self._proc.wait()
        err = self._tail.text()
        if self._proc.stderr is not None:
            self._proc.stderr.close()
        if rc == 0:
            return ChildExit()
        why = f"was {killed_by(-rc)}" if rc < 0 else f"ended with exit code {rc}"
        return ChildExit(f"command {self.command[0]} {why}\n{err}", rc)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def signal(self, sig: int) -> None:
        if self._proc is None:
            return
        try:
            self._proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def renew(self) -> bool:
        """A command runs again for each generation of its cluster (it reads TFCOORD_RESTARTS
        or its checkpoint to resume)."""
        self._proc, self._tail = None, None
        return True

    def soft_stop(self, reason: str) -> bool:
        if self.alive():
            print(
                f"tfcoord: stopping: {reason.splitlines()[0] if reason else 'stop requested'}",
                file=sys.stderr,
                flush=True,
            )
        return False


class ServerCommand(Command):
    """Server mode's child: :mod:`tfcoord.node.tfserver`, RUNNING once its server listens."""

    def __init__(self, extra_env: Mapping[str, str] | None = None) -> None:
        super().__init__(server_command(), extra_env)
        self._ready_fd: int | None = None

    def launch(self, launch: Launch) -> int:
        import subprocess

        from . import pdeath  # once the cluster is known (see Command.launch)

        launch.port.release()
        env = self._env(launch)
        # The server says on this pipe when it listens: "running" then means servable.
        ready_r, ready_w = os.pipe()
        env[READY_FD_ENV] = str(ready_w)
        try:
            self._proc = pdeath.popen(
                self.command,
                env=env,
                stdout=launch.stdout_fd if launch.stdout_fd >= 0 else None,
                stderr=subprocess.PIPE,
                pass_fds=(ready_w, *launch.pass_fds),
            )
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        self._ready_fd = ready_r
        self._tail = _tail(self._proc.stderr, launch)
        return self._proc.pid

    def ready(self) -> bool:
        assert self._ready_fd is not None
        fd, self._ready_fd = self._ready_fd, None
        return _serving(fd)


def run_node(cfg: NodeConfig) -> int:
    """Run one node to its end; returns the process exit code."""
    child = ServerCommand(cfg.extra_env) if cfg.server_mode else Command(cfg.command, cfg.extra_env)
    sup = NodeSupervisor(
        SupervisorConfig(
            address=cfg.address,
            token=cfg.token,
            job=cfg.job,
            executor_id=cfg.executor_id,
            attempt=cfg.attempt,
            task_id=cfg.task_id,
            host=cfg.host,
            port=cfg.port,
            # An explicit port (TENSORFLOW_PORT) is one a scheduler granted this node: a Mesos offer's.
            port_granted=cfg.port != 0,
            # GPUs granted to this task (a Mesos offer) are used whole; otherwise the CPU.
            gpus=GpuRequest(mesos_gpus=cfg.gpus),
            heartbeat_interval_s=cfg.heartbeat_interval_s,
            wait_timeout_s=cfg.wait_timeout_s,
            stop_grace_s=STOP_GRACE_S,
            ssl_context=cfg.ssl_context,
            request_timeout_s=cfg.request_timeout_s,
        ),
        child,
    )
    try:
        return sup.run().exit_code
    except TfcoordError as e:
        print(f"tfcoord node: {e}", file=sys.stderr, flush=True)
        return 2


def server_command() -> tuple[str, ...]:
    """The command of a node in server mode (see :mod:`tfcoord.node.tfserver`)."""
    return (sys.executable, "-m", "tfcoord.node.tfserver")


def _serving(ready_fd: int) -> bool:
    """Block until the server child reports that it listens (True) or exits first (False)."""
    with os.fdopen(ready_fd, "rb") as ready:
        return ready.readline().strip() == READY_LINE.strip()
