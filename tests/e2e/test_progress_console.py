"""A TensorFlowOnSpark program under a plain ``spark-submit`` shows tfcoord's progress.

Nothing configures logging there, so tfcoord does (tfcoord.driver.console): the reservation's
progress naming who is missing, readiness, each node's end and the outcome, prefixed
``tfcoord:``. ``TFCOORD_QUIET=1`` or ``--conf spark.tfcoord.quiet=true`` silence it; a program
that configured logging itself gets tfcoord's records through its own handlers instead.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark extra is not installed (pip install -e .[spark])")

from tfcoord.driver.standalone import LocalSparkCluster, spark_home

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TFOS_PROGRAM = """
import logging
import sys

from pyspark import SparkConf, SparkContext
from tensorflowonspark import TFCluster


def main_fun(args, ctx):
    print("node", ctx.job_name, ctx.task_index, "ran")


if __name__ == "__main__":
    if "--own-logging" in sys.argv:
        logging.basicConfig(level=logging.INFO, format="OWN %(name)s| %(message)s")
    sc = SparkContext(conf=SparkConf().setAppName("tfos-progress"))
    cluster = TFCluster.run(sc, main_fun, sys.argv[1:], 2, 0, False, TFCluster.InputMode.TENSORFLOW)
    cluster.shutdown()
    print("program done")
"""


@pytest.fixture(scope="module")
def cluster() -> object:
    with LocalSparkCluster(cores=1, workers=2, memory_mb=2048) as c:
        yield c


def _submit(
    cluster: LocalSparkCluster, script: Path, *args: str, conf: tuple[str, ...] = (), **env: str
) -> str:
    cmd = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        cluster.master_url,
        "--conf",
        "spark.cores.max=2",
        *conf,
        str(script),
        *args,
    ]
    full_env = {k: v for k, v in os.environ.items() if k != "TFCOORD_QUIET"}
    full_env.update(LocalSparkCluster.env(), **env)
    out = subprocess.run(cmd, env=full_env, cwd=script.parent, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "program done" in out.stdout
    # spark-submit runs a Python driver with its stderr joined to its stdout (PythonRunner):
    # the user sees both on the terminal, in the order written.
    return out.stdout


def test_plain_spark_submit_prints_progress_unless_quiet_or_configured(cluster, tmp_path):
    script = tmp_path / "tfos_program.py"
    script.write_text(TFOS_PROGRAM)

    err = _submit(cluster, script)
    # who is missing while reserving, readiness, node ends, the outcome
    assert re.search(
        r"^tfcoord: job \S+ (SUBMITTED|RESERVING): registered [01]/2 \(waiting for ", err, re.M
    ), err
    # Readiness. The job turns RUNNING once no node is still waiting to start; this main_fun
    # returns at once, so one worker can end before the other starts (READY 1/2, then READY 0/2)
    # and the second's whole run can fall between two of the watcher's updates (CI saw exactly
    # that): READY or RUNNING, each line shows the formed cluster and its nodes' count.
    assert re.search(r"^tfcoord: job \S+ (READY|RUNNING): [012]/2 nodes running", err, re.M), err[-3000:]
    assert re.search(r"^tfcoord: job \S+ SUCCEEDED$", err, re.M), err[-3000:]

    for quiet in ({"TFCOORD_QUIET": "1"}, {"conf": ("--conf", "spark.tfcoord.quiet=true")}):
        conf = quiet.pop("conf", ())
        err = _submit(cluster, script, conf=conf, **quiet)  # type: ignore[arg-type]
        assert "tfcoord: " not in err and "SUCCEEDED" not in err, err[-3000:]

    err = _submit(cluster, script, "--own-logging")
    assert "tfcoord: job" not in err  # not ours: the program's handler, in the program's format
    assert re.search(r"^OWN tfcoord\.spark\| job \S+ (READY|RUNNING): ", err, re.M), err[-3000:]
    assert re.search(r"^OWN tfcoord\.spark\| job \S+ SUCCEEDED$", err, re.M), err[-3000:]
