"""InputMode.SPARK on a real Spark standalone cluster: RDDs and a DStream fed into real TensorFlow nodes.

One TensorFlow worker runs on one executor; the feeding tasks run on the other, so
nothing depends on a feeding task sharing a Python worker with its node.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tfcoord.client import JobFailed
from tfcoord.client import feedmessages as fm
from tfcoord.driver import spark as tfs
from tfcoord.node import feedtls
from tfcoord.node.feedwire import FEED_META, frame

from . import mapfuns
from .mapfuns import alive, args_for
from .sparkjobs import active_jobs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SPARK = tfs.InputMode.SPARK


def _refuses_plaintext(address: str) -> bool:
    """A plaintext peer's first frame gets no feed-protocol answer: the port speaks TLS only."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(frame(fm.Open(kind="eof")))
        got = b""
        try:
            while data := sock.recv(65536):
                got += data
        except ConnectionResetError:
            pass
    return b"challenge" not in got


def test_inference_returns_the_sum_of_squares(sc, tmp_path):
    # The embedded coordinator serves TLS by default, so the feed is TLS: the node registered
    # its feed certificate's fingerprint, its feed port refuses plaintext, and feeding works.
    cluster = tfs.run(sc, mapfuns.infer_squares, args_for(tmp_path), 1, 0, input_mode=SPARK)
    try:
        (node,) = cluster.driver.status(cluster.job).nodes
        assert feedtls.valid_fingerprint(node.meta[feedtls.FEED_TLS_META])
        assert _refuses_plaintext(str(node.meta[FEED_META]))
        rdd = sc.parallelize(range(1000), 10)
        results = cluster.inference(rdd, feed_timeout=60)
        assert results.sum() == sum(x * x for x in range(1000))
        # one result per record, in order within each partition
        assert results.glom().collect() == rdd.map(lambda x: x * x).glom().collect()
    finally:
        status = cluster.shutdown(grace_secs=60)  # returns as soon as the node has finished
    assert status["state"] == "SUCCEEDED"


def test_inference_results_come_from_the_queue_named_qname_out(sc, tmp_path):
    args = args_for(tmp_path, qname_out="scores")
    cluster = tfs.run(
        sc, mapfuns.infer_squares, args, 1, 0, input_mode=SPARK, queues=["input", "scores", "error"]
    )
    try:
        with pytest.raises(
            ValueError, match=r"unknown queue 'output'.*queues are \['input', 'scores', 'error'\]"
        ):
            cluster.inference(sc.parallelize(range(10), 2))  # qname_out="output" is not declared
        (node,) = cluster.cluster_info
        assert f"{node['addr'][0]}:{node['addr'][1]}" == node["meta"]["feed_address"]  # its feed port
        results = cluster.inference(sc.parallelize(range(100), 4), feed_timeout=60, qname_out="scores")
        assert sorted(results.collect()) == [x * x for x in range(100)]
    finally:
        assert cluster.shutdown(grace_secs=60)["state"] == "SUCCEEDED"


def test_an_explicitly_plaintext_job_feeds_in_plaintext(sc, tmp_path):
    cluster = tfs.run(sc, mapfuns.infer_squares, args_for(tmp_path), 1, 0, input_mode=SPARK, plaintext=True)
    try:
        (node,) = cluster.driver.status(cluster.job).nodes
        assert feedtls.FEED_TLS_META not in node.meta
        assert cluster.inference(sc.parallelize(range(100), 2)).sum() == sum(x * x for x in range(100))
    finally:
        assert cluster.shutdown(grace_secs=60)["state"] == "SUCCEEDED"


def test_tensorflowonspark_inputmode_spark_numpy_results_sum(sc, tmp_path):
    # TensorFlowOnSpark's test_inputmode_spark: the node returns numpy arrays of squares,
    # Spark adds them up. The feed carries numpy values back as numpy (int32 here).
    from tensorflowonspark import TFCluster

    rdd = sc.parallelize(list(range(1000)), 10)
    cluster = TFCluster.run(sc, mapfuns.tfos_square_numpy, {}, 2, 0, input_mode=TFCluster.InputMode.SPARK)
    try:
        rdd_out = cluster.inference(rdd)
        assert rdd_out.sum() == sum(x * x for x in range(1000))
        assert rdd_out.map(lambda r: type(r).__module__ + "." + type(r).__name__).distinct().collect() == [
            "numpy.int32"
        ]
    finally:
        assert cluster.shutdown(grace_secs=60)["state"] == "SUCCEEDED"


def test_training_over_two_epochs_consumes_every_record_twice(sc, tmp_path):
    cluster = tfs.run(sc, mapfuns.train_counting, args_for(tmp_path), 1, 0, input_mode=SPARK)
    rdd = sc.parallelize([(i / 1000, 3 * i / 1000 + 1) for i in range(1000)], 7)
    cluster.train(rdd, num_epochs=2, feed_timeout=60)
    status = cluster.shutdown(grace_secs=60)
    assert status["state"] == "SUCCEEDED"
    rec = json.loads((tmp_path / "0.json").read_text())
    assert {int(k): v for k, v in rec["counts"].items()} == {i: 2 for i in range(1000)}
    assert status["nodes"][0]["meta"]["result.records"] == 2000
    assert rec["loss"] < rec["first_loss"] / 10  # real TensorFlow learned from it


def test_a_raising_node_fails_the_feed_fast_with_its_traceback(sc, tmp_path):
    cluster = tfs.run(sc, mapfuns.raise_at_once, args_for(tmp_path), 1, 0, input_mode=SPARK)
    t0 = time.monotonic()
    with pytest.raises(JobFailed, match="injected failure in a fed map_fun") as e:
        cluster.train(sc.parallelize(range(100), 2), feed_timeout=1)
    assert "Traceback" in str(e.value) and "worker:0" in str(e.value)
    assert time.monotonic() - t0 < 30
    with pytest.raises(JobFailed, match="injected failure"):
        cluster.shutdown()


#: The node fails this long after the feed ends, i.e. after the driver called shutdown().
LATE_S = 2.0


def test_a_late_error_surfaces_at_shutdown_within_grace_secs(sc, tmp_path):
    cluster = tfs.run(
        sc, mapfuns.raise_after_feed, args_for(tmp_path, delay_s=LATE_S), 1, 0, input_mode=SPARK
    )
    cluster.train(sc.parallelize(range(500), 3), num_epochs=1, feed_timeout=60)
    t0 = time.monotonic()
    with pytest.raises(JobFailed, match="late failure after consuming 500 records"):
        cluster.shutdown(grace_secs=5)
    assert time.monotonic() - t0 < 5 + 10  # raised once the node failed, not after a fixed sleep


def test_without_grace_secs_a_late_error_is_not_waited_for(sc, tmp_path):
    # TensorFlowOnSpark's semantic: the nodes get grace_secs after the feed ends, then are stopped.
    cluster = tfs.run(
        sc, mapfuns.raise_after_feed, args_for(tmp_path, delay_s=LATE_S), 1, 0, input_mode=SPARK
    )
    cluster.train(sc.parallelize(range(500), 3), num_epochs=1, feed_timeout=60)
    status = cluster.shutdown(grace_secs=0)
    assert status["state"] == "STOPPED" and "grace_secs" in status["stop_reason"]
    assert status["nodes"][0]["state"] == "STOPPED" and not status["nodes"][0]["error"]


def test_a_trainer_that_stops_reading_times_out_naming_node_and_queue(sc, tmp_path):
    from tfcoord.client.vocab import FailureReason
    from tfcoord.node.feedwire import FeedTimeout

    cluster = tfs.run(sc, mapfuns.never_read, args_for(tmp_path), 1, 0, input_mode=SPARK)
    try:
        with pytest.raises(
            FeedTimeout, match=r"worker:0 \(executor 0, host .*\) took no records from queue 'input'"
        ):
            cluster.train(sc.parallelize(range(200_000), 1), num_epochs=1, feed_timeout=1)
        # The node said so as data: the driver decided on the job's reason, not Spark's text.
        assert cluster.driver.status(cluster.job).reason == FailureReason.FEED_TIMEOUT
    finally:
        (tmp_path / "done").touch()
        cluster.shutdown()


def test_tensorflowonspark_slot_shape_trains_and_infers_on_two_one_core_executors(sc, tmp_path):
    # 2 executors x 1 core, 2 fed nodes: each node gives its task slot back once map_fun
    # runs, and the feeding tasks run in those same slots.
    assert tfs.await_task_slots(sc, 2) == 2
    cluster = tfs.run(sc, mapfuns.train_and_record_pid, args_for(tmp_path), 2, 0, input_mode=SPARK)
    assert active_jobs(sc) == set()  # no Spark task holds a node
    with pytest.raises(ValueError, match=r"unknown queue 'nope': this cluster's queues are \['input'"):
        cluster.train(sc.parallelize(range(10), 2), qname="nope")  # a bad argument leaves the job as it was
    cluster.train(sc.parallelize(range(1000), 4), num_epochs=2, feed_timeout=60)
    status = cluster.shutdown(grace_secs=60)
    assert status["state"] == "SUCCEEDED"
    assert sum(n["meta"]["result.records"] for n in status["nodes"]) == 2000
    assert all(n["meta"]["result.records"] > 0 for n in status["nodes"])
    assert not any(alive(int((tmp_path / f"pid-{i}").read_text())) for i in range(2))

    cluster = tfs.run(sc, mapfuns.infer_squares, args_for(tmp_path), 2, 0, input_mode=SPARK)
    try:
        assert cluster.inference(sc.parallelize(range(1000), 10)).sum() == sum(x * x for x in range(1000))
    finally:
        assert cluster.shutdown(grace_secs=60)["state"] == "SUCCEEDED"


def test_an_abandoned_failed_cluster_never_blocks_the_next_run(sc, tmp_path):
    # TensorFlowOnSpark's test_inputmode_spark_exception: an inference that raises, no shutdown().
    rdd = sc.parallelize([[x] for x in range(1000)], 10)
    t0 = time.monotonic()
    # The first error is the node's, or a feed timeout (feed_timeout=1 is shorter than a
    # TensorFlow import): either ends the job, and every node with it.
    with pytest.raises(Exception, match=r"FAKE exception during feeding|feed_timeout"):
        cluster = tfs.run(sc, mapfuns.raise_after_first_batch, {}, 2, 0, input_mode=SPARK)
        cluster.inference(rdd, feed_timeout=1).count()
    st = cluster.driver.await_job(cluster.job, 30, raise_on_failure=False)
    assert st["state"] in ("FAILED", "STOPPED")
    # Every node of the abandoned cluster has ended, and the next run finds the executors free.
    nxt = tfs.run(
        sc, mapfuns.infer_squares, args_for(tmp_path), 2, 0, input_mode=SPARK, reservation_timeout=60
    )
    try:
        assert nxt.inference(sc.parallelize(range(100), 4)).sum() == sum(x * x for x in range(100))
    finally:
        nxt.shutdown()
    assert time.monotonic() - t0 < 90


def test_a_dead_background_node_fails_the_job_fast(sc, tmp_path):
    import os
    import signal

    cluster = tfs.run(sc, mapfuns.never_read, args_for(tmp_path), 2, 0, input_mode=SPARK)
    try:
        st = cluster.driver.status(cluster.job)
        deadline = time.monotonic() + 60
        while not all("child_pid" in n["meta"] for n in st["nodes"]):  # RUNNING: map_fun has started
            assert time.monotonic() < deadline
            st = cluster.driver.watch(cluster.job, st["version"], 1.0)
        victim = next(n for n in st["nodes"] if n["executor_id"] == 1)
        os.kill(int(victim["meta"]["child_pid"]), signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(JobFailed, match=r"(?s)worker:1 .*killed by signal 9"):
            cluster.driver.await_job(cluster.job, 60)
        assert time.monotonic() - t0 < 5.0
        other = next(n for n in st["nodes"] if n["executor_id"] == 0)
        deadline = time.monotonic() + 30  # told to stop: map_fun's feed stops, then it is terminated
        while alive(int(other["meta"]["child_pid"])):
            assert time.monotonic() < deadline, "the surviving node was left running"
            time.sleep(0.1)
    finally:
        (tmp_path / "done").touch()
        with pytest.raises(JobFailed):
            cluster.shutdown()


def test_feeding_a_tensorflow_mode_cluster_is_refused(sc, tmp_path):
    cluster = tfs.run(sc, mapfuns.report_context, args_for(tmp_path), 1, 0)
    try:
        with pytest.raises(ValueError, match=r"input_mode=InputMode\.SPARK"):
            cluster.train(sc.parallelize(range(3)))
    finally:
        cluster.shutdown()


def test_a_streaming_job_stops_on_tfcoord_stop(sc, tmp_path, monkeypatch):
    from pyspark.streaming import StreamingContext

    # The embedded coordinator on the port TensorFlowOnSpark's TFOS_SERVER_PORT names (bind-close:
    # the only way to name a port in advance, as a user does); its connection file in a runtime
    # directory of the test's own.
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TFOS_SERVER_PORT", str(port))
    monkeypatch.setenv("TFCOORD_RUNTIME_DIR", str(tmp_path / "run"))
    cluster = tfs.run(sc, mapfuns.stream_consumer, args_for(tmp_path), 1, 0, input_mode=SPARK)
    assert cluster.cluster_meta["server_addr"][1] == port and cluster.link.address.rpartition(":")[2] == str(
        port
    )
    with pytest.warns(FutureWarning, match="DStream is deprecated"):
        ssc = StreamingContext(sc, 0.5)
    batches = 200
    stream = ssc.queueStream([sc.parallelize(range(i * 100, (i + 1) * 100), 2) for i in range(batches)])
    cluster.train(stream, feed_timeout=30)
    ssc.start()
    log = tmp_path / "consumed.jsonl"
    deadline = time.monotonic() + 60
    while not (log.exists() and len(log.read_text().splitlines()) >= 4):  # wait: 2 micro-batches in
        assert time.monotonic() < deadline, "the stream fed nothing"
        time.sleep(0.1)

    # Another shell of the same user stops the job with no flags: the embedded coordinator's
    # connection file (mode 600) gives its address, admin credential and CA.
    (conn,) = (tmp_path / "run").glob("coordinator-*.json")  # beside it: runs/, the run records
    assert conn.name == f"coordinator-{port}.json" and oct(conn.stat().st_mode & 0o777) == "0o600"
    env = {k: v for k, v in os.environ.items() if k not in ("TFCOORD_ADDRESS", "TFCOORD_SECRET_FILE")}
    cli = [sys.executable, "-m", "tfcoord", "stop", cluster.job]
    dry = subprocess.run([*cli, "--dry-run"], capture_output=True, text=True, timeout=60, env=env)
    assert dry.returncode == 0 and "would stop 1 node(s)" in dry.stdout and "dry run" in dry.stdout
    assert cluster.driver.status(cluster.job)["state"] == "RUNNING"
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60, env=env)
    stopped_at = time.time()
    assert done.returncode == 0 and "stopping 1 node(s)" in done.stdout, done.stdout + done.stderr

    status = cluster.shutdown(ssc)
    assert status["state"] == "STOPPED"
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    records = [r for line in lines for r in line["records"]]
    assert len(records) == len(set(records))  # nothing fed twice
    assert max(records) < batches * 100 - 100  # the stream was cut, not drained
    # Only what was handed over before the stop was still consumed, within moments of it.
    assert max(line["t"] for line in lines) < stopped_at + 2.0
    node = status["nodes"][0]
    assert node["state"] == "STOPPED" and not alive(int(node["meta"]["child_pid"]))
    assert active_jobs(sc) == set()
    assert not conn.exists()  # removed with the coordinator


def test_terminate_ends_that_nodes_feed_only_and_the_other_node_is_fed_on(sc, tmp_path):
    # TensorFlowOnSpark's DataFeed.terminate(): that node's feeding tasks skip the rest of their
    # partitions without error, also once its map_fun has returned; the other node gets all of its own.
    cluster = tfs.run(
        sc, mapfuns.terminate_early, args_for(tmp_path, limit=300, terminator=0), 2, 0, input_mode=SPARK
    )
    parts = 20
    rdd = sc.parallelize(range(100_000), parts)
    cluster.train(rdd, num_epochs=1, feed_timeout=60)  # returns, raising nothing
    status = cluster.shutdown(grace_secs=60)
    assert status["state"] == "SUCCEEDED", status["error"] or status["stop_reason"]
    nodes = {n["executor_id"]: n for n in status["nodes"]}
    assert nodes[0]["meta"]["feed_terminated"] == 1 and "feed_terminated" not in nodes[1]["meta"]
    assert {n["state"] for n in nodes.values()} == {"SUCCEEDED"}
    first = json.loads((tmp_path / "0.json").read_text())
    other = json.loads((tmp_path / "1.json").read_text())
    assert 300 <= first["consumed"] < 100_000 // 2
    # Partitions go round-robin by index: node 1 has every odd one, each record exactly once.
    per = 100_000 // parts
    assert sorted(other["records"]) == [x for p in range(1, parts, 2) for x in range(p * per, (p + 1) * per)]
    assert not set(first["records"]) & set(other["records"])
    assert not any(alive(int(n["meta"]["child_pid"])) for n in nodes.values())


def test_terminate_in_a_streaming_job_requests_its_stop(sc, tmp_path):
    # In a stream, a node's terminate() is the stop request (TensorFlowOnSpark's request_stop):
    # shutdown(ssc) returns, every node's feed ends.
    from pyspark.streaming import StreamingContext

    cluster = tfs.run(
        sc, mapfuns.terminate_early, args_for(tmp_path, limit=200, terminator=0), 1, 0, input_mode=SPARK
    )
    with pytest.warns(FutureWarning, match="DStream is deprecated"):
        ssc = StreamingContext(sc, 0.5)
    stream = ssc.queueStream([sc.parallelize(range(i * 100, (i + 1) * 100), 2) for i in range(200)])
    cluster.train(stream, feed_timeout=30)
    ssc.start()
    status = cluster.shutdown(ssc, grace_secs=60)
    assert status["state"] == "SUCCEEDED", status["error"] or status["stop_reason"]
    assert status["nodes"][0]["meta"]["feed_terminated"] == 1
    assert 200 <= json.loads((tmp_path / "0.json").read_text())["consumed"] < 200 * 100
    assert active_jobs(sc) == set()


@pytest.mark.parametrize("mode", ["spark", "tensorflow"])
def test_shutdown_grace_secs_lets_the_chief_export_and_the_evaluator_finish(sc, tmp_path, mode):
    # TensorFlowOnSpark's shutdown(grace_secs=...): the chief (exporting after the feed ends,
    # longer than any stop grace) and the evaluator (a final evaluation after the chief is
    # done) get that long to finish on their own; neither is cut off when the other ends.
    fed = mode == "spark"
    args = args_for(tmp_path, fed=fed, export_s=12, eval_s=6)
    cluster = tfs.run(
        sc,
        mapfuns.export_then_evaluate,
        args,
        2,
        0,
        input_mode=SPARK if fed else tfs.InputMode.TENSORFLOW,
        master_node="chief",
        eval_node=True,
    )
    if fed:
        cluster.train(sc.parallelize(range(1000), 4), num_epochs=1, feed_timeout=60)
    status = cluster.shutdown(grace_secs=90)
    assert status["state"] == "SUCCEEDED", status["error"] or status["stop_reason"]
    assert (tmp_path / "exported").read_text() == ("1000" if fed else "0")
    assert (tmp_path / "evaluated").read_text() == "final"
    assert {n["role"]: n["state"] for n in status["nodes"]} == {
        "chief": "SUCCEEDED",
        "evaluator": "SUCCEEDED",
    }
