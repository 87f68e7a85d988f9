"""Saving a model from a node: only the chief's copy is kept (TensorFlow 2's multi-worker rule)."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any


def export_saved_model(model: Any, export_dir: str, is_chief: bool = False, signatures: Any = None) -> None:
    """Save ``model`` as a SavedModel in ``export_dir`` when ``is_chief``, else to a scratch directory.

    Every worker saves because, under MultiWorkerMirroredStrategy, saving runs collective
    operations that all workers must join; only the chief's copy is kept (TensorFlow's
    multi-worker tutorial does the same). TensorFlowOnSpark's ``compat.export_saved_model``
    saved the others into ``worker_model`` in the current directory and left it there.

    Raises:
        TypeError: called TensorFlow 1's way, ``(sess, export_dir, tag_set, signatures)``.
    """
    given: object = is_chief  # untyped callers may pass TensorFlow 1's tag_set here
    if isinstance(given, str):
        raise TypeError(
            "export_saved_model(sess, export_dir, tag_set, signatures) is TensorFlow 1's form; "
            "TensorFlowOnSpark 2 refuses it under TensorFlow 2 too. Pass the model: "
            "export_saved_model(model, export_dir, is_chief=ctx.is_chief)"
        )
    import tensorflow as tf

    target = export_dir if is_chief else tempfile.mkdtemp(prefix="tfcoord-worker-model-")
    try:
        if signatures is None and _is_keras2(model):
            # Keras 2's own SavedModel: its serving_default signature names inputs and
            # outputs after the layers ("conv2d_input" -> "dense_1"), as the programs
            # written for TensorFlowOnSpark read them; export() would name them output_0.
            model.save(target, save_format="tf")
        elif signatures is None and callable(getattr(model, "export", None)):  # Keras 3
            model.export(target)
        else:
            tf.saved_model.save(model, target, signatures=signatures)
    finally:
        if not is_chief:
            shutil.rmtree(target, ignore_errors=True)


def _is_keras2(model: Any) -> bool:
    """Whether ``model`` is a tf_keras (Keras 2) model, not a Keras 3 one."""
    return any(c.__module__.split(".")[0] == "tf_keras" for c in type(model).__mro__)
