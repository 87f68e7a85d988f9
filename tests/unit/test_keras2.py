"""tfcoord.node.keras2: when TensorFlowOnSpark-compatible code gets Keras 2 as tf.keras."""

from __future__ import annotations

import pytest

from tfcoord.node import keras2


def test_set_when_unset_and_tf_keras_is_installed() -> None:
    env: dict[str, str] = {}
    assert keras2.use_keras2(env, have_tf_keras=True) and env == {"TF_USE_LEGACY_KERAS": "1"}
    assert keras2.wanted({})


@pytest.mark.parametrize("value", ["0", "false", "OFF"])
def test_an_explicit_no_is_the_opt_out(value: str) -> None:
    env = {"TF_USE_LEGACY_KERAS": value}
    assert not keras2.use_keras2(env, have_tf_keras=True) and env == {"TF_USE_LEGACY_KERAS": value}
    assert not keras2.wanted(env)


def test_without_tf_keras_tf_keras_stays_keras_3() -> None:
    env: dict[str, str] = {}
    assert not keras2.use_keras2(env, have_tf_keras=False) and env == {}


def test_tf_keras_is_found_when_installed() -> None:
    import importlib.util

    assert keras2.tf_keras_installed() == (importlib.util.find_spec("tf_keras") is not None)
