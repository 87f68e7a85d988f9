"""Feed benchmark: records per second fed from Spark into TensorFlow nodes through ``cluster.train``.

    python benchmarks/feed.py --records 1000000 --json [--nodes N] [--repeats N] [--systems tfcoord,tfos]

Both systems run in the same run, one after the other, on TensorFlowOnSpark's own slot
shape: a local Spark standalone cluster of ``--nodes`` workers x 1 core
(``LocalSparkCluster(cores=1, workers=N)``, TensorFlowOnSpark's
``SPARK_WORKER_INSTANCES=N``, ``-c 1``), each application with ``spark.cores.max=N``
and ``spark.task.cpus=1``: as many 1-core executors as TensorFlow nodes, so the feeding
tasks run in the slots the nodes were launched from. The data: an RDD of ``records``
rows ``(i, i * 0.5)`` in ``--partitions`` partitions (10 by default), made from a range
as the feeding tasks read it (not cached: cached blocks sit on one executor and Spark
delays tasks elsewhere by ``spark.locality.wait``, an artefact of the set-up). Each
system starts an N-worker TensorFlow cluster in InputMode.SPARK and feeds it with
``cluster.train(rdd, num_epochs=1)`` (TensorFlowOnSpark reads ``num_epochs=0`` as 10
epochs); the nodes' ``map_fun`` is the same code for both (TensorFlowOnSpark's
``TFNode.DataFeed`` API, imported from ``tensorflowonspark`` or from
``tfcoord.compat.tensorflowonspark``): ``next_batch(1000)`` until ``should_stop()``,
counting records, which each node writes to a file at the end so the run can check that
every record arrived exactly once.

Measured: ``records_per_s`` = records / (time from the ``train()`` call to its return).
Both systems return from ``train`` only once the nodes have consumed every partition
(TensorFlowOnSpark joins its queues; tfcoord waits for each node's end-of-partition ack).
Each run first feeds a 20,000-record warm-up RDD (Python workers, imports, connections)
that is not timed.

How each system uses the slots: TensorFlowOnSpark's node task returns once ``map_fun``
runs in a background process, and its feeding tasks must run in the node's executor
(they find the node's multiprocessing manager through a file in the executor's
directory). tfcoord's node also runs in the background of its executor once started
(its Spark task returns); its feeding tasks stream to the nodes over TCP from whichever
executor runs them.

TensorFlowOnSpark must be importable by the driver and the executors: run this under
``.venv-bench/bin/python`` (``make bench-feed`` makes that venv: .venv's packages plus the
anchors, ``pip install --no-deps tensorflowonspark==2.2.5``, since its own requirements pin
old packages it does not need here), or pass ``--tfos-path DIR`` for a ``pip install
--target DIR`` tree.

The floor, in the same run on the same cluster shape (its own application, first): Spark
handing the same partitions (the same RDD, made the same way) to a Python function that
only counts the records, ``rdd.mapPartitions(count).sum()`` after the same warm-up:
what Spark and its Python workers cost to produce and hand over the records, with no
feed and no TensorFlow node. Its rate is the summary's ``floor_records_per_s``, and
``ratio_to_floor`` = tfcoord's rate / the floor's (goal >= 0.5).

Output: one JSON line per system per run, then a summary with the shape, median rates,
the ratio tfcoord / TensorFlowOnSpark (target >= 20), the floor, the ratio to it and the
load average, then a ``figure`` row (``floor.figure``) for ``results.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
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

TFOS = "tensorflowonspark-2.2.5"
TFCOORD = "tfcoord"
#: Spark alone counting the records of the same partitions (see the module's docstring).
FLOOR = "floor"
TARGET_RATIO_TO_FLOOR = 0.5
#: tfcoord with an explicitly plaintext job (``plaintext=True``): its coordinator traffic and
#: feed in the clear, to measure what the default TLS feed costs (``--systems tfcoord,tfcoord-plaintext``).
TFCOORD_PLAINTEXT = "tfcoord-plaintext"
TARGET_RATIO = 20.0
WARMUP_RECORDS = 20_000
#: TensorFlowOnSpark's shutdown arms SIGALRM with this and exits the process if it fires.
TFOS_SHUTDOWN_TIMEOUT_S = 600
TFNODE = {
    TFCOORD: "tfcoord.compat.tensorflowonspark.TFNode",
    TFCOORD_PLAINTEXT: "tfcoord.compat.tensorflowonspark.TFNode",
    TFOS: "tensorflowonspark.TFNode",
}


# -- what runs in the node (pickled by value: this file is __main__) ----------------------


def map_fun(args: dict[str, Any], ctx: Any) -> None:
    """Read the feed to its end with TensorFlowOnSpark's DataFeed API; write the record count."""
    import importlib
    import os

    TFNode = importlib.import_module(args["tfnode"])
    feed = TFNode.DataFeed(ctx.mgr, True)
    count = total = 0
    while not feed.should_stop():
        batch = feed.next_batch(1000)
        count += len(batch)
        total += sum(r[0] for r in batch)
    path = os.path.join(args["dir"], f"count-{ctx.executor_id}.json")
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps({"count": count, "total": total}))
    os.replace(path + ".tmp", path)


def _cluster_api(system: str) -> Any:
    if system in (TFCOORD, TFCOORD_PLAINTEXT):
        from tfcoord.compat.tensorflowonspark import TFCluster
    else:
        from tensorflowonspark import TFCluster
    return TFCluster


def measure(system: str, sc: Any, rdd: Any, warm: Any, records: int, base: str, nodes: int) -> dict[str, Any]:
    run_dir = tempfile.mkdtemp(prefix=f"{system.split('-')[0]}-", dir=base)
    TFCluster = _cluster_api(system)
    args = {"dir": run_dir, "tfnode": TFNODE[system]}
    extra = {"plaintext": True} if system == TFCOORD_PLAINTEXT else {}
    try:
        cluster = TFCluster.run(
            sc,
            map_fun,
            args,
            nodes,
            0,
            input_mode=TFCluster.InputMode.SPARK,
            reservation_timeout=120,
            **extra,
        )
        try:
            cluster.train(warm, num_epochs=1, feed_timeout=600)
            t0 = time.perf_counter()
            cluster.train(rdd, num_epochs=1, feed_timeout=600)
            elapsed = time.perf_counter() - t0
        finally:
            if system == TFOS:
                cluster.shutdown(timeout=TFOS_SHUTDOWN_TIMEOUT_S)
            else:  # the nodes write their counts after the feed ends: give them the time to
                cluster.shutdown(grace_secs=60)
        counts = [json.loads(p.read_text()) for p in Path(run_dir).glob("count-*.json")]
        seen = {
            "nodes": len(counts),
            "count": sum(c["count"] for c in counts),
            "total": sum(c["total"] for c in counts),
        }
        expected = records + WARMUP_RECORDS
        expected_total = records * (records - 1) // 2 + WARMUP_RECORDS * (WARMUP_RECORDS - 1) // 2
        ok = seen["nodes"] == nodes and seen["count"] == expected and seen["total"] == expected_total
        return {
            "system": system,
            "ok": ok,
            "records": records,
            "seconds": round(elapsed, 3),
            "records_per_s": round(records / elapsed),
            "nodes_saw": seen["count"],
            **(
                {}
                if ok
                else {"error": f"the nodes saw {seen}, expected {nodes} nodes and {expected} records"}
            ),
        }
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # TFCluster calls sys.exit(1) on a failed node
        logging.getLogger("feed").debug("%s failed:\n%s", system, traceback.format_exc())
        return {"system": system, "ok": False, "error": f"{type(e).__name__}: {e}"[-3000:]}
    finally:
        if system == TFOS:
            signal.alarm(0)  # TFCluster.shutdown arms SIGALRM and never disarms it
        shutil.rmtree(run_dir, ignore_errors=True)


def measure_floor(sc: Any, rdd: Any, warm: Any, records: int, nodes: int) -> dict[str, Any]:
    """Spark hands the partitions to a function that only counts them: the feed's floor.

    Warmed first as tfcoord is: its nodes' job started a Python worker in every executor
    before its warm-up feed; here a job of one task per executor does (the warm-up RDD's
    two partitions would leave a third executor cold, its worker's start timed).
    """

    def count(it: Any) -> list[int]:
        n = 0
        for _ in it:
            n += 1
        return [n]

    sc.parallelize(range(nodes), nodes).mapPartitions(count).sum()
    warm.mapPartitions(count).sum()
    t0 = time.perf_counter()
    seen = rdd.mapPartitions(count).sum()
    elapsed = time.perf_counter() - t0
    return {
        "system": FLOOR,
        "ok": seen == records,
        "records": records,
        "seconds": round(elapsed, 3),
        "records_per_s": round(records / elapsed),
        **({} if seen == records else {"error": f"counted {seen} records of {records}"}),
    }


def _spark_context(master: str, executors: int, extra_path: str | None) -> Any:
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName(f"tfcoord-feed-bench-{executors}")
        .set("spark.cores.max", str(executors))
        .set("spark.task.cpus", "1")
        .set("spark.executor.memory", "2g")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.dynamicAllocation.enabled", "false")
        .set("spark.task.maxFailures", "1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )
    if extra_path:
        conf.set("spark.executorEnv.PYTHONPATH", extra_path)
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    deadline = time.monotonic() + 180
    tracker = sc._jsc.sc().statusTracker()
    while len(tracker.getExecutorInfos()) < executors + 1:  # + the driver
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {executors} executors registered within 180 s")
        time.sleep(0.2)
    return sc


def summarize(rows: list[dict[str, Any]], records: int, spark_version: str, nodes: int) -> dict[str, Any]:
    def median(system: str) -> float | None:
        rates = [r["records_per_s"] for r in rows if r["system"] == system and r.get("ok")]
        return round(statistics.median(rates)) if rates else None

    ours, theirs, plain = median(TFCOORD), median(TFOS), median(TFCOORD_PLAINTEXT)
    floor = median(FLOOR)
    ratio = round(ours / theirs, 2) if ours and theirs else None
    # What the default TLS feed costs against an explicitly plaintext job: 0.1 is 10 % slower.
    tls_cost = (
        {"tfcoord_plaintext_records_per_s": plain, "tls_cost": round(1 - ours / plain, 3)}
        if ours and plain
        else {}
    )
    return {
        "summary": True,
        "records": records,
        "spark": spark_version,
        # The same for both systems: TensorFlowOnSpark's slot shape.
        "shape": f"{nodes} TensorFlow node(s) on {nodes} executor(s) x 1 core (standalone: {nodes} "
        f"worker(s) x 1 core, spark.cores.max={nodes}, spark.task.cpus=1)",
        "tfcoord_records_per_s": ours,
        "tfos_records_per_s": theirs,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": None if ratio is None else ratio >= TARGET_RATIO,
        "floor_records_per_s": floor,
        "ratio_to_floor": round(ours / floor, 3) if ours and floor else None,
        "loadavg": load_average(),
        **tls_cost,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=1, help="TensorFlow nodes = executors = 1-core workers")
    ap.add_argument("--repeats", type=int, default=1, help="measured runs per system")
    ap.add_argument(
        "--systems",
        default="tfcoord,tfos",
        help="comma list of tfcoord (TLS, the default), tfcoord-plaintext (plaintext=True), tfos",
    )
    ap.add_argument("--tfos-path", help="a directory holding tensorflowonspark (pip install --target)")
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    args = ap.parse_args()
    if args.nodes < 1 or args.records < 1 or args.partitions < 1:
        ap.error("--nodes, --records and --partitions must be at least 1")
    names = {"tfcoord": TFCOORD, "tfcoord-plaintext": TFCOORD_PLAINTEXT, "tfos": TFOS}
    systems = [names[s] for s in args.systems.split(",") if s]
    if args.tfos_path:
        sys.path.insert(0, args.tfos_path)

    import pyspark

    from tfcoord.driver.standalone import LocalSparkCluster

    if TFOS in systems:
        import tensorflowonspark  # noqa: F401  (fail now, not after the tfcoord runs)

        from tfcoord import aliases

        if aliases.real_location("tensorflowonspark") is None:
            sys.exit(
                "tensorflowonspark here is tfcoord's alias, not TensorFlowOnSpark 2.2.5: run the anchor with .venv-bench/bin/python (make .venv-bench/.installed) or pass --tfos-path"
            )
    logging.getLogger().setLevel(logging.WARNING)  # tensorflowonspark's import sets INFO
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ.update(LocalSparkCluster.env())
    base = tempfile.mkdtemp(prefix="tfcoord-feed-bench-")
    rows: list[dict[str, Any]] = []
    try:
        with LocalSparkCluster(cores=1, workers=args.nodes, memory_mb=3072) as cluster:
            for system in [FLOOR, *systems]:
                sc = _spark_context(cluster.master_url, args.nodes, args.tfos_path)
                try:
                    rdd = sc.parallelize(range(args.records), args.partitions).map(lambda i: (i, i * 0.5))
                    warm = sc.parallelize(range(WARMUP_RECORDS), 2).map(lambda i: (i, i * 0.5))
                    for _ in range(args.repeats):
                        row = (
                            measure_floor(sc, rdd, warm, args.records, args.nodes)
                            if system == FLOOR
                            else measure(system, sc, rdd, warm, args.records, base, args.nodes)
                        )
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        if not row["ok"]:
                            break
                finally:
                    sc.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = summarize(rows, args.records, pyspark.__version__, args.nodes)
    print(json.dumps(summary), flush=True)
    row = figure(
        f"feed, {args.nodes} executor(s) x 1 core: records/s",
        unit="records/s",
        tfcoord=summary["tfcoord_records_per_s"],
        floor=summary["floor_records_per_s"],
        anchor=summary["tfos_records_per_s"],
        anchor_name="TensorFlowOnSpark 2.2.5",
        goal=TARGET_RATIO_TO_FLOOR,
        higher_is_better=True,
        shape=f"{args.records:,} records in {args.partitions} partitions; {args.nodes} node(s) on "
        f"{args.nodes} executor(s) x 1 core (standalone: {args.nodes} worker(s) x 1 core)",
        loadavg=summary["loadavg"],
    )
    print(json.dumps(row), flush=True)
    if not args.json:
        for r in rows:
            line = f"{r['records_per_s']:>12,} records/s" if r.get("ok") else f"FAIL {r['error'][-200:]}"
            print(f"{r['system']:<26}{line}", file=sys.stderr)
        print(f"ratio tfcoord / TensorFlowOnSpark: {summary['ratio']} ({summary['shape']})", file=sys.stderr)
        print(f"ratio tfcoord / floor (Spark counting): {summary['ratio_to_floor']}", file=sys.stderr)
        if "tls_cost" in summary:
            print(f"TLS feed cost vs plaintext=True: {summary['tls_cost']:.1%}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
