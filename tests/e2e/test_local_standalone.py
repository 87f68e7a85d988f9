"""``tfcoord submit --master local-standalone`` is sized to this machine or refused with the
numbers, before any Spark daemon starts: the CLI as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfcoord.driver.standalone import machine_mib

ROOT = Path(__file__).resolve().parents[2]
#: Refused before Spark starts (a JVM takes seconds): Python's start-up and imports only.
REFUSED_WITHIN_S = 20

pytestmark = [pytest.mark.timeout(120)]


def _submit(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
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
            *flags,
            "--",
            str(ROOT / "examples" / "spark_train.py"),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    return out, time.monotonic() - t0


def test_more_executor_cores_than_the_machine_has_are_refused_with_the_numbers(tmp_path):
    cores = len(os.sched_getaffinity(0))
    out, took = _submit(tmp_path, "--num-executors", str(cores + 1))
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert f"{cores + 1} executors x 1 core need {cores + 1} cores, this machine has {cores}" in last
    assert "--num-executors" in last and "Traceback" not in out.stderr
    assert "starting a local Spark" not in out.stderr  # no daemon was started
    assert took < REFUSED_WITHIN_S


def test_more_executor_memory_than_the_machine_has_is_refused_with_the_numbers(tmp_path):
    gib = machine_mib() // 1024 + 1
    out, took = _submit(tmp_path, "--num-executors", "1", "--executor-memory", f"{gib}g")
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert f"1 executor x {gib}g need {gib * 1024} MiB, this machine has {machine_mib()} MiB" in last
    assert "--executor-memory" in last and "Traceback" not in out.stderr
    assert took < REFUSED_WITHIN_S


def test_conf_over_the_flags_sizes_it_too(tmp_path):
    # --conf spark.executor.memory wins over --executor-memory in the application: the local
    # worker is sized (and refused) by what the application will ask for.
    gib = machine_mib() // 1024 + 1
    out, took = _submit(tmp_path, "--num-executors", "1", "--conf", f"spark.executor.memory={gib}g")
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"1 executor x {gib}g need {gib * 1024} MiB" in out.stderr.strip().splitlines()[-1]
    assert took < REFUSED_WITHIN_S
