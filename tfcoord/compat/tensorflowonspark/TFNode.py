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
from tfcoord.node.datafeed import DataFeed, FeedServer
from tfcoord.node.savedmodel import export_saved_model as _export

#: The function forms keep one DataFeed per queue of a node's feed, and remember which one
#: served the last batch, for batch_results.
_feeds: weakref.WeakKeyDictionary[FeedServer, dict[str, DataFeed]] = weakref.WeakKeyDictionary()
_last: weakref.WeakKeyDictionary[FeedServer, DataFeed] = weakref.WeakKeyDictionary()


def hdfs_path(ctx: TFNodeContext, path: str) -> str:
    """Resolve ``path`` against the cluster's default filesystem (see ``TFNodeContext.absolute_path``)."""
    return ctx.absolute_path(path)


def start_cluster_server(ctx: TFNodeContext, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
    """``(tf.train.ClusterSpec, tf.distribute.Server)`` for this node (``TFNodeContext.start_cluster_server``)."""
    return ctx.start_cluster_server(num_gpus, rdma)


def export_saved_model(model: Any, export_dir: str, is_chief: bool = False, signatures: Any = None) -> None:
    """Save ``model`` as a SavedModel in ``export_dir`` on the chief; other nodes' copies are discarded."""
    _export(model, export_dir, is_chief, signatures)


def release_port(ctx: TFNodeContext) -> None:
    """Free the node's reserved TensorFlow port (``TFNodeContext.release_port``)."""
    ctx.release_port()


def _feed(mgr: Any, qname: str) -> DataFeed:
    if not isinstance(mgr, FeedServer):
        return DataFeed(mgr)  # raises the "no data feed" error
    feeds = _feeds.setdefault(mgr, {})
    if qname not in feeds:
        # Never across two partitions, so the same calls serve inference (batch_results).
        feeds[qname] = DataFeed(mgr, train_mode=False, qname_in=qname)
    return feeds[qname]


def next_batch(mgr: Any, batch_size: int, qname: str = "input") -> list[Any]:
    """Up to ``batch_size`` records from queue ``qname``; ``[]`` once the feed has ended.

    A batch never spans two partitions, so it may be shorter at a partition's end.
    """
    feed = _feed(mgr, qname)
    _last[mgr] = feed
    return feed.next_batch(batch_size)


def batch_results(mgr: Any, results: Any, qname: str = "output") -> None:
    """One result per record of the last ``next_batch``, in order (``cluster.inference``).

    ``qname`` is accepted for compatibility: results go back to the feeding tasks directly.
    """
    feed = _last.get(mgr) if isinstance(mgr, FeedServer) else None
    if feed is None:
        raise RuntimeError("batch_results() before next_batch(): there is no batch to answer")
    feed.batch_results(results)


def terminate(mgr: Any, qname: str = "input") -> None:
    """Stop the feed early and ask the job to stop (``DataFeed.terminate``)."""
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
