"""How a feed ends before Spark has fed every partition, on a real Spark standalone cluster.

TensorFlowOnSpark's ``DataFeed.terminate()`` (a node stops on a step or record count while
Spark is still feeding), and a ``map_fun`` that raises while it is fed: the feeding tasks
Spark runs after that must end cleanly (terminate) or carry the node's own error (failure),
not fail with "cannot reach the feed port" and be retried.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from tfcoord.client import JobFailed
from tfcoord.driver import spark as tfs

from . import mapfuns
from .mapfuns import alive, args_for
from .sparkjobs import failed_tasks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SPARK = tfs.InputMode.SPARK


def _ends(pid: int, within_s: float = 30.0) -> None:
    """Wait until process ``pid`` (a node's supervisor, in the background of its executor) has
    ended; well under its 120 s afterlife."""
    deadline = time.monotonic() + within_s
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs {within_s:g} s later"
        time.sleep(0.1)


def test_terminate_then_return_ends_the_training_feed_without_errors_or_retries(sc, tmp_path, caplog):
    # The only fed node terminates its feed and returns: the job SUCCEEDED while Spark still
    # has most partitions to feed; their tasks skip them quietly (TensorFlowOnSpark's "mgr is
    # terminating, skipping partition"), none fails, and train() returns.
    cluster = tfs.run(
        sc, mapfuns.terminate_early, args_for(tmp_path, limit=300, terminator=0), 1, 0, input_mode=SPARK
    )
    sc.setJobGroup("terminate-train", "train, then terminate()")
    with caplog.at_level(logging.INFO, logger="tfcoord"):
        cluster.train(sc.parallelize(range(20_000), 20), num_epochs=1, feed_timeout=60)
    status = cluster.shutdown(grace_secs=30)
    assert status["state"] == "SUCCEEDED", status["error"] or status["stop_reason"]
    assert status["nodes"][0]["meta"]["feed_terminated"] == 1
    assert failed_tasks(sc, "terminate-train") == 0
    assert not [r for r in caplog.records if "before every partition was fed" in r.getMessage()]
    assert 300 <= json.loads((tmp_path / "0.json").read_text())["consumed"] < 20_000


def test_terminate_then_return_ends_an_inference_with_the_results_it_gave(sc, tmp_path):
    # TensorFlowOnSpark's inference that stops early: the action returns the results the node
    # gave (one per record it answered, in order), the partitions it did not take are skipped,
    # no task fails or is retried, and the job SUCCEEDED.
    cluster = tfs.run(
        sc, mapfuns.tfos_infer_then_terminate, args_for(tmp_path, limit=100), 1, 0, input_mode=SPARK
    )
    sc.setJobGroup("terminate-inference", "inference, then terminate()")
    t0 = time.monotonic()
    results = cluster.inference(sc.parallelize(range(10_000), 20), feed_timeout=60).collect()
    took = time.monotonic() - t0
    (node,) = cluster.driver.status(cluster.job).nodes
    status = cluster.shutdown(grace_secs=30)
    _ends(int(node.meta["pid"]))  # shutdown() ended its port's afterlife
    assert status["state"] == "SUCCEEDED", status["error"] or status["stop_reason"]
    answered = json.loads((tmp_path / "0.json").read_text())["records"]
    assert 100 <= len(answered) < 10_000
    assert results == [x * x for x in answered]
    assert failed_tasks(sc, "terminate-inference") == 0
    assert took < 60, f"the skipped partitions took {took:.1f} s"


def test_a_map_fun_error_while_fed_reaches_the_feeding_tasks_and_the_action(sc, tmp_path):
    # The node raises after its first batch; Spark retries the feeding task and runs the next
    # ones after the node's process is gone: every one of them, and so the action's error,
    # carries the node's own exception text, not "cannot reach the feed port".
    cluster = tfs.run(sc, mapfuns.raise_after_first_batch, args_for(tmp_path), 1, 0, input_mode=SPARK)
    sc.setJobGroup("raise-inference", "inference whose map_fun raises")
    with pytest.raises(Exception) as raised:
        cluster.inference(sc.parallelize(range(1000), 10), feed_timeout=60).collect()
    text = str(raised.value)
    assert "FAKE exception during feeding" in text and "map_fun on worker:0" in text, text[-3000:]
    assert "cannot reach the feed port" not in text
    assert failed_tasks(sc, "raise-inference") >= 2  # the retry was told the same error
    (node,) = cluster.driver.status(cluster.job).nodes
    with pytest.raises(JobFailed, match="FAKE exception during feeding"):
        cluster.shutdown()
    # The node's port answered late feeders until shutdown() said no more would come.
    _ends(int(node.meta["pid"]))


def test_a_peers_error_reaches_the_feeding_tasks_of_the_nodes_it_stopped(sc, tmp_path):
    # Worker 1 raises; the job fails and worker 0 is told to stop. Whichever feeding task
    # Spark gives up on (worker 1's, or worker 0's once its process ended), the action's error
    # carries worker 1's exception text, not "cannot reach the feed port".
    cluster = tfs.run(sc, mapfuns.infer_or_raise_on_worker_1, args_for(tmp_path), 2, 0, input_mode=SPARK)
    with pytest.raises(Exception) as raised:
        cluster.inference(sc.parallelize(range(4000), 40), feed_timeout=60).collect()
    text = str(raised.value)
    assert "FAKE exception on worker 1 during feeding" in text, text[-3000:]
    assert "cannot reach the feed port" not in text
    status = cluster.driver.await_job(cluster.job, 30, raise_on_failure=False)
    assert status["state"] == "FAILED"
