"""TensorFlowOnSpark's ``TFSparkNode``: the node context, and ``run`` over tfcoord's node runtime.

``TFCluster.run`` never comes here: its nodes register with tfcoord's coordinator. ``run`` is
TensorFlowOnSpark's lower-level node launcher for programs (and TensorFlowOnSpark's own tests)
that drive it directly with a ``reservation.Server``, whose reservations are a tfcoord job
(:mod:`.reservation`). Each Spark task runs the one node runtime of tfcoord: the node
supervisor (:mod:`tfcoord.node.supervisor`) reserves the TensorFlow port, registers a node of
the reservation job with TensorFlowOnSpark's node metadata, heartbeats, waits until every
node did, and forks ``fn(tf_args, ctx)`` (:class:`tfcoord.node.executor.ForkedFunction`), then
reports how it ended; the task raises ``NodeFailed`` with ``fn``'s traceback if it failed.
What is TensorFlowOnSpark's is the translation: the node's role and index come from
``cluster_template``, the cluster spec (``TF_CONFIG``, ``ctx.cluster_spec``) from the nodes'
metadata (``_get_cluster_spec``), and the GPUs from its rule below, applied once the cluster
is known (``CUDA_VISIBLE_DEVICES`` is set in the task's process too, as TensorFlowOnSpark's).
``background=False`` is the InputMode.TENSORFLOW way; ``background=True`` is the
InputMode.SPARK way, whose feeding half is tfcoord's own: it is refused with a pointer to
``TFCluster.run``.

GPUs, TensorFlowOnSpark's rule: ``tf_args.num_gpus`` if given (then required), else one when
the host has any. Spark's resource API (3.0+) assigns them when the task has ``gpu``
resources; on Kubernetes (``SPARK_EXECUTOR_POD_IP``) nothing else may, so without them the
node runs on the CPU, or fails if GPUs were asked for; elsewhere ``gpu_info.get_gpus`` picks
free ones, offset by this node's place among the nodes on its host.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tfcoord.client import ClusterInfo, NodeClient, RequestRejected, TfcoordError
from tfcoord.node.context import TFNodeContext as NodeContext
from tfcoord.node.executor import ForkedFunction, NodeFailed, NodeSpec, supervisor_config
from tfcoord.node.supervisor import FAILED, GpuRequest, Launch, Meta, NodeSupervisor
from tfcoord.node.tlsfiles import TlsFiles

from . import TFManager, gpu_info, reservation

log = logging.getLogger("tfcoord.compat")

#: Roles that train (TensorFlowOnSpark counts them as num_workers).
TRAINING_ROLES = ("chief", "master", "worker")


class TFNodeContext(NodeContext):
    """The node context, constructible as TensorFlowOnSpark's: ``TFNodeContext(executor_id=0,
    job_name='', task_index=0, cluster_spec={}, defaultFS='file://', working_dir='.', mgr=None)``.

    ``num_workers`` is counted from ``cluster_spec``, and ``mgr`` is the context's feed
    (``ctx.mgr``, what ``TFNode.DataFeed`` reads: a tfcoord feed server or a TFManager).
    """

    def __init__(
        self,
        executor_id: int = 0,
        job_name: str = "",
        task_index: int = 0,
        cluster_spec: dict[str, list[str]] | None = None,
        defaultFS: str = "file://",
        working_dir: str = ".",
        mgr: Any = None,
        **kw: Any,
    ) -> None:
        spec = dict(cluster_spec or {})
        kw.setdefault("num_workers", sum(len(v) for k, v in spec.items() if k in TRAINING_ROLES))
        super().__init__(
            executor_id=executor_id,
            job_name=job_name,
            task_index=task_index,
            cluster_spec=spec,
            defaultFS=defaultFS,
            working_dir=working_dir,
            **kw,
        )
        self._mgr = mgr

    @classmethod
    def of(cls, ctx: NodeContext, mgr: Any) -> TFNodeContext:
        """``ctx`` (a node's, once its TensorFlow port is released) with ``mgr`` as its feed."""
        return cls(
            ctx.executor_id,
            ctx.job_name,
            ctx.task_index,
            ctx.cluster_spec,
            ctx.defaultFS,
            ctx.working_dir,
            mgr,
            num_workers=ctx.num_workers,
            port=ctx.port,
            job_id=ctx.job_id,
            restart_count=ctx.restart_count,
        )

    @property
    def mgr(self) -> Any:
        return self._mgr

    def get_data_feed(
        self,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: dict[str, str] | None = None,
    ) -> Any:
        from . import TFNode

        return TFNode.DataFeed(self._mgr, train_mode, qname_in, qname_out, input_mapping)


def _has_spark_resource_api() -> bool:
    """Spark 3.0+ tells a task the GPUs it was given (``TaskContext.resources()``)."""
    from pyspark import TaskContext

    return hasattr(TaskContext, "resources")


def _get_cluster_spec(sorted_cluster_info: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Role → ``["host:port", ...]`` from reservations sorted by executor id."""
    spec: dict[str, list[tuple[int, str]]] = {}
    for node in sorted_cluster_info:
        spec.setdefault(node["job_name"], []).append((node["task_index"], f"{node['host']}:{node['port']}"))
    return {role: [addr for _, addr in sorted(nodes)] for role, nodes in spec.items()}


def _slot(template: Mapping[str, Sequence[int]], executor_id: int) -> tuple[str, int]:
    for role, executors in template.items():
        if executor_id in executors:
            return role, list(executors).index(executor_id)
    raise ValueError(f"executor {executor_id} has no place in cluster_template {dict(template)!r}")


def _task_gpus(num_gpus: int, required: bool, place: Callable[[], int]) -> list[str]:
    """The GPU ids this node may use (``place()``: its index among the nodes on its host)."""
    if _has_spark_resource_api():
        from pyspark import TaskContext

        # TaskContext() is the running task's (pyspark hands out its one instance).
        resources = (TaskContext().resources() or {}) if TaskContext.get() is not None else {}
        if "gpu" in resources:
            return list(resources["gpu"].addresses)[:num_gpus]
    if "SPARK_EXECUTOR_POD_IP" in os.environ:
        if required:
            raise RuntimeError(
                f"{num_gpus} GPU(s) requested (num_gpus), but Spark assigned this task none; on "
                "Kubernetes set spark.executor.resource.gpu.amount and spark.task.resource.gpu.amount"
            )
        return []
    if not gpu_info.is_gpu_available():
        if required:
            raise RuntimeError(
                f"{num_gpus} GPU(s) requested (num_gpus), but this host has none (no nvidia-smi)"
            )
        return []
    return list(gpu_info.get_gpus(num_gpus, place(), format=gpu_info.AS_LIST))


def _use_gpus(tf_args: Any, spec: Mapping[str, list[str]], job_name: str, task_index: int) -> list[str]:
    """Set ``CUDA_VISIBLE_DEVICES`` by TensorFlowOnSpark's rule (see the module's docstring); the GPUs."""
    n = tf_args.get("num_gpus") if isinstance(tf_args, Mapping) else getattr(tf_args, "num_gpus", None)
    required = n is not None
    num_gpus = int(n) if n is not None else (1 if gpu_info.is_gpu_available() else 0)

    def place() -> int:
        mine = spec[job_name][task_index]
        on_host = [
            a for addrs in spec.values() for a in addrs if a.rsplit(":", 1)[0] == mine.rsplit(":", 1)[0]
        ]
        return on_host.index(mine)

    gpus = _task_gpus(num_gpus, required, place) if num_gpus > 0 else []
    log.info("%s:%d uses %s", job_name, task_index, f"GPU(s) {','.join(gpus)}" if gpus else "the CPU")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return gpus


class _TFOSNode(ForkedFunction):
    """One node of ``TFSparkNode.run``: tfcoord's forked ``map_fun`` under the node supervisor,
    placed by TensorFlowOnSpark's rules.

    It registers TensorFlowOnSpark's node metadata (executor id, host, role and index from
    ``cluster_template``); once every node did, the cluster spec is TensorFlowOnSpark's, built
    from them (``_get_cluster_spec``), and so are ``TF_CONFIG``, the context and the GPUs.
    """

    def __init__(
        self, spec: NodeSpec, executor_id: int, addr: reservation.ReservationAddress, tf_args: Any
    ) -> None:
        super().__init__(spec, executor_id)
        self._addr = addr
        self._tf_args = tf_args
        self._cluster: dict[str, list[str]] = {}
        self._gpus: list[str] = []

    def prepare(self, host: str, client: NodeClient) -> Meta:
        meta = super().prepare(host, client)
        mine = {
            "executor_id": self.executor_id,
            "host": host,
            "job_name": self.role,
            "task_index": self.index,
        }
        meta[reservation.NODE_META_KEY] = reservation.encode_meta(mine)
        return meta

    def before_launch(self, info: ClusterInfo) -> None:
        super().before_launch(info)
        with reservation.Client(self._addr) as client:
            nodes = client.get_reservations()
        cluster_info = sorted((n for n in nodes if "job_name" in n), key=lambda n: n["executor_id"])
        self._cluster = _get_cluster_spec(cluster_info)
        log.info("%s:%d of %s", self.role, self.index, self._cluster)
        self._gpus = _use_gpus(self._tf_args, self._cluster, self.role, self.index)

    def launch(self, launch: Launch) -> int:
        tf_config = {"cluster": self._cluster, "task": {"type": self.role, "index": self.index}}
        env = {**launch.env, "TF_CONFIG": json.dumps(tf_config), "CUDA_VISIBLE_DEVICES": ",".join(self._gpus)}
        info = ClusterInfo(launch.info.job, self.executor_id, self.role, self.index, self._cluster)
        return super().launch(dataclasses.replace(launch, info=info, env=env))


@dataclasses.dataclass(frozen=True)
class _WithManager:
    """``fn`` called with TensorFlowOnSpark's context: ``ctx.mgr`` a ``TFManager`` of ``queues``,
    started in ``fn``'s process (whose feed it is) and shut down when ``fn`` returns."""

    fn: Callable[[Any, Any], Any]
    queues: tuple[str, ...]

    def __call__(self, tf_args: Any, ctx: NodeContext) -> Any:
        mgr = TFManager.start(None, self.queues, "local")
        try:
            return self.fn(tf_args, TFNodeContext.of(ctx, mgr))
        finally:
            mgr.shutdown()


def _template_slots(template: Mapping[str, Sequence[int]]) -> tuple[tuple[str, int], ...]:
    """(role, index) per executor id of ``cluster_template`` (ids it does not name: no role)."""
    places = {eid: (role, i) for role, ids in template.items() for i, eid in enumerate(ids)}
    return tuple(places.get(eid, ("", -1)) for eid in range(max(places, default=-1) + 1))


def _run_node(spec: NodeSpec, executor_id: int, addr: reservation.ReservationAddress, tf_args: Any) -> None:
    """Be node ``executor_id`` until ``map_fun`` ends, in the first free slot of the reservations
    from ``executor_id`` on; raise ``NodeFailed`` with the node's error if it failed."""
    role, index = spec.slots[executor_id]
    outcome = None
    for k in range(addr.size):
        child = _TFOSNode(spec, executor_id, addr, tf_args)
        cfg = supervisor_config(spec, executor_id, ssl_context=child.ssl_context)
        # GPUs are TensorFlowOnSpark's to choose, once the cluster is known (before_launch).
        cfg = dataclasses.replace(cfg, executor_id=(executor_id + k) % addr.size, gpus=GpuRequest())
        try:
            outcome = NodeSupervisor(cfg, child).start().wait()
        except RequestRejected as e:
            if e.code in reservation.TAKEN:
                continue  # another node holds this slot: the next one
            raise NodeFailed(f"{role}:{index} (executor {executor_id}): {e}") from None
        except TfcoordError as e:
            raise NodeFailed(f"{role}:{index} (executor {executor_id}): {e}") from None
        break
    if outcome is None:
        raise NodeFailed(
            f"{role}:{index} (executor {executor_id}): all {addr.size} reservations are taken already"
        )
    if outcome.state == FAILED:
        raise NodeFailed(f"{role}:{index} (executor {executor_id}) failed:\n{outcome.error}")


def run(
    fn: Callable[[Any, Any], Any],
    tf_args: Any,
    cluster_meta: Mapping[str, Any],
    tensorboard: bool,
    log_dir: str | None,
    queues: Sequence[str],
    background: bool,
) -> Callable[[Iterable[int]], list[Any]]:
    """The Spark map function that makes its task node ``executor_id`` of the cluster.

    Args:
        cluster_meta: TensorFlowOnSpark's: ``server_addr`` (what ``reservation.Server.start()``
            returned), ``cluster_template`` (role → executor ids), ``default_fs``,
            ``working_dir``, and ``reservation_timeout`` (seconds a node waits for the others).
        tensorboard: start TensorBoard on ``log_dir`` beside the chief (else worker 0).
        queues: the names of the queues of the node's ``TFManager`` (``ctx.mgr``).
        background: must be False (see the module's docstring).

    Raises (from the map function):
        NodeFailed: the node failed (the message carries ``fn``'s traceback), or could not
            register.
        ValueError: its executor id has no place in ``cluster_template``.
    """
    if background:
        raise ValueError(
            "TFSparkNode.run(background=True) is TensorFlowOnSpark's InputMode.SPARK launcher, whose "
            "feeding tfcoord does itself: use TFCluster.run(sc, map_fun, tf_args, num_executors, num_ps, "
            "input_mode=TFCluster.InputMode.SPARK)"
        )
    template = {role: list(ids) for role, ids in cluster_meta["cluster_template"].items()}
    addr = cluster_meta.get("server_addr")

    def _mapfn(executors: Iterable[int]) -> list[Any]:
        executor_id = next(iter(executors))
        _slot(template, executor_id)
        if not isinstance(addr, reservation.ReservationAddress):
            raise ValueError(
                f"cluster_meta['server_addr'] must be what reservation.Server.start() returned (it carries "
                f"the reservations' credentials), not {addr!r}"
            )
        spec = NodeSpec(
            address=addr.address,
            token=addr.token,
            job=addr.job,
            map_fun=_WithManager(fn, tuple(queues)),
            tf_args=tf_args,
            slots=_template_slots(template),
            tensorboard=tensorboard,
            log_dir=log_dir,
            default_fs=str(cluster_meta.get("default_fs", "file://")),
            working_dir=str(cluster_meta.get("working_dir", ".")),
            wait_timeout_s=float(cluster_meta.get("reservation_timeout", 600)),
            tls=TlsFiles(ca_pem=addr.ca_pem),
            queues=tuple(queues),
        )
        _run_node(spec, executor_id, addr, tf_args)
        return []

    return _mapfn


__all__ = ["TFNodeContext", "run"]
