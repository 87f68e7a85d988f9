"""Keras 2 for TensorFlowOnSpark's programs: ``tf.keras`` as tf-keras when it is installed.

TensorFlow 2.16+ makes ``tf.keras`` Keras 3, and Keras 3's ``model.fit`` fails under
MultiWorkerMirroredStrategy and ParameterServerStrategy (keras-team/keras#20585:
"unsupported type PerReplica"); it also refuses Keras 2 spellings TensorFlowOnSpark's
examples and tests use (``Adam(lr=...)``). TensorFlow's own switch,
``TF_USE_LEGACY_KERAS=1``, read when ``tf.keras`` is first used, makes ``tf.keras`` the
``tf_keras`` package (Keras 2) instead.

TensorFlowOnSpark-compatible nodes (``tensorflowonspark.TFCluster.run``) and the driver of
its pipeline API set it, when tf-keras is installed, before the user's code imports
TensorFlow. It is only ever set when unset, so ``TF_USE_LEGACY_KERAS=0`` on the driver
(for the nodes it starts) or in an executor's environment is the opt-out. Programs written
for Keras 3 keep working: ``import keras`` is Keras 3 either way, and tfcoord's own
``run`` leaves ``tf.keras`` alone.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, MutableMapping

ENV = "TF_USE_LEGACY_KERAS"
#: Values of ENV that mean "no": TensorFlow reads "1"/"true" as yes.
OFF = ("0", "false", "no", "off")


def tf_keras_installed() -> bool:
    return importlib.util.find_spec("tf_keras") is not None


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` leaves Keras 2 on: ``TF_USE_LEGACY_KERAS`` unset or not "0"."""
    return environ.get(ENV, "1").strip().lower() not in OFF


def use_keras2(environ: MutableMapping[str, str], have_tf_keras: bool | None = None) -> bool:
    """Set ``TF_USE_LEGACY_KERAS=1`` in ``environ`` unless it is set already or tf-keras is missing.

    ``have_tf_keras``: whether tf-keras is installed (default: look). Returns whether
    ``tf.keras`` will be Keras 2 (in a process that has not used it yet).
    """
    have = tf_keras_installed() if have_tf_keras is None else have_tf_keras
    if ENV not in environ and have:
        environ[ENV] = "1"
    return environ.get(ENV, "").strip().lower() not in ("", *OFF)


def keras2_too_late() -> bool:
    """TensorFlow is imported already in this process: switching ``tf.keras`` may no longer work."""
    return "tensorflow" in sys.modules
