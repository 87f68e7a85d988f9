"""The fake master's agent side over the v1 API: the fetcher before the command, and environment
secrets resolved (or refused) as a Mesos master and its containerizers do."""

from __future__ import annotations

import base64
import shlex
import stat

from tests.mesos.fake_master import AgentSpec, FakeMaster
from tests.mesos.test_fake_master import PY, connect, session, task_info  # noqa: F401 (fixtures)


def secret(name: str, value: str) -> dict[str, object]:
    data = base64.b64encode(value.encode()).decode()
    return {"name": name, "type": "SECRET", "secret": {"type": "VALUE", "value": {"data": data}}}


async def test_uris_are_fetched_into_the_sandbox_before_the_command_starts(connect, tmp_path):  # noqa: F811
    (tmp_path / "tool.sh").write_text("#!/bin/sh\necho fetched-tool\n")
    async with FakeMaster([AgentSpec(cpus=2, mem=1024)], heartbeat_interval_s=0.5) as m:
        sched = await connect(m)
        [offer] = await sched.offers()
        info = task_info(offer, "f", "./tool.sh")
        info["command"]["uris"] = [{"value": f"file://{tmp_path / 'tool.sh'}", "executable": True}]
        await sched.launch([offer], info)
        assert await sched.states("f", "TASK_FINISHED") == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
        task = m.task("f")
        assert task.fetched == [task.sandbox / "tool.sh"]
        assert stat.S_IMODE(task.fetched[0].stat().st_mode) == 0o755
        assert (task.sandbox / "stdout").read_text() == "fetched-tool\n"


async def test_a_failed_fetch_fails_the_task_before_it_starts(connect):  # noqa: F811
    async with FakeMaster([AgentSpec(cpus=2, mem=1024)], heartbeat_interval_s=0.5) as m:
        sched = await connect(m)
        [offer] = await sched.offers()
        info = task_info(offer, "nofetch", "true")
        info["command"]["uris"] = [{"value": "http://127.0.0.1:9/none.tar.gz"}]
        await sched.launch([offer], info)
        status = await sched.update("nofetch")
        assert status["state"] == "TASK_FAILED"  # no TASK_STARTING: the command never ran
        assert status["reason"] == "REASON_CONTAINER_LAUNCH_FAILED"
        assert status["message"].startswith(
            "Failed to launch container: Failed to fetch all URIs for container"
        )
        assert "Error downloading resource" in status["message"]
        assert m.task("nofetch").pid is None


async def test_secrets_resolve_under_the_mesos_containerizer_of_a_1_4_master(connect):  # noqa: F811
    async with FakeMaster([AgentSpec(cpus=2, mem=1024)], heartbeat_interval_s=0.5) as m:
        sched = await connect(m)
        [offer] = await sched.offers()
        script = "import os; print(os.environ['TOKEN'])"
        info = task_info(offer, "s", f"{PY} -c {shlex.quote(script)}")
        info["command"]["environment"] = {"variables": [secret("TOKEN", "hush")]}
        await sched.launch([offer], info)
        assert await sched.states("s", "TASK_FINISHED") == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
        assert (m.task("s").sandbox / "stdout").read_text() == "hush\n"

        [offer] = await sched.offers()
        docker = {"type": "DOCKER", "docker": {"image": "img", "network": "HOST"}}
        info = task_info(offer, "d", "true", container=docker)
        info["command"]["environment"] = {"variables": [secret("TOKEN", "hush")]}
        await sched.launch([offer], info)
        status = await sched.update("d")
        assert (status["state"], status["reason"]) == ("TASK_FAILED", "REASON_CONTAINER_LAUNCH_FAILED")
        assert "Docker containerizer does not support environment secrets (TOKEN)" in status["message"]


async def test_a_master_older_than_1_4_refuses_secrets(connect):  # noqa: F811
    async with FakeMaster([AgentSpec(cpus=2, mem=1024)], heartbeat_interval_s=0.5, version="1.3.2") as m:
        sched = await connect(m)
        subscribed = next(e for e in sched.history if e["type"] == "SUBSCRIBED")
        assert subscribed["subscribed"]["master_info"]["version"] == "1.3.2"
        [offer] = await sched.offers()
        info = task_info(offer, "old", "true")
        info["command"]["environment"] = {"variables": [secret("TOKEN", "hush")]}
        await sched.launch([offer], info)
        status = await sched.update("old")
        assert (status["state"], status["reason"]) == ("TASK_ERROR", "REASON_TASK_INVALID")
        assert (
            status["message"]
            == "Environment variable 'TOKEN' of type 'SECRET' is not supported by Mesos 1.3.2"
        )
