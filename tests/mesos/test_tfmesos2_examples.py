"""tfmesos2's examples, run as its README runs them, against the fake master.

The README exports the Mesos settings and runs the example::

    export MESOS_SSL=true
    export MESOS_MASTER=localhost:5050
    export MESOS_USERNAME=<MESOS_PRINCIPAL>
    export MESOS_PASSWORD=<MESOS_SECRET>
    python examples/plus.py

``tests/mesos/tfmesos2_examples/`` holds plus.py and matrix.py as written for tfmesos2 (``from
tfmesos2 import cluster``, a dict job list, ParameterServerStrategy over ``c.cluster_def``); the
test runs each as its own ``python`` process with those variables pointing at a fake master that
serves HTTPS and checks Basic credentials. The tasks' "image" is one built for tfmesos2: Python
with TensorFlow and without tfcoord (this environment's packages without its ``.pth`` hooks, so
tfcoord's editable install does not import); the node runtime reaches it as the archive the
coordinator serves. ``MESOS_CA_FILE`` (the fake master's CA) and ``TFCOORD_TASK_PYTHON`` (that
image's interpreter) are the only settings tfmesos2 has no name for.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.pki import Authority
from tests.mesos.fake_master import AgentSpec, ThreadedFakeMaster
from tfcoord import aliases

EXAMPLES = Path(__file__).with_name("tfmesos2_examples")
#: Three TensorFlow imports in the tasks and one in the driver, on two cores.
RUN_TIMEOUT_S = 240
#: Where a real tfmesos2 is installed (a ``pip install tfmesos2``; ``make bench`` keeps it in .venv-bench), the alias
#: steps aside for it; the example then runs with the name bound to tfcoord's module, unchanged.
ALIASED = (
    "import importlib, runpy, sys\n"
    "sys.modules['tfmesos2'] = importlib.import_module('tfcoord.compat.tfmesos2')\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
)


@pytest.fixture
def tls_master(tmp_path: Path) -> Iterator[tuple[ThreadedFakeMaster, Path]]:
    ca = Authority.create(tmp_path / "pki")
    leaf = ca.issue("master", server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(leaf.cert, leaf.key)
    agents = [AgentSpec(cpus=4, mem=8192)]
    with ThreadedFakeMaster(
        agents,
        ssl_context=context,
        username="mesos",
        password="test",
        heartbeat_interval_s=0.5,
        kill_grace_s=1.0,
    ) as m:
        yield m, ca.cert


@pytest.fixture
def tfmesos2_image(tmp_path: Path) -> str:
    """Python with TensorFlow and without tfcoord, as an image built for tfmesos2 has it."""
    site = sysconfig.get_paths()["purelib"]
    path = tmp_path / "tfmesos2-image-python3"
    path.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    path.chmod(0o755)
    probe = subprocess.run([str(path), "-c", "import tfcoord.client"], capture_output=True, cwd=tmp_path)
    assert probe.returncode != 0, "tfcoord must not import in the tfmesos2 image"
    return str(path)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    ("example", "result"),
    [("plus.py", "42"), ("matrix.py", "[[21 29  8]\n [12 18  5]\n [39 51 14]]")],
)
def test_the_readme_way_runs_tfmesos2s_example_unchanged(
    example: str,
    result: str,
    tls_master: tuple[ThreadedFakeMaster, Path],
    tfmesos2_image: str,
    tmp_path: Path,
) -> None:
    pytest.importorskip(
        "tensorflow", reason="the tensorflow extra is not installed (pip install -e .[tensorflow])"
    )
    master, ca = tls_master
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MESOS_", "TFCOORD_", "TFMESOS2_")) and k != "DOCKER_IMAGE"
    }
    env.update(
        MESOS_SSL="true",
        MESOS_MASTER=master.master.address,
        MESOS_USERNAME="mesos",
        MESOS_PASSWORD="test",
        MESOS_CA_FILE=str(ca),
        TFCOORD_TASK_PYTHON=tfmesos2_image,
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    script = str(EXAMPLES / example)
    argv = [sys.executable, script]
    if aliases.real_location("tfmesos2") is not None:
        argv = [sys.executable, "-c", ALIASED, script]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.rstrip().endswith(f"Result is: \n{result}"), done.stdout[-2000:]
    # The program went through tfcoord: three tasks of tfmesos2's image, each running the fetched
    # node archive; the framework as tfmesos2 registers it (role "tensorflow").
    tasks = list(master.master.tasks.values())
    assert len(tasks) == 3
    for task in tasks:
        assert task.task_info["container"]["docker"]["image"] == "avhost/tensorflow-mesos:latest"
        assert task.fetched and task.fetched[0].name.startswith("tfcoord-node-")
        assert task.task_info["command"]["value"].startswith(f"exec {tfmesos2_image} -c ")
    [subscribe] = master.master.calls_of("SUBSCRIBE")
    assert subscribe["subscribe"]["framework_info"]["roles"] == ["tensorflow"]
    assert '{"cluster": {"ps": ["127.0.0.1:' in done.stdout
