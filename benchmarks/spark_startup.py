"""Spark startup benchmark: how long from ``run()`` until every node is inside ``map_fun``?

    python benchmarks/spark_startup.py --json [--repeats N] [--systems tfcoord,tfos]

One local Spark standalone cluster (``LocalSparkCluster``: a master and one worker
with 2 cores) and one SparkContext with 2 executors x 1 core run the same trivial
``map_fun`` through TensorFlowOnSpark 2.2.5's ``TFCluster.run`` and through tfcoord's
``tfcoord.driver.spark.run`` (2 workers, no ps, InputMode.TENSORFLOW, no TensorBoard).
``map_fun`` writes ``time.time()`` on entry to a file in a per-run directory under
/tmp (executors and driver share this host, so one clock) and returns at once.

Measured per run (all wall-clock ``time.time()`` on this host; ``t0`` is taken just
before the ``run()`` call):

* ``startup_s``: max over nodes of the entry time written by ``map_fun``, minus ``t0``.
  For TensorFlowOnSpark this includes its executor-side reservation client polling
  with one-second sleeps; for tfcoord, the node supervisor's fork of ``map_fun``.
* ``run_returned_s``: when ``run()`` returned, minus ``t0`` (tfcoord returns once the
  job is READY; TensorFlowOnSpark once its driver-side one-second poll sees every
  reservation).
* ``until_shutdown_s``: when ``cluster.shutdown()`` returned (called immediately after
  ``run()``), minus ``t0``. TensorFlowOnSpark's shutdown in InputMode.TENSORFLOW runs a
  second Spark job and then always sleeps at least 5 s before checking for active jobs.
* ``coordination_s`` (the share of startup spent rendezvousing): from the last
  registration to the moment every node holds the cluster spec.
  - tfcoord: start = the coordinator's timestamp of the last ``"<role>:<i> REGISTERED"``
    entry in ``status(job)["events"]``; end = max over nodes of the time
    ``NodeClient.await_cluster`` returned with the decoded spec on the node. The end
    is stamped by a probe installed in each executor's Python worker when the task's
    arguments are unpickled (``_Probe`` below); it wraps ``await_cluster`` and writes
    one file after it returns, adding microseconds. The coordinator's own events
    cannot give the end: it marks every node READY in the same step (same timestamp)
    as the last registration, when the spec is queued to every waiting node.
    ``coordination_events_bound_s`` is the events-only upper bound: last REGISTERED to
    the last ``"<role>:<i> RUNNING"`` report, which a node sends after it received the
    spec, set TF_CONFIG and forked ``map_fun``.
  - TensorFlowOnSpark: its reservation server keeps no timestamps, so the same probe
    wraps ``reservation.Client.register`` (start = max over nodes of the time
    ``register`` returned, i.e. the server had stored the reservation: this favours
    TensorFlowOnSpark by one round trip) and ``Client.await_reservations`` (end = max
    over nodes of when it returned with the full reservation list).

Warm-up: before any measured run, a plain 2-task Spark job runs once both executors
have registered (JVMs up, Python daemons and workers started), then one discarded run
of each system (printed with ``"warmup": true``): TensorFlowOnSpark's task closure
imports tensorflow into the executor's Python worker when it is unpickled, and Spark
reuses Python workers (``spark.python.worker.reuse``, on by default), so later runs
find it imported. The measured figures are therefore the warm, steady state, which
favours TensorFlowOnSpark; the warm-up lines show the cold cost. Measured repeats then
alternate the order (tfcoord first on even repeats, TensorFlowOnSpark first on odd).
Both systems share the executors' Python workers, so after a TensorFlowOnSpark run
tfcoord's node forks ``map_fun`` from a worker holding TensorFlow.

The floor runs in the same loop (a third system, ``floor``, warm-up and alternation
included): a no-op Spark job with the same number of tasks on the same executors, each
task writing ``time.time()`` on entry exactly as ``map_fun`` does and returning. Its
``startup_s`` is what Spark takes to launch the tasks and start Python in them; the
summary's ``floor_s`` is its median and ``ratio_to_floor`` tfcoord's median startup over
it (goal <= 1.5), with the load average, then a ``figure`` row for ``results.py``.

A TensorFlowOnSpark failure is recorded (``"ok": false`` with the error), not raised:
the remaining repeats of it are skipped, tfcoord's still run. Output: one JSON line per
system per run, then a summary line with medians, the ratio tfcoord startup /
TensorFlowOnSpark startup (target <= 0.5) and tfcoord's coordination share (target
< 50 ms).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor import figure, load_average
from floor import ratio as ratio_of

TFOS = "tensorflowonspark-2.2.5"
TFCOORD = "tfcoord"
FLOOR = "floor"
TARGET_RATIO_TO_FLOOR = 1.5
#: Generous: a run that has not formed its cluster by then has failed.
RESERVATION_TIMEOUT_S = 120
#: TensorFlowOnSpark's shutdown arms SIGALRM with this and exits the process if it fires.
TFOS_SHUTDOWN_TIMEOUT_S = 300
TARGET_RATIO = 0.5
TARGET_COORDINATION_S = 0.050
NUM_EXECUTORS = 2


# -- what runs in the executors (pickled by value: this file is __main__) ----------------------


def map_fun(args: dict[str, Any], ctx: Any) -> None:
    """The trivial node function: note when it was entered, then return."""
    import os
    import time

    entered = time.time()
    path = os.path.join(args["dir"], f"enter-{ctx.executor_id}")
    with open(path + ".tmp", "w") as f:
        f.write(repr(entered))
    os.replace(path + ".tmp", path)


def _install_probe(system: str, run_dir: str) -> str:
    """Runs in the executor when the task's arguments are unpickled; see the module docstring.

    Wraps the rendezvous calls of ``system`` (always the original methods, so a reused
    Python worker does not stack wrappers) to stamp their return times into ``run_dir``.
    """
    import os
    import time

    def stamp(name: str) -> None:
        t = time.time()
        with open(os.path.join(run_dir, name), "w") as f:
            f.write(repr(t))

    if system == "tfcoord":
        from tfcoord.client import NodeClient

        orig = NodeClient.__dict__.get("_bench_orig_await_cluster") or NodeClient.await_cluster
        NodeClient._bench_orig_await_cluster = orig  # type: ignore[attr-defined]

        def await_cluster(self: Any, *a: Any, **k: Any) -> Any:
            info = orig(self, *a, **k)
            stamp(f"spec-{self.executor_id}")
            return info

        NodeClient.await_cluster = await_cluster  # type: ignore[method-assign]
    else:
        from tensorflowonspark import reservation

        cls = reservation.Client
        orig_reg = cls.__dict__.get("_bench_orig_register") or cls.register
        orig_wait = cls.__dict__.get("_bench_orig_await") or cls.await_reservations
        cls._bench_orig_register, cls._bench_orig_await = orig_reg, orig_wait

        def register(self: Any, meta: dict[str, Any]) -> Any:
            resp = orig_reg(self, meta)
            self._bench_eid = meta["executor_id"]
            stamp(f"register-{meta['executor_id']}")
            return resp

        def await_reservations(self: Any) -> Any:
            info = orig_wait(self)
            stamp(f"spec-{getattr(self, '_bench_eid', os.getpid())}")
            return info

        cls.register, cls.await_reservations = register, await_reservations
    return run_dir


class _Probe:
    """Pickles as a call to ``_install_probe``: the probe is set up as the task unpickles."""

    def __init__(self, system: str, run_dir: str) -> None:
        self.system, self.run_dir = system, run_dir

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return _install_probe, (self.system, self.run_dir)


# -- the driver --------------------------------------------------------------------------------


def _stamps(run_dir: str, prefix: str) -> list[float]:
    return [float(open(p).read()) for p in sorted(glob.glob(os.path.join(run_dir, f"{prefix}-*")))]


def _entry_figures(run_dir: str, t0: float) -> dict[str, Any]:
    entered = _stamps(run_dir, "enter")
    if len(entered) != NUM_EXECUTORS:
        raise RuntimeError(f"{len(entered)} of {NUM_EXECUTORS} nodes entered map_fun")
    return {"startup_s": round(max(entered) - t0, 4), "entered_s": [round(t - t0, 4) for t in entered]}


def _last_node_event(events: list[list[Any]], state: str) -> float | None:
    """The coordinator's time of the last ``"<role>:<index> <state>"`` entry (once per node)."""
    times = [float(t) for t, text in events if re.match(rf"\w+:\d+ {state}\b", str(text))]
    return max(times) if len(times) == NUM_EXECUTORS else None


def run_tfcoord(sc: Any, run_dir: str) -> dict[str, Any]:
    from tfcoord.driver.spark import run

    args = {"dir": run_dir, "probe": _Probe("tfcoord", run_dir)}
    t0 = time.time()
    cluster = run(sc, map_fun, args, NUM_EXECUTORS, 0, reservation_timeout=RESERVATION_TIMEOUT_S)
    t_run = time.time()
    status = cluster.shutdown()
    t_end = time.time()
    row = _entry_figures(run_dir, t0)
    events = status["events"]
    registered, running = _last_node_event(events, "REGISTERED"), _last_node_event(events, "RUNNING")
    spec = _stamps(run_dir, "spec")
    coordination = max(spec) - registered if registered and len(spec) == NUM_EXECUTORS else None
    return {
        "system": TFCOORD,
        "ok": True,
        "state": status["state"],
        **row,
        "run_returned_s": round(t_run - t0, 4),
        "until_shutdown_s": round(t_end - t0, 4),
        "coordination_s": None if coordination is None else round(coordination, 5),
        "coordination_events_bound_s": round(running - registered, 5) if registered and running else None,
    }


def run_tfos(sc: Any, run_dir: str) -> dict[str, Any]:
    from tensorflowonspark import TFCluster

    args = {"dir": run_dir, "probe": _Probe("tfos", run_dir)}
    t0 = time.time()
    try:
        cluster = TFCluster.run(
            sc, map_fun, args, NUM_EXECUTORS, 0, reservation_timeout=RESERVATION_TIMEOUT_S
        )
        t_run = time.time()
        cluster.shutdown(timeout=TFOS_SHUTDOWN_TIMEOUT_S)
        t_end = time.time()
    finally:
        signal.alarm(0)  # TFCluster.shutdown arms SIGALRM (sys.exit when it fires) and never disarms it
    row = _entry_figures(run_dir, t0)
    reg, spec = _stamps(run_dir, "register"), _stamps(run_dir, "spec")
    ok = len(reg) == len(spec) == NUM_EXECUTORS
    return {
        "system": TFOS,
        "ok": True,
        **row,
        "run_returned_s": round(t_run - t0, 4),
        "until_shutdown_s": round(t_end - t0, 4),
        "coordination_s": round(max(spec) - max(reg), 5) if ok else None,
    }


def _noop_task(run_dir: str) -> Any:
    """The floor's task function: ``map_fun``'s entry stamp, with no coordinator behind it."""

    def enter(_: Any) -> None:
        import os
        import time

        from pyspark import TaskContext

        entered = time.time()
        path = os.path.join(run_dir, f"enter-{TaskContext.get().partitionId()}")
        with open(path + ".tmp", "w") as f:
            f.write(repr(entered))
        os.replace(path + ".tmp", path)

    return enter


def run_floor(sc: Any, run_dir: str) -> dict[str, Any]:
    t0 = time.time()
    sc.parallelize(range(NUM_EXECUTORS), NUM_EXECUTORS).foreachPartition(_noop_task(run_dir))
    t_end = time.time()
    return {"system": FLOOR, "ok": True, **_entry_figures(run_dir, t0), "job_s": round(t_end - t0, 4)}


RUNNERS = {TFCOORD: run_tfcoord, TFOS: run_tfos, FLOOR: run_floor}


def _error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    if "Traceback (most recent call last)" in text:  # a Py4J error carrying the executor's traceback
        tb = text[text.rindex("Traceback (most recent call last)") :]
        lines = [ln for ln in tb.splitlines() if ln.strip() and not ln.startswith("\tat ")]
        return "\n".join(lines)[-3000:]
    return text[-3000:]


def measure(system: str, sc: Any, base: str, warmup: bool) -> dict[str, Any]:
    run_dir = tempfile.mkdtemp(prefix=f"{system.split('-')[0]}-", dir=base)
    try:
        row = RUNNERS[system](sc, run_dir)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # TFCluster calls sys.exit(1) on a failed node
        logging.getLogger("spark_startup").debug("%s failed:\n%s", system, traceback.format_exc())
        row = {"system": system, "ok": False, "error": _error_text(e)}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {**row, "warmup": warmup}


def _spark_context(master: str) -> Any:
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName("tfcoord-spark-startup-bench")
        .set("spark.executor.cores", "1")
        .set("spark.cores.max", str(NUM_EXECUTORS))
        .set("spark.executor.memory", "1g")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.dynamicAllocation.enabled", "false")
        .set("spark.task.maxFailures", "1")  # a failing node shows as an error, not a retry
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    return sc


def _warm_spark(sc: Any, timeout_s: float = 180.0) -> None:
    """Wait for both executors, then run one 2-task job so each has its Python workers up."""
    deadline = time.monotonic() + timeout_s
    tracker = sc._jsc.sc().statusTracker()
    while len(tracker.getExecutorInfos()) < NUM_EXECUTORS + 1:  # + the driver
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {NUM_EXECUTORS} executors registered within {timeout_s:g} s")
        time.sleep(0.2)
    sc.parallelize(range(NUM_EXECUTORS), NUM_EXECUTORS).map(lambda x: time.sleep(0.5) or x).collect()


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get("ok") and r.get(key) is not None]
    return round(statistics.median(values), 5) if values else None


def summarize(rows: list[dict[str, Any]], spark_version: str) -> dict[str, Any]:
    measured = [r for r in rows if not r["warmup"]]
    out: dict[str, Any] = {"summary": True, "spark": spark_version}
    for system in RUNNERS:
        mine = [r for r in measured if r["system"] == system]
        if not mine:
            continue
        out[system] = {
            "runs": len(mine),
            "ok": sum(1 for r in mine if r.get("ok")),
            **{
                f"median_{k}": _median(mine, k)
                for k in ("startup_s", "run_returned_s", "until_shutdown_s", "coordination_s")
            },
        }
        errors = [r["error"] for r in mine if not r.get("ok")]
        if errors:
            out[system]["error"] = errors[0]
    ours, theirs = out.get(TFCOORD, {}), out.get(TFOS, {})
    if ours.get("median_startup_s") and theirs.get("median_startup_s"):
        ratio = ours["median_startup_s"] / theirs["median_startup_s"]
        out["startup_ratio"] = round(ratio, 3)
        out["startup_ratio_target_met"] = ratio <= TARGET_RATIO
    if ours.get("median_coordination_s") is not None:
        out["coordination_target_met"] = ours["median_coordination_s"] < TARGET_COORDINATION_S
    floor = out.get(FLOOR, {}).get("median_startup_s")
    out["floor_s"] = floor
    out["ratio_to_floor"] = ratio_of(ours.get("median_startup_s"), floor)
    out["loadavg"] = load_average()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="measured runs per system (after the warm-up)")
    ap.add_argument(
        "--systems",
        default=f"{TFCOORD},tfos,floor",
        help="comma list of tfcoord, tfos, floor (the no-op job)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    args = ap.parse_args()
    names = {"tfcoord": TFCOORD, "tfos": TFOS, "floor": FLOOR}
    systems = [names[s] for s in args.systems.split(",") if s]

    import pyspark

    from tfcoord.driver.standalone import LocalSparkCluster

    if TFOS in systems:  # imports tensorflow in the driver: do it before any clock starts
        from tensorflowonspark import TFCluster  # noqa: F401

        from tfcoord import aliases

        if aliases.real_location("tensorflowonspark") is None:
            sys.exit(
                "tensorflowonspark here is tfcoord's alias, not TensorFlowOnSpark 2.2.5: run the anchor with .venv-bench/bin/python (make .venv-bench/.installed) or pass --tfos-path"
            )

    # tensorflowonspark's import sets the root logger to INFO; keep the driver's stderr to
    # warnings for both systems (the executors log as each system makes them).
    logging.getLogger().setLevel(logging.WARNING)

    os.environ.update(LocalSparkCluster.env())
    base = tempfile.mkdtemp(prefix="tfcoord-spark-startup-")
    rows: list[dict[str, Any]] = []
    failed: set[str] = set()

    def one(system: str, warmup: bool, sc: Any) -> Any:
        if system in failed:
            return sc
        row = measure(system, sc, base, warmup)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not row["ok"]:
            failed.add(system)
            if sc._jsc is None:  # TFCluster stopped the SparkContext on its way out
                sc = _spark_context(master)
                _warm_spark(sc)
        return sc

    try:
        with LocalSparkCluster(cores=NUM_EXECUTORS, memory_mb=4096) as cluster:
            master = cluster.master_url
            sc = _spark_context(master)
            try:
                _warm_spark(sc)
                for system in systems:
                    sc = one(system, True, sc)
                for i in range(args.repeats):
                    for system in systems if i % 2 == 0 else systems[::-1]:
                        sc = one(system, False, sc)
            finally:
                sc.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = summarize(rows, pyspark.__version__)
    print(json.dumps(summary), flush=True)
    row = figure(
        "Spark startup: run() to every node in map_fun",
        unit="s",
        tfcoord=summary.get(TFCOORD, {}).get("median_startup_s"),
        floor=summary["floor_s"],
        anchor=summary.get(TFOS, {}).get("median_startup_s"),
        anchor_name="TensorFlowOnSpark 2.2.5",
        goal=TARGET_RATIO_TO_FLOOR,
        shape=f"{NUM_EXECUTORS} executors x 1 core, 1 standalone worker; median of {args.repeats} warm runs",
        loadavg=summary["loadavg"],
    )
    print(json.dumps(row), flush=True)
    if not args.json:
        print(
            f"\n{'system':<26}{'startup_s':>11}{'run_ret_s':>11}{'shutdown_s':>12}{'coord_ms':>10}",
            file=sys.stderr,
        )
        for r in rows:
            if not r.get("ok"):
                print(f"{r['system']:<26}FAIL {r['error'].splitlines()[-1][:80]}", file=sys.stderr)
                continue
            coord = "-" if r.get("coordination_s") is None else f"{r['coordination_s'] * 1000:.1f}"
            print(
                f"{r['system']:<26}{r['startup_s']:>11.3f}{r['run_returned_s']:>11.3f}"
                f"{r['until_shutdown_s']:>12.3f}{coord:>10}" + ("  (warm-up)" if r["warmup"] else ""),
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
