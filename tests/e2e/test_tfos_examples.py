"""TensorFlowOnSpark's Keras MNIST examples, unchanged, submitted as its README shows.

examples/mnist/keras/ holds TensorFlowOnSpark 2.2.5's own mnist_spark.py, mnist_inference.py
and mnist_pipeline.py (the one edit: NumPy 2 removed ``np.int``). Each runs through
``spark-submit`` on a standalone cluster of 2 workers x 1 core (TensorFlowOnSpark's
shape), on MNIST-shaped data that examples/mnist/mnist_data_setup.py writes offline, at
small scale through the examples' own arguments (one epoch, big batches: the scripts
still feed all 60,000 records).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark extra is not installed (pip install -e .[spark])")
pytest.importorskip(
    "tensorflow", reason="the TensorFlow extra is not installed (pip install -e .[tensorflow])"
)
pytest.importorskip("sklearn", reason="the examples extra is not installed (pip install -e .[examples])")

from tfcoord.driver.standalone import LocalSparkCluster, spark_home

ROOT = Path(__file__).resolve().parents[2]
KERAS = ROOT / "examples" / "mnist" / "keras"
#: SHA-256 of TensorFlowOnSpark 2.2.5's examples as published (read off the copy in
#: ../shared/tfos-examples, which a clean clone need not have beside it): our copies must
#: hash the same, so not one line of them is ours.
PUBLISHED_SHA256 = {
    "mnist/keras/mnist_spark.py": "4a9ead09d35500f0fb0e58df885de166e43b86502762e57b63d2ef32aa304e89",
    "mnist/keras/mnist_inference.py": "85a28540379b3c8a5e81fd132a1ec3b25033e2ccc547bf181697e8d46ef0b5d3",
    "mnist/keras/mnist_pipeline.py": "df81d7bbadede17a6fa8ec04ca2c5a9989b1f9dca1c2bc18dc498fcd1ea216df",
    "utils/stop_streaming.py": "68e9f3525a3695dc2ce5f25c23f9079c0d19f15dd34998ee02362c0c179648ce",
}
WORKERS = 2
#: mnist_spark.py trains 0.9 x 60000 / batch / workers steps: 27 steps of 1000 per worker,
#: 27,000 records of the 30,000 each is fed (5 of the 10 partitions). Keras reads up to two
#: batches ahead, so each worker must be fed 2 batches more than it trains on, or its
#: reader waits for records that never come while its peer, done, waits for it.
BATCH = "1000"
SUBMIT_TIMEOUT_S = 300

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def mnist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mnist") / "data"
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mnist" / "mnist_data_setup.py"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def cluster() -> object:
    with LocalSparkCluster(cores=1, workers=WORKERS, memory_mb=3072) as c:
        yield c


def submit(cluster: LocalSparkCluster, script: str, *args: str, cwd: Path, conf: tuple[str, ...] = ()) -> str:
    """spark-submit as TensorFlowOnSpark's keras README does; returns the driver's output."""
    cmd = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        cluster.master_url,
        "--conf",
        f"spark.cores.max={WORKERS}",
        "--conf",
        "spark.task.cpus=1",
        *conf,
        str(KERAS / script),
        *args,
    ]
    env = dict(LocalSparkCluster.env(), TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{script} {' '.join(args)} failed:\n{text[-6000:]}"
    return text


def test_the_examples_are_tensorflowonsparks_own():
    for published, digest in PUBLISHED_SHA256.items():
        ours = (ROOT / "examples" / published).read_text()
        if published.endswith("mnist_inference.py"):  # the one edit NumPy 2 forces, undone
            assert ours.count("astype(int)") == 1
            ours = ours.replace("astype(int)", "astype(np.int)")
        assert hashlib.sha256(ours.encode()).hexdigest() == digest, published


def _labels(mnist: Path, split: str) -> Counter[int]:
    return Counter(
        int(line.split(",", 1)[0])
        for f in sorted((mnist / "csv" / split).glob("part-*"))
        for line in f.read_text().splitlines()
    )


def test_keras_mnist_spark_trains_then_mnist_inference_predicts(cluster, mnist, tmp_path):
    model, export, predictions = tmp_path / "mnist_model", tmp_path / "mnist_export", tmp_path / "predictions"
    submit(
        cluster,
        "mnist_spark.py",
        "--cluster_size",
        str(WORKERS),
        "--images_labels",
        str(mnist / "csv/train"),
        "--model_dir",
        str(model),
        "--export_dir",
        str(export),
        "--epochs",
        "1",
        "--batch_size",
        BATCH,
        cwd=tmp_path,
    )
    assert (export / "saved_model.pb").is_file()
    assert list(model.glob("weights-0001*"))  # the chief's ModelCheckpoint
    submit(
        cluster,
        "mnist_inference.py",
        "--cluster_size",
        str(WORKERS),
        "--images_labels",
        str(mnist / "tfr/test"),
        "--export_dir",
        str(export),
        "--output",
        str(predictions),
        cwd=tmp_path,
    )
    # One file per node, one "label prediction" line per test record; the two nodes
    # read disjoint shards of the TFRecord files, which hold every test record once.
    lines = [ln.split() for f in sorted(predictions.glob("part-*")) for ln in f.read_text().splitlines()]
    assert len(list(predictions.glob("part-*"))) == WORKERS
    assert Counter(int(label) for label, _ in lines) == _labels(mnist, "test")
    assert {int(pred) for _, pred in lines} <= set(range(10))


def test_keras_mnist_pipeline_trains_on_tfrecords_and_infers_from_csv_and_tfrecords(cluster, mnist, tmp_path):
    model, export = tmp_path / "mnist_model", tmp_path / "mnist_export"
    common = ("--cluster_size", str(WORKERS), "--batch_size", BATCH)
    conf = ("--conf", f"spark.executorEnv.JAVA_HOME={LocalSparkCluster.env()['JAVA_HOME']}")
    submit(
        cluster,
        "mnist_pipeline.py",
        *common,
        "--images_labels",
        str(mnist / "tfr/train"),
        "--format",
        "tfr",
        "--mode",
        "train",
        "--model_dir",
        str(model),
        "--export_dir",
        str(export),
        "--epochs",
        "1",
        cwd=tmp_path,
        conf=conf,
    )
    assert (export / "saved_model.pb").is_file()
    seen = {}
    for fmt in ("csv", "tfr"):
        out = tmp_path / f"predictions-{fmt}"
        submit(
            cluster,
            "mnist_pipeline.py",
            *common,
            "--images_labels",
            str(mnist / fmt / "test"),
            "--format",
            fmt,
            "--mode",
            "inference",
            "--export_dir",
            str(export),
            "--output",
            str(out),
            cwd=tmp_path,
            conf=conf,
        )
        rows = [json.loads(ln) for f in sorted(out.glob("part-*")) for ln in f.read_text().splitlines()]
        assert len(rows) == sum(_labels(mnist, "test").values())
        assert all(len(r["prediction"]) == 10 and r["argmax"] in range(10) for r in rows)
        assert all(abs(sum(r["prediction"]) - 1) < 1e-3 for r in rows)  # softmax outputs
        seen[fmt] = sorted((r["argmax"], tuple(round(p, 4) for p in r["prediction"])) for r in rows)
    # The same records through both readers (CSV text, TFRecords via dfutil): the same answers.
    assert seen["csv"] == seen["tfr"]


def test_the_data_setup_refuses_to_overwrite(mnist):
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mnist" / "mnist_data_setup.py"), "--output", str(mnist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "already exist" in run.stderr, run.stderr[-2000:]
    assert os.listdir(mnist / "csv" / "train")  # left as it was
