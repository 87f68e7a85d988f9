"""Mesos readiness benchmark: 1 ps + 2 workers, submission to every task ready, tfcoord vs tfmesos2.

    python benchmarks/mesos_ready.py [--runs 3] [--tfmesos2-runs 1] [--json]

Both systems run against the same fake Mesos master, started once as its own process
(``python tests/mesos/fake_master.py --port 0 --port-file F``), which runs every launched
task as a local process. Each run is a whole ``cluster()``-style bring-up: the framework
subscribes, offers come, three tasks launch, each task reports in and learns the cluster.

tfcoord runs in this process through its driver API (an embedded coordinator running the
Mesos framework, tasks in server mode: each starts a ``tf.distribute.Server``). Two times
are reported: ``ready_s``, from the start of the bring-up until every task holds the
cluster spec (the job is READY: the point at which tfmesos2 considers a task ready, its
port reported), and ``serving_s``, until every task's TensorFlow server listens (RUNNING).
Whether all three tasks were launched from the first round of offers comes from the
framework's own counters.

tfmesos2 0.4.0 (``pip install tfmesos2==0.4.0 six``) binds a fixed callback port (11000)
and cannot run ``cluster()`` twice in one process, so each of its runs is a subprocess, run
by ``/usr/bin/python3`` (the interpreter its tasks are hard-coded to use: it passes its own
``sys.path`` to them, so its scheduler must share their standard library);
``ready_s`` is how long its ``cluster()`` took to yield. Its tasks poll every 10 s and its
scheduler sleeps a fixed 10 s. A failure (not installed, port taken, timeout) is recorded
in the result instead of ending the benchmark.

The floor (``mesos_floor.py``), on the same master in the same run, as many times as
tfcoord and interleaved with its runs: a bare scheduler launching the same three tasks,
each a Python that connects back once; ``floor_s`` is from its subscription to the third
connection. The result carries ``floor_s`` (median), ``ratio_to_floor`` (tfcoord's median
``ready_s`` over it; goal <= 2), the load average and a ``figure`` row for ``results.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FAKE_MASTER = ROOT / "tests" / "mesos" / "fake_master.py"

sys.path.insert(0, str(ROOT / "benchmarks"))
from floor import figure, load_average, ratio  # noqa: E402
from mesos_floor import run_floor  # noqa: E402

from tfcoord.client import DriverClient  # noqa: E402
from tfcoord.coordinator.mesos.config import MesosConfig  # noqa: E402
from tfcoord.coordinator.mesos.jobs import MesosJob, parse_role  # noqa: E402
from tfcoord.driver import mesos  # noqa: E402

#: Generous bounds: a run that takes this long has failed anyway (three TensorFlow imports on
#: a loaded two-core machine take well under a minute).
RUN_TIMEOUT_S = 240.0
TFMESOS2_TIMEOUT_S = 240.0
#: tfmesos2's tasks run ``/usr/bin/python3 -m tfmesos2.server`` (hard-coded in 0.4.0).
TFMESOS2_TASK_PYTHON = "/usr/bin/python3"
#: The cluster both systems bring up: tfmesos2's default task size.
ROLES = ("ps:1:cpus=1,mem=1024", "worker:2:cpus=1,mem=1024")
#: The floor's tasks: the same three, the same sizes.
FLOOR_TASKS = [("ps", 1.0, 1024.0), ("worker", 1.0, 1024.0), ("worker", 1.0, 1024.0)]
TARGET_RATIO_TO_FLOOR = 2.0

TFMESOS2_RUN = textwrap.dedent(
    """
    import json, logging, sys, time
    from tfmesos2 import Job, cluster
    t0 = time.monotonic()
    with cluster([Job(name="ps", num=1), Job(name="worker", num=2)], client_ip="127.0.0.1",
                 loglevel=logging.WARNING) as c:
        ready = time.monotonic() - t0
        print(json.dumps({"ready_s": ready, "cluster_def": c.cluster_def}), flush=True)
    """
)


class FakeMasterProcess:
    """``tests/mesos/fake_master.py`` as its own process: one agent with room for both runs."""

    def __init__(self, workdir: Path) -> None:
        port_file = workdir / "master.port"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(FAKE_MASTER),
                "--port",
                "0",
                "--port-file",
                str(port_file),
                "--cpus",
                "8",
                "--mem",
                "16384",
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # printed once the port file is in place
        if "listening" not in line:
            self.proc.kill()
            raise RuntimeError(f"the fake master did not start: {line!r}")
        self.address = f"127.0.0.1:{int(port_file.read_text())}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def run_tfcoord(master: str) -> dict[str, Any]:
    config = MesosConfig.from_env({"MESOS_MASTER": master}, python=sys.executable)
    job = MesosJob.of([parse_role(r) for r in ROLES])  # no command: server mode
    t0_wall, t0 = time.time(), time.monotonic()
    coord = mesos.start_coordinator(config, advertise_host="127.0.0.1")
    try:
        with DriverClient(coord.address, coord.secret, ssl_context=mesos.driver_tls(coord)) as driver:
            jid = driver.submit(job.to_spec(name="bench", reservation_timeout_s=RUN_TIMEOUT_S))
            status = mesos.wait_running(driver, jid, timeout_s=RUN_TIMEOUT_S)
            serving = time.monotonic() - t0
            ready_at = next(t for t, text in status["events"] if text.endswith("-> READY"))
            stats = coord.call(lambda: coord.server.engines["mesos"].job_stats(jid))
            mesos.stop_and_wait(driver, jid, "benchmark run over")
        return {
            "ready_s": round(ready_at - t0_wall, 3),
            "serving_s": round(serving, 3),
            "launched_s": round(stats["launched"] - t0, 3) if stats.get("launched") else None,
            "offer_rounds_to_launch_all": stats.get("launched_in_rounds"),
            "cluster_def": status["cluster"],
        }
    finally:
        coord.stop()


def run_tfmesos2(master: str, python: str) -> dict[str, Any]:
    # The scheduler runs under the interpreter its tasks will use, with this environment's
    # packages on PYTHONPATH: tfmesos2 hands its sys.path to the tasks, so a scheduler on
    # another interpreter would give them a standard library that is not theirs. Every
    # site-packages of this one: .venv-bench holds tfmesos2 and sees the rest in .venv.
    sites = [p for p in sys.path if p.endswith("site-packages")] or [sysconfig.get_paths()["purelib"]]
    env = dict(os.environ, MESOS_MASTER=master, MESOS_SSL="false", PYTHONPATH=os.pathsep.join(sites))
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            [python, "-c", TFMESOS2_RUN], env=env, capture_output=True, text=True, timeout=TFMESOS2_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-800:]
        return {"error": f"no readiness within {TFMESOS2_TIMEOUT_S:g} s", "stderr_tail": str(tail)}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {
            "error": f"exit code {out.returncode}",
            "stderr_tail": out.stderr[-800:],
            "took_s": round(time.monotonic() - t0, 3),
        }
    result = json.loads(lines[-1])
    result["ready_s"] = round(result["ready_s"], 3)
    return result


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return round(statistics.median(values), 3) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="tfcoord runs (median reported)")
    parser.add_argument(
        "--tfmesos2-runs", type=int, default=1, help="tfmesos2 runs (about 20 s each); 0 skips it"
    )
    parser.add_argument(
        "--tfmesos2-python",
        default=TFMESOS2_TASK_PYTHON,
        help="interpreter of tfmesos2's scheduler (its tasks always run /usr/bin/python3)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mesos-bench-") as tmp:
        master = FakeMasterProcess(Path(tmp))
        try:
            tfcoord_runs, floor_runs = [], []
            for _ in range(args.runs):
                try:
                    tfcoord_runs.append(run_tfcoord(master.address))
                except Exception as e:  # a failed run is a result too
                    tfcoord_runs.append({"error": f"{type(e).__name__}: {e}"})
                try:
                    floor_runs.append(run_floor(master.address, FLOOR_TASKS))
                except Exception as e:
                    floor_runs.append({"error": f"{type(e).__name__}: {e}"})
            tfmesos2_runs = [
                run_tfmesos2(master.address, args.tfmesos2_python) for _ in range(args.tfmesos2_runs)
            ]
        finally:
            master.stop()
    ours, theirs = median(tfcoord_runs, "ready_s"), median(tfmesos2_runs, "ready_s")
    floor = median(floor_runs, "floor_s")
    result = {
        "benchmark": "mesos_ready",
        "cluster": {"ps": 1, "worker": 2},
        "master": "tests/mesos/fake_master.py (own process; tasks run as local processes)",
        "tfcoord": {
            "runs": tfcoord_runs,
            "ready_s_median": ours,
            "serving_s_median": median(tfcoord_runs, "serving_s"),
            "all_launched_from_first_offer_round": all(
                r.get("offer_rounds_to_launch_all") == 1 for r in tfcoord_runs
            ),
        },
        "tfmesos2": {"version": "0.4.0", "runs": tfmesos2_runs, "ready_s_median": theirs},
        "ratio_ready": round(ours / theirs, 4) if ours and theirs else None,
    }
    result["target_met"] = result["ratio_ready"] is not None and result["ratio_ready"] <= 0.1
    result.update(
        floor={"runs": floor_runs, "floor_s_median": floor},
        floor_s=floor,
        ratio_to_floor=ratio(ours, floor),
        loadavg=load_average(),
    )
    result["figure"] = figure(
        "Mesos readiness: submission to every task holding the spec",
        unit="s",
        tfcoord=ours,
        floor=floor,
        anchor=theirs,
        anchor_name="tfmesos2 0.4.0",
        goal=TARGET_RATIO_TO_FLOOR,
        shape=f"1 ps + 2 workers on the fake master (own process); median of {args.runs}",
        loadavg=result["loadavg"],
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"tfcoord : ready {ours} s (median of {args.runs}), serving {result['tfcoord']['serving_s_median']} s, "
            f"all launched from the first offer round: {result['tfcoord']['all_launched_from_first_offer_round']}"
        )
        print(
            f"tfmesos2: ready {theirs} s"
            + "".join(f"\n  failed: {r['error']}" for r in tfmesos2_runs if "error" in r)
        )
        print(
            f"ratio   : {result['ratio_ready']} (target <= 0.1: {'met' if result['target_met'] else 'not met'})"
        )
        print(
            f"floor   : {floor} s (a bare scheduler's tasks connecting back); tfcoord / floor {result['ratio_to_floor']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
