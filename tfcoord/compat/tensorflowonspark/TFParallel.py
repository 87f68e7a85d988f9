"""``TFParallel.run``: independent single-node TensorFlow jobs, one per executor."""

from __future__ import annotations

from typing import Any

from tfcoord.driver.spark import parallel

from .TFCluster import with_aliases


def run(sc: Any, map_fn: Any, tf_args: Any, num_executors: int, use_barrier: bool = True) -> None:
    """Run ``map_fn(tf_args, ctx)`` on ``num_executors`` executors, each on its own
    (TensorFlowOnSpark's signature; see :func:`tfcoord.driver.spark.parallel`)."""
    parallel(sc, map_fn, tf_args, num_executors, use_barrier, **with_aliases(sc, {}))


__all__ = ["run"]
