"""Resources per role on the session's real standalone cluster.

Each test runs ``tfcoord submit --engine spark`` as a subprocess (a second Spark application
beside the session's, on the worker's spare cores and GPUs) with ``--role-resources``: the ps
and the workers run as Spark jobs of their own, with their own ResourceProfile, joined into one
cluster by the coordinator. Refusals are checked in-process against the session's application.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark import mapfuns
from tests.spark.conftest import WORKER_GPUS
from tfcoord.driver.resources import ResourcesError
from tfcoord.driver.spark import run

SCRIPT = Path(__file__).with_name("roles_script.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _submit(sc: Any, tmp_path: Path, mode: str, *flags: str) -> dict[str, dict[str, Any]]:
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "spark",
            "--master",
            sc.master,
            "--num-executors",
            "3",
            "--ps",
            "1",
            *flags,
            "--",
            str(SCRIPT),
            str(out),
            mode,
        ],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_ps_tasks_get_one_cpu_and_worker_tasks_two_and_the_job_trains(sc, tmp_path):
    # Two executors of 3 cores: a 2-cpu worker task and the 1-cpu ps fit on one, never two workers.
    nodes = _submit(
        sc,
        tmp_path,
        "train",
        "--executor-cores",
        "3",
        "--conf",
        "spark.cores.max=6",
        "--role-resources",
        "ps:cpus=1",
        "--role-resources",
        "worker:cpus=2",
    )
    assert sorted(nodes) == ["ps-0", "worker-0", "worker-1"]
    assert nodes["ps-0"]["task_cpus"] == 1 and nodes["ps-0"]["resources"] == {"cpus": 1, "gpus": []}
    for name in ("worker-0", "worker-1"):
        n = nodes[name]
        assert n["task_cpus"] == 2 and n["resources"] == {"cpus": 2, "gpus": []}
        assert n["variable"].startswith("/job:ps/task:0")
        assert n["loss_last"] < n["loss_first"] / 100, n
        assert abs(n["w"] - 3) < 0.1 and abs(n["b"] - 2) < 0.1
    used: dict[str, int] = {}
    for n in nodes.values():
        used[n["executor"]] = used.get(n["executor"], 0) + n["task_cpus"]
    assert nodes["worker-0"]["executor"] != nodes["worker-1"]["executor"]
    assert all(cpus <= 3 for cpus in used.values()), used


def test_workers_get_distinct_gpus_through_their_profile_and_the_ps_none(sc, tmp_path):
    # One executor of 5 cores holding the worker's 2 (fake) GPUs: every node runs on it.
    nodes = _submit(
        sc,
        tmp_path,
        "record",
        "--executor-cores",
        "5",
        "--conf",
        "spark.cores.max=5",
        "--conf",
        f"spark.executor.resource.gpu.amount={len(WORKER_GPUS)}",
        "--role-resources",
        "ps:cpus=1",
        "--role-resources",
        "worker:cpus=2,gpus=1",
    )
    ps, w0, w1 = nodes["ps-0"], nodes["worker-0"], nodes["worker-1"]
    assert ps["task_gpus"] == [] and ps["cuda"] == "" and ps["resources"]["gpus"] == []
    assert len(w0["task_gpus"]) == len(w1["task_gpus"]) == 1
    assert sorted(w0["task_gpus"] + w1["task_gpus"]) == sorted(WORKER_GPUS)
    for w in (w0, w1):
        assert w["cuda"] == w["task_gpus"][0] and w["resources"] == {"cpus": 2, "gpus": w["task_gpus"]}
    assert len({n["executor"] for n in nodes.values()}) == 1


def test_more_task_cpus_than_executor_cores_is_refused_before_anything_starts(sc, tmp_path):
    args = mapfuns.args_for(tmp_path)
    with pytest.raises(ResourcesError, match=r"^worker asks for 2 cpus per task but executors have 1 cores"):
        run(sc, mapfuns.report_context, args, 2, 0, role_resources={"worker": {"cpus": 2}})
    assert not list(tmp_path.glob("*.json"))


def test_gpus_on_executors_without_gpus_are_refused(sc, tmp_path):
    args = mapfuns.args_for(tmp_path)
    with pytest.raises(ResourcesError, match=r"^worker asks for GPUs but the executors have none: set"):
        run(sc, mapfuns.report_context, args, 2, 0, role_resources={"worker": {"gpus": 1}})


def test_a_role_the_cluster_lacks_is_refused(sc, tmp_path):
    args = mapfuns.args_for(tmp_path)
    with pytest.raises(ResourcesError, match=r"names 'wroker', which this cluster has no task of"):
        run(sc, mapfuns.report_context, args, 2, 0, role_resources={"wroker": {"cpus": 1}})


@pytest.mark.parametrize(
    ("master", "flags", "expected"),
    [
        ("local[2]", [], r"local\[2\] \(local mode\) has no stage-level scheduling"),
        ("yarn", [], r"role_resources on YARN needs dynamic allocation"),
        (
            "k8s://https://127.0.0.1:1",
            ["--conf", "spark.dynamicAllocation.enabled=true", "--role-resources", "ps:gpus=1"],
            r"ps asks for GPUs but spark.executor.resource.gpu.discoveryScript is not set",
        ),
    ],
)
def test_submit_refuses_what_the_cluster_manager_cannot_honour_in_one_line(tmp_path, master, flags, expected):
    script = tmp_path / "train.py"
    script.write_text("def main_fun(args, ctx):\n    pass\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "spark",
            "--master",
            master,
            "--num-executors",
            "2",
            "--ps",
            "1",
            "--role-resources",
            "worker:cpus=1",
            *flags,
            "--",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if re.search(expected, line)]) == 1, proc.stderr
