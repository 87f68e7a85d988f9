"""``TFParallel.run``: independent single-node TensorFlow jobs, one per executor."""

from tfcoord.node.spark import parallel as run

__all__ = ["run"]
