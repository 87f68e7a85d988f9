"""Accuracy of TensorFlowOnSpark's Keras MNIST examples on tfcoord vs the same model fitted in one process.

    python benchmarks/mnist_accuracy.py [--workers 3] [--data DIR] [--json]

On a local Spark standalone cluster of ``--workers`` workers x 1 core (TensorFlowOnSpark's
keras README: ``SPARK_WORKER_INSTANCES=3``, ``-c 1``), submitted as that README shows
(``spark-submit --conf spark.cores.max=N --conf spark.task.cpus=1``), with the examples'
default epochs and batch size, unchanged (examples/mnist/keras/: NumPy 2's ``np.int`` is
the one edit):

1. ``mnist_spark.py`` trains on the CSV train set (InputMode.SPARK) and exports a SavedModel;
   ``mnist_inference.py`` (TFParallel) predicts the TFRecord test set with it;
2. ``mnist_pipeline.py --mode train --format csv`` trains through TFEstimator; ``--mode
   inference --format tfr`` predicts the test set through TFModel and dfutil;
3. the same model (mnist_spark.py's ``build_and_compile_cnn_model``: same layers, loss,
   SGD(0.001)) is fitted in this one process on the same 60,000 training records, with the
   examples' epochs and batch size, and scored on the same 10,000 test records.

The data is examples/mnist/mnist_data_setup.py's (scikit-learn's real digits, upsampled to
28x28 and shifted; train and test from disjoint digits). Prints one JSON line per
measurement and a summary with each distributed accuracy's distance, in points, from the
single-process one (target: within 2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KERAS = ROOT / "examples" / "mnist" / "keras"
TARGET_POINTS = 2.0
EPOCHS, BATCH = 3, 64  # the examples' defaults


def _read_csv(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    rows = [
        np.array(line.split(","), dtype=np.int64)
        for f in sorted(directory.glob("part-*"))
        for line in f.read_text().splitlines()
    ]
    data = np.stack(rows)
    return data[:, 1:], data[:, 0]


def single_process(data: Path) -> dict[str, Any]:
    """mnist_spark.py's model, fitted here on the whole train set; its test accuracy."""
    import tensorflow as tf

    train_x, train_y = _read_csv(data / "csv" / "train")
    test_x, test_y = _read_csv(data / "csv" / "test")

    def images(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32) / 255.0).reshape(-1, 28, 28, 1)

    model = tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        loss=tf.keras.losses.sparse_categorical_crossentropy,
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=["accuracy"],
    )
    t0 = time.monotonic()
    model.fit(images(train_x), train_y.astype(np.float32), epochs=EPOCHS, batch_size=BATCH, verbose=0)
    preds = np.argmax(model.predict(images(test_x), batch_size=1000, verbose=0), axis=1)
    return {
        "run": "single process (model.fit, same model, same data)",
        "accuracy": round(float(np.mean(preds == test_y)), 4),
        "seconds": round(time.monotonic() - t0, 1),
    }


class Submitter:
    def __init__(self, master: str, workers: int, env: dict[str, str], cwd: Path, timeout_s: float) -> None:
        from tfcoord.node.standalone import spark_home

        self.base = [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            master,
            "--conf",
            f"spark.cores.max={workers}",
            "--conf",
            "spark.task.cpus=1",
        ]
        self.env, self.cwd, self.timeout_s = env, cwd, timeout_s

    def __call__(self, script: str, *args: str, conf: tuple[str, ...] = ()) -> float:
        t0 = time.monotonic()
        out = subprocess.run(
            [*self.base, *conf, str(KERAS / script), *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{script} {' '.join(args)} failed:\n{(out.stdout + out.stderr)[-4000:]}")
        return round(time.monotonic() - t0, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3, help="Spark workers x 1 core = TensorFlow nodes")
    ap.add_argument(
        "--data", help="mnist_data_setup.py's output (made in a temporary directory if not given)"
    )
    ap.add_argument("--timeout", type=float, default=1200, help="seconds allowed per spark-submit")
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    args = ap.parse_args()

    from tfcoord.node.standalone import LocalSparkCluster

    work = Path(tempfile.mkdtemp(prefix="tfcoord-mnist-accuracy-"))
    data = Path(args.data) if args.data else work / "data"
    if not args.data:
        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "mnist" / "mnist_data_setup.py"), "--output", str(data)],
            check=True,
            capture_output=True,
        )
    _, test_y = _read_csv(data / "csv" / "test")
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    env = dict(LocalSparkCluster.env(), TF_CPP_MIN_LOG_LEVEL="2")
    os.environ.update(env)  # the Spark daemons, and so the executors, inherit it
    n = str(args.workers)
    with LocalSparkCluster(cores=1, workers=args.workers, memory_mb=3072) as cluster:
        submit = Submitter(cluster.master_url, args.workers, env, work, args.timeout)
        # 1. mnist_spark.py, then mnist_inference.py on its export
        secs = submit(
            "mnist_spark.py",
            "--cluster_size",
            n,
            "--images_labels",
            str(data / "csv/train"),
            "--model_dir",
            str(work / "spark_model"),
            "--export_dir",
            str(work / "spark_export"),
        )
        secs_inf = submit(
            "mnist_inference.py",
            "--cluster_size",
            n,
            "--images_labels",
            str(data / "tfr/test"),
            "--export_dir",
            str(work / "spark_export"),
            "--output",
            str(work / "spark_predictions"),
        )
        pairs = [
            line.split()
            for f in sorted((work / "spark_predictions").glob("part-*"))
            for line in f.read_text().splitlines()
        ]
        if len(pairs) != len(test_y):
            raise RuntimeError(f"mnist_inference.py predicted {len(pairs)} of {len(test_y)} test records")
        emit(
            {
                "run": "mnist_spark.py + mnist_inference.py",
                "workers": args.workers,
                "accuracy": round(float(np.mean([int(a) == int(b) for a, b in pairs])), 4),
                "train_seconds": secs,
                "inference_seconds": secs_inf,
            }
        )
        # 2. mnist_pipeline.py: TFEstimator on CSV, TFModel on TFRecords (dfutil)
        conf = ("--conf", f"spark.executorEnv.JAVA_HOME={env['JAVA_HOME']}")
        secs = submit(
            "mnist_pipeline.py",
            "--cluster_size",
            n,
            "--images_labels",
            str(data / "csv/train"),
            "--format",
            "csv",
            "--mode",
            "train",
            "--model_dir",
            str(work / "pipe_model"),
            "--export_dir",
            str(work / "pipe_export"),
            conf=conf,
        )
        secs_inf = submit(
            "mnist_pipeline.py",
            "--cluster_size",
            n,
            "--images_labels",
            str(data / "tfr/test"),
            "--format",
            "tfr",
            "--mode",
            "inference",
            "--export_dir",
            str(work / "pipe_export"),
            "--output",
            str(work / "pipe_predictions"),
            conf=conf,
        )
        # TFModel keeps the rows' order (partitions in file order), as the test files hold them.
        preds = [
            json.loads(line)["argmax"]
            for f in sorted((work / "pipe_predictions").glob("part-*"))
            for line in f.read_text().splitlines()
        ]
        if len(preds) != len(test_y):
            raise RuntimeError(f"mnist_pipeline.py predicted {len(preds)} of {len(test_y)} test records")
        emit(
            {
                "run": "mnist_pipeline.py (TFEstimator csv, TFModel tfr)",
                "workers": args.workers,
                "accuracy": round(float(np.mean(np.array(preds) == test_y)), 4),
                "train_seconds": secs,
                "inference_seconds": secs_inf,
            }
        )
    # 3. the same model in one process
    emit(single_process(data))
    base = rows[-1]["accuracy"]
    gaps = {r["run"]: round(100 * (r["accuracy"] - base), 2) for r in rows[:-1]}
    summary = {
        "summary": True,
        "shape": f"{args.workers} Spark workers x 1 core, spark.cores.max={args.workers}, spark.task.cpus=1, "
        f"--cluster_size {args.workers}; examples' defaults: {EPOCHS} epochs, batch {BATCH}",
        "single_process_accuracy": base,
        "points_from_single_process": gaps,
        "target_points": TARGET_POINTS,
        "meets_target": all(abs(g) <= TARGET_POINTS for g in gaps.values()),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
