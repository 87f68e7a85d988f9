"""Installing as a user does, and shipping the environment to executors as YARN and Kubernetes
users do: the four wheels built from this checkout, ``pip install 'tfcoord[spark]'`` into a
clean virtual environment (no access to this checkout or its .venv), a local job run by
that environment's ``tfcoord``; then that environment packed with venv-pack and shipped
to the executors of a real Spark standalone cluster by ``spark-submit --archives``, with
``spark.pyspark.python`` pointing into it.

Dependencies come from the package index (or pip's cache), as for any user.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark extra is not installed (pip install -e .[spark])")

from tfcoord.driver.standalone import LocalSparkCluster

ROOT = Path(__file__).resolve().parents[2]
#: The four distributions: the client (msgpack only), the node, the coordinator, and the
#: command line with the TensorFlowOnSpark and tfmesos2 APIs (the root).
DISTRIBUTIONS = ("client", "node", "coordinator", ".")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 500), **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A clean venv with tfcoord[spark] installed from freshly built wheels, and venv-pack."""
    tmp = tmp_path_factory.mktemp("install")
    src, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    # Build from a copy: a build writes build/ and *.egg-info next to the sources.
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "site", "*.egg-info", "build", "__pycache__", ".pytest_cache", ".ruff_cache"
        ),
    )
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(dist),
            *(str(src / d) for d in DISTRIBUTIONS),
        ]
    )
    wheels = sorted(p.name.split("-")[0] for p in dist.glob("*.whl"))
    assert wheels == ["tfcoord", "tfcoord_client", "tfcoord_coordinator", "tfcoord_node"], wheels
    # --copies: the interpreter is a file of the venv, not a link out of it. Spark 4 refuses to
    # unpack an archive with a link pointing outside it ("would create entry outside").
    run([sys.executable, "-m", "venv", "--copies", str(venv)])
    run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--find-links",
            str(dist),
            "tfcoord[spark]",
            "venv-pack",
        ]
    )
    yield venv


def test_pip_install_then_a_local_job(user_env: Path, tmp_path: Path) -> None:
    py, tfcoord = str(user_env / "bin" / "python"), str(user_env / "bin" / "tfcoord")
    env = {"PATH": f"{user_env / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}  # nothing of this checkout
    # Installed, not found in this checkout: every part of the namespace comes from the venv.
    where = run(
        [
            py,
            "-c",
            "import tfcoord.cli, tfcoord.client, tfcoord.driver.spark, tfcoord.coordinator.server as s; "
            "print(s.__file__, tfcoord.cli.__file__)",
        ],
        env=env,
        cwd=tmp_path,
    ).stdout
    assert str(ROOT) not in where and where.count(str(user_env)) == 2, where
    # The client alone imports nothing heavy (executors and task images load it).
    light = "import sys, tfcoord.client; print(sorted(m for m in ('aiohttp', 'pyspark') if m in sys.modules))"
    assert run([py, "-c", light], env=env, cwd=tmp_path).stdout.strip() == "[]"
    script = tmp_path / "hello.py"
    script.write_text(
        "import json, os\nprint('task', json.loads(os.environ['TF_CONFIG'])['task']['index'])\n"
    )
    out = run(
        [tfcoord, "submit", "--engine", "local", "--workers", "2", "--", "python", str(script)],
        env=env,
        cwd=tmp_path,
    )
    assert sorted(re.findall(r"\[worker:(\d)\] task (\d)", out.stdout)) == [("0", "0"), ("1", "1")], (
        out.stdout
    )
    assert re.search(r"job \S+ SUCCEEDED", out.stderr), out.stderr


SPARK_SUBMIT_APP = """
import sys

from pyspark import SparkConf, SparkContext

from tfcoord.driver.spark import run


def main_fun(argv, ctx):
    import msgpack  # from the shipped environment, not the worker's own Python

    return {"python": sys.executable, "prefix": sys.prefix, "msgpack": msgpack.__file__}


if __name__ == "__main__":
    sc = SparkContext(conf=SparkConf().setAppName("archives"))
    status = run(sc, main_fun, sys.argv[1:], 2, 0).shutdown()
    for n in status["nodes"]:
        meta = n["meta"]
        print(f"{n['role']}:{n['index']} python={meta['result.python']} prefix={meta['result.prefix']}")
    sc.stop()
"""


def test_spark_submit_ships_a_packed_venv_with_archives(user_env: Path, tmp_path: Path) -> None:
    # .tar.gz: Spark unpacks it with tar, keeping the interpreter executable (a plain .tar it
    # unpacks itself, dropping the permission bits). Fast compression: 400 MB, most of it pyspark.
    packed = tmp_path / "tfcoord-env.tar.gz"
    run(
        [
            str(user_env / "bin" / "venv-pack"),
            "--prefix",
            str(user_env),
            "--output",
            str(packed),
            "--compress-level",
            "1",
        ]
    )
    app = tmp_path / "app.py"
    app.write_text(SPARK_SUBMIT_APP)
    env = {**os.environ, **LocalSparkCluster.env()}
    env.pop("PYSPARK_PYTHON", None)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    env["PATH"] = f"{user_env / 'bin'}:{env['PATH']}"
    with LocalSparkCluster(cores=2) as cluster:
        out = run(
            [str(user_env / "bin" / "spark-submit"), "--master", cluster.master_url,
             "--archives", f"{packed}#environment",
             "--conf", "spark.pyspark.python=./environment/bin/python",
             "--conf", f"spark.pyspark.driver.python={user_env / 'bin' / 'python'}",
             "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
             "--conf", "spark.ui.enabled=false", str(app)],
            env=env, cwd=tmp_path,
        )  # fmt: skip
    nodes = re.findall(r"worker:(\d) python=(\S+) prefix=(\S+)", out.stdout)
    assert sorted(n[0] for n in nodes) == ["0", "1"], out.stdout + out.stderr[-3000:]
    for _, python, prefix in nodes:
        # Each executor ran the unpacked archive's interpreter, in its own work directory.
        assert python.endswith("environment/bin/python") and prefix.endswith("/environment"), (python, prefix)
        assert not prefix.startswith(str(user_env))
