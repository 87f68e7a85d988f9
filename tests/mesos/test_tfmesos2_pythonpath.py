"""tfmesos2 0.4.0 gives every task its scheduler's ``sys.path`` as ``PYTHONPATH``; tasks run
on the agent's own ``python3`` without an image of their own (the Mesos containerizer, a
filesystem shared with the agents) find TensorFlow and the program's modules through it.

Against the fake master, whose tasks are real processes started with only ``PATH`` (as on an
agent): the agent's ``python3`` has neither tfcoord's dependencies nor TensorFlow installed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mesos.fake_master import AgentSpec, ThreadedFakeMaster
from tfcoord.compat.tfmesos2 import Job, cluster, scheduler_python_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: The variables that would name the tasks' Python or image: a user who sets none of them
#: runs tfmesos2's way.
SAYS_OTHERWISE = ("DOCKER_IMAGE", "TFCOORD_TASK_PYTHON", "TFCOORD_MESOS_ENV", "TFCOORD_MESOS_NODE_ARCHIVE")


@pytest.fixture
def master() -> Iterator[ThreadedFakeMaster]:
    with ThreadedFakeMaster(
        [AgentSpec(cpus=4, mem=8192)], heartbeat_interval_s=0.5, kill_grace_s=1.0, inherit_env=False
    ) as m:
        yield m


@pytest.fixture
def scheduler_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module only the scheduler's ``sys.path`` holds (not installed, not on PYTHONPATH)."""
    lib = tmp_path / "scheduler-lib"
    lib.mkdir()
    (lib / "only_on_the_scheduler.py").write_text("ANSWER = 42\n")
    monkeypatch.syspath_prepend(str(lib))
    for name in SAYS_OTHERWISE:
        monkeypatch.delenv(name, raising=False)
    return lib


def test_tasks_find_tensorflow_and_the_schedulers_modules_through_its_sys_path(
    master: ThreadedFakeMaster, scheduler_module: Path, tmp_path: Path
) -> None:
    out = tmp_path / "answer"
    # The task's command runs on the agent's python3, as a tfmesos2 user's own code would.
    command = [
        "python3",
        "-c",
        f"import only_on_the_scheduler, pathlib; pathlib.Path({str(out)!r}).write_text(str(only_on_the_scheduler.ANSWER))",
    ]
    with cluster([Job("worker", 1, cpus=0.5, mem=256)], "127.0.0.1", master=master.master.address) as c:
        # Server mode: the node imported TensorFlow on the agent's python3 and its server listens.
        (task,) = c.tasks.values()
        assert task.state == "TASK_RUNNING" and task.initialized
        env = {
            v["name"]: v.get("value")
            for v in master.master.task(task.mesos_task_id).task_info["command"]["environment"]["variables"]
        }
        assert env["PYTHONPATH"].split(os.pathsep) == [p for p in sys.path if p]
        assert str(scheduler_module) in env["PYTHONPATH"].split(os.pathsep)
    with cluster(
        [Job("worker", 1, cpus=0.5, mem=256)], "127.0.0.1", master=master.master.address, command=command
    ) as c:
        (task,) = c.tasks.values()
        # The task's command ran to its end on the agent (a failed import would fail the task).
        master.call(master.master.wait_task_state(task.mesos_task_id, "TASK_FINISHED", timeout_s=60), 90)
    assert out.read_text() == "42"


def test_a_named_python_image_or_pythonpath_wins(scheduler_module: Path) -> None:
    assert scheduler_python_path({}, {}, image=None, python=None) == os.pathsep.join(p for p in sys.path if p)
    assert scheduler_python_path({}, {}, image=None, python="/opt/py/bin/python3") is None
    assert (
        scheduler_python_path({"TFCOORD_TASK_PYTHON": "/opt/py/bin/python3"}, {}, image=None, python=None)
        is None
    )
    assert scheduler_python_path({}, {}, image="registry/tf:2.15", python=None) is None
    assert scheduler_python_path({"DOCKER_IMAGE": "registry/tf:2.15"}, {}, image=None, python=None) is None
    assert scheduler_python_path({}, {"PYTHONPATH": "/shared/lib"}, image=None, python=None) is None
