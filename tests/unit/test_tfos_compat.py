"""TensorFlowOnSpark's TFNode helpers used as its own unit tests use them: a real TFManager (a feed server)."""

from __future__ import annotations

import getpass
import os
import pickle
import threading
from types import SimpleNamespace

import pytest

from tfcoord.compat.tensorflowonspark import TFManager, TFNode, marker, util
from tfcoord.node.feedwire import FeedError


def test_a_datafeed_over_a_local_manager_reads_until_the_end_marker() -> None:
    mgr = TFManager.start("abc", ["input", "output"], "local")  # a str key, as TensorFlowOnSpark's test
    try:
        q = mgr.get_queue("input")
        for i in range(10):
            q.put(i)
        q.put(None)
        feed = TFNode.DataFeed(mgr)
        assert not feed.done_feeding and feed.next_batch(2) == [0, 1]
        assert feed.next_batch(4) == [2, 3, 4, 5]
        assert feed.next_batch(10) == [6, 7, 8, 9]  # fewer than asked: the feed ended
        assert feed.should_stop()
    finally:
        mgr.shutdown()


def test_inference_batches_stop_at_a_partition_end_and_results_go_to_the_output_queue() -> None:
    mgr = TFManager.start(b"key", ["input", "output"])
    try:
        q = mgr.get_queue("input")
        for item in (1, 2, marker.EndPartition(), 3, None):
            q.put(item)
        feed = TFNode.DataFeed(mgr, train_mode=False)
        batch = feed.next_batch(10)
        assert batch == [1, 2]
        feed.batch_results([x * x for x in batch])
        out = mgr.get_queue("output")
        assert [out.get(), out.get()] == [1, 4]
        assert feed.next_batch(10) == [3] and feed.should_stop()
    finally:
        mgr.shutdown()


def test_results_go_to_the_queue_named_qname_out_and_an_unknown_name_is_refused() -> None:
    mgr = TFManager.start(b"key", ["input", "scores"])
    try:
        q = mgr.get_queue("input")
        for item in (1, 2, marker.EndPartition()):
            q.put(item)
        feed = TFNode.DataFeed(mgr, train_mode=False, qname_out="scores")
        feed.batch_results([x * 10 for x in feed.next_batch(10)])
        out = mgr.get_queue("scores")
        assert [out.get(), out.get()] == [10, 20]
        with pytest.raises(ValueError, match=r"unknown queue 'output'.*TFManager.start"):
            TFNode.DataFeed(mgr, train_mode=False).batch_results([1])
        assert mgr.get_queue("output") is None  # TensorFlowOnSpark's answer for a name it does not serve
    finally:
        mgr.shutdown()


def test_a_remote_manager_listens_on_this_hosts_address_with_tls_and_a_random_key() -> None:
    mgr = TFManager.start(None, ["input"], "remote")
    try:
        host, _ = mgr.address
        assert host == util.get_ip_address() and len(mgr.authkey) == TFManager.AUTHKEY_BYTES
        assert mgr.address.pin  # feeders pin its certificate
        with pytest.raises(FeedError, match="refused the feed"):
            TFManager.connect(mgr.address, b"wrong key").get_queue("input").put(None)
        other = TFManager.connect(pickle.loads(pickle.dumps(mgr.address)), mgr.authkey)
        q = other.get_queue("input")

        def produce() -> None:  # another process's feeder: a partition goes when it ends,
            for item in (1, 2, marker.EndPartition()):  # and put returns once it was taken
                q.put(item)
            other.set("state", "stopped")  # TensorFlowOnSpark's shutdown

        producer = threading.Thread(target=produce)
        producer.start()
        feed = TFNode.DataFeed(mgr)
        assert feed.next_batch(10) == [1, 2] and feed.should_stop()
        producer.join(30)
        assert not producer.is_alive()
        with pytest.raises(ValueError, match="sets only 'state'"):
            other.set("x", 1)
    finally:
        mgr.shutdown()


def test_terminate_shows_in_the_managers_state_and_drops_what_is_queued() -> None:
    mgr = TFManager.start(b"key", ["input"])
    try:
        assert mgr.get("state") == "running"
        q = mgr.get_queue("input")
        for i in range(5):
            q.put(i)
        feed = TFNode.DataFeed(mgr)
        assert feed.next_batch(1) == [0]
        feed.terminate()
        assert mgr.get("state") == "terminating" and feed.should_stop()
        mgr.set("user", {"a": 1})
        assert mgr.get("user") == {"a": 1}
    finally:
        mgr.shutdown()


def test_hdfs_path_takes_any_object_with_defaultfs_and_working_dir() -> None:
    cwd, user = os.getcwd(), getpass.getuser()
    for fs in ("file://", "hdfs://", "viewfs://"):
        ctx = SimpleNamespace(defaultFS=fs, working_dir=cwd)
        assert TFNode.hdfs_path(ctx, "hdfs://foo/bar") == "hdfs://foo/bar"
        assert TFNode.hdfs_path(ctx, "/foo/bar") == f"{fs}/foo/bar"
        relative = f"file://{cwd}/foo/bar" if fs == "file://" else f"{fs}/user/{user}/foo/bar"
        assert TFNode.hdfs_path(ctx, "foo/bar") == relative


def test_tf_version_is_the_installed_tensorflow() -> None:
    from importlib import metadata

    assert metadata.version("tensorflow-cpu") == TFNode.TF_VERSION


def test_the_node_context_takes_tensorflowonspark_constructor_arguments() -> None:
    from tfcoord.compat.tensorflowonspark import TFSparkNode

    spec = {"ps": ["h:1"], "chief": ["h:2"], "worker": ["h:3", "h:4"]}
    mgr = TFManager.start(b"k", ["input"])
    try:
        ctx = TFSparkNode.TFNodeContext(2, "worker", 0, spec, "hdfs://nn", "/w", mgr)  # positional, as TFoS
        assert (ctx.executor_id, ctx.worker_num, ctx.job_name, ctx.task_index) == (2, 2, "worker", 0)
        assert ctx.num_workers == 3 and ctx.defaultFS == "hdfs://nn" and ctx.working_dir == "/w"
        assert ctx.mgr is mgr and ctx.absolute_path("x") == f"hdfs://nn/user/{getpass.getuser()}/x"
        assert ctx.tmp_socket is None  # no port reserved for a hand-made context
    finally:
        mgr.shutdown()
    assert TFSparkNode.TFNodeContext().cluster_spec == {}


def test_tmp_socket_holds_the_reserved_port_until_released() -> None:
    from tfcoord.node.context import TFNodeContext
    from tfcoord.node.ports import PortReservation

    port = PortReservation()
    ctx = TFNodeContext(0, "worker", 0, {"worker": ["h:1"]}, 1, _release=port.release, _port=port)
    assert ctx.tmp_socket is not None and ctx.tmp_socket.getsockname()[1] == port.port
    ctx.release_port()
    assert ctx.tmp_socket is None
