"""One node's life, whatever runs its work: the node supervisor every engine uses.

A node — a Spark task, a Mesos task, a process of the local engine — is a supervisor and
one child. The supervisor does the part that is the same everywhere, written once here:

1. reserve the TensorFlow port (keeping the socket bound, see :mod:`.ports`) and pick GPUs;
2. connect to the coordinator, let the child prepare (open a feed port, start TensorBoard),
   register, and heartbeat from then on;
3. block until the cluster is complete, then start the child under a lock — unless the
   coordinator said stop meanwhile — with ``TF_CONFIG`` and ``CUDA_VISIBLE_DEVICES`` set;
4. report RUNNING once the child can do its work, then its end: SUCCEEDED, FAILED (with the
   child's error text) or STOPPED when the coordinator (or :meth:`NodeSupervisor.stop`) asked;
5. stop the child when told to: first the child's own soft stop (a fed node finishes its
   queue), then SIGTERM, then SIGKILL after a grace period; release port, GPUs and connection.

What runs is a :class:`Child`: a forked ``map_fun`` (:class:`tfcoord.node.executor.ForkedFunction`),
a command (:class:`tfcoord.node.runner.Command`) or a ``tf.distribute.Server``
(:class:`tfcoord.node.runner.ServerCommand`). The supervisor works in a thread of its own,
so a node can outlive the call that started it: :meth:`NodeSupervisor.start` returns once
the node is registered, :meth:`~NodeSupervisor.wait` returns how it ended. That thread also
forks the child and waits for it, which the parent-death signal needs (see :mod:`.pdeath`):
a child dies with the thread that started it.
"""

from __future__ import annotations

import logging
import os
import signal
import ssl
import threading
import traceback
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfcoord.client import ClusterRestarted, NodeClient, RequestRejected, TfcoordError
from tfcoord.client import messages as m
from tfcoord.client.client import DEFAULT_REQUEST_TIMEOUT_S, ClusterInfo
from tfcoord.client.vocab import NodeState

from .gpus import CPU, GpuSelection, select_gpus
from .ports import PortReservation

if TYPE_CHECKING:
    from .outputlog import OutputLog
    from .reporting import ReportPipe

log = logging.getLogger("tfcoord.node")

#: A child told to stop gets this long after SIGTERM before SIGKILL: enough for TensorFlow
#: to close its sessions, short enough that a stopped job frees its executors at once.
STOP_GRACE_S = 5.0

#: The child's environment names its cluster's generation here: how many times the job has
#: restarted its cluster so far (0 the first time), so the work knows to resume.
RESTARTS_ENV = "TFCOORD_RESTARTS"

#: How a node ends, as it reports it.
SUCCEEDED, FAILED, STOPPED = NodeState.SUCCEEDED, NodeState.FAILED, NodeState.STOPPED

Meta = dict[str, str | int | float]


#: What a signal that ends a child most likely means, for the node's error line.
_SIGNAL_HINTS = {
    signal.SIGKILL: "the kernel's out-of-memory killer, or a kill -9",
    signal.SIGSEGV: "a crash in native code such as TensorFlow's; its Python stack is in the output",
    signal.SIGBUS: "a crash in native code, or a memory-mapped file that shrank",
    signal.SIGABRT: "native code aborted, such as a failed check in TensorFlow",
    signal.SIGILL: "native code built for another CPU, with an instruction this one lacks",
    signal.SIGTERM: "something outside tfcoord stopped it",
}


def killed_by(signum: int) -> str:
    """``killed by signal 11 (SIGSEGV: a crash in native code ...)``: a child's end by a signal."""
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"killed by signal {signum}"
    hint = _SIGNAL_HINTS.get(sig)
    named = f"{sig.name}: {hint}" if hint else sig.name
    return f"killed by signal {signum} ({named})"


@dataclass(frozen=True)
class ChildExit:
    """How a child ended.

    Attributes:
        error: empty when it did its work; else what the node reports (a traceback, the tail
            of a command's stderr).
        exit_code: the process's exit status (negative: killed by that signal).
        meta: shown in the node's status on success (a map_fun's returned scalars).
    """

    error: str = ""
    exit_code: int = 0
    meta: Meta = field(default_factory=dict)


@dataclass(frozen=True)
class Launch:
    """What a child gets when the cluster is complete."""

    info: ClusterInfo
    #: ``TF_CONFIG``, ``CUDA_VISIBLE_DEVICES``, ``TFCOORD_JOB``, ``TFCOORD_ROLE``, ``TFCOORD_TASK_INDEX``.
    env: dict[str, str]
    #: Still held: the child releases it when its TensorFlow is about to bind it.
    port: PortReservation
    #: ``role:index (executor N, host H)``, for messages.
    node: str
    #: Descriptors the process must inherit (a command: ``Popen(pass_fds=...)``): the write
    #: end of the progress pipe, named in ``env`` as ``TFCOORD_REPORT_FD``.
    pass_fds: tuple[int, ...] = ()
    #: Where the process writes its stdout and stderr (pipes to :mod:`.outputlog`, which
    #: passes the output on and sends it to the coordinator); -1: leave them as they are.
    stdout_fd: int = -1
    stderr_fd: int = -1


class Child(ABC):
    """The work a supervisor runs: one process, started once the cluster is known.

    Only the supervisor's thread calls :meth:`launch`, :meth:`wait` and :meth:`close`;
    :meth:`soft_stop`, :meth:`alive` and :meth:`signal` may come from the stop watcher.
    """

    def prepare(self, host: str, client: NodeClient) -> Meta:
        """Before registering: set up what others must find (a feed port); returns node metadata."""
        return {}

    def before_launch(self, info: ClusterInfo) -> None:  # noqa: B027 - an optional hook
        """After the cluster is known, before the launch lock: wait for helpers (TensorBoard)."""

    @abstractmethod
    def launch(self, launch: Launch) -> int:
        """Start the process; returns its pid. Called under the supervisor's lock."""

    def ready(self) -> bool:
        """Block until the child can do its work (True) or ended before it could (False)."""
        return True

    @abstractmethod
    def wait(self) -> ChildExit:
        """Block until the process ends; reap it."""

    @abstractmethod
    def alive(self) -> bool:
        """Whether the process was started and has not ended."""

    @abstractmethod
    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process if it still runs."""

    def soft_stop(self, reason: str) -> bool:
        """Ask the child to finish on its own before SIGTERM; True if it ended meanwhile."""
        return False

    def lingers(self) -> bool:
        """After a successful end: must the node stay up until the job ends (it still serves)?"""
        return False

    def renew(self) -> bool:
        """After the process ended, ready the child to be launched again (the job restarted its
        cluster); False if this child can run only once."""
        return False

    def close(self) -> None:  # noqa: B027 - an optional hook
        """After the process ended (or never started): stop helpers, close what prepare opened."""


@dataclass(frozen=True)
class GpuRequest:
    """Which GPUs a node asks for (see :func:`tfcoord.node.gpus.select_gpus`)."""

    count: int = 0
    #: Fail the node when fewer than ``count`` GPUs are free (``tf_args.num_gpus`` given).
    require: bool = False
    #: ``TaskContext.resources()`` of the Spark task; its GPU addresses win.
    spark_resources: Any = None
    #: GPU ids a Mesos offer granted.
    mesos_gpus: tuple[str, ...] = ()
    #: Host-local claims, so two nodes starting together do not pick the same free GPU.
    lock_dir: str | None = None
    holder_name: str = ""

    def select(self) -> GpuSelection:
        return select_gpus(
            self.count,
            spark_resources=self.spark_resources,
            mesos_gpus=list(self.mesos_gpus) or None,
            require=self.require,
            lock_dir=self.lock_dir,
            holder_name=self.holder_name,
        )


@dataclass(frozen=True)
class SupervisorConfig:
    """One node: which job and slot, and how to reach the coordinator."""

    address: str
    token: bytes
    job: str
    executor_id: int
    attempt: int = 0
    #: Who started the node (a Spark task, a Mesos task id), for the coordinator's messages.
    task_id: str = ""
    #: The address other nodes dial; default: the local address of our coordinator connection.
    host: str | None = None
    #: The TensorFlow port; 0 picks a free one.
    port: int = 0
    #: The port was granted to this node alone (a Mesos offer's): see PortReservation.
    port_granted: bool = False
    gpus: GpuRequest = GpuRequest()
    heartbeat_interval_s: float = 2.0
    #: How long to wait for the rest of the cluster to register.
    wait_timeout_s: float = 600.0
    #: Roles that serve the others (a ps, an evaluator): when their child returns they stay
    #: up, reported SUCCEEDED, until the job tells them to stop.
    linger_roles: tuple[str, ...] = ()
    stop_grace_s: float = STOP_GRACE_S
    ssl_context: ssl.SSLContext | None = None
    #: The work's progress reports (``ctx.report``) reach the coordinator at most this often.
    report_interval_s: float = 1.0
    #: How long one request to the coordinator (not a wait) may take to be answered.
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S


@dataclass(frozen=True)
class NodeOutcome:
    """How a supervised node ended, as it reported it."""

    state: NodeState  #: SUCCEEDED, FAILED or STOPPED
    role: str
    index: int
    error: str = ""
    #: What a process running this node should exit with: 0 unless the child failed.
    exit_code: int = 0


class NodeSupervisor:
    """Run one node with ``child`` as its work; see the module's docstring.

    ``NodeSupervisor(cfg, child).run()`` blocks until the node ends. ``start()`` returns once
    the node is registered and heartbeating; ``wait()`` then returns its outcome, and
    ``stop()`` ends it early.
    """

    def __init__(self, config: SupervisorConfig, child: Child) -> None:
        self.config = config
        self.child = child
        self.role = ""
        self.index = -1
        #: ``role:index (executor N, host H)`` once registered.
        self.node = f"executor {config.executor_id}"
        self.client: NodeClient | None = None
        self._lock = threading.Lock()  # orders "launch unless stopping" against "stop what runs"
        self._launched = False
        #: One more for each generation of the cluster this node rejoins: a stop or a reaper of
        #: an earlier generation never reaches the child of a later one.
        self._epoch = 0
        self._stop = threading.Event()  # told to stop, by the coordinator or by stop()
        self._local_reason = ""  # stop()'s reason: the coordinator did not ask, so say why
        self._local_stop = threading.Event()  # stop() was called (not the coordinator's stop)
        self._may_restart = False  # the job may still restart its cluster (registration says)
        self._port: PortReservation | None = None
        self._child_ended = threading.Event()
        self._registered = threading.Event()  # set also when the node ended before registering
        self._was_registered = False
        self._running = threading.Event()
        self._settled = threading.Event()  # the child runs, or the node ended
        self._done = threading.Event()
        self._outcome: NodeOutcome | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- the handle ---------------------------------------------------------------------

    def start(self) -> NodeSupervisor:
        """Start the node in a thread of its own; return once it is registered.

        Raises what stopped it from registering (the coordinator unreachable or refusing,
        the port taken, GPUs unavailable).
        """
        if self._thread is not None:
            raise RuntimeError("a NodeSupervisor runs once")
        self._thread = threading.Thread(
            target=self._main, name=f"tfcoord-node-{self.config.job}-{self.config.executor_id}", daemon=True
        )
        self._thread.start()
        self._registered.wait()
        if not self._was_registered and self._error is not None:
            raise self._error
        return self

    def run(self) -> NodeOutcome:
        """Start the node and block until it ends (``start().wait()``).

        Interrupted (Ctrl-C in the local engine), it stops the node first, so its child
        does not run on unsupervised.
        """
        self.start()
        try:
            return self.wait()
        except KeyboardInterrupt:
            self.stop("the node was interrupted")
            self._done.wait(self.config.stop_grace_s + 5.0)
            raise

    def wait(self, timeout_s: float | None = None) -> NodeOutcome:
        """Block until the node ended; returns its outcome.

        Raises:
            TimeoutError: still running after ``timeout_s``.
            TfcoordError: the coordinator refused or lost the node (the node could not report).
            BaseException: whatever broke the supervisor itself (reported as the node's error).
        """
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"{self.node} of job {self.config.job} still runs after {timeout_s:g} s")
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome

    def wait_running(self, timeout_s: float | None = None) -> bool:
        """Block until the child runs (True), or the node ended first or the timeout passed (False)."""
        self._settled.wait(timeout_s)
        return self._running.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def stop(self, reason: str = "stopped by its supervisor") -> None:
        """End the node early, as a stop from the coordinator would; it reports STOPPED.

        Unless the coordinator had asked this node to stop, its job then fails: a cluster
        cannot lose a node; ``reason`` becomes the job's error.

        Returns at once; :meth:`wait` says when it has ended. A node still waiting for its
        cluster stops when the cluster forms (it reports STOPPED instead of launching) or
        when the job ends, whichever comes first.
        """
        self._local_reason = self._local_reason or reason
        self._local_stop.set()
        self._on_stop(reason)

    # -- the node's life ----------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._outcome = self._supervise()
        except BaseException as e:
            self._error = e
        finally:
            self._registered.set()
            self._settled.set()
            self._done.set()

    def _supervise(self) -> NodeOutcome:
        cfg = self.config
        port = self._port = PortReservation(cfg.port, granted=cfg.port_granted)
        # Claimed for the node's whole life (and its child's, which inherits the claim):
        # another node starting on this host meanwhile skips our GPUs.
        gpus = CPU
        try:
            gpus = cfg.gpus.select()
            client = NodeClient(
                cfg.address,
                cfg.token,
                cfg.job,
                cfg.executor_id,
                cfg.attempt,
                ssl_context=cfg.ssl_context,
                request_timeout_s=cfg.request_timeout_s,
            ).connect()
        except BaseException:
            gpus.release()
            port.release()
            raise
        self.client = client
        try:
            return self._run(client, port, gpus)
        except TfcoordError:
            raise  # the coordinator refused or lost us: it knows, or will once heartbeats stop
        except BaseException:
            # A bug here or in the child's set-up: let the job know why.
            try:
                client.report(FAILED, error="tfcoord node supervisor:\n" + traceback.format_exc())
            except Exception:
                pass
            raise
        finally:
            self._stop_child()
            self.child.close()
            (self._port or port).release()
            gpus.release()
            client.close()

    def _run(self, client: NodeClient, port: PortReservation, gpus: GpuSelection) -> NodeOutcome:
        """Register, run the child once the cluster formed, report how it ended; again for
        each new generation when the job restarts its cluster (a peer was lost)."""
        cfg = self.config
        host = cfg.host or client.local_host()
        meta: Meta = {"pid": os.getpid(), "gpu_source": gpus.source}
        meta.update(self.child.prepare(host, client))
        while True:
            try:
                reg = client.register(host, port.port, gpus=gpus.uuids, task_id=cfg.task_id, meta=meta)
            except ClusterRestarted:
                # The job restarted its cluster again while this node waited out its backoff:
                # it rejoins the newer generation (or stops, if the job is ending).
                outcome = NodeOutcome(STOPPED, self.role, self.index, client.stop_reason)
            else:
                self.role, self.index = reg.role, reg.index
                self._may_restart = reg.restarts < reg.max_restarts
                self.node = f"{self.role}:{self.index} (executor {cfg.executor_id}, host {host})"
                if not self._was_registered:
                    client.start_heartbeats(cfg.heartbeat_interval_s, on_stop=self._on_stop)
                    self._was_registered = True
                    self._registered.set()
                outcome = self._generation(client, port, gpus)
            if client.restart_to is None or self._local_reason:
                return outcome
            renewed = self._next_generation(client, port)
            if renewed is None:  # stopped (by stop()) while waiting to rejoin
                return outcome
            port = renewed

    def _next_generation(self, client: NodeClient, port: PortReservation) -> PortReservation | None:
        """The job restarted its cluster: after the backoff, ready this node to rejoin the
        new generation with a port of its own (the old one may be gone: another process may
        have taken it while TensorFlow held it). None: the node was stopped meanwhile."""
        cfg = self.config
        log.info(
            "%s of job %s: the cluster restarts as generation %s (%s); rejoining in %g s",
            self.node,
            cfg.job,
            client.restart_to,
            client.stop_reason,
            client.restart_backoff_s,
        )
        if not self.child.renew():
            raise RuntimeError(f"{type(self.child).__name__} cannot run again: the node cannot rejoin")
        if self._local_stop.wait(client.restart_backoff_s):
            return None
        # Rejoin first: from here the client's stop watch of the old generation no longer
        # counts as a stop (see _on_stop), so clearing the stop below cannot be undone by it.
        client.rejoin()
        with self._lock:
            self._epoch += 1
            self._stop.clear()
            self._launched = False
            self._child_ended.clear()
            self._running.clear()
            if self._local_stop.is_set():  # stop() came after the backoff: the node ends here
                return None
        port.release()
        self._port = PortReservation(cfg.port, granted=cfg.port_granted)
        return self._port

    def _generation(self, client: NodeClient, port: PortReservation, gpus: GpuSelection) -> NodeOutcome:
        # Loaded once registered, not before: a Mesos task's registration waits on every import.
        from .outputlog import OutputLog
        from .reporting import ReportPipe

        cfg = self.config
        try:
            info = client.await_cluster(cfg.wait_timeout_s)
        except ClusterRestarted:
            # The cluster formed and restarted before this node's wait arrived (a peer was
            # lost meanwhile): nothing was launched; rejoin, or stop with the job.
            return NodeOutcome(STOPPED, self.role, self.index, client.stop_reason)
        self.child.before_launch(info)
        env = {
            "TF_CONFIG": info.tf_config_json(),
            **gpus.env(),
            "TFCOORD_JOB": cfg.job,
            "TFCOORD_ROLE": info.role,
            "TFCOORD_TASK_INDEX": str(info.index),
            # The cluster's generation: how many times the job restarted it (resume from a checkpoint).
            RESTARTS_ENV: str(client.generation),
        }
        reports = ReportPipe(client.progress, cfg.report_interval_s)
        env.update(reports.env())
        output = OutputLog(client.send_logs)
        try:
            with self._lock:
                if self._stopping(client):
                    return self._report(client, STOPPED, info)
                launch = Launch(
                    info, env, port, self.node, (reports.write_fd,), output.stdout_fd, output.stderr_fd
                )
                pid = self.child.launch(launch)
                self._launched = True
            reports.measure(pid)
            reports.start()
            output.start()
            return self._watch(client, port, info, pid, reports, output)
        finally:
            reports.close()
            output.close()

    def _watch(
        self,
        client: NodeClient,
        port: PortReservation,
        info: ClusterInfo,
        pid: int,
        reports: ReportPipe,
        output: OutputLog,
    ) -> NodeOutcome:
        cfg = self.config
        port.release()  # our copy, if the child did not take it over already
        if self.child.ready():
            try:
                client.report(NodeState.RUNNING, meta={"child_pid": pid})
            except ClusterRestarted:
                # A peer was lost while the child started: its generation is over before it
                # ran. Stopped as the stop watch would stop it; then it rejoins.
                self._on_stop(client.stop_reason)
            self._running.set()
            self._settled.set()
        ended = self.child.wait()
        self._child_ended.set()
        reports.close()  # its last figures and lines go before its end, which may end the job
        output.close()
        if self._stopping(client):
            return self._report(client, STOPPED, info)
        if ended.error:
            code = ended.exit_code if ended.exit_code > 0 else 1
            error = ended.error
            tail = output.tail()
            if ended.exit_code < 0 and tail:  # killed: no traceback, its last output says where it was
                error = f"{error}\nits last {len(tail)} lines of output:\n" + "\n".join(tail)
            failed = self._report(
                client,
                FAILED,
                info,
                error=error[-m.MAX_ERROR_LEN :],
                exit_code=code,
                child_code=ended.exit_code,
            )
            if self._may_restart:
                # This failure may have restarted the cluster. The coordinator says so to this
                # node as to any other, through its stop watch (stop and rejoin, or stop: the
                # job failed), and the answer to the report itself does not carry it: without
                # this wait the node read restart_to before its stop watch had set it, exited
                # instead of rejoining, and the new generation waited for its slot in vain.
                self._stop.wait()
            return failed
        outcome = self._report(client, SUCCEEDED, info, meta=ended.meta)
        # A ps or evaluator that returned, or a node whose work still serves (a terminated feed
        # answering its feeders), or any node of a job that may still restart its cluster
        # (a peer lost later needs this one to rejoin): up, reported SUCCEEDED, until the job
        # tells it to stop or to rejoin.
        if info.role in cfg.linger_roles or self.child.lingers() or self._may_restart:
            self._stop.wait()
        return outcome

    def _stopping(self, client: NodeClient) -> bool:
        return self._stop.is_set() or client.should_stop()

    def _report(
        self,
        client: NodeClient,
        state: NodeState,
        info: ClusterInfo,
        *,
        error: str = "",
        meta: Mapping[str, Any] | None = None,
        exit_code: int = 0,
        child_code: int = 0,
    ) -> NodeOutcome:
        if state == STOPPED and not client.should_stop():
            error = self._local_reason  # the job fails: this node stopped unasked, and this says why
        try:
            client.report(state, error=error, meta=meta, exit_code=child_code)
        except RequestRejected as e:
            # The job ended meanwhile (a peer's failure got there first): the coordinator has
            # its outcome already, and this node's own is still what the child did.
            log.info(
                "%s of job %s: the coordinator did not take our %s report: %s",
                self.node,
                self.config.job,
                state,
                e,
            )
        return NodeOutcome(state, info.role, info.index, error, exit_code)

    # -- stopping -------------------------------------------------------------------------

    def _on_stop(self, reason: str) -> None:
        """Told to stop (the stop watcher's thread, or stop()): end the child, never block long.
        Once per generation: the child was told already by the first."""
        with self._lock:
            if self._stop.is_set():
                return
            client = self.client
            if not self._local_stop.is_set() and client is not None and not client.should_stop():
                # The stop watch of a generation this node has left: it came after rejoin().
                return
            self._stop.set()
            epoch = self._epoch
            soft = self._launched and not self._child_ended.is_set()
        if soft and self.child.soft_stop(reason):
            return
        with self._lock:
            if epoch != self._epoch or not self._launched or not self.child.alive():
                return
            self.child.signal(signal.SIGTERM)
        self._reap_after_grace(epoch)

    def _reap_after_grace(self, epoch: int) -> None:
        threading.Thread(
            target=self._kill_after_grace, args=(epoch,), name="tfcoord-node-reaper", daemon=True
        ).start()

    def _kill_after_grace(self, epoch: int) -> None:
        # Only the supervisor's thread reaps the child; this one only escalates, and only
        # the child of its own generation (the next one's may run by the time it wakes).
        if self._child_ended.wait(self.config.stop_grace_s):
            return
        with self._lock:
            if epoch == self._epoch and self.child.alive():
                self.child.signal(signal.SIGKILL)

    def _stop_child(self) -> None:
        """On the way out: a child still running gets SIGTERM, then SIGKILL after the grace."""
        with self._lock:
            if not self._launched or self._child_ended.is_set() or not self.child.alive():
                return
            self.child.signal(signal.SIGTERM)
            epoch = self._epoch
        self._reap_after_grace(epoch)
        self.child.wait()
        self._child_ended.set()
