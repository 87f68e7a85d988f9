"""TensorFlowOnSpark's ``TFSparkNode``: the node context, and ``run`` on a reservation server.

``TFCluster.run`` never comes here: its nodes register with tfcoord's coordinator. ``run`` is
TensorFlowOnSpark's lower-level node launcher for programs (and TensorFlowOnSpark's own tests)
that drive it directly with a ``reservation.Server``: the Spark task registers this node's
address there, waits until every node did, sets ``TF_CONFIG``, picks GPUs as
TensorFlowOnSpark does and runs ``fn(tf_args, ctx)`` in the task (``background=False``, the
InputMode.TENSORFLOW way). ``background=True`` is the InputMode.SPARK way, whose feeding
half is tfcoord's own: it is refused with a pointer to ``TFCluster.run``.

GPUs, TensorFlowOnSpark's rule: ``tf_args.num_gpus`` if given (then required), else one when
the host has any. Spark's resource API (3.0+) assigns them when the task has ``gpu``
resources; on Kubernetes (``SPARK_EXECUTOR_POD_IP``) nothing else may, so without them the
node runs on the CPU, or fails if GPUs were asked for; elsewhere ``gpu_info.get_gpus`` picks
free ones, offset by this node's place among the nodes on its host.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tfcoord.node.context import TFNodeContext as _Context
from tfcoord.node.ports import PortReservation
from tfcoord.node.tensorboard import TensorBoard

from . import TFManager, gpu_info, reservation, util

log = logging.getLogger("tfcoord.compat")

#: Roles that train (TensorFlowOnSpark counts them as num_workers).
_TRAINING_ROLES = ("chief", "master", "worker")


class TFNodeContext(_Context):
    """The node context, constructible as TensorFlowOnSpark's: ``TFNodeContext(executor_id=0,
    job_name='', task_index=0, cluster_spec={}, defaultFS='file://', working_dir='.', mgr=None)``.

    ``num_workers`` is counted from ``cluster_spec``, and ``mgr`` becomes the context's feed
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
        kw.setdefault("num_workers", sum(len(v) for k, v in spec.items() if k in _TRAINING_ROLES))
        super().__init__(
            executor_id=executor_id,
            job_name=job_name,
            task_index=task_index,
            cluster_spec=spec,
            defaultFS=defaultFS,
            working_dir=working_dir,
            **kw,
        )
        self._feed = mgr


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


def _tensorboard_here(template: Mapping[str, Sequence[int]], job_name: str, task_index: int) -> bool:
    """TensorBoard runs beside the chief (or master), else beside worker 0."""
    if "chief" in template or "master" in template:
        return job_name in ("chief", "master")
    return (job_name, task_index) == ("worker", 0)


def _reserve(
    server_addr: Any,
    executor_id: int,
    job_name: str,
    task_index: int,
    host: str,
    port: int,
    board: TensorBoard | None,
) -> dict[str, list[str]]:
    """Register this node with the reservation server; the cluster spec once every node did."""
    tb_url = board.wait_url() if board is not None else None
    with reservation.Client(server_addr) as client:
        client.register(
            {
                "executor_id": executor_id,
                "host": host,
                "job_name": job_name,
                "task_index": task_index,
                "port": port,
                "tb_pid": board.proc.pid if board is not None else 0,
                "tb_port": int(tb_url.rsplit(":", 1)[1]) if tb_url else 0,
            }
        )
        cluster_info = sorted(client.await_reservations(), key=lambda n: n["executor_id"])
    return _get_cluster_spec(cluster_info)


def _use_gpus(tf_args: Any, spec: Mapping[str, list[str]], job_name: str, task_index: int) -> None:
    """Set ``CUDA_VISIBLE_DEVICES`` by TensorFlowOnSpark's rule (see the module's docstring)."""
    n = tf_args.get("num_gpus") if isinstance(tf_args, Mapping) else getattr(tf_args, "num_gpus", None)
    required = n is not None
    num_gpus = int(n) if required else (1 if gpu_info.is_gpu_available() else 0)

    def place() -> int:
        mine = spec[job_name][task_index]
        on_host = [
            a for addrs in spec.values() for a in addrs if a.rsplit(":", 1)[0] == mine.rsplit(":", 1)[0]
        ]
        return on_host.index(mine)

    gpus = _task_gpus(num_gpus, required, place) if num_gpus > 0 else []
    log.info("%s:%d uses %s", job_name, task_index, f"GPU(s) {','.join(gpus)}" if gpus else "the CPU")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)


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
        cluster_meta: TensorFlowOnSpark's: ``server_addr`` (the reservation server),
            ``cluster_template`` (role → executor ids), ``default_fs``, ``working_dir``.
        tensorboard: start TensorBoard on ``log_dir`` beside the chief (else worker 0).
        queues: the names of the node's TFManager queues (``ctx.mgr``).
        background: must be False (see the module's docstring).
    """
    if background:
        raise ValueError(
            "TFSparkNode.run(background=True) is TensorFlowOnSpark's InputMode.SPARK launcher, whose "
            "feeding tfcoord does itself: use TFCluster.run(sc, map_fun, tf_args, num_executors, num_ps, "
            "input_mode=TFCluster.InputMode.SPARK)"
        )
    template = {role: list(ids) for role, ids in cluster_meta["cluster_template"].items()}

    def _mapfn(executors: Iterable[int]) -> list[Any]:
        executor_id = next(iter(executors))
        job_name, task_index = _slot(template, executor_id)
        host = util.get_ip_address()
        board = None
        with PortReservation() as port:
            try:
                if tensorboard and _tensorboard_here(template, job_name, task_index):
                    logdir = log_dir or os.path.join(str(cluster_meta.get("working_dir", ".")), "tensorboard")
                    board = TensorBoard(logdir, host)
                spec = _reserve(
                    cluster_meta["server_addr"], executor_id, job_name, task_index, host, port.port, board
                )
                log.info("%s:%d of %s", job_name, task_index, spec)
                _use_gpus(tf_args, spec, job_name, task_index)
                os.environ["TF_CONFIG"] = json.dumps(
                    {"cluster": spec, "task": {"type": job_name, "index": task_index}}
                )
                port.release()  # TensorFlow binds it now
                mgr = TFManager.start(os.urandom(16), list(queues), "local")
                try:
                    ctx = TFNodeContext(
                        executor_id,
                        job_name,
                        task_index,
                        spec,
                        cluster_meta.get("default_fs", "file://"),
                        cluster_meta.get("working_dir", "."),
                        mgr,
                    )
                    if isinstance(tf_args, list):
                        sys.argv = list(tf_args)  # argparse in fn sees tf_args, as TensorFlowOnSpark does
                    fn(tf_args, ctx)
                finally:
                    mgr.shutdown()
            finally:
                if board is not None:
                    board.stop()
        return []

    return _mapfn


__all__ = ["TFNodeContext", "run"]
