"""Distributed TensorFlow on Spark with tfcoord: MultiWorkerMirroredStrategy, custom training loop.

Run it on any Spark master (this is what ``make demo`` does on a local standalone cluster):

    tfcoord submit --engine spark --master spark://HOST:7077 --num-executors 2 --tensorboard \\
        -- examples/spark_train.py --steps 60

Each executor runs ``main_fun(args, ctx)`` with ``TF_CONFIG`` already set by the coordinator;
the dict it returns shows up in the job's status (``tfcoord status JOB``).
"""

from __future__ import annotations

import argparse
import os


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="spark_train.py")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    return ap.parse_args(argv)


def main_fun(argv: list[str], ctx) -> dict:
    import numpy as np
    import tensorflow as tf

    args = parse(list(argv))
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(1234)
    x = rng.normal(size=(1024, 1)).astype("float32")
    y = (3 * x + 2 + 0.01 * rng.normal(size=(1024, 1))).astype("float32")
    with strategy.scope():
        w = tf.Variable(0.0)
        b = tf.Variable(0.0)
        opt = tf.keras.optimizers.SGD(0.2)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch)
    batches = iter(strategy.experimental_distribute_dataset(ds))

    @tf.function
    def step(batch):
        def replica(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((w * xb + b - yb) ** 2) / strategy.num_replicas_in_sync
            opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b], strict=True))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica, args=batch), axis=None)

    # Worker 0 writes summaries where TensorBoard (started beside it) reads them.
    logdir = os.environ.get("TFCOORD_LOG_DIR", "tensorboard")
    writer = tf.summary.create_file_writer(logdir) if ctx.task_index == 0 else tf.summary.create_noop_writer()
    loss = 0.0
    with writer.as_default():
        for i in range(args.steps):
            loss = float(step(next(batches)))
            tf.summary.scalar("loss", loss, step=i)
    writer.flush()
    return {"final_loss": round(loss, 6), "w": round(float(w.numpy()), 4), "b": round(float(b.numpy()), 4)}
