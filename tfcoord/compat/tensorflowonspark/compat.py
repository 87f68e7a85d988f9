"""``tensorflowonspark.compat``: helpers over TensorFlow API changes, for the user's TensorFlow code."""

from __future__ import annotations

from typing import Any

from tfcoord.node.savedmodel import export_saved_model as _export


def export_saved_model(model: Any, export_dir: str, is_chief: bool = False) -> None:
    """Save ``model`` as a SavedModel in ``export_dir`` on the chief; other nodes' copies are discarded."""
    _export(model, export_dir, is_chief)


def disable_auto_shard(options: Any) -> None:
    """Turn off tf.data auto-sharding in ``options`` (a ``tf.data.Options``): fed data is sharded already."""
    import tensorflow as tf

    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF


def is_gpu_available() -> bool:
    """Whether TensorFlow sees a GPU (the ones in ``CUDA_VISIBLE_DEVICES``)."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU")) > 0


__all__ = ["disable_auto_shard", "export_saved_model", "is_gpu_available"]
