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

from . import marker


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
#: How long ``terminate`` keeps draining a TFManager queue that has gone quiet (TensorFlowOnSpark's 5 s).
DRAIN_QUIET_S = 5.0


def DataFeed(
    mgr: Any,
    train_mode: bool = True,
    qname_in: str = "input",
    qname_out: str = "output",
    input_mapping: dict[str, str] | None = None,
) -> Any:
    """The feed ``map_fun`` reads: over the network from ``ctx.mgr`` (a tfcoord node), or over the
    queues of a ``TFManager`` (``TFManager.start``), as TensorFlowOnSpark's DataFeed."""
    if hasattr(mgr, "get_queue"):
        return QueueDataFeed(mgr, train_mode, qname_in, qname_out, input_mapping)
    return _NetworkFeed(mgr, train_mode, qname_in, qname_out, input_mapping)


class QueueDataFeed:
    """TensorFlowOnSpark's DataFeed over a TFManager's queues: ``None`` ends the feed, an
    ``EndPartition`` marker ends a partition (inference batches stop there)."""

    def __init__(
        self,
        mgr: Any,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: dict[str, str] | None = None,
    ) -> None:
        self.mgr = mgr
        self.train_mode = train_mode
        self.qname_in = qname_in
        self.qname_out = qname_out
        self._queues: dict[str, Any] = {}
        self.done_feeding = False
        self.input_tensors = (
            [t for _, t in sorted(input_mapping.items())] if input_mapping is not None else None
        )

    def _queue(self, name: str) -> Any:
        queue = self._queues.get(name)
        if queue is not None:
            return queue
        queue = self.mgr.get_queue(name)
        if str(queue) == "None":  # the manager's answer for a name it does not serve
            raise ValueError(
                f"unknown queue {name!r}: this manager serves no such queue; name it in "
                "TFManager.start(authkey, queues)"
            )
        self._queues[name] = queue
        return queue

    def next_batch(self, batch_size: int) -> Any:
        """Up to ``batch_size`` items; fewer at the end of the feed (or of a partition, inference)."""
        queue = self._queue(self.qname_in)
        tensors: Any = [] if self.input_tensors is None else {t: [] for t in self.input_tensors}
        count = 0
        while count < batch_size:
            item = queue.get(block=True)
            queue.task_done()
            if item is None:
                self.done_feeding = True
                break
            if isinstance(item, marker.EndPartition):
                if not self.train_mode and count > 0:
                    break
                continue
            if self.input_tensors is None:
                tensors.append(item)
            else:
                for i, t in enumerate(self.input_tensors):
                    tensors[t].append(item[i])
            count += 1
        return tensors

    def should_stop(self) -> bool:
        return self.done_feeding

    def batch_results(self, results: Any) -> None:
        """Put one result per item of the last batch on the output queue."""
        queue = self._queue(self.qname_out)
        for item in results:
            queue.put(item, block=True)

    def terminate(self) -> None:
        """Take no more data: mark the manager terminating and drop what is queued."""
        from queue import Empty

        self.mgr.set("state", "terminating")
        queue = self._queue(self.qname_in)
        while True:
            try:
                queue.get(block=True, timeout=DRAIN_QUIET_S)
            except Empty:
                break
            queue.task_done()
        self.done_feeding = True


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


def _feed(mgr: Any, qname: str) -> Any:
    if not isinstance(mgr, FeedServer):
        return DataFeed(
            mgr, train_mode=False, qname_in=qname
        )  # a TFManager's queues, or the "no data feed" error
    feeds = _feeds.setdefault(mgr, {})
    if qname not in feeds:
        # Never across two partitions, so the same calls serve inference (batch_results).
        feeds[qname] = _NetworkFeed(mgr, train_mode=False, qname_in=qname)
    return feeds[qname]


def next_batch(mgr: Any, batch_size: int, qname: str = "input") -> list[Any]:
    """Up to ``batch_size`` records from queue ``qname``; ``[]`` once the feed has ended.

    A batch never spans two partitions, so it may be shorter at a partition's end.
    """
    feed = _feed(mgr, qname)
    _last[mgr] = feed
    return feed.next_batch(batch_size)


def batch_results(mgr: Any, results: Any, qname: str = "output") -> None:
    """One result per record of the last ``next_batch``, in order (``cluster.inference``), on
    queue ``qname``: the feeding tasks read it (``cluster.inference(..., qname_out=...)``)."""
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
