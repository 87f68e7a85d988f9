"""One real Spark standalone cluster per test session; the session's application has 2 executors x 1 core.

The worker offers more than that application takes (8 cores, and 2 GPUs found by a fake discovery
script), so a test may run a second application beside it on other executors (the resources per
role tests: tasks of 2 cpus, GPU addresses from Spark).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="the Spark extra is not installed (pip install -e .[spark])")

from tfcoord.driver.standalone import LocalSparkCluster  # noqa: E402

#: What the session's worker offers: the session application takes 2 cores of it (spark.cores.max).
WORKER_CORES = 8
#: GPUs the worker offers through its discovery script (addresses "0" and "1"); no real GPU.
WORKER_GPUS = ("0", "1")

#: Executors look for `nvidia-smi` here first; the GPU test puts a fake one in it.
FAKEBIN = "fakebin"


@pytest.fixture(scope="session")
def spark_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp(FAKEBIN)


@pytest.fixture(scope="session")
def gpu_lock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executors' GPU claims: this session's own, not the host's (other test runs share it)."""
    return tmp_path_factory.mktemp("gpu-locks")


@pytest.fixture(scope="session")
def gpu_discovery_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Spark's resource discovery contract: print the resource's name and addresses as JSON."""
    script = tmp_path_factory.mktemp("gpu-discovery") / "gpus.sh"
    addresses = ", ".join(f'"{a}"' for a in WORKER_GPUS)
    script.write_text(f'#!/bin/sh\necho \'{{"name": "gpu", "addresses": [{addresses}]}}\'\n')
    script.chmod(0o755)
    return script


@pytest.fixture(scope="session")
def sc(spark_bin: Path, gpu_lock_dir: Path, gpu_discovery_script: Path) -> Iterator[object]:
    from pyspark import SparkConf, SparkContext
    from pyspark.cloudpickle import register_pickle_by_value

    import tests.spark.mapfuns as mapfuns

    # Executors cannot import the test package; ship the map functions by value.
    register_pickle_by_value(mapfuns)
    os.environ.update(LocalSparkCluster.env())
    worker_conf = {
        "spark.worker.resource.gpu.amount": str(len(WORKER_GPUS)),
        "spark.worker.resource.gpu.discoveryScript": str(gpu_discovery_script),
    }
    with LocalSparkCluster(cores=WORKER_CORES, memory_mb=8192, worker_conf=worker_conf) as cluster:
        conf = (
            SparkConf()
            .setMaster(cluster.master_url)
            .setAppName("tfcoord-tests")
            .set("spark.executor.cores", "1")
            .set("spark.cores.max", "2")
            .set("spark.executor.memory", "1g")
            .set("spark.pyspark.python", sys.executable)
            .set("spark.task.maxFailures", "2")
            .set("spark.ui.enabled", "false")
            .set("spark.executorEnv.PATH", f"{spark_bin}:{os.environ['PATH']}")
            .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
            .set("spark.executorEnv.TFCOORD_GPU_LOCK_DIR", str(gpu_lock_dir))
            # Executors as on a cluster without tfcoord-aliases installed: `import
            # tensorflowonspark` there must work through what the driver ships (tfcoord.aliases).
            .set("spark.executorEnv.TFCOORD_ALIASES", "off")
        )
        context = SparkContext(conf=conf)
        context.setLogLevel("ERROR")
        try:
            yield context
        finally:
            context.stop()


@pytest.fixture(autouse=True)
def _isolated(sc: object) -> Iterator[None]:
    """Whatever a test leaves running on the executors is cancelled before the next one."""
    yield
    sc.cancelAllJobs()  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The pipeline's tests run after every other Spark test of the session.

    TFModel loads its SavedModel once per Python worker and keeps it (as TensorFlowOnSpark
    does), so TensorFlow is initialized in that reused worker; a node forked from such a
    worker later cannot configure collective ops ("Collective ops must be configured at
    program startup"), which MultiWorkerMirroredStrategy needs. Real applications do not
    run TFModel inference and then MWMS training in one application's workers; the tests
    share one.
    """
    last = [i for i in items if i.nodeid.startswith("tests/spark/test_pipeline.py")]
    if last:
        items[:] = [i for i in items if i not in last] + last
