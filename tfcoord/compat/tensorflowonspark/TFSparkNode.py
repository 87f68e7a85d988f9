"""TensorFlowOnSpark's ``TFSparkNode``: what its users import from it, the node context."""

from __future__ import annotations

from typing import Any

from tfcoord.node.context import TFNodeContext as _Context

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


__all__ = ["TFNodeContext"]
