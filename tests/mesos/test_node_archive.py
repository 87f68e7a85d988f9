"""Tasks run the node archive their coordinator serves, on images with or without tfcoord.

The fake master's agents run each task's command as a real process after fetching its URIs
for real (tests/mesos/fetcher.py: HTTP Basic from the URI, as the Mesos fetcher sends it). The
"image" is the interpreter the TaskInfo names:

* without tfcoord: this Python's own binary with ``-I -S``: no site-packages (so neither
  tfcoord nor msgpack), no PYTHONPATH -- the node runtime can only come from the archive;
* with tfcoord: this virtual environment's Python, which has tfcoord installed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mesos.fake_master import AgentSpec, ThreadedFakeMaster
from tfcoord.client import JobFailed, auth
from tfcoord.compat.tfmesos2 import Job, cluster
from tfcoord.coordinator.nodearchive import node_archive

ONE = [Job("worker", 1, cpus=0.5, mem=256)]
TWO = [Job("ps", 1, cpus=0.5, mem=256), Job("worker", 1, cpus=0.5, mem=256)]
WAIT_S = 30.0


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith(("MESOS_", "TFCOORD_MESOS_", "TFMESOS2_"))]:
        monkeypatch.delenv(var)
    monkeypatch.delenv("DOCKER_IMAGE", raising=False)
    monkeypatch.delenv("TFCOORD_ADDRESS", raising=False)


@pytest.fixture
def bare_python(tmp_path: Path) -> str:
    """An "image" with Python and nothing else: neither tfcoord nor msgpack imports there."""
    path = tmp_path / "bare-python3"
    path.write_text(f'#!/bin/sh\nexec {os.path.realpath(sys.executable)} -I -S "$@"\n')
    path.chmod(0o755)
    for module in ("tfcoord.client", "tfcoord.node", "msgpack"):
        probe = subprocess.run([str(path), "-c", f"import {module}"], capture_output=True, cwd=tmp_path)
        assert probe.returncode != 0, f"{module} must not import in the bare image"
    return str(path)


@pytest.fixture
def master() -> Iterator[ThreadedFakeMaster]:
    with ThreadedFakeMaster([AgentSpec(cpus=4, mem=8192)], heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        yield m


def wait(m: ThreadedFakeMaster, predicate: Any) -> Any:
    return m.call(m.master.wait_until(predicate, WAIT_S), WAIT_S + 5)


def sleep_in(python: str) -> list[str]:
    return [python, "-c", "import time; time.sleep(3600)"]


def token_of(info: dict[str, Any]) -> dict[str, Any]:
    [var] = [v for v in info["command"]["environment"]["variables"] if v["name"] == "TFCOORD_TOKEN"]
    return var


def test_an_image_without_tfcoord_runs_the_archive_its_coordinator_serves(
    master: ThreadedFakeMaster, bare_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_IMAGE", "")  # no container: the Mesos containerizer, which resolves secrets
    archive = node_archive()
    with cluster(
        TWO, "127.0.0.1", master=master.master.address, python=bare_python, command=sleep_in(bare_python)
    ) as c:
        assert sorted(c.cluster_def) == ["ps", "worker"]
        assert all(t.initialized for t in c.tasks.values())
        for task in master.master.tasks.values():
            command = task.task_info["command"]
            [uri] = command["uris"]
            assert uri["value"].endswith(f"/v1/node-archive/{archive.name}")
            assert uri["value"].startswith("http://tfcoord:")  # the download credential, as libcurl sends it
            assert (uri["executable"], uri["extract"], uri["output_file"]) == (True, False, archive.name)
            assert command["value"].startswith(f"exec {bare_python} -c ")
            assert f'"$MESOS_SANDBOX"/{archive.name} {archive.sha256} --address' in command["value"]
            [fetched] = task.fetched
            assert fetched == task.sandbox / archive.name
            assert hashlib.sha256(fetched.read_bytes()).hexdigest() == archive.sha256
            assert stat.S_IMODE(fetched.stat().st_mode) == 0o755
            # The token reaches the task as a Secret: nothing in the TaskInfo shows it in clear.
            var = token_of(task.task_info)
            assert var["type"] == "SECRET" and "value" not in var
            token = base64.b64decode(var["secret"]["value"]["data"]).decode()
            assert (
                token == auth.job_token(c._coord.secret, c.job, c._coord.server.state.jobs[c.job].owner).hex()
            )
            assert token not in str(task.task_info).replace(var["secret"]["value"]["data"], "")


def test_an_image_with_tfcoord_runs_the_archive_too_or_its_own_when_told(
    master: ThreadedFakeMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with cluster(
        ONE,
        "127.0.0.1",
        master=master.master.address,
        python=sys.executable,
        command=sleep_in(sys.executable),
    ):
        [task] = master.master.tasks.values()
        assert task.fetched and "-m tfcoord.node" not in task.task_info["command"]["value"]
        # Docker (tfmesos2's default image): its containerizer resolves no secrets, so a plain variable.
        assert task.task_info["container"]["docker"]["image"] == "avhost/tensorflow-mesos:latest"
        assert "value" in token_of(task.task_info) and "type" not in token_of(task.task_info)
    wait(master, lambda: all(t.gone for t in master.master.tasks.values()))
    monkeypatch.setenv("TFCOORD_MESOS_NODE_ARCHIVE", "false")
    with cluster(
        ONE,
        "127.0.0.1",
        master=master.master.address,
        python=sys.executable,
        command=sleep_in(sys.executable),
    ) as c:
        [task] = [t for t in master.master.tasks.values() if c.job in t.task_id]
        assert "uris" not in task.task_info["command"] and not task.fetched
        assert task.task_info["command"]["value"].startswith(
            f"exec {sys.executable} -m tfcoord.node --address"
        )


def test_an_old_master_gets_the_token_as_a_plain_variable(
    bare_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_IMAGE", "")
    with (
        ThreadedFakeMaster([AgentSpec(cpus=4, mem=8192)], heartbeat_interval_s=0.5, version="1.3.0") as m,
        cluster(ONE, "127.0.0.1", master=m.master.address, python=bare_python, command=sleep_in(bare_python)),
    ):
        [task] = m.master.tasks.values()
        assert "value" in token_of(task.task_info) and "secret" not in token_of(task.task_info)


def test_tfmesos2s_client_credentials_are_the_archives_download_credential(
    master: ThreadedFakeMaster, bare_python: str
) -> None:
    env = {"TFMESOS2_CLIENT_USERNAME": "fetch-user", "TFMESOS2_CLIENT_PASSWORD": "p@ss:w/rd"}
    with cluster(
        ONE,
        "127.0.0.1",
        master=master.master.address,
        python=bare_python,
        command=sleep_in(bare_python),
        env=env,
    ):
        [task] = master.master.tasks.values()
        [uri] = task.task_info["command"]["uris"]
        assert uri["value"].startswith("http://fetch-user:p%40ss%3Aw%2Frd@127.0.0.1:")
        assert task.fetched


def test_a_fetch_the_agent_cannot_do_fails_the_job_naming_it(
    master: ThreadedFakeMaster, bare_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFCOORD_MESOS_URIS", "http://127.0.0.1:9/data.tar.gz")
    with (
        pytest.raises(
            JobFailed, match=r"Failed to fetch all URIs for container .*Error downloading resource"
        ),
        cluster(
            ONE, "127.0.0.1", master=master.master.address, python=bare_python, command=sleep_in(bare_python)
        ),
    ):
        pass
    [task] = master.master.tasks.values()
    assert len(task.task_info["command"]["uris"]) == 2 and task.fetched == []  # none counts: one failed
