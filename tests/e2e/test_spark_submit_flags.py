"""`tfcoord submit --engine spark` as a spark-submit user types it, against a real Spark
standalone cluster: spark-submit's flags reach Spark, and Ctrl-C stops the job.

The CLI runs as a subprocess; the cluster (master + worker, 2 cores) is this module's own,
since the test session's SparkContext (tests/spark) holds every core of its cluster.
"""

from __future__ import annotations

import re
import signal
import subprocess
import zipfile
from collections.abc import Iterator

import pytest

from tests.integration.lines import Lines, as_from_a_terminal
from tests.integration.served import TFCOORD, Served
from tfcoord.client.entry import ExitCode

pytest.importorskip("pyspark", reason="the Spark extra is not installed (pip install -e .[spark])")

from tfcoord.driver.standalone import LocalSparkCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    with LocalSparkCluster(cores=2, memory_mb=4096) as cluster:
        yield cluster.master_url


#: Written for spark-submit: its main block owns the SparkContext, reads back what the
#: command line set, and runs the job; the executors import the --py-files module and read
#: the --files file and the --archives directory.
SCRIPT = """
import os
import sys

from pyspark import SparkConf, SparkContext

import shipped_helper  # from --py-files: on the driver's sys.path too, as under spark-submit
from tfcoord.driver.spark import run


def main_fun(argv, ctx):
    from pyspark import SparkFiles

    import shipped_helper

    with open(SparkFiles.get("data.txt")) as f:
        shipped = f.read().strip()
    with open(os.path.join("unpacked", "inner.txt")) as f:
        unpacked = f.read().strip()
    return {"helper": shipped_helper.VALUE, "file": shipped, "archive": unpacked}


if __name__ == "__main__":
    sc = SparkContext(conf=SparkConf())
    conf = sc.getConf()
    for key in ("spark.driver.memory", "spark.executor.memory", "spark.tfcoord.test.flag", "spark.task.maxFailures"):
        print(f"{key}={conf.get(key)}")
    print(f"driver helper={shipped_helper.VALUE}")
    run(sc, main_fun, sys.argv[1:], 2, 0).shutdown()
"""


def test_spark_submit_flags_reach_spark_the_driver_and_the_executors(master, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    with zipfile.ZipFile(tmp_path / "deps.zip", "w") as z:
        z.writestr("shipped_helper.py", "VALUE = 'from-py-files'\n")
    (tmp_path / "data.txt").write_text("from-files\n")
    with zipfile.ZipFile(tmp_path / "env.zip", "w") as z:
        z.writestr("inner.txt", "from-archives\n")
    out = subprocess.run(
        [
            *TFCOORD,
            "submit",
            "--engine",
            "spark",
            "--master",
            master,
            "--num-executors",
            "2",
            "--deploy-mode",
            "client",
            "--driver-memory",
            "768m",
            "--executor-memory",
            "900m",
            "--conf",
            "spark.tfcoord.test.flag=on",
            "--conf",
            "spark.task.maxFailures=2",
            "--py-files",
            str(tmp_path / "deps.zip"),
            "--files",
            str(tmp_path / "data.txt"),
            "--archives",
            f"{tmp_path / 'env.zip'}#unpacked",
            "--",
            str(tmp_path / "train.py"),
        ],
        capture_output=True,
        text=True,
        timeout=360,
        cwd=tmp_path,
        env=LocalSparkCluster.env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "spark.driver.memory=768m" in out.stdout, out.stdout
    assert "spark.executor.memory=900m" in out.stdout
    assert "spark.tfcoord.test.flag=on" in out.stdout and "spark.task.maxFailures=2" in out.stdout
    assert "driver helper=from-py-files" in out.stdout
    results = re.findall(r"worker:(\d) on \S+: (.*)", out.stderr)
    assert sorted(r[0] for r in results) == ["0", "1"], out.stderr[-3000:]
    for _, got in results:
        assert got.split() == ["helper=from-py-files", "file=from-files", "archive=from-archives"], got


WAIT_FOR_STOP = """
import time


def main_fun(argv, ctx):
    time.sleep(600)  # until the job is stopped
"""
#: The same, written for spark-submit: its SparkContext installs pyspark's SIGINT handler.
WAIT_FOR_STOP_OWN_MAIN = (
    WAIT_FOR_STOP
    + """

if __name__ == "__main__":
    import sys

    from pyspark import SparkConf, SparkContext

    from tfcoord.driver.spark import run

    run(SparkContext(conf=SparkConf()), main_fun, sys.argv[1:], 2, 0).shutdown()
"""
)


@pytest.mark.parametrize("script", [WAIT_FOR_STOP, WAIT_FOR_STOP_OWN_MAIN], ids=["main_fun", "own_main"])
def test_ctrl_c_under_the_spark_engine_stops_the_job_and_exits_130(master, tmp_path, script):
    served = Served(tmp_path)
    (tmp_path / "wait.py").write_text(script)
    proc = subprocess.Popen(
        [
            *TFCOORD,
            "submit",
            "--engine",
            "spark",
            "--master",
            master,
            "--num-executors",
            "2",
            "--",
            str(tmp_path / "wait.py"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=as_from_a_terminal,
        text=True,
        cwd=tmp_path,
        env=dict(
            LocalSparkCluster.env(), **{k: v for k, v in served.env.items() if k.startswith("TFCOORD_")}
        ),
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)  # type: ignore[arg-type]
    try:
        job = re.search(
            r"job (\S+) (READY|RUNNING): ", err.wait_for(r"job \S+ (READY|RUNNING): ", 300)
        ).group(1)  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)  # as Ctrl-C does
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        assert code == ExitCode.INTERRUPTED, err.text()[-3000:]
        assert err.text().strip().splitlines()[-1] == f"tfcoord: interrupted: job {job} STOPPED", err.text()[
            -3000:
        ]
        assert "Traceback" not in err.text() and out.text() == ""
        status = served.cli("status", job)
        assert status.stdout.startswith(f"job {job} STOPPED"), status.stdout + status.stderr
        assert "interrupted (Ctrl-C)" in status.stdout
    finally:
        served.stop()
