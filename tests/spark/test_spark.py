"""TensorFlow clusters on a real Spark standalone cluster, through the TensorFlowOnSpark-shaped API."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tfcoord import aliases
from tfcoord.client import JobFailed
from tfcoord.driver import spark as tfs

from . import mapfuns
from .mapfuns import alive, args_for
from .sparkjobs import active_jobs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
#: Tests of the alias's shim: where a real TensorFlowOnSpark is installed the alias rightly
#: steps aside and ships no shim (CI installs none, so these run there).
alias_in_use = pytest.mark.skipif(
    aliases.real_location("tensorflowonspark") is not None,
    reason="a real TensorFlowOnSpark is installed here (pip install tensorflowonspark): the alias steps aside",
)


def _records(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"{i}.json").read_text()) for i in range(n)]


def test_basic_run_assigns_roles_and_always_sets_tf_config(sc, tmp_path):
    cluster = tfs.run(sc, mapfuns.report_context, args_for(tmp_path), num_executors=2, num_ps=0)
    status = cluster.shutdown()
    assert status["state"] == "SUCCEEDED"
    recs = _records(tmp_path, 2)
    spec = recs[0]["cluster_spec"]
    assert list(spec) == ["worker"] and len(spec["worker"]) == 2
    for i, r in enumerate(recs):
        assert (r["job_name"], r["task_index"], r["worker_num"], r["num_workers"]) == ("worker", i, i, 2)
        # TF_CONFIG is set even without a chief (TensorFlowOnSpark issue #560)
        assert r["tf_config"] == {"cluster": spec, "task": {"type": "worker", "index": i}}
        assert r["cuda"] == ""  # always set: CPU here
        assert r["defaultFS"] == "file://" and r["absolute"].startswith("file:///")
    assert len({r["pid"] for r in recs}) == 2


def test_mwms_training_on_two_executors_agrees(sc, tmp_path):
    cluster = tfs.run(sc, mapfuns.mwms_train, args_for(tmp_path, steps=30), num_executors=2, num_ps=0)
    cluster.shutdown()
    a, b = _records(tmp_path, 2)
    assert a["replicas"] == b["replicas"] == 2
    assert (a["w"], a["b"]) == (b["w"], b["b"])
    assert abs(a["w"] - 3) < 0.05 and abs(a["b"] - 2) < 0.05


def test_ps_and_worker_cluster(sc, tmp_path):
    cluster = tfs.run(sc, mapfuns.ps_and_worker, args_for(tmp_path), num_executors=2, num_ps=1)
    status = cluster.shutdown()
    ps, worker = _records(tmp_path, 2)
    assert ps["job_name"] == "ps" and worker["job_name"] == "worker"
    assert worker["value"] == 42.0 and "/job:ps/" in worker["device"]
    states = {n["role"]: n["state"] for n in status["nodes"]}
    assert states == {"ps": "STOPPED", "worker": "SUCCEEDED"}  # the ps was told to stop, not left running
    ps_pid = next(int(n["meta"]["child_pid"]) for n in status["nodes"] if n["role"] == "ps")
    assert ps_pid == ps["pid"] and not alive(ps_pid)  # its TensorFlow server process is gone


def test_chief_and_evaluator_roles(sc, tmp_path):
    cluster = tfs.run(
        sc,
        mapfuns.report_context,
        args_for(tmp_path),
        num_executors=2,
        num_ps=0,
        master_node="chief",
        eval_node=True,
    )
    # With a grace the evaluator's map_fun always runs: without one, a chief that ends first has the
    # evaluator stopped, under load before its map_fun writes its record (seen in a full tests/spark run).
    status = cluster.shutdown(grace_secs=120)
    chief, evaluator = _records(tmp_path, 2)  # TensorFlowOnSpark's order: chief, then evaluator
    assert (chief["job_name"], chief["task_index"], evaluator["job_name"], evaluator["task_index"]) == (
        "chief",
        0,
        "evaluator",
        0,
    )
    assert chief["tf_config"]["task"] == {"type": "chief", "index": 0}
    assert evaluator["tf_config"]["task"] == {"type": "evaluator", "index": 0}
    assert chief["num_workers"] == 1 and set(chief["cluster_spec"]) >= {"chief"}
    # The chief's success is the job's; the evaluator, given the grace, ends on its own.
    assert status["state"] == "SUCCEEDED"
    states = {n["role"]: n["state"] for n in status["nodes"]}
    assert states["chief"] == "SUCCEEDED" and states["evaluator"] == "SUCCEEDED"
    assert not alive(evaluator["pid"])


def _free_port() -> int:
    with socket.socket() as s:  # bind-close: the only way to name a port in advance, as a user does
        s.bind(("", 0))
        return s.getsockname()[1]


def test_tensorflow_and_tensorboard_ports_are_honoured(sc, tmp_path):
    tf_port, tb_port = _free_port(), _free_port()
    # Environment variables for the node tasks' Python workers (pyspark ships sc.environment).
    sc.environment.update(TENSORFLOW_PORT=str(tf_port), TENSORBOARD_PORT=str(tb_port))
    try:
        cluster = tfs.run(
            sc,
            mapfuns.wait_for_flag,
            args_for(tmp_path),
            num_executors=1,
            num_ps=0,
            tensorboard=True,
            log_dir=str(tmp_path / "tb"),
        )
    finally:
        for k in ("TENSORFLOW_PORT", "TENSORBOARD_PORT"):
            sc.environment.pop(k, None)
    try:
        url = cluster.tensorboard_url()
        assert url is not None and url.endswith(f":{tb_port}")
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200
        # TensorFlowOnSpark's cluster_info and cluster_meta keys, with what they mean here.
        (node,) = cluster.cluster_info
        assert (node["executor_id"], node["job_name"], node["task_index"]) == (0, "worker", 0)
        assert (node["port"], node["tb_port"]) == (tf_port, tb_port) and alive(node["tb_pid"])
        assert node["addr"] is None and node["authkey"] is None  # no feed port (InputMode.TENSORFLOW)
        meta = cluster.cluster_meta
        assert meta["id"] == cluster.job and meta["cluster_template"] == {"worker": [0]}
        assert meta["num_executors"] == 1 and meta["working_dir"] == os.getcwd() and meta["release_port"]
        host, port = meta["server_addr"]
        assert cluster.node.address == f"{host}:{port}"
    finally:
        (tmp_path / "done").touch()
        status = cluster.shutdown()
    assert status["nodes"][0]["port"] == tf_port
    assert meta["default_fs"] == _records(tmp_path, 1)[0]["defaultFS"]
    (node,) = cluster.cluster_info  # after shutdown: as the job ended
    assert node["state"] == "SUCCEEDED" and node["tb_pid"] > 0 and not alive(node["tb_pid"])
    assert _records(tmp_path, 1)[0]["cluster_spec"]["worker"][0].endswith(f":{tf_port}")


@pytest.mark.parametrize("release", [True, False])
def test_release_port(sc, tmp_path, release):
    cluster = tfs.run(
        sc, mapfuns.check_port, args_for(tmp_path), num_executors=2, num_ps=0, release_port=release
    )
    cluster.shutdown()
    for r in _records(tmp_path, 2):
        assert r["free_before_release"] is release  # held until ctx.release_port() when release_port=False
        assert r["free_after_release"] is True


def test_tensorboard_url_answers_http(sc, tmp_path):
    cluster = tfs.run(
        sc,
        mapfuns.wait_for_flag,
        args_for(tmp_path),
        num_executors=2,
        num_ps=0,
        tensorboard=True,
        log_dir=str(tmp_path / "tb"),
    )
    try:
        url = cluster.tensorboard_url()
        assert url is not None and url.startswith("http://")
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and b"TensorBoard" in page.read()
    finally:
        (tmp_path / "done").touch()
        status = cluster.shutdown()
    assert status["state"] == "SUCCEEDED"
    tb = [n for n in status["nodes"] if n["meta"].get("tensorboard_url")]
    assert [(n["role"], n["index"]) for n in tb] == [("worker", 0)]
    with pytest.raises(OSError):  # stopped with its node
        urllib.request.urlopen(url, timeout=5)


def test_raising_map_fun_fails_the_job_fast_with_its_traceback(sc, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as e:
        cluster = tfs.run(sc, mapfuns.raise_on_worker_1, args_for(tmp_path), num_executors=2, num_ps=0)
        cluster.shutdown()
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "worker:1 (executor 1, host" in msg and "failed:" in msg
    assert "ValueError: injected failure in map_fun on worker 1" in msg and "Traceback" in msg
    assert took < 60, f"took {took:.0f} s; the other node sleeps 600 s and must have been stopped"


def test_reservation_timeout_names_missing_executors(sc, tmp_path):
    # Another Spark job holds one of the two task slots: the second node can never start.
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(60)
        port = srv.getsockname()[1]
        blocker = threading.Thread(
            target=lambda: sc.parallelize([0], 1).foreach(lambda _: mapfuns.hold_slot("127.0.0.1", port))
        )
        blocker.start()
        conn, _ = srv.accept()  # the slot-holding task runs
        try:
            with pytest.raises(JobFailed) as e:
                tfs.run(
                    sc,
                    mapfuns.report_context,
                    args_for(tmp_path),
                    num_executors=2,
                    num_ps=0,
                    reservation_timeout=8,
                )
        finally:
            conn.close()
            blocker.join(60)
    msg = str(e.value)
    assert "reservation timed out after 8 s: 1 of 2 slots not filled" in msg
    assert re.search(r"worker:\d \(executor \d\): never registered", msg), msg
    assert "dynamic allocation" in msg  # the usual causes are suggested


def test_a_cluster_the_application_cannot_hold_is_refused_at_once(sc, tmp_path):
    # 2 executors x 1 core, 3 nodes: refused before anything starts, with the numbers, instead
    # of waiting out the 600 s reservation timeout.
    before = active_jobs(sc)  # an earlier test's job may still be ending
    t0 = time.monotonic()
    with pytest.raises(ValueError) as e:
        tfs.run(sc, mapfuns.report_context, args_for(tmp_path), num_executors=3, num_ps=1)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "the application has 2 Spark task slot(s), 2 executors x 1 core (spark.cores.max=2" in msg
    assert "needs 3 nodes running at once" in msg and "spark.cores.max=3" in msg
    assert took < 5, f"refused after {took:.1f} s"
    assert active_jobs(sc) <= before  # no node was started
    assert not list(tmp_path.glob("*.json"))


def test_argument_checks_say_what_to_change(sc, tmp_path):
    with pytest.raises(ValueError, match="leaves no room for 3 ps"):
        tfs.run(sc, mapfuns.report_context, args_for(tmp_path), num_executors=2, num_ps=3)
    with pytest.raises(ValueError, match="at least one worker or a chief"):
        tfs.run(sc, mapfuns.report_context, args_for(tmp_path), num_executors=1, num_ps=1)


@pytest.mark.parametrize("barrier", [True, False])
def test_parallel_runs_independent_nodes(sc, tmp_path, barrier):
    tfs.parallel(sc, mapfuns.independent, args_for(tmp_path), num_executors=2, use_barrier=barrier)
    recs = _records(tmp_path, 2)
    assert [r["executor_id"] for r in recs] == [0, 1]
    assert all(r["tf_config"] is None and r["num_workers"] == 2 for r in recs)


def test_parallel_barrier_with_too_few_slots_is_a_clear_error(sc, tmp_path):
    with pytest.raises(ValueError, match="barrier mode needs 3 task slots at once but the cluster has 2"):
        tfs.parallel(sc, mapfuns.independent, args_for(tmp_path), num_executors=3)


@pytest.mark.parametrize("barrier", [True, False])
def test_parallel_map_fun_error_names_the_task_with_its_traceback(sc, tmp_path, barrier):
    with pytest.raises(tfs.ParallelTaskFailed) as e:
        tfs.parallel(sc, mapfuns.raise_on_task_1, args_for(tmp_path), num_executors=2, use_barrier=barrier)
    msg = str(e.value)
    assert re.search(
        r"parallel task 1 of 2 \(host \S+, stage \d+ partition 1 TID \d+ attempt \d+\) failed:", msg
    )
    assert "Traceback (most recent call last)" in msg and "raise_on_task_1" in msg
    assert "ValueError: injected failure in parallel task 1" in msg
    assert "\tat org.apache" not in msg  # the Python story, not the Java stack


#: A second application on the session's standalone cluster, with no spark.cores.max and
#: executors larger than its worker's memory: it never gets an executor.
CROWDED_OUT = """
import sys
from pyspark import SparkConf, SparkContext
from tfcoord.driver import spark as tfs

def fn(args, ctx):
    pass

conf = (
    SparkConf()
    .setMaster(sys.argv[1])
    .setAppName("crowded-out")
    .set("spark.ui.enabled", "false")
    .set("spark.executor.memory", "100g")
)
sc = SparkContext(conf=conf)
sc.setLogLevel("ERROR")
tfs.run(sc, fn, None, 2, 0, reservation_timeout=float(sys.argv[2]))
"""


def test_a_reservation_short_of_executors_is_named_within_seconds(sc, tmp_path):
    # The configuration does not say how many executors the application gets; the ones that
    # registered (none: no worker has 100 GiB) cannot hold 2 nodes: the driver says so after
    # EXECUTOR_WAIT_S, with the numbers, instead of waiting out its 600 s reservation timeout.
    from tfcoord.driver.standalone import LocalSparkCluster

    proc = subprocess.Popen(
        [sys.executable, "-c", CROWDED_OUT, sc.master, "600"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=LocalSparkCluster.env(),
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    try:
        seen, submitted_at, warned = [], None, None
        for line in proc.stderr:  # ends at the warning, or when the program ends without one
            seen.append(line)
            if submitted_at is None and " SUBMITTED: " in line:
                submitted_at = time.monotonic()
            if "Spark task slot(s) after" in line:
                warned = line
                break
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert warned is not None and submitted_at is not None, "".join(seen)[-3000:]
    assert time.monotonic() - submitted_at < tfs.EXECUTOR_WAIT_S + 15
    assert f"the application has 0 Spark task slot(s) after {tfs.EXECUTOR_WAIT_S:g} s" in warned
    assert "needs 2 nodes running at once" in warned


#: Runs parallel() right after SparkContext() returns, before the executors have registered.
EARLY_PARALLEL = """
import sys
from pyspark import SparkConf, SparkContext
from tfcoord.driver import spark as tfs

def fn(args, ctx):
    pass

conf = SparkConf().setMaster("local-cluster[2,1,1024]").setAppName("early").set("spark.ui.enabled", "false")
sc = SparkContext(conf=conf)
sc.setLogLevel("ERROR")
print("slots at start:", tfs._task_slots(sc), flush=True)
tfs.parallel(sc, fn, None, num_executors=2)
print("parallel done", flush=True)
sc.stop()
"""


def test_parallel_right_after_the_spark_context_starts_waits_for_executors(tmp_path):
    from tfcoord.driver.standalone import LocalSparkCluster

    out = subprocess.run(
        [sys.executable, "-c", EARLY_PARALLEL],
        capture_output=True,
        text=True,
        timeout=240,
        env=LocalSparkCluster.env(),
        cwd=tmp_path,
    )
    assert "slots at start: 0" in out.stdout, out.stdout + out.stderr[-3000:]  # the case this is about
    assert out.returncode == 0 and "parallel done" in out.stdout, out.stderr[-3000:]


#: TensorFlowOnSpark's tests start a SparkContext per test class in one process: run, stop, run again.
NEXT_CONTEXT = """
import os, sys
from pyspark import SparkConf, SparkContext
from tfcoord import aliases

aliases.install()
from tensorflowonspark import TFCluster, TFParallel

def fn(args, ctx):
    pass

for i in range(2):
    conf = SparkConf().setMaster("local-cluster[1,1,1024]").setAppName(f"context-{i}").set("spark.ui.enabled", "false")
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    TFParallel.run(sc, fn, None, 1, use_barrier=False)
    print(f"context {i}:", TFCluster.run(sc, fn, None, 1, 0).shutdown()["state"], flush=True)
    sc.stop()
    dead = [p for p in sys.path if p.endswith("tfcoord_tensorflowonspark_alias.zip") and not os.path.exists(p)]
    print(f"dead shim zips on sys.path after stop {i}:", len(dead), flush=True)
"""


@alias_in_use
def test_a_second_spark_context_in_the_same_driver_runs_clusters_too(tmp_path):
    from tfcoord.driver.standalone import LocalSparkCluster

    out = subprocess.run(
        [sys.executable, "-c", NEXT_CONTEXT],
        capture_output=True,
        text=True,
        timeout=240,
        env=LocalSparkCluster.env(),
        cwd=tmp_path,
    )
    # The first context's shim zip is deleted by sc.stop() but stays on the driver's sys.path:
    # the case this is about.
    assert "dead shim zips on sys.path after stop 0: 1" in out.stdout, out.stdout + out.stderr[-3000:]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "context 0: SUCCEEDED" in out.stdout and "context 1: SUCCEEDED" in out.stdout


def test_tensorflowonspark_driver_code_runs_unchanged(sc, tmp_path):
    # The driver and map_fun use TensorFlowOnSpark's names only; the import is the one change.
    from tfcoord.compat.tensorflowonspark import TFCluster

    args = args_for(tmp_path, export=str(tmp_path / "model"))  # hdfs_path makes it file:///...
    cluster = TFCluster.run(
        sc, mapfuns.tfos_style, args, 1, 0, False, TFCluster.InputMode.SPARK, master_node="chief"
    )
    results = cluster.inference(sc.parallelize(range(100), 4)).collect()
    cluster.shutdown(grace_secs=60)
    assert results == [2.0 * x + 1.0 for x in range(100)]  # computed by TensorFlow on the node
    rec = json.loads((tmp_path / "tfos.json").read_text())
    assert (rec["worker_num"], rec["job_name"], rec["task_index"], rec["records"]) == (0, "chief", 0, 100)
    assert rec["target"] == "grpc://" + rec["cluster"]["chief"][0]  # served at this node's address

    import tensorflow as tf

    for export in ("model", "model-ctx"):  # the chief's SavedModel, from TFNode and from ctx
        loaded = tf.saved_model.load(str(tmp_path / export))
        assert loaded(tf.constant([3.0])).numpy().tolist() == [7.0]


@alias_in_use
def test_tensorflowonspark_imports_work_on_executors_without_an_install(sc, tmp_path):
    aliases.install()  # the driver imported tensorflowonspark through the alias (.pth or tfcoord submit)
    import tensorflowonspark
    from tensorflowonspark import TFCluster

    cluster = TFCluster.run(sc, mapfuns.tfos_imports, args_for(tmp_path), 2, 0)
    assert cluster.shutdown()["state"] == "SUCCEEDED"
    for i in range(2):  # inside map_fun: the node installed the finder before calling it
        rec = json.loads((tmp_path / f"{i}.json").read_text())
        assert rec["same"] and rec["name"] == "tfcoord.compat.tensorflowonspark"

    def in_a_plain_task(x: int) -> str:  # no node here: the shipped shim answers the import
        import os

        import tensorflowonspark.TFNode as tfnode

        import tfcoord.compat.tensorflowonspark.TFNode as compat_tfnode

        return f"{x}:{tfnode is compat_tfnode}:{os.environ.get('TFCOORD_ALIASES')}"

    assert sc.parallelize(range(4), 2).map(in_a_plain_task).collect() == [f"{i}:True:off" for i in range(4)]
    assert tensorflowonspark.TFCluster is TFCluster


def test_keras_fit_under_mwms_trains_as_keras_2_in_tensorflowonspark_nodes(sc, tmp_path):
    from tfcoord.compat.tensorflowonspark import TFCluster
    from tfcoord.node import keras2

    if not keras2.tf_keras_installed():
        pytest.skip("tf-keras is not installed (make install adds it): Keras 3's fit fails under MWMS")
    cluster = TFCluster.run(sc, mapfuns.keras_fit, args_for(tmp_path), 2, 0)
    assert cluster.shutdown()["state"] == "SUCCEEDED"
    recs = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert all(r["keras"].startswith("tf_keras") for r in recs)  # tf.keras is Keras 2 in the nodes
    assert all(round(r["adam_lr"], 6) == 0.2 for r in recs)  # and lr= is the learning rate, as in Keras 2
    assert recs[0]["weights"] == recs[1]["weights"]  # synchronous: both workers end the same
    assert recs[0]["loss"] < 1.0


def test_tf_args_given_as_a_list_become_sys_argv_in_map_fun(sc, tmp_path):
    argv = ["mnist_spark.py", "--epochs", "1", str(tmp_path)]
    assert tfs.run(sc, mapfuns.record_argv, argv, 1, 0).shutdown()["state"] == "SUCCEEDED"
    assert json.loads((tmp_path / "argv-0.json").read_text()) == argv


FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *query-gpu*) printf '0, GPU-aaaa, 16000, 10, 15990\\n1, GPU-bbbb, 16000, 12000, 4000\\n' ;;
  *query-compute-apps*) printf 'GPU-bbbb, 4242, python, 12000\\n' ;;
esac
"""


def test_gpu_selection_with_fake_nvidia_smi(sc, tmp_path, spark_bin):
    smi = spark_bin / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    try:
        cluster = tfs.run(
            sc, mapfuns.report_context, args_for(tmp_path, num_gpus=1), num_executors=1, num_ps=0
        )
        status = cluster.shutdown()
    finally:
        smi.unlink()
    assert _records(tmp_path, 1)[0]["cuda"] == "0"  # GPU 1 is busy (pid 4242)
    assert status["nodes"][0]["gpus"] == ["GPU-aaaa"]


TWO_FREE_GPUS = """#!/bin/sh
case "$*" in
  *query-gpu*) printf '0, GPU-aaaa, 16000, 0, 16000\\n1, GPU-bbbb, 16000, 0, 16000\\n' ;;
esac
"""


@pytest.mark.parametrize("api", ["run", "parallel"])
def test_two_nodes_on_one_host_get_different_gpus(sc, tmp_path, spark_bin, api):
    # Both executors run on this host and nvidia-smi shows both GPUs idle to both nodes
    # (nothing has started on them yet): only the host-local claim keeps them apart.
    smi = spark_bin / "nvidia-smi"
    smi.write_text(TWO_FREE_GPUS)
    smi.chmod(0o755)
    args = args_for(tmp_path, num_gpus=1)
    try:
        if api == "run":
            status = tfs.run(sc, mapfuns.wait_for_peer, args, num_executors=2, num_ps=0).shutdown()
            assert sorted(g for n in status["nodes"] for g in n["gpus"]) == ["GPU-aaaa", "GPU-bbbb"]
        else:
            tfs.parallel(sc, mapfuns.wait_for_peer, args, num_executors=2)
    finally:
        smi.unlink()
    assert sorted(r["cuda"] for r in _records(tmp_path, 2)) == ["0", "1"]
