"""The node runtime inside a Spark executor task (and on the driver for ``driver_ps_nodes``).

One Spark task per TensorFlow node, as in TensorFlowOnSpark, but the task is only a
supervisor: it reserves the TensorFlow port (keeping the socket bound), picks GPUs,
registers, heartbeats, blocks for the cluster, then forks the user's
``map_fun(args, ctx)`` into a child process with ``TF_CONFIG`` set. Forking keeps
TensorFlowOnSpark's semantics (the function runs with the executor's Python, its
imports and closures) while letting the supervisor terminate it the moment the
coordinator says stop — a failed peer, a stop request, or, for a ps or evaluator,
the end of training — so no TensorFlow process is ever left behind.

The child inherits the reserved port's socket: the parent closes its copy after the
fork, and the child closes its own just before ``map_fun`` (``release_port=True``) or
when the user calls ``ctx.release_port()``.
"""

from __future__ import annotations

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
from typing import Any

from tfcoord.client import Client, NodeClient, TfcoordError
from tfcoord.client import messages as m

from . import feedwire, pdeath
from .context import TFNodeContext
from .gpuclaim import lock_dir
from .gpus import CPU, select_gpus
from .ports import PortReservation
from .tensorboard import TensorBoard
from .tlsfiles import TlsFiles

#: A map_fun told to stop gets this long after SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0
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
    #: InputMode.SPARK: chief, master and worker nodes open a feed port.
    feed: bool = False
    #: TLS toward the coordinator: files each node reads once, when it starts.
    tls: TlsFiles | None = None


def _requested_gpus(tf_args: Any) -> tuple[int, bool]:
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
            out[f"result.{k}"[:64]] = v if not isinstance(v, str) else v[:1000]
    return out


def _request_stop(spec: NodeSpec, reason: str, ssl_context: ssl.SSLContext | None = None) -> None:
    """Ask the coordinator to stop this node's job (``DataFeed.terminate()``)."""
    with Client(spec.address, spec.token, role="node", job=spec.job, ssl_context=ssl_context).connect() as c:
        c.request(lambda i: m.StopJob(id=i, job=spec.job, reason=reason[: m.MAX_TEXT_LEN]))


def _child(
    spec: NodeSpec, ctx: TFNodeContext, env: dict[str, str], port: PortReservation, outcome, parent_released,
    feed_sock: socket.socket | None = None, node: str = "", parent_pid: int = 0,
    ssl_context: ssl.SSLContext | None = None,
) -> None:  # fmt: skip
    """Runs in the forked child: the user's function; sends ("result", meta) or ("error", traceback)."""
    code = 0
    feed = None
    try:
        # Before anything else: if the supervisor is SIGKILLed (Spark cancelling the task),
        # we go with it rather than train on as an orphan.
        pdeath.die_with_parent(parent_pid)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.update(env)
        ctx._release = port.release
        if feed_sock is not None:
            from .datafeed import FeedServer

            feed = FeedServer(feed_sock, spec.token, spec.job, node,
                              lambda r: _request_stop(spec, r, ssl_context)).start()  # fmt: skip
            ctx._feed = feed
        # The port must be ours alone from here: wait until the parent closed its copy.
        parent_released.wait()
        if spec.release_port:
            ctx.release_port()
        result = spec.map_fun(spec.tf_args, ctx)
        if feed is not None:  # feeders still connected hear that nobody will read their data
            feed.stop(f"map_fun on {node} returned")
            feed.close()
        outcome.send(("result", result_meta(result)))
    except BaseException:
        error = traceback.format_exc()
        if feed is not None:
            feed.fail(error)  # the feeding tasks fail with the node's traceback
        outcome.send(("error", error))
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # No atexit, no Spark worker clean-up: the parent owns everything but this function.
        os._exit(code)


def run_node(spec: NodeSpec, executor_id: int, attempt: int = 0, task_id: str = "",
             spark_resources: Any = None) -> None:  # fmt: skip
    """Be node ``executor_id`` of the job until it ends; raise if this node failed."""
    role, index = spec.slots[executor_id]
    port = PortReservation(int(os.environ.get("TENSORFLOW_PORT", "0") or 0))
    num_gpus, required = _requested_gpus(spec.tf_args)
    # Claimed for this supervisor's whole life (and map_fun's, which inherits the claim):
    # another node starting on this host meanwhile skips our GPUs.
    gpus = CPU
    try:
        ssl_context = spec.tls.context() if spec.tls is not None else None  # the files are read here, once
        gpus = select_gpus(num_gpus, spark_resources=spark_resources, require=required, lock_dir=lock_dir(),
                           holder_name=f"job {spec.job} {role}:{index} (executor {executor_id})")  # fmt: skip
        client = NodeClient(spec.address, spec.token, spec.job, executor_id, attempt,
                            ssl_context=ssl_context).connect()  # fmt: skip
    except BaseException:
        gpus.release()
        port.release()
        raise
    board: TensorBoard | None = None
    child: multiprocessing.process.BaseProcess | None = None
    feed_sock: socket.socket | None = None
    child_done = threading.Event()
    try:
        host = client.local_host()
        node = f"{role}:{index} (executor {executor_id}, host {host})"
        meta: dict[str, str | int | float] = {"pid": os.getpid(), "gpu_source": gpus.source}
        if spec.feed and role in feedwire.FEED_ROLES:
            # Bound and listening before we register, so a feeder that learns the address
            # can connect at once; map_fun's process inherits the socket and accepts.
            feed_sock = socket.create_server(("", int(os.environ.get("TFCOORD_FEED_PORT", "0") or 0)),
                                             backlog=FEED_BACKLOG)  # fmt: skip
            meta[feedwire.FEED_META] = f"{host}:{feed_sock.getsockname()[1]}"
        # Where summaries go and TensorBoard looks; map_fun finds it in TFCOORD_LOG_DIR.
        logdir = spec.log_dir or os.path.join(spec.working_dir or os.getcwd(), "tensorboard")
        if spec.tensorboard and _tensorboard_role(spec, executor_id):
            board = TensorBoard(logdir, host, int(os.environ.get("TENSORBOARD_PORT", "0") or 0),
                                on_url=lambda url: client.heartbeat(meta={"tensorboard_url": url}))  # fmt: skip
            meta["tensorboard_pid"] = board.proc.pid
        client.register(host, port.port, gpus=gpus.uuids, task_id=task_id, meta=meta)
        fork = multiprocessing.get_context("fork")
        lock = fork.Lock()

        def on_stop(reason: str) -> None:
            if feed_sock is not None and child is not None:
                _stop_feed(spec, node, str(meta[feedwire.FEED_META]), reason)
                if child_done.wait(FEED_STOP_GRACE_S):
                    return
            with lock:
                if child is not None and child.is_alive():
                    os.kill(child.pid, signal.SIGTERM)  # type: ignore[arg-type]

        client.start_heartbeats(spec.heartbeat_interval_s, on_stop=on_stop)
        info = client.await_cluster(spec.wait_timeout_s)
        if board is not None:
            # It started with the reservation, so this mostly overlaps; waiting here means the
            # URL is advertised while map_fun runs; a short job would otherwise end first.
            board.wait_url()
        env = {"TF_CONFIG": info.tf_config_json(), "TFCOORD_LOG_DIR": logdir, **gpus.env()}
        ctx = TFNodeContext(
            executor_id=executor_id, job_name=info.role, task_index=info.index, cluster_spec=info.cluster,
            num_workers=info.num_workers, defaultFS=spec.default_fs, working_dir=spec.working_dir,
            port=port.port, job_id=spec.job,
        )  # fmt: skip
        receive, send = fork.Pipe(duplex=False)
        with lock:
            if client.should_stop():
                client.report("stopped")
                return
            released = fork.Event()
            # Forked from this thread, which lives until the child is reaped: the child's
            # parent-death signal is tied to the forking thread (see pdeath).
            child = fork.Process(target=_child, daemon=False,
                                 args=(spec, ctx, env, port, send, released, feed_sock, node, os.getpid(),
                                       ssl_context))  # fmt: skip
            child.start()
        port.release()  # our copy; the child holds the port until map_fun starts
        if feed_sock is not None:
            feed_sock.close()  # the child's copy accepts; once it exits, feeders are refused
        released.set()
        send.close()
        client.report("running", meta={"child_pid": child.pid})
        try:  # read before joining: a large traceback must not block the child on a full pipe
            kind, payload = receive.recv()
        except EOFError:  # the child died without a word (signal, os._exit in user code)
            kind, payload = "", None
        child.join()
        child_done.set()
        if kind == "error":
            error = str(payload)
        elif kind != "result" and child.exitcode and child.exitcode < 0:
            error = f"map_fun process was killed by signal {-child.exitcode} (out of memory?)"
        elif kind != "result":
            error = f"map_fun process exited with code {child.exitcode} without finishing"
        else:
            error = ""
        if client.should_stop():
            client.report("stopped")
        elif error:
            client.report("failed", error=error)
            raise NodeFailed(f"{role}:{index} (executor {executor_id}) failed:\n{error}")
        else:
            client.report("succeeded", meta=payload or {})
            if role in SERVING_ROLES:  # a ps or evaluator that returned: stay up until told to stop
                client.stop_event.wait()
    except TfcoordError as e:
        raise NodeFailed(f"{role}:{index} (executor {executor_id}): {e}") from None
    except NodeFailed:
        raise
    except BaseException:
        try:
            client.report("failed", error="tfcoord node supervisor:\n" + traceback.format_exc())
        except Exception:
            pass
        raise
    finally:
        if child is not None and child.is_alive():
            child.terminate()
            child.join(STOP_GRACE_S)
            if child.is_alive():
                child.kill()
                child.join()
        if board is not None:
            board.stop()
        if feed_sock is not None:
            feed_sock.close()
        port.release()
        gpus.release()
        client.close()


def _stop_feed(spec: NodeSpec, node: str, address: str, reason: str) -> None:
    """Tell our map_fun's feed to take no more data (it may already be gone)."""
    from .feeder import FeedPlan, FeedTarget, control

    target = FeedTarget(node, address)
    try:
        control(FeedPlan(spec.job, spec.token, (target,)), target, "stop", reason)
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
        run_node(spec, ids[0], attempt, task_id, tc.resources() if tc else None)

    return run
