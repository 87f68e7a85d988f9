"""``TFCluster.run`` and ``TFCluster.InputMode``, backed by tfcoord's coordinator."""

from tfcoord.node.spark import InputMode, SparkCluster, run

#: TensorFlowOnSpark's name for the object ``run`` returns.
TFCluster = SparkCluster

__all__ = ["InputMode", "TFCluster", "run"]
