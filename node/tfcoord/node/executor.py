"""The node runtime inside a Spark executor task (and on the driver for ``driver_ps_nodes``).

One Spark task per TensorFlow node, as in TensorFlowOnSpark, but the task is only a
supervisor (:mod:`.supervisor`): it reserves the TensorFlow port (keeping the socket bound),
picks GPUs, registers, heartbeats, blocks for the cluster, then forks the user's
``map_fun(args, ctx)`` into a child process (:class:`ForkedFunction`) with ``TF_CONFIG`` set. Forking keeps
TensorFlowOnSpark's semantics (the function runs with the executor's Python, its
imports and closures) while letting the supervisor terminate it the moment the
coordinator says stop — a failed peer, a stop request, or, for a ps or evaluator,
the end of training — so no TensorFlow process is ever left behind.

The child inherits the reserved port's socket: the parent closes its copy after the
fork, and the child closes its own just before ``map_fun`` (``release_port=True``) or
when the user calls ``ctx.release_port()``.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import os
import signal
import socket
import ssl
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import TYPE_CHECKING, Any

from tfcoord.client import Client, NodeClient, TfcoordError
from tfcoord.client import messages as m
from tfcoord.client.client import ClusterInfo
from tfcoord.client.replies import RESULT_META, TENSORBOARD_META, TENSORBOARD_PID_META
from tfcoord.client.vocab import FailureReason

from . import feedtls, feedwire, pdeath
from .context import TFNodeContext
from .feedtls import FeedIdentity
from .gpuclaim import lock_dir
from .ports import PortReservation
from .supervisor import (
    FAILED,
    RESTARTS_ENV,
    STOP_GRACE_S,
    Child,
    ChildExit,
    GpuRequest,
    Launch,
    Meta,
    NodeSupervisor,
    SupervisorConfig,
    killed_by,
)
from .tensorboard import TensorBoard
from .tlsfiles import TlsFiles

if TYPE_CHECKING:
    from .datafeed import FeedServer

log = logging.getLogger("tfcoord.node")

#: Entries of a map_fun's returned dict shown in the node's status (see result_meta).
MAX_RESULT_ENTRIES = 16
#: Roles that serve the others and are stopped when training ends.
SERVING_ROLES = ("ps", "evaluator")
#: A fed node told to stop first stops its feed, so map_fun sees should_stop() and can
#: finish (save a model); it is terminated if it has not returned after this long.
FEED_STOP_GRACE_S = 10.0
#: Connections a feed port queues before map_fun's process accepts them: one per
#: concurrently feeding Spark task is plenty.
FEED_BACKLOG = 128
#: What map_fun's process says on its outcome pipe when its ``DataFeed.terminate()`` ran.
FEED_TERMINATED = "feed_terminated"
#: How long a background fed node's port goes on answering after the job ended (its feed
#: terminated: "skip the partition"; its map_fun failed: the node's error). Spark still runs
#: the feeding tasks it had queued then (and retries a failed one), back to back, each
#: answered in milliseconds; without an answer they would fail with "cannot reach the feed
#: port" and be retried. The driver's ``shutdown()`` ends it sooner (it says the feed is
#: over), and the node dies with its executor anyway.
FEED_AFTERLIFE_S = 120.0


@dataclass(frozen=True)
class NodeSpec:
    """Everything a Spark task needs to become a node; pickled into the task's closure."""

    address: str
    token: bytes
    job: str
    map_fun: Callable[[Any, TFNodeContext], Any]
    tf_args: Any
    #: (role, index) per executor id, so a node knows its role before registering.
    slots: tuple[tuple[str, int], ...]
    tensorboard: bool = False
    log_dir: str | None = None
    release_port: bool = True
    default_fs: str = "file://"
    working_dir: str = ""
    heartbeat_interval_s: float = 2.0
    wait_timeout_s: float = 600.0
    #: ``ctx.report`` figures reach the coordinator at most this often.
    report_interval_s: float = 1.0
    #: InputMode.SPARK: chief, master and worker nodes open a feed port.
    feed: bool = False
    #: TLS toward the coordinator: files each node reads once, when it starts.
    tls: TlsFiles | None = None
    #: Run in the background of the executor and give the Spark task back once map_fun
    #: runs (InputMode.SPARK: the feeding tasks need the slot; see :mod:`.background`).
    background: bool = False
    #: TensorFlowOnSpark-compatible nodes: ``tf.keras`` is Keras 2 when tf-keras is installed
    #: (see :mod:`.keras2`; an explicit ``TF_USE_LEGACY_KERAS`` wins).
    legacy_keras: bool = False
    #: The queue names a fed node's DataFeed may use (``run(..., queues=...)``).
    queues: tuple[str, ...] = ("input", "output", "error")
    #: Called in the node's process before map_fun (``run(..., executor_setup=...)``): the
    #: TensorFlowOnSpark layer installs its import aliases there, so the node needs no
    #: knowledge of the layers above it.
    setup: Callable[[], None] | None = None
    #: Where a fed node's feed port listens: None, the address the node registers (the one
    #: feeders dial); "0.0.0.0" or "::" widens it to every interface.
    feed_bind: str | None = None
    #: ``run(..., role_resources=...)``: role → ``{"cpus", "gpus", "memory_mb"}`` of the roles that
    #: run with a ResourceProfile of their own. Not empty: GPUs follow the profiles alone (the
    #: addresses Spark gives each task; none for a role without GPUs), never nvidia-smi discovery.
    role_resources: Mapping[str, Mapping[str, Any]] | None = None


def requested_gpus(tf_args: Any) -> tuple[int, bool]:
    """TensorFlowOnSpark's rule: ``tf_args.num_gpus`` if given (required), else one if any exist."""
    n = tf_args.get("num_gpus") if isinstance(tf_args, Mapping) else getattr(tf_args, "num_gpus", None)
    return (1, False) if n is None else (int(n), True)


def _tensorboard_role(spec: NodeSpec, executor_id: int) -> bool:
    """TensorBoard runs beside the chief/master, or worker 0 when there is none."""
    roles = {r for r, _ in spec.slots}
    role, index = spec.slots[executor_id]
    if roles & {"chief", "master"}:
        return role in ("chief", "master")
    return role == "worker" and index == 0


def result_meta(value: Any) -> dict[str, str | int | float]:
    """What of a map_fun's return value the node shows in its status: a small dict of scalars.

    Lets a driver read a node's outcome (a final loss, an accuracy) without a side channel.
    Anything else is ignored.
    """
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, str | int | float] = {}
    for k, v in list(value.items())[:MAX_RESULT_ENTRIES]:
        if (
            isinstance(k, str)
            and 0 < len(k) <= 64
            and isinstance(v, (str, int, float))
            and not isinstance(v, bool)
        ):
            out[f"{RESULT_META}{k}"[:64]] = v if not isinstance(v, str) else v[:1000]
    return out


def _request_stop(
    spec: NodeSpec,
    reason: str,
    ssl_context: ssl.SSLContext | None = None,
    quiet: bool = False,
    cause: FailureReason = FailureReason.STOPPED,
) -> None:
    """Ask the coordinator to stop this node's job (a stalled feed).

    ``quiet``: from a background thread; a failure is only printed (the job may have ended).
    ``cause``: the job's ``reason`` once stopped (``feed_timeout`` for a stalled feed).
    """
    try:
        with Client(
            spec.address, spec.token, role="node", job=spec.job, ssl_context=ssl_context
        ).connect() as c:
            c.request(lambda i: m.StopJob(id=i, job=spec.job, reason=reason[: m.MAX_TEXT_LEN], cause=cause))
    except Exception as e:
        if not quiet:
            raise
        print(
            f"tfcoord: could not ask the coordinator to stop job {spec.job}: {e}", file=sys.stderr, flush=True
        )


def _child(
    spec: NodeSpec,
    ctx: TFNodeContext,
    env: dict[str, str],
    port: PortReservation,
    outcome: Connection[tuple[str, Any], object],
    parent_released: Event,
    feed_sock: socket.socket | None = None,
    node: str = "",
    parent_pid: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    output_fds: tuple[int, int] = (-1, -1),
    feed_tls: FeedIdentity | None = None,
) -> None:
    """Runs in the forked child: the user's function; sends ("result", meta) or ("error", traceback).

    Before that it may send ("feed_terminated", reason) once, when ``DataFeed.terminate()`` ran
    (from whichever thread map_fun called it on).
    """
    code = 0
    feed = None
    sending = threading.Lock()

    def tell(msg: tuple[str, Any]) -> None:
        with sending:
            outcome.send(msg)

    try:
        # Before anything else: if the supervisor is SIGKILLed (Spark cancelling the task),
        # we go with it rather than train on as an orphan.
        pdeath.die_with_parent(parent_pid)
        for fd, target in zip(output_fds, (1, 2), strict=True):
            if fd >= 0:  # map_fun's output goes to the node's output log (which passes it on)
                (sys.stdout if target == 1 else sys.stderr).flush()
                os.dup2(fd, target)
                os.close(fd)
                # print() must reach fd 1 and 2 even where sys.stdout was replaced (pytest, IPython).
                stream = open(  # noqa: SIM115 - the child's stdout/stderr for its whole life
                    target, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
                )
                if target == 1:
                    sys.stdout = stream
                else:
                    sys.stderr = stream
        # A crash in native code (TensorFlow, a C extension) then prints where map_fun was on
        # the node's output, which its failure shows, instead of ending without a word.
        faulthandler.enable(file=sys.stderr, all_threads=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.update(env)
        ctx._release = port.release
        ctx._port = port
        if feed_sock is not None:
            from .datafeed import FeedServer

            feed = FeedServer(
                feed_sock,
                spec.token,
                spec.job,
                node,
                on_terminate=lambda r: tell((FEED_TERMINATED, r)),
                on_stall=lambda r: _request_stop(
                    spec, r, ssl_context, quiet=True, cause=FailureReason.FEED_TIMEOUT
                ),
                queues=spec.queues,
                tls=feed_tls,
            ).start()
            ctx._feed = feed
        # The port must be ours alone from here: wait until the parent closed its copy.
        parent_released.wait()
        if spec.setup is not None:
            spec.setup()
        from .hadoop import expand_classpath

        expand_classpath(os.environ)  # hdfs:// paths in TensorFlow, as TensorFlowOnSpark's nodes
        if isinstance(spec.tf_args, list):
            sys.argv = list(spec.tf_args)  # TensorFlowOnSpark's rule: argparse in map_fun sees tf_args
        if spec.legacy_keras:
            from . import keras2

            if keras2.use_keras2(os.environ):  # before map_fun imports TensorFlow
                keras2.honour_lr()  # Adam(lr=0.2) in TensorFlowOnSpark's programs and tests
        if spec.release_port:
            ctx.release_port()
        result = spec.map_fun(spec.tf_args, ctx)
        if feed is not None:  # feeders still connected hear that nobody will read their data
            feed.stop(f"map_fun on {node} returned")
            feed.close()
            feed.settle()  # and those still in their handshake, before this process ends
        tell(("result", result_meta(result)))
    except BaseException:
        error = traceback.format_exc()
        if feed is not None:
            feed.fail(error)  # the feeding tasks fail with the node's traceback
            feed.close()
            feed.settle()
        tell(("error", error))
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # No atexit, no Spark worker clean-up: the parent owns everything but this function.
        os._exit(code)


class ForkedFunction(Child):
    """The child of a Spark node: ``map_fun(tf_args, ctx)`` in a forked process.

    Also runs what lives beside it: the feed port of an InputMode.SPARK node (bound before
    registering, accepted on by map_fun's process) and TensorBoard beside the chief.
    """

    def __init__(self, spec: NodeSpec, executor_id: int, afterlife_s: float = 0.0) -> None:
        self.spec = spec
        self.executor_id = executor_id
        #: How long :meth:`afterlife` keeps the feed port answering after the node ended;
        #: 0: it is closed with the node (:meth:`close`).
        self.afterlife_s = afterlife_s
        self.role, self.index = spec.slots[executor_id]
        self.ssl_context = spec.tls.context() if spec.tls is not None else None  # the files are read once
        self._fork = multiprocessing.get_context("fork")
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._receive: Connection[object, tuple[str, Any]] | None = None
        self._board: TensorBoard | None = None
        self._feed_sock: socket.socket | None = None
        self._feed_address = ""
        #: The feed port's TLS identity when the job's coordinator traffic is TLS (feedtls).
        self._feed_tls: FeedIdentity | None = None
        self._node = ""
        self._ended = threading.Event()
        self._client: NodeClient | None = None
        #: What map_fun's process said last: ("result", meta), ("error", text), or ("", None).
        self._outcome: tuple[str, Any] = ("", None)
        self._reader: threading.Thread | None = None
        self._feed_terminated = threading.Event()
        #: Why the node was told to stop (its feed first): its late feeders are told the same.
        self._stop_reason = ""
        #: After map_fun ended with its feed terminated, or failed: answers the feeders still
        #: coming that the node takes no data, or with its error.
        self._lingering: FeedServer | None = None
        # Where summaries go and TensorBoard looks; map_fun finds it in TFCOORD_LOG_DIR.
        self._logdir = spec.log_dir or os.path.join(spec.working_dir or os.getcwd(), "tensorboard")

    def prepare(self, host: str, client: NodeClient) -> Meta:
        self._client = client
        meta: Meta = {}
        if self.spec.feed and self.role in feedwire.FEED_ROLES:
            # Bound and listening before we register, so a feeder that learns the address
            # can connect at once; map_fun's process inherits the socket and accepts.
            bind = self.spec.feed_bind if self.spec.feed_bind is not None else host
            self._feed_sock = socket.create_server(
                (bind, int(os.environ.get("TFCOORD_FEED_PORT", "0") or 0)), backlog=FEED_BACKLOG
            )
            self._feed_address = f"{host}:{self._feed_sock.getsockname()[1]}"
            meta[feedwire.FEED_META] = self._feed_address
            if self.spec.tls is not None:
                # The job's coordinator traffic is TLS, so its feed is: the certificate's
                # fingerprint is registered with the coordinator, and feeders pin it.
                self._feed_tls = feedtls.new_identity(self.spec.job)
                meta[feedtls.FEED_TLS_META] = self._feed_tls.fingerprint
        if self.spec.tensorboard and _tensorboard_role(self.spec, self.executor_id):
            self._board = TensorBoard(
                self._logdir,
                host,
                int(os.environ.get("TENSORBOARD_PORT", "0") or 0),
                on_url=lambda url: client.heartbeat(meta={TENSORBOARD_META: url}),
            )
            meta[TENSORBOARD_PID_META] = self._board.proc.pid
        return meta

    def before_launch(self, info: ClusterInfo) -> None:
        if self._board is not None:
            # It started with the reservation, so this mostly overlaps; waiting here means the
            # URL is advertised while map_fun runs; a short job would otherwise end first.
            self._board.wait_url()

    def launch(self, launch: Launch) -> int:
        spec, info = self.spec, launch.info
        self._node = launch.node
        env = {**launch.env, "TFCOORD_LOG_DIR": self._logdir}
        ctx = TFNodeContext(
            executor_id=self.executor_id,
            job_name=info.role,
            task_index=info.index,
            cluster_spec=info.cluster,
            num_workers=info.num_workers,
            defaultFS=spec.default_fs,
            working_dir=spec.working_dir,
            port=launch.port.port,
            job_id=spec.job,
            restart_count=int(launch.env.get(RESTARTS_ENV, "0")),
            resources=task_resources(spec, info.role, launch.env),
        )
        self._receive, send = self._fork.Pipe(duplex=False)
        released = self._fork.Event()
        # Forked from the supervisor's thread, which lives until the child is reaped: the
        # child's parent-death signal is tied to the forking thread (see pdeath).
        self._proc = self._fork.Process(
            target=_child,
            daemon=False,
            args=(
                spec,
                ctx,
                env,
                launch.port,
                send,
                released,
                self._feed_sock,
                launch.node,
                os.getpid(),
                self.ssl_context,
                (launch.stdout_fd, launch.stderr_fd),
                self._feed_tls,
            ),
        )
        self._proc.start()
        launch.port.release()  # our copy; the child holds the port until map_fun starts
        # Our copy of the feed socket stays open but unused (the child's copy accepts), so that
        # a node whose feed was terminated can go on answering its feeders after map_fun ends.
        released.set()
        send.close()
        # Read from now on: a large traceback must not block the child on a full pipe, and a
        # terminated feed is shown in the node's status while map_fun still runs.
        self._reader = threading.Thread(target=self._read_child, name="tfcoord-node-outcome", daemon=True)
        self._reader.start()
        assert self._proc.pid is not None
        return self._proc.pid

    def _read_child(self) -> None:
        receive = self._receive
        assert receive is not None  # started by launch, after the pipe
        while True:
            try:
                kind, payload = receive.recv()
            except EOFError:  # the child died without a word (signal, os._exit in user code)
                return
            if kind != FEED_TERMINATED:
                self._outcome = (kind, payload)
                return
            self._feed_terminated.set()
            log.info("%s: DataFeed.terminate(): its feed is over (%s)", self._node, payload)
            if self._client is not None:
                try:
                    self._client.heartbeat(meta={feedwire.FEED_TERMINATED_META: 1})
                except (TfcoordError, OSError) as e:  # the job ended meanwhile; nothing to show it to
                    log.debug("could not show the terminated feed of %s: %s", self._node, e)

    def wait(self) -> ChildExit:
        assert self._proc is not None and self._reader is not None
        self._reader.join()
        kind, payload = self._outcome
        self._proc.join()
        self._ended.set()
        self._after_feed(kind == "result", str(payload) if kind == "error" else "")
        code = self._proc.exitcode or 0
        if kind == "error":
            return ChildExit(str(payload), code or 1)
        if kind != "result" and code < 0:
            return ChildExit(f"map_fun process was {killed_by(-code)}", code)
        if kind != "result":
            return ChildExit(f"map_fun process exited with code {code} without finishing", code or 1)
        return ChildExit("", 0, payload or {})

    def _after_feed(self, succeeded: bool, error: str) -> None:
        """map_fun ended: its feeding tasks still to come are answered by this process now.

        After its feed was terminated and it succeeded, they are told the node takes no more
        data, so they skip their partitions (TensorFlowOnSpark's) while the other nodes are
        fed on; after it failed, they are told its error (``error``, the traceback), so
        Spark's task error and the driver's carry it; after it was told to stop (a peer
        failed: the reason holds the peer's error), they are told why. Otherwise (it
        returned with its feed open, or died without a word) feeders are refused from now on.
        """
        if self._feed_sock is None:
            return
        terminated = succeeded and self._feed_terminated.is_set()
        if not (terminated or error or self._stop_reason):
            self._feed_sock.close()
            return
        from .datafeed import FeedServer

        self._lingering = FeedServer(
            self._feed_sock, self.spec.token, self.spec.job, self._node, tls=self._feed_tls
        ).start()  # the same certificate: feeders pin it
        if terminated:
            self._lingering.terminate(f"DataFeed.terminate() on {self._node}: its feed is over")
        elif error:
            self._lingering.fail(error)
        else:
            self._lingering.stop(self._stop_reason)

    def lingers(self) -> bool:
        return self._lingering is not None

    def renew(self) -> bool:
        """map_fun is forked again for each generation of its cluster (``ctx.restart_count``
        says which); a fed node cannot: the partitions fed to it are gone (run() refuses
        restarts with InputMode.SPARK)."""
        if self._feed_sock is not None:
            return False
        self._proc, self._reader, self._outcome = None, None, ("", None)
        self._ended.clear()
        return True

    def alive(self) -> bool:
        # Not Process.is_alive(): that reaps from the calling thread, and only wait() may.
        return self._proc is not None and not self._ended.is_set()

    def signal(self, sig: int) -> None:
        # Until wait() reaped it the pid is ours (a zombie at worst), never a reused one.
        if self._proc is not None and not self._ended.is_set() and self._proc.pid is not None:
            try:
                os.kill(self._proc.pid, sig)
            except ProcessLookupError:
                pass

    def soft_stop(self, reason: str) -> bool:
        """A fed node first stops its feed, so map_fun sees should_stop() and can finish."""
        if not self._feed_address:
            return False
        pin = self._feed_tls.fingerprint if self._feed_tls is not None else ""
        self._stop_reason = reason or "the job is stopping"
        _stop_feed(self.spec, self._node, self._feed_address, reason, pin)
        return self._ended.wait(FEED_STOP_GRACE_S)

    def close(self) -> None:
        if self._board is not None:
            self._board.stop()
        if self._lingering is not None and self.afterlife_s > 0:
            return  # still answering late feeders: afterlife() closes it
        if self._lingering is not None:
            self._lingering.close()
        if self._feed_sock is not None:
            self._feed_sock.close()

    def afterlife(self) -> None:
        """After the node's end (its supervisor is done): keep answering late feeders for up
        to :attr:`afterlife_s`, or until the driver says the feed is over; then close."""
        if self._lingering is not None:
            self._lingering.feed_over.wait(self.afterlife_s)
            self._lingering.close()
        if self._feed_sock is not None:
            self._feed_sock.close()


def task_resources(spec: NodeSpec, role: str, env: Mapping[str, str]) -> dict[str, Any]:
    """``ctx.resources``: the cpus Spark gave this node's task, the GPUs it runs on (what
    ``CUDA_VISIBLE_DEVICES`` holds) and, where the role asked for it, its memory."""
    asked = (spec.role_resources or {}).get(role, {})
    out: dict[str, Any] = {}
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
    except ImportError:  # a node on the driver (driver_ps_nodes) of a driver without pyspark
        tc = None
    if tc is not None:
        out["cpus"] = tc.cpus()
    elif asked.get("cpus") is not None:
        out["cpus"] = asked["cpus"]
    out["gpus"] = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    if asked.get("memory_mb") is not None:
        out["memory_mb"] = asked["memory_mb"]
    return out


def supervisor_config(
    spec: NodeSpec,
    executor_id: int,
    attempt: int = 0,
    task_id: str = "",
    spark_resources: Any = None,
    ssl_context: ssl.SSLContext | None = None,
) -> SupervisorConfig:
    """How the supervisor runs node ``executor_id`` of a Spark job."""
    role, index = spec.slots[executor_id]
    # With role_resources the profile says which roles hold GPUs: Spark's grant is the only source.
    num_gpus, required = (0, False) if spec.role_resources else requested_gpus(spec.tf_args)
    gpus = GpuRequest(
        count=num_gpus,
        require=required,
        spark_resources=spark_resources,
        lock_dir=lock_dir(),
        holder_name=f"job {spec.job} {role}:{index} (executor {executor_id})",
    )
    return SupervisorConfig(
        address=spec.address,
        token=spec.token,
        job=spec.job,
        executor_id=executor_id,
        attempt=attempt,
        task_id=task_id,
        port=int(os.environ.get("TENSORFLOW_PORT", "0") or 0),
        gpus=gpus,
        heartbeat_interval_s=spec.heartbeat_interval_s,
        wait_timeout_s=spec.wait_timeout_s,
        report_interval_s=spec.report_interval_s,
        linger_roles=SERVING_ROLES,
        stop_grace_s=STOP_GRACE_S,
        ssl_context=ssl_context,
    )


def start_node(
    spec: NodeSpec, executor_id: int, attempt: int = 0, task_id: str = "", spark_resources: Any = None
) -> NodeSupervisor:
    """Start node ``executor_id`` of the job; returns once it is registered (see NodeSupervisor)."""
    child = ForkedFunction(spec, executor_id)
    cfg = supervisor_config(spec, executor_id, attempt, task_id, spark_resources, child.ssl_context)
    return NodeSupervisor(cfg, child).start()


def run_node(
    spec: NodeSpec, executor_id: int, attempt: int = 0, task_id: str = "", spark_resources: Any = None
) -> None:
    """Be node ``executor_id`` of the job until it ends; raise NodeFailed if this node failed."""
    role, index = spec.slots[executor_id]
    try:
        outcome = start_node(spec, executor_id, attempt, task_id, spark_resources).wait()
    except TfcoordError as e:
        raise NodeFailed(f"{role}:{index} (executor {executor_id}): {e}") from None
    if outcome.state == FAILED:
        raise NodeFailed(f"{role}:{index} (executor {executor_id}) failed:\n{outcome.error}")


def _stop_feed(spec: NodeSpec, node: str, address: str, reason: str, pin: str = "") -> None:
    """Tell our map_fun's feed to take no more data (it may already be gone)."""
    from .feeder import FeedPlan, FeedTarget, control

    target = FeedTarget(node, address, pin)
    try:
        control(FeedPlan(spec.job, spec.token, (target,), tls=bool(pin)), target, "stop", reason)
    except feedwire.FeedError:
        pass


class NodeFailed(RuntimeError):
    """Raised in the Spark task of a node that failed, so Spark shows the failure too."""


def spark_partition(spec: NodeSpec) -> Callable[[Iterable[int]], None]:
    """The function ``foreachPartition`` runs: one partition holds one executor id."""

    def run(partition: Iterable[int]) -> None:
        from pyspark import TaskContext

        ids = list(partition)
        if len(ids) != 1:
            raise ValueError(f"each Spark partition must carry one executor id, got {ids}")
        tc = TaskContext.get()
        attempt = tc.attemptNumber() if tc else 0
        task_id = (
            f"stage {tc.stageId()} partition {tc.partitionId()} TID {tc.taskAttemptId()}" if tc else "driver"
        )
        resources = tc.resources() if tc else None
        if not spec.background:
            run_node(spec, ids[0], attempt, task_id, resources)
            return
        from .background import BackgroundNodeFailed, run_in_background

        try:
            run_in_background(
                lambda started: _background_node(spec, ids[0], attempt, task_id, resources, started)
            )
        except BackgroundNodeFailed as e:
            raise NodeFailed(str(e)) from None

    return run


def _background_node(
    spec: NodeSpec, executor_id: int, attempt: int, task_id: str, resources: Any, started: Callable[[], None]
) -> None:
    """A background node's process (see :mod:`.background`): ``started()`` once map_fun runs."""
    role, index = spec.slots[executor_id]
    # Its Spark task has returned: the feeding tasks Spark still runs after the job ended
    # are answered by this process for a while (see FEED_AFTERLIFE_S).
    child = ForkedFunction(spec, executor_id, afterlife_s=FEED_AFTERLIFE_S)
    try:
        cfg = supervisor_config(spec, executor_id, attempt, task_id, resources, child.ssl_context)
        sup = NodeSupervisor(cfg, child).start()
        if sup.wait_running():
            started()
        outcome = sup.wait()
    except TfcoordError as e:
        raise NodeFailed(f"{role}:{index} (executor {executor_id}): {e}") from None
    finally:
        child.afterlife()
    if outcome.state == FAILED:
        raise NodeFailed(f"{role}:{index} (executor {executor_id}) failed:\n{outcome.error}")
