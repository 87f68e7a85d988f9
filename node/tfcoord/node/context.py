"""What a user's ``map_fun(args, ctx)`` receives: TensorFlowOnSpark's TFNodeContext, filled by tfcoord."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket

    from .ports import PortReservation


@dataclass
class TFNodeContext:
    """The node's place in the cluster, with TensorFlowOnSpark's attribute names.

    Attributes:
        executor_id: the node's slot, 0..N-1 (TensorFlowOnSpark's executor id).
        job_name: its role: ``ps``, ``chief``, ``master``, ``evaluator`` or ``worker``.
        task_index: its index within the role.
        cluster_spec: role → ``["host:port", ...]`` ordered by task index.
        num_workers: training tasks (chief/master plus workers).
        defaultFS: the Hadoop default filesystem (``file://`` or ``hdfs://namenode``).
        working_dir: the driver's working directory.
        resources: what this node's task was given: ``{"cpus": 2, "gpus": ["0"]}`` (the cpus of
            its Spark task, the GPU ids in ``CUDA_VISIBLE_DEVICES``), with ``"memory_mb"`` where
            its role asked for memory (``run(..., role_resources=...)``).
        restart_count: how many times the job has restarted its cluster before this run of
            map_fun (0 the first time; see ``run(..., max_restarts=N)``): resume from the
            last checkpoint when it is above 0.
    """

    executor_id: int
    job_name: str
    task_index: int
    cluster_spec: dict[str, list[str]]
    num_workers: int
    defaultFS: str = "file://"
    working_dir: str = ""
    #: The TensorFlow port this node registered (held until ``release_port``).
    port: int = 0
    job_id: str = ""
    restart_count: int = 0
    resources: dict[str, Any] = field(default_factory=dict)
    _release: Callable[[], None] | None = field(default=None, repr=False)
    #: The node's feed server (InputMode.SPARK on a chief, master or worker), else None.
    _feed: Any = field(default=None, repr=False)
    #: The reservation holding the TensorFlow port (a PortReservation), while map_fun runs.
    _port: PortReservation | None = field(default=None, repr=False)

    @property
    def tmp_socket(self) -> socket.socket | None:
        """The socket that holds this node's TensorFlow port until ``release_port()`` (TensorFlowOnSpark's
        name); None once released, and always None with ``release_port=True``."""
        return self._port.socket if self._port is not None else None

    @property
    def mgr(self) -> Any:
        """What ``TFNode.DataFeed(ctx.mgr, ...)`` takes (TensorFlowOnSpark's TFManager): the feed server."""
        return self._feed

    def get_data_feed(
        self,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: dict[str, str] | None = None,
    ) -> Any:
        """The data Spark feeds this node (``cluster.train`` / ``cluster.inference``).

        Returns a :class:`~tfcoord.node.datafeed.DataFeed`: ``next_batch(n)``,
        ``should_stop()``, ``batch_results(results)``, ``terminate()``, ``dataset(...)``.

        Raises:
            RuntimeError: the cluster was not started with ``input_mode=InputMode.SPARK``,
                or this node's role (ps, evaluator) is not fed.
        """
        from .datafeed import DataFeed

        return DataFeed(self._feed, train_mode, qname_in, qname_out, input_mapping)

    @property
    def worker_num(self) -> int:
        """TensorFlowOnSpark's other name for ``executor_id``."""
        return self.executor_id

    @property
    def tf_config(self) -> dict[str, Any]:
        return {"cluster": self.cluster_spec, "task": {"type": self.job_name, "index": self.task_index}}

    def report(self, **figures: int | float) -> bool:
        """Report progress figures (``ctx.report(step=step, loss=loss)``) for status and the dashboard.

        Call it as often as you like (every step): reports are coalesced and sent to the
        coordinator about once a second. Up to 16 numbers, named a letter then letters,
        digits, ``_`` or ``.``; NaN and infinities are skipped. Returns True if this report
        was passed on (False when rate limited, or outside a tfcoord node).
        """
        from .reporting import report

        return report(**figures)

    def release_port(self) -> None:
        """Free the reserved TensorFlow port; call it just before starting your own gRPC server.

        Needed only with ``release_port=False``; otherwise the port is free already.
        """
        if self._release is not None:
            self._release()
            self._release = None

    def start_cluster_server(self, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
        """Start this node's TensorFlow server: ``(tf.train.ClusterSpec, tf.distribute.Server)``.

        TensorFlowOnSpark's helper with TensorFlow 2 classes, for map functions that start
        their own gRPC server (ps/worker between-graph code). The server binds this node's
        registered port, which is released first (``release_port=False`` needs no extra
        call). GPUs were chosen when the node started (``tf_args.num_gpus``) and are in
        ``CUDA_VISIBLE_DEVICES``; ``num_gpus`` is accepted for the signature only.

        Args:
            rdma: use the ``grpc+verbs`` protocol (only TensorFlow builds with verbs have it).
        """
        import tensorflow as tf

        self.release_port()
        cluster = tf.train.ClusterSpec(self.cluster_spec)
        server = tf.distribute.Server(
            cluster,
            job_name=self.job_name,
            task_index=self.task_index,
            protocol="grpc+verbs" if rdma else "grpc",
            start=True,
        )
        return cluster, server

    @property
    def is_chief(self) -> bool:
        """The node that saves models: the chief or master, else worker 0 (TensorFlow's rule)."""
        if self.job_name in ("chief", "master"):
            return True
        return (
            self.job_name == "worker"
            and self.task_index == 0
            and not ({"chief", "master"} & set(self.cluster_spec))
        )

    def export_saved_model(
        self, model: Any, export_dir: str, is_chief: bool | None = None, signatures: Any = None
    ) -> None:
        """Save ``model`` as a SavedModel in ``export_dir``, on the chief only.

        Other nodes save to a temporary directory that is then removed: under
        MultiWorkerMirroredStrategy saving runs collective operations, so every worker
        must take part. ``is_chief`` defaults to :attr:`is_chief`. Keras models are saved
        with ``model.export``, anything else (a ``tf.Module``) with ``tf.saved_model.save``.
        """
        from .savedmodel import export_saved_model

        export_saved_model(model, export_dir, self.is_chief if is_chief is None else is_chief, signatures)

    def absolute_path(self, path: str) -> str:
        """Resolve ``path`` against the default filesystem (TensorFlowOnSpark's ``hdfs_path``).

        A path with a scheme is returned as is; an absolute path is put on ``defaultFS``;
        a relative one is under ``working_dir`` on a local filesystem, or the user's
        home directory (``/user/NAME``) on HDFS.
        """
        if "://" in path:
            return path
        fs = self.defaultFS or "file://"
        while fs.endswith("/") and not fs.endswith("://"):  # "hdfs://nn/" -> "hdfs://nn"; "file://" stays
            fs = fs[:-1]
        if path.startswith("/"):
            return fs + path  # file:///tmp/x (not file:/tmp/x, which TensorFlow takes for a relative path)
        if fs.startswith("file:") or not fs:
            return "file://" + os.path.join(self.working_dir or os.getcwd(), path)
        return f"{fs}/user/{getpass.getuser()}/{path}"
