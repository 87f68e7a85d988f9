"""The node installs and runs alone: ``pip install tfcoord-client tfcoord-node`` into a clean
virtual environment (what a Mesos task image or a Spark executor's environment holds) gives a
working ``tfcoord-node`` and ``python -m tfcoord.node``, with no command line, no coordinator
and no aiohttp; such a node registers with a coordinator, receives its cluster spec in
``TF_CONFIG`` and reports its end.

The wheels are built from this checkout; their dependencies (msgpack, cryptography) come from
the package index or pip's cache, as for any user.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfcoord.client import DriverClient, JobSpec, make_roles
from tfcoord.client.auth import TOKEN_ENV
from tfcoord.client.entry import TLS_CA_PEM_ENV, ExitCode
from tfcoord.client.vocab import JobState
from tfcoord.coordinator.embedded import EmbeddedCoordinator

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: The node's command: prints the TF_CONFIG it was given, as one line of JSON.
PRINT_TF_CONFIG = "import os; print('TF_CONFIG=' + os.environ['TF_CONFIG'], flush=True)"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 500), **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def node_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A clean venv holding tfcoord-client and tfcoord-node (and what they declare), nothing else."""
    tmp = tmp_path_factory.mktemp("node-alone")
    src, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    for part in ("client", "node"):  # a build writes build/ and *.egg-info beside the sources
        shutil.copytree(
            ROOT / part, src / part, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__")
        )
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(dist),
            src / "client",
            src / "node",
        ]
    )
    assert sorted(p.name.split("-")[0] for p in dist.glob("*.whl")) == ["tfcoord_client", "tfcoord_node"]
    run([sys.executable, "-m", "venv", str(venv)])
    run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--find-links",
            str(dist),
            "tfcoord-client",
            "tfcoord-node",
        ]
    )
    yield venv


def test_the_node_environment_holds_the_node_and_nothing_above_it(node_env: Path) -> None:
    python = str(node_env / "bin" / "python")
    probe = (
        "import importlib.util as u, json; "
        "print(json.dumps({m: u.find_spec(m) is not None for m in "
        "('tfcoord.client', 'tfcoord.node.main', 'msgpack', 'cryptography', "
        "'aiohttp', 'tfcoord.cli', 'tfcoord.coordinator', 'tfcoord.driver', 'pyspark')}))"
    )
    found = json.loads(run([python, "-c", probe], cwd=node_env).stdout)
    assert found == {
        "tfcoord.client": True,
        "tfcoord.node.main": True,
        "msgpack": True,
        "cryptography": True,
        "aiohttp": False,
        "tfcoord.cli": False,
        "tfcoord.coordinator": False,
        "tfcoord.driver": False,
        "pyspark": False,
    }
    # Its mistakes are one line with the exit code for usage, not a traceback.
    bad = subprocess.run(
        [str(node_env / "bin" / "tfcoord-node"), "--job", "j", "--executor-id", "0", "--", "true"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != TOKEN_ENV},
        timeout=60,
    )
    assert bad.returncode == ExitCode.USAGE
    assert bad.stderr.strip() == f"tfcoord: {TOKEN_ENV} must hold the job token as 64 hex digits"


@pytest.mark.parametrize("entry", [["bin/tfcoord-node"], ["bin/python", "-m", "tfcoord.node"]])
def test_a_node_installed_alone_registers_and_receives_its_spec(node_env: Path, entry: list[str]) -> None:
    with (
        EmbeddedCoordinator() as coord,
        DriverClient(coord.address, coord.secret, ssl_context=coord.client_context()) as driver,
    ):
        job = driver.submit(JobSpec(roles=make_roles(2, 0), reservation_timeout_s=120))
        env = dict(os.environ, **{TOKEN_ENV: driver.job_token(job).hex(), TLS_CA_PEM_ENV: coord.ca_pem or ""})
        env.pop("PYTHONPATH", None)  # nothing of this checkout or its .venv
        procs = [
            subprocess.Popen(
                [
                    str(node_env / entry[0]),
                    *entry[1:],
                    "--address",
                    coord.address,
                    "--job",
                    job,
                    "--executor-id",
                    str(i),
                    "--host",
                    "127.0.0.1",
                    "--",
                    str(node_env / "bin" / "python"),
                    "-c",
                    PRINT_TF_CONFIG,
                ],
                env=env,
                cwd=node_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (_out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err[-3000:]
        status = driver.await_job(job, timeout_s=60)
        assert status.state == JobState.SUCCEEDED
        configs = [
            json.loads(
                next(line for line in out.splitlines() if "TF_CONFIG=" in line).split("TF_CONFIG=", 1)[1]
            )
            for out, _ in outs
        ]
        assert [c["task"] for c in configs] == [
            {"type": "worker", "index": 0},
            {"type": "worker", "index": 1},
        ]
        assert configs[0]["cluster"] == configs[1]["cluster"] == status.cluster
        assert len(status.cluster["worker"]) == 2
