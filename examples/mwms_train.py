"""Tiny MultiWorkerMirroredStrategy training job used as a tfcoord example.

Fits a linear regression ``y = 3x + 2 + noise`` on deterministic synthetic
data with a *custom* training loop (``strategy.run`` / ``strategy.reduce`` /
``optimizer.apply_gradients`` inside a ``tf.function``).  Keras ``model.fit``
is deliberately avoided: it does not work under MultiWorkerMirroredStrategy
with Keras 3 (keras-team/keras#20585).

The cluster is read from the ``TF_CONFIG`` environment variable, which the
tfcoord coordinator sets for every worker, e.g.::

    {"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]},
     "task": {"type": "worker", "index": 0}}

A one-worker cluster (or no ``TF_CONFIG`` at all) works too.

Run it through tfcoord::

    tfcoord submit --engine local --workers 2 -- python examples/mwms_train.py

Every worker ends by printing exactly one line of the form::

    final loss <loss, 6 decimals> weights <w> <b>

Because gradients are all-reduced across workers, the line is identical on
every worker, so tests can compare worker outputs.

Flags:
  --steps N            number of training steps (default 30)
  --fail-on-worker K   worker K raises RuntimeError at the first step (for
                       testing failure propagation)
  --log-dir DIR        worker 0 (the chief) writes a tf.summary "loss" scalar
                       to DIR
"""

import argparse
import importlib.util
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

NUM_EXAMPLES = 256
GLOBAL_BATCH_SIZE = 32
LEARNING_RATE = 0.3
SEED = 1234


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="number of training steps (default: 30)")
    parser.add_argument(
        "--fail-on-worker",
        type=int,
        default=None,
        metavar="K",
        help="raise RuntimeError on worker K at the first step",
    )
    parser.add_argument(
        "--log-dir", default=None, metavar="DIR", help="write a tf.summary loss scalar here from the chief"
    )
    return parser.parse_args(argv)


def task_from_tf_config():
    """Return (task_type, task_index) from TF_CONFIG, defaulting to worker 0."""
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = tf_config.get("task") or {}
    return task.get("type", "worker"), int(task.get("index", 0))


def write_loss_summary(loss, step):
    """Write a "loss" scalar summary to the default tf.summary writer.

    tf.summary.scalar is implemented by TensorBoard, which recent
    TensorFlow wheels no longer install.  Without it, write the same
    scalar-plugin summary through the core tf.summary.write op.
    """
    if importlib.util.find_spec("tensorboard") is not None:
        tf.summary.scalar("loss", loss, step=step)
        return
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    metadata.data_class = summary_pb2.DATA_CLASS_SCALAR
    tf.summary.write("loss", tf.constant(loss, dtype=tf.float32), step=step, metadata=metadata)


def make_data():
    """Deterministic synthetic data, identical on every worker."""
    rng = np.random.default_rng(SEED)
    x = rng.uniform(-1.0, 1.0, size=(NUM_EXAMPLES, 1)).astype(np.float32)
    noise = rng.normal(0.0, 0.01, size=(NUM_EXAMPLES, 1)).astype(np.float32)
    y = 3.0 * x + 2.0 + noise
    return x, y


def main(argv=None):
    args = parse_args(argv)
    task_type, task_index = task_from_tf_config()
    # Worker 0 acts as chief (tfcoord clusters have no separate "chief" job).
    is_chief = task_type == "chief" or (task_type == "worker" and task_index == 0)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    x, y = make_data()

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH_SIZE)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.repeat().batch(batch, drop_remainder=True)

    dist_ds = strategy.distribute_datasets_from_function(dataset_fn)

    with strategy.scope():
        w = tf.Variable(0.0, name="w")
        b = tf.Variable(0.0, name="b")
        optimizer = tf.keras.optimizers.SGD(learning_rate=LEARNING_RATE)

    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            pred = features * w + b
            per_example = tf.reduce_sum(tf.square(pred - labels), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
        grads = tape.gradient(loss, [w, b])
        # Inside a replica context the optimizer all-reduces the gradients.
        optimizer.apply_gradients(zip(grads, [w, b], strict=True))
        return loss

    @tf.function
    def train_step(inputs):
        per_replica_loss = strategy.run(step_fn, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)

    writer = None
    if args.log_dir and is_chief:
        writer = tf.summary.create_file_writer(args.log_dir)

    loss = float("nan")
    iterator = iter(dist_ds)
    for step in range(args.steps):
        if (
            step == 0
            and args.fail_on_worker is not None
            and task_type == "worker"
            and task_index == args.fail_on_worker
        ):
            raise RuntimeError(f"injected failure on worker {args.fail_on_worker}")
        loss = float(train_step(next(iterator)).numpy())
        if writer is not None:
            with writer.as_default():
                write_loss_summary(loss, step)

    if writer is not None:
        writer.flush()
        writer.close()

    print(f"final loss {loss:.6f} weights {float(w.numpy()):.6f} {float(b.numpy()):.6f}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
