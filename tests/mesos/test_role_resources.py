"""One ``role_resources`` description drives a Mesos job: ``tfcoord submit --engine mesos --ps 1
--workers 2 --role-resources ...`` against the fake master, each role's tasks launched with, and
placed by, its own resources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mesos.fake_master import AgentSpec, ThreadedFakeMaster
from tfcoord.client import make_roles
from tfcoord.driver.resources import ResourcesError, mesos_roles, role_resources

ROOT = Path(__file__).resolve().parents[2]
#: The same description the Spark engine takes (run(..., role_resources=...)).
ROLES = {"ps": {"cpus": 0.5, "memory": "256m"}, "worker": {"cpus": 2, "memory": "1g"}}
#: Each node records its role, so the test knows every task ran the command.
TASK = "import json, os, pathlib, sys; t = json.loads(os.environ['TF_CONFIG'])['task']; pathlib.Path(sys.argv[1], f\"{t['type']}{t['index']}\").touch()"


def _scalars(task_info: dict) -> dict[str, float]:
    return {r["name"]: r["scalar"]["value"] for r in task_info["resources"] if "scalar" in r}


@pytest.mark.timeout(120)
def test_submit_engine_mesos_sizes_each_roles_offers_from_role_resources(tmp_path: Path) -> None:
    # A small agent no worker fits on (1 cpu) and a large one both workers fit on beside the ps.
    agents = [
        AgentSpec("127.0.0.1", cpus=1, mem=2048, ports=((31000, 31099),)),
        AgentSpec("127.0.0.1", cpus=5, mem=4096, ports=((32000, 32099),)),
    ]
    with ThreadedFakeMaster(agents, heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        env = dict(os.environ, MESOS_MASTER=m.master.address, TFCOORD_TASK_PYTHON=sys.executable)
        for var in ("TFCOORD_ADDRESS", "MESOS_ATTRIBUTES", "DOCKER_IMAGE"):
            env.pop(var, None)
        flags = [f"{role}:" + ",".join(f"{k}={v}" for k, v in r.items()) for role, r in ROLES.items()]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tfcoord",
                "submit",
                "--engine",
                "mesos",
                "--advertise-host",
                "127.0.0.1",
                "--ps",
                "1",
                "--workers",
                "2",
                *(a for f in flags for a in ("--role-resources", f)),
                "--",
                sys.executable,
                "-c",
                TASK,
                str(tmp_path),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=100,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        assert (
            "submitted to Mesos: 1 ps (cpus=0.5,mem=256,gpus=0), 2 worker (cpus=2,mem=1024,gpus=0)"
            in out.stderr
        )
        assert {"worker0", "worker1"} <= {p.name for p in tmp_path.iterdir()}
        small = m.master.agents[0].id
        tasks = {t.task_info["name"]: t for t in m.master.tasks.values()}
        by_role = {name: _scalars(t.task_info) for name, t in tasks.items()}
        assert len(tasks) == 3, by_role
        for name, t in tasks.items():
            res = by_role[name]
            if "/job:ps/" in name:
                assert (res["cpus"], res["mem"]) == (0.5, 256.0), (name, res)
            else:
                assert (res["cpus"], res["mem"]) == (2.0, 1024.0), (name, res)
                assert t.agent_id != small  # no offer of the small agent fits a worker


def test_role_resources_for_mesos_refuse_a_role_the_cluster_lacks_and_fill_in_defaults() -> None:
    roles = make_roles(2, 1)
    with pytest.raises(ResourcesError, match="names 'chief', which this cluster has no task of"):
        mesos_roles(roles, role_resources({"chief": {"cpus": 1}}))
    ps, worker = mesos_roles(roles, role_resources({"worker": {"gpus": 1, "memory": 2048}}))
    assert (ps.role, ps.count, ps.cpus, ps.mem, ps.gpus) == ("ps", 1, 1.0, 1024.0, 0)
    assert (worker.role, worker.count, worker.cpus, worker.mem, worker.gpus) == ("worker", 2, 1.0, 2048.0, 1)
