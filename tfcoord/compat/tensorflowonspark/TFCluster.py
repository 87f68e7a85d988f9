"""``TFCluster.run`` and ``TFCluster.InputMode``, backed by tfcoord's coordinator."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from tfcoord import aliases
from tfcoord.driver.spark import InputMode, SparkCluster
from tfcoord.driver.spark import run as _run
from tfcoord.node import keras2

log = logging.getLogger("tfcoord.compat")

#: TensorFlowOnSpark's name for the object ``run`` returns.
TFCluster = SparkCluster


def with_aliases(sc: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for the driver, with ``import tensorflowonspark`` giving tfcoord's inside
    map_fun too: the shim shipped to ``sc``'s executors and the alias finder installed in
    each node's process before map_fun (see :mod:`tfcoord.aliases`)."""
    if aliases.installed() and aliases.ship_to_executors(sc):
        kwargs.setdefault("executor_setup", aliases.install)
    return kwargs


@functools.wraps(_run)
def run(
    sc: Any, map_fun: Any, tf_args: Any, num_executors: int, num_ps: int, *args: Any, **kwargs: Any
) -> SparkCluster:
    # Said once per cluster, so a log shows which TensorFlowOnSpark the program ran on.
    log.info("%s", aliases.describe("tensorflowonspark"))
    # TensorFlowOnSpark's programs are written for tf.keras 2: Keras 2 in the nodes when tf-keras is
    # installed there, unless the driver says TF_USE_LEGACY_KERAS=0 (tfcoord.node.keras2).
    kwargs.setdefault("legacy_keras", keras2.wanted(os.environ))
    return _run(sc, map_fun, tf_args, num_executors, num_ps, *args, **with_aliases(sc, kwargs))


__all__ = ["InputMode", "TFCluster", "run"]
