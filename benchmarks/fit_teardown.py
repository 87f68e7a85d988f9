"""The pause between ``model.fit``'s last step and its return, without tfcoord or Spark.

    python benchmarks/fit_teardown.py [--steps 300,350] [--trials 2] [--variants default,no-autotune]

TensorFlowOnSpark's Keras MNIST examples (``mnist_spark.py``, ``mnist_pipeline.py``) wait
between the last training step and the export for seconds to minutes (see
docs/src/benchmarks.md). This reproduces the same wait in one process with nothing of
tfcoord in it: the examples' model under ``MultiWorkerMirroredStrategy`` (one local
worker), ``fit(..., steps_per_epoch=N)`` for 3 epochs over ``tf.data.Dataset.from_generator``
of an endless plain Python generator, as the examples build it (``batch(64)``). Each trial
is a fresh process; the figure is the time from the last ``on_train_batch_end`` to
``fit``'s return, which is the teardown of fit's iterators.

Variants:

* ``default``: as the examples run;
* ``no-autotune``: the same, but tf.data autotuning is disabled (``Options.autotune.enabled =
  False``) on the generator's dataset *and* on the per-device datasets that the strategy's
  ``MultiDeviceIterator`` builds (they carry their own default options, so only a patch of
  ``multi_device_iterator_ops._create_device_dataset`` reaches them; a diagnostic, not a fix).

If ``default`` pauses and ``no-autotune`` does not, the wait is tf.data's autotuning thread
(``Model::OptimizeLoop``), which a root iterator's destructor joins and which sleeps out its
optimization period (doubling to 60 s) before it exits: a TensorFlow matter, not the feed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

BATCH, EPOCHS = 64, 3


def trial(steps: int, variant: str) -> dict[str, Any]:
    """One fit in this process; returns its timings."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # the Keras the nodes run (tf-keras)
    import numpy as np
    import tensorflow as tf
    from mnist_accuracy import examples_model  # benchmarks/, this script's own directory

    def no_autotune(ds: Any) -> Any:
        options = tf.data.Options()
        options.autotune.enabled = False
        return ds.with_options(options)

    if variant == "no-autotune":
        from tensorflow.python.data.ops import multi_device_iterator_ops as mdi

        create = mdi._create_device_dataset

        def create_without_autotune(*args: Any, **kwargs: Any) -> Any:
            return no_autotune(create(*args, **kwargs))

        mdi._create_device_dataset = create_without_autotune

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def records() -> Any:
        rng = np.random.default_rng(0)
        while True:
            yield rng.random((28, 28, 1), dtype=np.float32), np.float32(rng.integers(10))

    ds = tf.data.Dataset.from_generator(
        records, (tf.float32, tf.float32), (tf.TensorShape([28, 28, 1]), tf.TensorShape([]))
    ).batch(BATCH)
    if variant == "no-autotune":
        ds = no_autotune(ds)
    with strategy.scope():
        model = examples_model(tf)
    last = [0.0]

    class LastStep(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            last[0] = time.monotonic()

    t0 = time.monotonic()
    model.fit(ds, epochs=EPOCHS, steps_per_epoch=steps, verbose=0, callbacks=[LastStep()])
    returned = time.monotonic()
    return {
        "variant": variant,
        "steps_per_epoch": steps,
        "training_s": round(last[0] - t0, 1),
        "last_step_to_fit_return_s": round(returned - last[0], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="300,350", help="steps_per_epoch values, comma-separated")
    ap.add_argument("--trials", type=int, default=2, help="fits per variant and steps value")
    ap.add_argument("--variants", default="default,no-autotune", help="default and/or no-autotune")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per fit")
    ap.add_argument("--trial", nargs=2, metavar=("STEPS", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trial:
        print(json.dumps(trial(int(args.trial[0]), args.trial[1])), flush=True)
        return 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - {"default", "no-autotune"})
    if unknown:
        ap.error(f"--variants takes default and/or no-autotune, not {unknown}")
    steps = [int(s) for s in args.steps.split(",") if s]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    # All trials at once, each in its own process: the pause is a timer in TensorFlow, not CPU
    # work, so running them side by side only stretches the training time.
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--trial", str(n), variant],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(args.trials)
        for n in steps
        for variant in variants
    ]
    failed = 0
    for p in procs:
        out, err = p.communicate(timeout=args.timeout)
        if p.returncode != 0:
            failed += 1
            print(f"a trial failed ({' '.join(p.args[-2:])}):\n{err[-2000:]}", file=sys.stderr)
            continue
        print(out.strip().splitlines()[-1], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
