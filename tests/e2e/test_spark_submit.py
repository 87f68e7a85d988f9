"""`tfcoord submit --engine spark`: the command `make demo` runs, end to end in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.pki import Pki, have_openssl
from tests.integration.served import Served

pytest.importorskip("pyspark", reason="the Spark extra is not installed (pip install -e .[spark])")
pytest.importorskip(
    "tensorflow", reason="the TensorFlow extra is not installed (pip install -e .[tensorflow])"
)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_submit_spark_trains_on_a_local_standalone_cluster(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "spark",
            "--master",
            "local-standalone",
            "--num-executors",
            "2",
            "--tensorboard",
            "--log-dir",
            str(tmp_path / "tb"),
            "--",
            str(ROOT / "examples" / "spark_train.py"),
            "--steps",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=tmp_path,
    )
    err = out.stderr
    assert out.returncode == 0, err[-3000:]
    # live progress: who is still missing while reserving, then running, then the outcome
    assert re.search(
        r"job \S+ (SUBMITTED|RESERVING): registered [01]/2 \(waiting for worker:\d(, worker:\d)?\)", err
    )
    assert re.search(r"job \S+ RUNNING: [012]/2 nodes running", err), err[-3000:]
    assert re.search(r"job \S+ SUCCEEDED", err)
    assert re.search(r"TensorBoard: http://[\d.]+:\d+", err)
    results = re.findall(r"worker:(\d) on \S+: final_loss=(\S+) w=(\S+) b=(\S+)", err)
    assert sorted(r[0] for r in results) == ["0", "1"], err[-3000:]
    assert results[0][1:] == results[1][1:]  # both workers hold the same model
    assert abs(float(results[0][2]) - 3) < 0.1 and abs(float(results[0][3]) - 2) < 0.1
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))  # worker 0 wrote summaries


def test_submit_spark_explains_bad_usage(tmp_path):
    run = [sys.executable, "-m", "tfcoord", "submit", "--engine", "spark"]
    out = subprocess.run([*run, "--", "python", "x.py"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--num-executors" in out.stderr
    run += ["--num-executors", "2"]
    out = subprocess.run([*run, "--", "python", "x.py"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no script at x.py" in out.stderr
    out = subprocess.run([*run, "--", "ls"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "give the Python script after --" in out.stderr


SPARK_SUBMIT_STYLE = """
import sys

from pyspark import SparkConf, SparkContext

from tfcoord.driver.spark import run


def main_fun(argv, ctx):
    return {"argv": "+".join(argv), "index": ctx.task_index}


if __name__ == "__main__":  # as spark-submit runs it: the script owns its SparkContext and job
    sc = SparkContext(conf=SparkConf().setAppName("main-block"))
    run(sc, main_fun, sys.argv[1:], 2, 0).shutdown()
    print("main block ran on", sc.master, "with", sc.getConf().get("spark.cores.max"), "cores")
"""


def test_submit_spark_runs_the_script_as_main_like_spark_submit(tmp_path):
    script = tmp_path / "own_main.py"
    script.write_text(SPARK_SUBMIT_STYLE)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "spark",
            "--num-executors",
            "2",
            "--",
            "python",
            str(script),
            "--flag",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"main block ran on spark://[\d.]+:\d+ with 2 cores", out.stdout), out.stdout
    assert re.search(r"job \S+ SUCCEEDED", out.stderr)
    assert sorted(re.findall(r"worker:(\d) on \S+: argv=--flag\+x", out.stderr)) == ["0", "1"], out.stderr[
        -3000:
    ]


def test_submit_spark_shows_the_scripts_own_traceback_for_an_import_error(tmp_path):
    script = tmp_path / "needs_missing.py"
    script.write_text("import os\nimport no_such_module_here\n\n\ndef main_fun(argv, ctx):\n    pass\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "spark",
            "--num-executors",
            "1",
            "--",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert f'File "{script}", line 2, in <module>' in out.stderr
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in out.stderr
    assert "tfcoord/" not in out.stderr.split("Traceback", 1)[1].replace(str(script), "")
    assert out.stderr.strip().splitlines()[-1].startswith(f"tfcoord: {script} failed")


WAIT_FOR_STOP = """
import time


def main_fun(argv, ctx):
    time.sleep(300)  # until tfcoord stop terminates us
"""


@pytest.mark.skipif(not have_openssl(), reason="the openssl command makes the test certificates")
def test_submit_spark_through_a_mutual_tls_coordinator_prints_the_real_outcome_of_a_stopped_job(tmp_path):
    # The driver and both executors reach the coordinator over mutual TLS, from TFCOORD_TLS_*.
    pki = Pki.create(tmp_path / "pki")
    served = Served(
        tmp_path,
        "--tls-cert",
        str(pki.server.cert),
        "--tls-key",
        str(pki.server.key),
        "--tls-ca",
        str(pki.ca.cert),
    )
    env = dict(
        served.env,
        TFCOORD_TLS_CA=str(pki.ca.cert),
        TFCOORD_TLS_CERT=str(pki.client.cert),
        TFCOORD_TLS_KEY=str(pki.client.key),
    )
    script = tmp_path / "wait.py"
    script.write_text(WAIT_FOR_STOP)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "spark",
            "--master",
            "local-standalone",
            "--num-executors",
            "2",
            "--",
            str(script),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        assert proc.stderr is not None
        seen, job = [], None
        for line in proc.stderr:  # the progress lines, as they come
            seen.append(line)
            if found := re.search(r"job (\S+) RUNNING: ", line):
                job = found.group(1)
                break
        assert job is not None, "".join(seen)[-3000:]
        stop = served.cli("stop", job, "--reason", "enough for today", env=env)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        err = "".join(seen) + proc.stderr.read()
        assert proc.wait(timeout=120) == 4, err[-3000:]  # ExitCode.STOPPED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]
        served.stop()
    assert f"job {job} STOPPED: enough for today" in err, err[-3000:]
    assert "SUCCEEDED" not in err
