"""Node death benchmark: a node's TensorFlow process is SIGKILLed; how long until the driver reports the error?

    python benchmarks/node_death.py [--engines local,spark] [--systems tfcoord,tfos] [--repeats 3] [--json]

Every run starts a 2-worker job whose nodes' code notes its process id and then waits (a
training that never ends by itself), SIGKILLs worker 1's process (the one running the
user's code: ``map_fun`` on Spark, the command on the local engine) and measures, on
this process's monotonic clock, from the ``kill()`` to the driver's error:

* ``local`` (tfcoord only): ``tfcoord submit --engine local --workers 2 -- python -c ...``
  as a subprocess (an embedded coordinator, TLS, as a user runs it). ``error_s``: until its
  first line on stderr after the kill that says the job failed (the ``tfcoord: ...`` line
  naming the node and its signal); ``exit_s``: until the command exited (the other node
  stopped, the coordinator closed), with its exit code.
* ``spark``: one local Spark standalone cluster (a worker with 2 cores; 2 executors x 1
  core; ``spark.task.maxFailures=1``, so a lost task fails the Spark job instead of being
  retried, for both systems), ``run(sc, map_fun, args, 2, 0)`` then ``shutdown()`` in
  InputMode.TENSORFLOW. ``error_s``: until ``shutdown()`` raised. tfcoord's ``map_fun``
  runs in a process its node supervisor forked, and the supervisor reports the exit to the
  coordinator, which fails the job; its driver raises ``JobFailed`` naming worker 1.
  TensorFlowOnSpark 2.2.5 (the anchor) runs a worker's ``map_fun`` in the foreground of the
  Spark task's Python worker: its death fails the Spark task, so the Spark job, which its
  driver's background thread records as an error; its ``shutdown()`` polls Spark's active
  jobs with 5 s sleeps, then runs a shutdown job, then calls ``sys.exit(1)`` (stopping the
  SparkContext: this benchmark makes a new one after each of its runs). Measured here, it
  never got there: its shutdown job waits on the dead node's executor, and the driver
  reported the death only when ``shutdown(timeout=--tfos-timeout)`` fired its SIGALRM and
  ``sys.exit(1)``; its ``error_s`` is that timeout (``noticed_by_timeout``).

The floor: the time the OS takes to report a process's exit to its parent: a child
Python waiting in ``sleep`` is SIGKILLed while a thread of this process waits for it in
``waitpid``; ``floor_s`` is from the ``kill()`` until that thread is back (median of
``--floor-repeats``). Goals: median ``error_s`` under 1 s on Spark, under 0.3 s on the
local engine. Output: a JSON line per run, then a summary per engine with ``floor_s``,
``ratio_to_floor`` and the load average, and a ``figure`` row per engine for ``results.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor import figure, load_average, ratio

TFOS = "tensorflowonspark-2.2.5"
TFCOORD = "tfcoord"
#: Seconds any one run may take before it counts as failed (a driver that never notices).
RUN_TIMEOUT_S = 120.0
GOAL_S = {"spark": 1.0, "local": 0.3}
#: The local engine's node command: note the process id, then wait to be killed.
LOCAL_NODE = (
    "import os, threading; d = os.environ['BENCH_DIR']; i = os.environ['TFCOORD_TASK_INDEX']; "
    "open(f'{d}/pid-{i}.tmp', 'w').write(str(os.getpid())); os.replace(f'{d}/pid-{i}.tmp', f'{d}/pid-{i}'); "
    "threading.Event().wait()"
)


def map_fun(args: dict[str, Any], ctx: Any) -> None:
    """Spark's node function (both systems): note the process id, then wait to be killed."""
    import os
    import threading

    path = os.path.join(args["dir"], f"pid-{ctx.task_index}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    threading.Event().wait()


def _wait_for_pid(run_dir: str, index: int, deadline: float) -> int:
    path = os.path.join(run_dir, f"pid-{index}")
    while not os.path.exists(path):  # written atomically by the node once it runs
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {index} never started")
        time.sleep(0.01)
    return int(Path(path).read_text())


# -- the floor -----------------------------------------------------------------------------


def measure_floor() -> float:
    p = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; print(flush=True); time.sleep(600)"], stdout=subprocess.PIPE
    )
    assert p.stdout is not None
    p.stdout.readline()  # it runs
    back: list[float] = []
    waiter = threading.Thread(target=lambda: (os.waitpid(p.pid, 0), back.append(time.monotonic())))
    waiter.start()
    time.sleep(0.05)  # let the waiter block in waitpid (the supervisor's state when a node dies)
    t_kill = time.monotonic()
    os.kill(p.pid, signal.SIGKILL)
    waiter.join()
    p.returncode = -signal.SIGKILL  # reaped by the waiter
    p.stdout.close()
    return back[0] - t_kill


# -- the local engine ------------------------------------------------------------------------


def run_local(base: str) -> dict[str, Any]:
    run_dir = tempfile.mkdtemp(dir=base)
    env = dict(os.environ, BENCH_DIR=run_dir)
    cmd = [sys.executable, "-m", "tfcoord", "submit", "--engine", "local", "--workers", "2", "--"]
    p = subprocess.Popen(
        [*cmd, sys.executable, "-c", LOCAL_NODE],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []
    assert p.stderr is not None
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), ln)) for ln in p.stderr])  # type: ignore[union-attr]
    reader.start()
    try:
        pid = _wait_for_pid(run_dir, 1, time.monotonic() + RUN_TIMEOUT_S)
        _wait_for_pid(run_dir, 0, time.monotonic() + RUN_TIMEOUT_S)
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        code = p.wait(RUN_TIMEOUT_S)
        t_exit = time.monotonic()
        reader.join()
        after = [(t, ln.strip()) for t, ln in lines if t >= t_kill]
        failed = [(t, ln) for t, ln in after if "fail" in ln.lower() or "signal" in ln.lower()]
        return {
            "engine": "local",
            "system": TFCOORD,
            "ok": bool(failed) and code != 0,
            "error_s": round(failed[0][0] - t_kill, 4) if failed else None,
            "exit_s": round(t_exit - t_kill, 4),
            "exit_code": code,
            "error_line": failed[0][1][:300] if failed else None,
        }
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        reader.join()
        shutil.rmtree(run_dir, ignore_errors=True)


# -- Spark -----------------------------------------------------------------------------------


def _spark_context(master: str) -> Any:
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName("tfcoord-node-death-bench")
        .set("spark.executor.cores", "1")
        .set("spark.cores.max", "2")
        .set("spark.executor.memory", "1g")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.dynamicAllocation.enabled", "false")
        .set("spark.task.maxFailures", "1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("OFF")
    deadline = time.monotonic() + 180
    tracker = sc._jsc.sc().statusTracker()
    while len(tracker.getExecutorInfos()) < 3:  # 2 executors + the driver
        if time.monotonic() > deadline:
            raise RuntimeError("fewer than 2 executors registered within 180 s")
        time.sleep(0.2)
    sc.parallelize(range(2), 2).map(lambda x: x).collect()  # Python workers up
    return sc


def run_spark(system: str, sc: Any, base: str, tfos_timeout_s: int) -> dict[str, Any]:
    """One run; the driver's calls stay on this (the main) thread: TensorFlowOnSpark's
    shutdown arms SIGALRM, which only the main thread may."""
    run_dir = tempfile.mkdtemp(dir=base)
    killed: list[float] = []
    failure: list[BaseException] = []

    def killer() -> None:
        try:
            pid = _wait_for_pid(run_dir, 1, time.monotonic() + RUN_TIMEOUT_S)
            _wait_for_pid(run_dir, 0, time.monotonic() + RUN_TIMEOUT_S)
            killed.extend((time.monotonic(), time.time()))
            os.kill(pid, signal.SIGKILL)
        except BaseException as e:
            failure.append(e)

    k = threading.Thread(target=killer)
    k.start()
    args = {"dir": run_dir}
    error, events = None, []
    try:
        if system == TFCOORD:
            from tfcoord.driver.spark import run

            cluster = run(sc, map_fun, args, 2, 0, reservation_timeout=RUN_TIMEOUT_S)
            cluster.shutdown(timeout=RUN_TIMEOUT_S)
        else:
            from tensorflowonspark import TFCluster

            cluster = TFCluster.run(sc, map_fun, args, 2, 0, reservation_timeout=RUN_TIMEOUT_S)
            cluster.shutdown(timeout=tfos_timeout_s)
    except BaseException as e:  # JobFailed; TensorFlowOnSpark's sys.exit(1)
        t_err = time.monotonic()
        error = f"{type(e).__name__}: {e}".strip()
        status = getattr(e, "status", None)
        events = list(status.events) if status is not None else []
    else:
        t_err = time.monotonic()
    finally:
        signal.alarm(0)  # TFCluster.shutdown arms SIGALRM and never disarms it
        k.join()
        shutil.rmtree(run_dir, ignore_errors=True)
    if failure or not killed:
        return {"engine": "spark", "system": system, "ok": False, "error": repr(failure[:1])}
    # Where tfcoord's time went, from the coordinator's own event times (wall clock, this host).
    reported = [t for t, text in events if text.startswith("worker:1 FAILED")]
    failed = [t for t, text in events if text.endswith("-> FAILED")]
    return {
        "engine": "spark",
        "system": system,
        "ok": error is not None,
        "error_s": round(t_err - killed[0], 4),
        **({"coordinator_node_failed_s": round(reported[0] - killed[1], 4)} if reported else {}),
        **({"coordinator_job_failed_s": round(failed[0] - killed[1], 4)} if failed else {}),
        "error": (error or "shutdown() returned without an error")[-400:],
        **({"noticed_by_timeout": t_err - killed[0] >= tfos_timeout_s - 1} if system == TFOS else {}),
    }


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get("ok") and r.get(key) is not None]
    return round(statistics.median(values), 4) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="local,spark", help="comma list of local, spark")
    ap.add_argument("--systems", default="tfcoord,tfos", help="on Spark: comma list of tfcoord, tfos")
    ap.add_argument("--repeats", type=int, default=3, help="runs per engine and system")
    ap.add_argument(
        "--tfos-repeats", type=int, default=1, help="TensorFlowOnSpark's runs (each waits out its timeout)"
    )
    ap.add_argument(
        "--tfos-timeout",
        type=int,
        default=60,
        help="TensorFlowOnSpark's shutdown(timeout=): its driver reports the death no sooner",
    )
    ap.add_argument("--floor-repeats", type=int, default=20, help="SIGKILL-to-waitpid measurements")
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    systems = [{"tfcoord": TFCOORD, "tfos": TFOS}[s] for s in args.systems.split(",") if s]
    if args.repeats < 1 or args.floor_repeats < 1 or not set(engines) <= {"local", "spark"}:
        ap.error("--repeats and --floor-repeats must be at least 1; --engines takes local and spark")
    logging.getLogger().setLevel(logging.WARNING)
    floors = sorted(measure_floor() for _ in range(args.floor_repeats))
    floor_s = round(statistics.median(floors), 5)
    print(json.dumps({"system": "floor", "floor_s": floor_s, "max_s": round(floors[-1], 5)}), flush=True)
    rows: list[dict[str, Any]] = []
    base = tempfile.mkdtemp(prefix="tfcoord-node-death-")

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    try:
        if "local" in engines:
            for _ in range(args.repeats):
                emit(run_local(base))
        if "spark" in engines:
            if TFOS in systems:
                from tensorflowonspark import TFCluster  # noqa: F401  (imports tensorflow: before any clock)

                from tfcoord import aliases

                if aliases.real_location("tensorflowonspark") is None:
                    sys.exit(
                        "tensorflowonspark here is tfcoord's alias, not TensorFlowOnSpark 2.2.5: run the anchor with .venv-bench/bin/python (make .venv-bench/.installed)"
                    )
                logging.getLogger().setLevel(logging.WARNING)
            from tfcoord.driver.standalone import LocalSparkCluster

            os.environ.update(LocalSparkCluster.env())
            with LocalSparkCluster(cores=2, memory_mb=4096) as cluster:
                sc = _spark_context(cluster.master_url)
                try:
                    for i in range(args.repeats):
                        for system in systems:
                            if system == TFOS and i >= args.tfos_repeats:
                                continue
                            try:
                                emit(run_spark(system, sc, base, args.tfos_timeout))
                            except Exception:
                                emit(
                                    {
                                        "engine": "spark",
                                        "system": system,
                                        "ok": False,
                                        "error": traceback.format_exc()[-600:],
                                    }
                                )
                            if sc._jsc is None:  # TensorFlowOnSpark stopped it on its way out
                                sc = _spark_context(cluster.master_url)
                            elif system == TFOS:  # its failed job leaves the context spent
                                sc.stop()
                                sc = _spark_context(cluster.master_url)
                finally:
                    sc.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    loadavg = load_average()
    for engine in engines:
        mine = [r for r in rows if r["engine"] == engine]
        ours = _median([r for r in mine if r["system"] == TFCOORD], "error_s")
        theirs = _median([r for r in mine if r["system"] == TFOS], "error_s") if engine == "spark" else None
        summary = {
            "summary": True,
            "engine": engine,
            "tfcoord_error_s_median": ours,
            "tfos_error_s_median": theirs,
            "floor_s": floor_s,
            "ratio_to_floor": ratio(ours, floor_s),
            "goal_s": GOAL_S[engine],
            "goal_met": ours is not None and ours < GOAL_S[engine],
            "loadavg": loadavg,
        }
        print(json.dumps(summary), flush=True)
        row = figure(
            f"node death to driver error ({engine})",
            unit="s",
            tfcoord=ours,
            floor=floor_s,
            anchor=theirs,
            anchor_name="TensorFlowOnSpark 2.2.5" if engine == "spark" else "",
            goal=None,
            shape=(
                "2 workers, 2 executors x 1 core, spark.task.maxFailures=1"
                if engine == "spark"
                else "2 workers, tfcoord submit --engine local"
            )
            + f"; median of {args.repeats}"
            + (
                f" (TensorFlowOnSpark: {args.tfos_repeats}, shutdown(timeout={args.tfos_timeout}))"
                if theirs
                else ""
            ),
            loadavg=loadavg,
            note=f"goal: median < {GOAL_S[engine]:g} s",
        )
        row["goal_met"] = summary["goal_met"]
        print(json.dumps(row), flush=True)
    if not args.json:
        for r in rows:
            print(
                f"{r['engine']:<7}{r['system']:<26}{r.get('error_s')}  {r.get('error', '')[:100]}",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
