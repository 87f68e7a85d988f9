"""``python my_job.py`` from a virtual environment with a ``local[N]`` master: the executors run
the driver's Python.

PySpark starts its Python workers with ``PYSPARK_PYTHON``, else ``python3`` from PATH. From a
virtual environment that was not activated, that is another environment, and the first task
failed deep in Spark with ``No module named 'tfcoord'``. On a local master tfcoord has them run
the driver's own interpreter and says so in one line. Their output reaches this stderr
directly there, and is not printed a second time from the coordinator.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark extra is not installed (pip install -e .[spark])")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROGRAM = """
from pyspark import SparkConf, SparkContext
from tensorflowonspark import TFCluster


def main_fun(args, ctx):
    import sys

    print("node", ctx.job_name, ctx.task_index, "runs", sys.executable, flush=True)


sc = SparkContext(conf=SparkConf().setMaster("local[2]").setAppName("local-python"))
cluster = TFCluster.run(sc, main_fun, None, 2, 0)
cluster.shutdown()
sc.stop()
print("program done")
"""


def test_a_local_master_runs_the_executors_on_the_drivers_python(tmp_path: Path) -> None:
    # `python3` on PATH: this interpreter's binary outside its virtual environment and with no
    # site-packages (-S), so the same Python version (as PySpark requires) without tfcoord,
    # wherever else tfcoord may be installed. Spark gives its workers pyspark on PYTHONPATH.
    other = tmp_path / "other-python"
    other.mkdir()
    (other / "python3").write_text(f'#!/bin/sh\nexec {os.path.realpath(sys.executable)} -S "$@"\n')
    (other / "python3").chmod(0o755)
    probe = subprocess.run(
        [str(other / "python3"), "-c", "import tfcoord.node"], capture_output=True, text=True, cwd=tmp_path
    )
    assert "No module named 'tfcoord'" in probe.stderr, probe.stderr  # what the executors would have met
    script = tmp_path / "job.py"
    script.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["PATH"] = f"{other}{os.pathsep}{env['PATH']}"
    out = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip().endswith("program done"), out.stdout
    assert (
        f"tfcoord: the executors of this local Spark run this driver's Python ({sys.executable}): "
        in out.stderr
    )
    # On local[N] the executors' output is this process's stderr already: each line once, as
    # the executor printed it (the driver does not follow it from the coordinator too).
    for index in (0, 1):
        shown = [line for line in out.stderr.splitlines() if f"node worker {index} runs" in line]
        assert shown == [f"node worker {index} runs {sys.executable}"], out.stderr[-4000:]
