"""A custom training loop under MultiWorkerMirroredStrategy that survives a lost worker.

    tfcoord submit --engine local --workers 2 --max-restarts 2 -- \
        python examples/fault_tolerance/custom_loop.py --checkpoint-dir /shared/ckpt --epochs 6

A ``tf.train.CheckpointManager`` saves the model, the optimizer and the epoch after every
epoch. When a worker is lost, tfcoord restarts the whole cluster as a new generation
(``TFCOORD_RESTARTS`` says which) and every worker restores the last checkpoint and goes on
from the epoch after it. As TensorFlow asks for multi-worker saving, every worker saves (the
save is a collective), the chief into the checkpoint directory and the others into a
directory of their own.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--checkpoint-dir", required=True)
p.add_argument("--epochs", type=int, default=6)
p.add_argument("--steps", type=int, default=8, help="steps per epoch")
args = p.parse_args()

task = json.loads(os.environ["TF_CONFIG"])["task"]
restarts = int(os.environ.get("TFCOORD_RESTARTS", "0"))
name = f"{task['type']}:{task['index']}"
strategy = tf.distribute.MultiWorkerMirroredStrategy()
chief = task["type"] == "chief" or (task["type"] == "worker" and task["index"] == 0)

rng = np.random.default_rng(0)
x = rng.normal(size=(args.steps * 16, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16))

with strategy.scope():
    w = tf.Variable(tf.zeros((4, 1)))
    optimizer = tf.keras.optimizers.SGD(0.05)
    epoch = tf.Variable(0, dtype=tf.int64)
    steps = tf.Variable(0, dtype=tf.int64)

directory = (
    args.checkpoint_dir if chief else os.path.join(args.checkpoint_dir, f"tmp-{name.replace(':', '-')}")
)
ckpt = tf.train.Checkpoint(w=w, optimizer=optimizer, epoch=epoch, steps=steps)
manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=2)
latest = tf.train.latest_checkpoint(args.checkpoint_dir)  # the chief's: every worker restores it
if latest:
    ckpt.restore(latest)


@tf.function
def train_step(iterator):
    def step(batch):
        bx, by = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((bx @ w - by) ** 2)
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
        steps.assign_add(1)
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step, args=(next(iterator),)), axis=None)


iterator = iter(data)
while int(epoch.numpy()) < args.epochs:
    for _ in range(args.steps):
        train_step(iterator)
    epoch.assign_add(1)
    manager.save(checkpoint_number=int(epoch.numpy()))
    print(
        f"{name} pid {os.getpid()} generation {restarts}: epoch {int(epoch.numpy())}/{args.epochs} done",
        flush=True,
    )
print(
    f"{name} generation {restarts}: trained {int(steps.numpy())} steps in all ({args.epochs} epochs x {args.steps})",
    flush=True,
)
