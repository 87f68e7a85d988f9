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

tf-keras (2.11+) still accepts ``lr=`` but drops the value with a warning, so
``Adam(lr=0.2)`` trains at the default 0.001: code written for the Keras 2 TensorFlowOnSpark
knew, where ``lr`` was the learning rate, silently trains far more slowly. Where Keras 2 is
switched on for such code, :func:`honour_lr` makes ``lr=`` the learning rate again.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("tfcoord.node.keras2")

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


#: The tf-keras module whose optimizer base class drops ``lr=``.
OPTIMIZER_MODULE = "tf_keras.src.optimizers.optimizer"
#: Where an optimizer holds its ``lr=`` from ``_process_kwargs`` until ``_build_learning_rate``.
_PENDING_LR = "_tfcoord_lr"


def honour_lr() -> None:
    """Make tf-keras' optimizers take ``lr=`` as the learning rate, as Keras 2 before 2.11 did
    (``lr`` wins over ``learning_rate``, as it did there). Applies now if tf-keras' optimizers
    are imported already, otherwise when they are; TensorFlow is not imported here, so a
    ``map_fun`` still sets ``CUDA_VISIBLE_DEVICES`` before it does."""
    module = sys.modules.get(OPTIMIZER_MODULE)
    if module is not None:
        _patch_lr(module)
    elif not any(isinstance(f, _AfterImport) and f.name == OPTIMIZER_MODULE for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(OPTIMIZER_MODULE, _patch_lr))


def _patch_lr(module: ModuleType) -> None:
    base = getattr(module, "_BaseOptimizer", None)
    if base is None or not all(hasattr(base, a) for a in ("_process_kwargs", "_build_learning_rate")):
        log.warning(
            "tfcoord: this tf-keras has no _BaseOptimizer hooks; lr= keeps tf-keras' meaning (ignored)"
        )
        return
    if getattr(base, _PENDING_LR + "_honoured", False):
        return
    process, build = base._process_kwargs, base._build_learning_rate
    said: list[str] = []

    def _process_kwargs(self: Any, kwargs: dict[str, Any]) -> Any:
        lr = kwargs.pop("lr", None)
        if lr is not None:
            setattr(self, _PENDING_LR, lr)
            if not said:
                said.append(type(self).__name__)
                log.warning(
                    "tfcoord: %s(lr=%s) trains at learning rate %s, as Keras 2 before 2.11 did "
                    "(tf-keras would ignore lr=); write learning_rate= to say it the current way",
                    type(self).__name__,
                    lr,
                    lr,
                )
        return process(self, kwargs)

    def _build_learning_rate(self: Any, learning_rate: Any) -> Any:
        lr = self.__dict__.pop(_PENDING_LR, None)
        return build(self, learning_rate if lr is None else lr)

    base._process_kwargs, base._build_learning_rate = _process_kwargs, _build_learning_rate
    setattr(base, _PENDING_LR + "_honoured", True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after module ``name`` is executed, whoever imports it, once."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once, and not found again by the lookup below
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, then: Callable[[ModuleType], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename... for tracebacks
        return getattr(self._loader, name)
