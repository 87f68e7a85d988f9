"""Recovery benchmark: from a node's death to every node of the new generation running again,
beside what users do today without restarts (resubmitting the job).

    python benchmarks/recovery.py --json [--engines local,spark] [--repeats N] [--workers N]

Per engine and run, one job of N workers (no ps; Spark: N executors x 1 core on a local
standalone cluster started here) with ``max_restarts=1``:

* ``fresh_submit_s``: from submitting the job to every node reported RUNNING (its work
  started): what a user pays to resubmit a job by hand, whoever notices the failure;
* ``recovery_s``: from SIGKILL of worker 1's work process (the OOM killer's way) to every node
  of generation 1 RUNNING again: the coordinator hears the exit from the node's supervisor,
  restarts the cluster, every node stops its work, backs off (``--backoff``, default 0: the
  floor), rejoins, receives the new spec and runs its work again;
* ``ratio``: recovery_s / fresh_submit_s (goal: <= 0.2 on Spark) and the goal on the local
  engine, recovery under 3 s.

The work is a process that starts and waits (TensorFlow is not imported): TensorFlow's own
start, which both a restart and a fresh submission pay once per process, is measured apart
(``tf_import_s``, a ``python -c "import tensorflow"``) and left out of both figures.

Output: one JSON object per run (``engine``, ``recovery_s``, ``fresh_submit_s``, ``ratio``,
``workers``, ``shape``), then a summary line per engine with medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for part in ("client", "node", "coordinator", "", "benchmarks"):
    sys.path.insert(0, str(ROOT / part))

from floor import figure, load_average  # noqa: E402

from tfcoord.client import JobSpec, make_roles  # noqa: E402
from tfcoord.client.entry import TLS_CA_ENV  # noqa: E402
from tfcoord.client.jobreplies import JobStatus  # noqa: E402
from tfcoord.client.vocab import JobState  # noqa: E402
from tfcoord.client.watcher import watch_until  # noqa: E402
from tfcoord.driver.session import CoordinatorLink  # noqa: E402

#: The work: waits until it is stopped (SIGTERM) or killed.
WAIT_FOREVER = "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); signal.pause()"
PHASE_TIMEOUT_S = 300.0
#: The goals: on Spark, recovery within this fraction of a fresh submission's time ...
GOAL_RATIO_SPARK = 0.2
#: ... on the local engine, within this many seconds.
GOAL_S_LOCAL = 3.0


def _all_running(generation: int) -> Any:
    def done(st: JobStatus) -> bool:
        return st.terminal or (
            st.generation == generation and st.state == JobState.RUNNING and st.running == st.size
        )

    return done


def _child_pid(st: JobStatus, index: int) -> int:
    node = next(n for n in st.nodes if n.role == "worker" and n.index == index)
    return int(node.meta["child_pid"])


def _measure(driver: Any, job: str, t0: float) -> tuple[float, float]:
    st = watch_until(driver, job, _all_running(0), timeout_s=PHASE_TIMEOUT_S)
    assert st.state == JobState.RUNNING, st.why
    fresh = time.monotonic() - t0
    st = driver.status(job)
    t1 = time.monotonic()
    os.kill(_child_pid(st, 1), signal.SIGKILL)
    st = watch_until(driver, job, _all_running(1), timeout_s=PHASE_TIMEOUT_S)
    assert st.generation == 1 and st.state == JobState.RUNNING, st.why
    return fresh, time.monotonic() - t1


def run_local(workers: int, backoff_s: float) -> dict[str, Any]:
    from tfcoord.driver.local import _LocalNodes

    link = CoordinatorLink.start_embedded(quiet=True)
    with link, tempfile.TemporaryDirectory() as tmp, link.connect() as driver, open(os.devnull, "wb") as sink:
        env = dict(os.environ)
        if link.ca_pem:
            Path(tmp, "ca.pem").write_text(link.ca_pem)
            env[TLS_CA_ENV] = str(Path(tmp, "ca.pem"))
        spec = JobSpec(roles=make_roles(workers), max_restarts=1, restart_backoff_s=backoff_s, engine="local")
        t0 = time.monotonic()
        job = driver.submit(spec)
        env["TFCOORD_TOKEN"] = driver.job_token(job).hex()
        nodes = _LocalNodes(driver, spec, job, [sys.executable, "-c", WAIT_FOREVER], env, sink)
        nodes.start()
        try:
            fresh, recovery = _measure(driver, job, t0)
        finally:
            driver.stop(job, "benchmark run over")
            nodes.stop()
    return {
        "engine": "local",
        "fresh_submit_s": fresh,
        "recovery_s": recovery,
        "shape": f"{workers} local processes",
    }


def _wait_forever_map_fun(args: Any, ctx: Any) -> None:
    import signal as sig

    sig.signal(sig.SIGTERM, lambda *a: sys.exit(0))
    sig.pause()


def run_spark(sc: Any, workers: int, backoff_s: float) -> dict[str, Any]:
    from tfcoord.driver import spark as tfs

    t0 = time.monotonic()
    cluster = tfs.run(sc, _wait_forever_map_fun, [], workers, 0, max_restarts=1, restart_backoff_s=backoff_s)
    try:
        fresh, recovery = _measure(cluster.driver, cluster.job, t0)
    finally:
        cluster.driver.stop(cluster.job, "benchmark run over")
        try:
            cluster.shutdown()
        except Exception:  # stopped: shutdown reports it
            pass
    return {
        "engine": "spark",
        "fresh_submit_s": fresh,
        "recovery_s": recovery,
        "shape": f"{workers} Spark executors x 1 core (standalone)",
    }


def _spark_context(workers: int) -> tuple[Any, Any]:
    from pyspark import SparkConf, SparkContext
    from pyspark.cloudpickle import register_pickle_by_value

    from tfcoord.driver.standalone import LocalSparkCluster

    local = LocalSparkCluster(cores=workers).start()
    os.environ.update(LocalSparkCluster.env())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    register_pickle_by_value(sys.modules[__name__])
    conf = (
        SparkConf()
        .setMaster(local.master_url)
        .setAppName("tfcoord recovery benchmark")
        .set("spark.cores.max", str(workers))
        .set("spark.executor.cores", "1")
        .set("spark.task.cpus", "1")
        .set("spark.dynamicAllocation.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    sc.parallelize(range(workers), workers).map(lambda x: x).collect()  # executors up
    return sc, local


def tf_import_s() -> float | None:
    t = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True)
    return time.monotonic() - t if done.returncode == 0 else None


def _figure(engine: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The results table's row (``floor.figure``): recovery beside resubmitting by hand."""
    recovery, ratio = summary["recovery_s_median"], summary["ratio_median"]
    if engine == "spark":
        note, met = f"goal: ≤ {GOAL_RATIO_SPARK:g}x a fresh submission", ratio <= GOAL_RATIO_SPARK
    else:
        note, met = f"goal: < {GOAL_S_LOCAL:g} s", recovery < GOAL_S_LOCAL
    row = figure(
        f"recovery: node death to all running again ({engine})",
        unit="s",
        tfcoord=recovery,
        floor=None,
        anchor=summary["fresh_submit_s_median"],
        anchor_name="a fresh submission",
        goal=None,
        shape=f"{summary['shape']}; median of {summary['runs']}",
        loadavg=load_average(),
        note=note,
    )
    row["goal_met"] = met
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", default="local,spark")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--backoff", type=float, default=0.0, help="restart_backoff_s (default 0: the floor)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    results: dict[str, list[dict[str, Any]]] = {}
    sc = local = None
    try:
        for engine in engines:
            if engine == "spark":
                sc, local = _spark_context(args.workers)
            for _ in range(args.repeats):
                r = (
                    run_local(args.workers, args.backoff)
                    if engine == "local"
                    else run_spark(sc, args.workers, args.backoff)
                )
                r.update(
                    workers=args.workers, ratio=r["recovery_s"] / r["fresh_submit_s"], backoff_s=args.backoff
                )
                results.setdefault(engine, []).append(r)
                print(json.dumps(r) if args.json else r, flush=True)
    finally:
        if sc is not None:
            sc.stop()
        if local is not None:
            local.stop()
    tf_s = tf_import_s()
    for engine, rs in results.items():
        summary = {
            "summary": engine,
            "recovery_s_median": statistics.median(r["recovery_s"] for r in rs),
            "fresh_submit_s_median": statistics.median(r["fresh_submit_s"] for r in rs),
            "ratio_median": statistics.median(r["ratio"] for r in rs),
            "runs": len(rs),
            "shape": rs[0]["shape"],
            "tf_import_s": tf_s,
            "load_avg_1m": os.getloadavg()[0],
        }
        print(json.dumps(summary) if args.json else summary, flush=True)
        print(json.dumps(_figure(engine, summary)) if args.json else _figure(engine, summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
