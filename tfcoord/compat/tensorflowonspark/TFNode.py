"""TensorFlowOnSpark's ``TFNode``: the helpers map functions call, and ``DataFeed``.

Every name TensorFlowOnSpark 2.2.5's ``TFNode`` has, working where 2.2.5 only raises
"DEPRECATED": ``start_cluster_server`` (2.2.5 raises under TensorFlow 2) returns a
``tf.train.ClusterSpec`` and a started ``tf.distribute.Server``; ``export_saved_model``
(2.2.5 has TensorFlow 1's ``(sess, export_dir, tag_set, signatures)``, refused under
TensorFlow 2) takes a model, as ``tensorflowonspark.compat.export_saved_model`` does, and
keeps the chief's copy only; ``next_batch``, ``batch_results`` and ``terminate`` (2.2.5
always raises) work on ``ctx.mgr`` as in TensorFlowOnSpark 1.x.
"""

from __future__ import annotations

import weakref
from typing import Any

from tfcoord.node.context import TFNodeContext
from tfcoord.node.datafeed import DataFeed as _NetworkFeed
from tfcoord.node.datafeed import FeedServer
from tfcoord.node.savedmodel import export_saved_model as _export

from . import TFManager


def _tf_version() -> str:
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


#: The installed TensorFlow's version ("" without one), as TensorFlowOnSpark's TFNode has it.
TF_VERSION = _tf_version()


def _server(mgr: Any) -> Any:
    """The feed server behind ``mgr``: a node's (``ctx.mgr``), or a TFManager's."""
    return mgr.server if isinstance(mgr, TFManager.TFManager) else mgr


class ManagerFeed(_NetworkFeed):
    """The feed of a ``TFManager``'s queues, which refuses a queue it does not serve where the
    queue is used, as TensorFlowOnSpark's does (its ``output`` only in ``batch_results``)."""

    def __init__(
        self,
        mgr: TFManager.TFManager,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: dict[str, str] | None = None,
    ) -> None:
        self.manager = mgr
        self._served(qname_in, "qname_in")
        super().__init__(mgr.server, train_mode, qname_in, qname_out, input_mapping)

    def _served(self, qname: str, what: str) -> None:
        if qname not in self.manager.queues:
            raise ValueError(
                f"unknown queue {qname!r} ({what}): this manager serves {list(self.manager.queues)}; "
                "name it in TFManager.start(authkey, queues)"
            )

    def batch_results(self, results: Any) -> None:
        self._served(self.qname_out, "qname_out")
        super().batch_results(results)


def DataFeed(
    mgr: Any,
    train_mode: bool = True,
    qname_in: str = "input",
    qname_out: str = "output",
    input_mapping: dict[str, str] | None = None,
) -> _NetworkFeed:
    """The feed ``map_fun`` reads: a node's (``ctx.mgr``, fed over the network by
    ``cluster.train``/``cluster.inference``), or a ``TFManager``'s queues: ``None`` ends the
    feed, an ``EndPartition`` marker ends a partition (inference batches stop there)."""
    if isinstance(mgr, TFManager.TFManager):
        return ManagerFeed(mgr, train_mode, qname_in, qname_out, input_mapping)
    return _NetworkFeed(mgr, train_mode, qname_in, qname_out, input_mapping)


#: The function forms keep one DataFeed per queue of a node's feed, and remember which one
#: served the last batch, for batch_results.
_feeds: weakref.WeakKeyDictionary[FeedServer, dict[str, _NetworkFeed]] = weakref.WeakKeyDictionary()
_last: weakref.WeakKeyDictionary[FeedServer, _NetworkFeed] = weakref.WeakKeyDictionary()


def hdfs_path(ctx: TFNodeContext, path: str) -> str:
    """Resolve ``path`` against the cluster's default filesystem (see ``TFNodeContext.absolute_path``)."""
    # Any object with defaultFS and working_dir will do, as in TensorFlowOnSpark (its tests pass a stand-in).
    return TFNodeContext.absolute_path(ctx, path)


def start_cluster_server(ctx: TFNodeContext, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
    """``(tf.train.ClusterSpec, tf.distribute.Server)`` for this node (``TFNodeContext.start_cluster_server``)."""
    return ctx.start_cluster_server(num_gpus, rdma)


def export_saved_model(model: Any, export_dir: str, is_chief: bool = False, signatures: Any = None) -> None:
    """Save ``model`` as a SavedModel in ``export_dir`` on the chief; other nodes' copies are discarded."""
    _export(model, export_dir, is_chief, signatures)


def release_port(ctx: TFNodeContext) -> None:
    """Free the node's reserved TensorFlow port (``TFNodeContext.release_port``)."""
    ctx.release_port()


def _feed(mgr: Any, qname: str) -> _NetworkFeed:
    server = _server(mgr)
    if not isinstance(server, FeedServer):
        return DataFeed(mgr, train_mode=False, qname_in=qname)  # the "no data feed" error
    feeds = _feeds.setdefault(server, {})
    if qname not in feeds:
        # Never across two partitions, so the same calls serve inference (batch_results).
        feeds[qname] = DataFeed(mgr, train_mode=False, qname_in=qname)
    return feeds[qname]


def next_batch(mgr: Any, batch_size: int, qname: str = "input") -> list[Any]:
    """Up to ``batch_size`` records from queue ``qname``; ``[]`` once the feed has ended.

    A batch never spans two partitions, so it may be shorter at a partition's end.
    """
    feed = _feed(mgr, qname)
    _last[feed.server] = feed
    batch: list[Any] = feed.next_batch(batch_size)
    return batch


def batch_results(mgr: Any, results: Any, qname: str = "output") -> None:
    """One result per record of the last ``next_batch``, in order (``cluster.inference``), on
    queue ``qname``: the feeding tasks read it (``cluster.inference(..., qname_out=...)``)."""
    mgr = _server(mgr)
    feed = _last.get(mgr) if isinstance(mgr, FeedServer) else None
    if feed is None:
        raise RuntimeError("batch_results() before next_batch(): there is no batch to answer")
    mgr.check_queue(qname, "qname")
    feed.qname_out = qname
    feed.batch_results(results)


def terminate(mgr: Any, qname: str = "input") -> None:
    """End this node's feed early (``DataFeed.terminate``): its feeding tasks skip the rest of
    their partitions, the other nodes are fed on."""
    _feed(mgr, qname).terminate()


__all__ = [
    "DataFeed",
    "batch_results",
    "export_saved_model",
    "hdfs_path",
    "next_batch",
    "release_port",
    "start_cluster_server",
    "terminate",
]
