"""``tfcoord submit --engine local --role-resources``: node processes pinned to their CPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tfcoord.driver.local import cpu_plan, cpu_shortfall
from tfcoord.driver.resources import Resources

PRINT_AFFINITY = "import os; print('cpus', sorted(os.sched_getaffinity(0)))"


@pytest.mark.timeout(120)
def test_local_nodes_run_on_the_cpus_their_role_asks_for_and_gpus_are_warned_about(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "local",
            "--workers",
            "2",
            "--role-resources",
            "worker:cpus=1,gpus=1",
            "--",
            sys.executable,
            "-c",
            PRINT_AFFINITY,
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    available = sorted(os.sched_getaffinity(0))
    expected = {0: [available[0]], 1: [available[1 % len(available)]]}
    seen = {
        int(i): [int(c) for c in cpus.split(", ")]
        for i, cpus in re.findall(r"\[worker:(\d)\] cpus \[([\d, ]+)\]", out.stdout)
    }
    assert seen == expected, out.stdout + out.stderr
    for i, cpus in expected.items():
        assert f"worker:{i} pinned to CPU(s) {cpus[0]}" in out.stderr
    assert "warning: the local engine does not enforce gpus or memory (roles worker)" in out.stderr
    assert ("nodes share CPUs" in out.stderr) == (len(available) < 2), out.stderr


def test_cpu_plan_gives_each_node_cpus_of_its_own_then_wraps_around() -> None:
    slots = [("ps", 0), ("worker", 0), ("worker", 1)]
    given = {"ps": Resources(cpus=1), "worker": Resources(cpus=1.5)}
    assert cpu_plan(slots, given, [0, 1, 2, 3, 4]) == {0: (0,), 1: (1, 2), 2: (3, 4)}
    assert cpu_plan(slots, given, [4, 6]) == {0: (4,), 1: (4, 6), 2: (4, 6)}
    assert cpu_plan(slots, {"worker": Resources(gpus=1)}, [0, 1]) == {}


def test_cpus_the_machine_cannot_give_each_node_are_named_with_the_numbers() -> None:
    slots = [("ps", 0), ("worker", 0), ("worker", 1)]
    given = {"ps": Resources(cpus=0.5), "worker": Resources(cpus=2)}
    assert cpu_shortfall(slots, given, 5) is None  # 1 + 2 x 2: each node has CPUs of its own
    short = cpu_shortfall(slots, given, 4)
    assert short is not None and short.startswith(
        "the roles ask 5 CPUs in all (1 ps x 0.5, 2 worker x 2), this machine lets this process use 4: nodes share CPUs"
    )
    assert cpu_shortfall(slots, {"worker": Resources(gpus=1)}, 1) is None  # no cpus asked


def test_local_engine_refuses_a_role_it_does_not_run(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--workers",
            "1",
            "--role-resources",
            "ps:cpus=1",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "role_resources names 'ps', which this cluster has no task of (its roles: worker)" in out.stderr
