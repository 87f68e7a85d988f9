"""Keras ``fit`` under MultiWorkerMirroredStrategy that survives a lost worker.

    tfcoord submit --engine local --workers 2 --max-restarts 2 -- \
        python examples/fault_tolerance/keras_fit.py --backup-dir /shared/backup --epochs 6

Each node gets ``TF_CONFIG`` from tfcoord. ``BackupAndRestore`` saves the training state at
the end of every epoch; when a worker is lost (preempted, OOM-killed), tfcoord restarts the
whole cluster as a new generation (``TFCOORD_RESTARTS`` says which) and ``fit`` resumes at
the epoch it was in, so the run ends after the same number of epochs as an undisturbed one.
The backup directory must be reachable by every node of every generation (HDFS, a shared
filesystem). Keras 3 cannot run ``fit`` under this strategy (keras-team/keras#20585): this
uses tf-keras (``TF_USE_LEGACY_KERAS=1``).
"""

import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--backup-dir", required=True)
p.add_argument("--epochs", type=int, default=6)
p.add_argument("--steps", type=int, default=8, help="steps per epoch")
args = p.parse_args()

task = json.loads(os.environ["TF_CONFIG"])["task"]
restarts = int(os.environ.get("TFCOORD_RESTARTS", "0"))
name = f"{task['type']}:{task['index']}"
strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(0)  # every worker the same data: the batches are split between them
x = rng.normal(size=(args.steps * 16, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")


class EpochLines(tf.keras.callbacks.Callback):
    """One line per epoch (``tfcoord submit`` shows it prefixed with the node's name)."""

    def on_epoch_end(self, epoch, logs=None):
        print(
            f"{name} pid {os.getpid()} generation {restarts}: epoch {epoch + 1}/{args.epochs} done",
            flush=True,
        )


backup = tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir)
model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps, callbacks=[backup, EpochLines()], verbose=0)
print(
    f"{name} generation {restarts}: trained {int(model.optimizer.iterations.numpy())} steps "
    f"in all ({args.epochs} epochs x {args.steps})",
    flush=True,
)
