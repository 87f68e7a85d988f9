"""tfcoord.node.keras2: when TensorFlowOnSpark-compatible code gets Keras 2 as tf.keras."""

from __future__ import annotations

import os
import subprocess
import sys

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


#: Builds optimizers as TensorFlowOnSpark-era code does; honour_lr() runs before tf-keras is
#: imported ("before", as in a node) or after (a driver that imported TensorFlow first).
LR_PROGRAM = """
import sys
from tfcoord.node import keras2
if sys.argv[1] == "before":
    keras2.honour_lr()
import tensorflow as tf
tf.keras.optimizers.SGD(learning_rate=0.1)  # tf-keras' optimizers are imported now
if sys.argv[1] == "after":
    keras2.honour_lr()
    keras2.honour_lr()  # twice is once
opt = tf.keras.optimizers
print(tf.keras.__name__.split(".")[0])
print(float(opt.Adam(lr=0.2).learning_rate), float(opt.RMSprop(learning_rate=0.3, lr=0.05).learning_rate))
print(float(opt.SGD(0.01).learning_rate), float(opt.Adam(learning_rate=0.3).learning_rate), float(opt.Adam().learning_rate))
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
def test_lr_is_the_learning_rate_in_keras_2(when: str) -> None:
    """tf-keras drops Adam(lr=0.2) (0.001 remains); TensorFlowOnSpark-era code meant 0.2."""
    if not keras2.tf_keras_installed():
        pytest.skip("tf-keras is not installed (make install adds it)")
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-c", LR_PROGRAM, when], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    keras, given, plain = out.stdout.split("\n")[:3]
    assert keras == "tf_keras"
    assert [round(float(v), 6) for v in given.split()] == [0.2, 0.05]  # lr wins, as in Keras 2.10
    assert [round(float(v), 6) for v in plain.split()] == [0.01, 0.3, 0.001]  # the rest is unchanged
    said = [line for line in out.stderr.splitlines() if "lr=" in line and line.startswith("tfcoord:")]
    assert said == [
        "tfcoord: Adam(lr=0.2) trains at learning rate 0.2, as Keras 2 before 2.11 did "
        "(tf-keras would ignore lr=); write learning_rate= to say it the current way"
    ]
