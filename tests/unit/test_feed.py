"""The pure parts of data feeding: partition assignment, batching, the node's queue, the feeder's credits."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from tfcoord.client import feedmessages as fm
from tfcoord.client import messages as m
from tfcoord.client.errors import RemoteProtocolError
from tfcoord.client.protocol import CLOSED, Connection
from tfcoord.client.vocab import ErrorCode
from tfcoord.node import feedwire as fw
from tfcoord.node.feedqueue import FeedQueue


def _frames(data: bytes) -> list[m.Message]:
    """The feed messages in ``data``, through the shared framing."""
    conn = fw.connection()
    conn.receive_data(data)
    conn.receive_data(b"")
    out = []
    while (msg := conn.next_event()) is not CLOSED:
        out.append(msg)
    return out


# -- assignment ---------------------------------------------------------------------------


def test_partitions_go_round_robin_by_index():
    assert [fw.assign(p, 3) for p in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert {fw.assign(p, 1) for p in range(5)} == {0}


def test_assignment_needs_a_fed_node():
    with pytest.raises(ValueError, match="no node that takes fed data"):
        fw.assign(0, 0)
    with pytest.raises(ValueError, match="negative"):
        fw.assign(-1, 2)


def test_feeding_needs_a_free_slot_per_fed_node():
    fw.check_slots(slots=2, node_tasks=0, fed_nodes=2)  # TensorFlowOnSpark's shape: background nodes
    fw.check_slots(slots=2, node_tasks=1, fed_nodes=1)  # a node holding its slot, one feeder
    fw.check_slots(slots=3, node_tasks=2, fed_nodes=1)  # a ps and a worker: one fed node
    # Two synchronous workers and one free slot: worker 0's feeder holds it while worker 0
    # waits in all-reduce for worker 1, whose partition then never gets a slot.
    with pytest.raises(ValueError) as e:
        fw.check_slots(slots=3, node_tasks=2, fed_nodes=2)
    msg = str(e.value)
    assert "training needs 2 free Spark task slot(s)" in msg and "leaving 1" in msg
    assert "at least 4 slots" in msg and "hold 2 of them" in msg
    with pytest.raises(ValueError, match=r"has 1 slot\(s\), leaving 1"):
        fw.check_slots(slots=1, node_tasks=0, fed_nodes=2)


# -- batching -----------------------------------------------------------------------------


def test_batches_keep_every_record_in_order_and_cap_records_per_frame():
    records = [(i, f"s{i}", b"\x00" * (i % 3)) for i in range(20_000)]
    out = list(fw.batches(records, fw.BatchPacker(max_records=7000)))
    assert [n for _, n in out] == [7000, 7000, 6000]
    decoded = [r for frame, _ in out for f in _frames(frame) for r in f.records]
    assert decoded == [[i, s, b] for i, s, b in records]  # tuples travel as lists


def test_batches_close_at_the_byte_target():
    out = list(fw.batches([b"x" * 1000] * 100, fw.BatchPacker(batch_bytes=10_000)))
    assert all(len(frame) < 12_000 for frame, _ in out[:-1])
    assert sum(n for _, n in out) == 100 and len(out) == 10


def test_numpy_arrays_and_scalars_arrive_as_numpy():
    sent = (
        np.arange(6, dtype=np.int32).reshape(2, 3),
        np.float32(1.5),
        np.bool_(True),
        np.array(["ab", "c"]),
    )
    (frame, n), *_ = fw.batches([sent])
    (got,) = _frames(frame)[0].records
    assert n == 1 and [type(v) for v in got] == [type(v) for v in sent]
    assert got[0].dtype == np.int32 and got[0].shape == (2, 3) and got[0].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert got[1] == np.float32(1.5) and got[3].tolist() == ["ab", "c"]
    got[0][0, 0] = 7  # writable, as an unpickled array is


def test_numpy_results_come_back_as_numpy_and_add_up():
    results = list(np.square(np.arange(10, dtype=np.int32)))  # what tf_feed.batch_results(x.numpy()) sends
    (msg,) = _frames(fw.frame(fm.Results(results=results)))
    assert {type(r) for r in msg.results} == {np.int32} and sum(msg.results) == 285


def test_object_arrays_travel_as_their_elements():
    (frame, _), *_ = fw.batches([np.array([1, "x"], dtype=object)])
    assert _frames(frame)[0].records == [[1, "x"]]


def test_the_coordinator_protocol_still_refuses_extension_types():
    body = msgpack.packb({"op": "credit", "n": np.int32(1)}, default=fw._default, use_bin_type=True)
    conn = Connection(fw.MAX_FRAME_BYTES, decode=fm.decode)
    conn.receive_data(len(body).to_bytes(4, "big") + body)
    with pytest.raises(RemoteProtocolError, match="ext"):
        conn.next_event()


def test_an_unsupported_record_names_its_type():
    class Point:
        pass

    with pytest.raises(fw.UnsupportedRecord, match=r"test_feed.*Point.*convert it"):
        list(fw.batches([1, 2, (3, Point())]))


def test_a_record_over_the_frame_limit_is_refused():
    with pytest.raises(fw.UnsupportedRecord, match="split it"):
        fw.BatchPacker().add(b"x" * fw.MAX_FRAME_BYTES)


def test_feed_frames_refuse_oversized_truncated_and_unknown_messages():
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        _frames((fw.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError, match="inside a frame"):
        _frames(fw.frame(fm.Credit(n=1))[:-1])
    with pytest.raises(RemoteProtocolError, match="must hold a map"):
        _frames(b"\x00\x00\x00\x01\x01")
    with pytest.raises(
        RemoteProtocolError, match="unknown feed op 'status'"
    ):  # a coordinator op is not a feed op
        _frames(Connection().send(m.Status(id=1)))
    with pytest.raises(RemoteProtocolError, match=r"open\.qname"):
        _frames(_packed({"op": "open", "kind": "feed", "qname": ""}))
    with pytest.raises(RemoteProtocolError, match=r"credit\.n"):
        _frames(_packed({"op": "credit", "n": -1}))


def _packed(obj: dict) -> bytes:
    """A frame packed by hand, for maps the message classes refuse to build."""
    body = msgpack.packb(obj)
    return len(body).to_bytes(4, "big") + body


def test_a_batch_frame_is_the_batch_message():
    (frame, n), *_ = fw.batches([1, "a", b"b"])
    assert n == 3 and _frames(frame) == [fm.Batch(records=[1, "a", b"b"])]
    assert frame == fw.frame(fm.Batch(records=[1, "a", b"b"]))


# -- the node's queue ---------------------------------------------------------------------


def test_training_batches_run_across_partitions_and_grant_credit_per_batch():
    q = FeedQueue()
    q.open(1)
    q.open(2)
    q.put(1, [1, 2, 3])
    q.end(1)
    q.put(2, [4, 5])
    t = q.take(4, partition_bound=False)
    assert t.records == [1, 2, 3, 4]
    assert t.segments == [(1, 3), (2, 1)]
    assert t.credits == {1: 1} and t.finished == [1] and not t.eof
    t = q.take(4, partition_bound=False)
    assert t.records == [5] and t.credits == {2: 1} and t.finished == []


def test_inference_batches_stop_at_a_partition_end():
    q = FeedQueue()
    q.open(1)
    q.open(2)
    q.put(1, [1, 2])
    q.put(1, [3])
    q.end(1)
    q.put(2, [4, 5])
    q.end(2)
    t = q.take(10, partition_bound=True)
    assert t.records == [1, 2, 3] and t.finished == [1] and t.credits == {1: 2}
    t = q.take(10, partition_bound=True)
    assert t.records == [4, 5] and t.finished == [2]


def test_an_empty_partition_is_skipped_not_returned_as_an_empty_batch():
    q = FeedQueue()
    q.open(1)
    q.end(1)
    q.open(2)
    q.put(2, [7])
    q.end(2)
    t = q.take(5, partition_bound=True)
    assert t.records == [7] and t.finished == [1, 2]


def test_inference_consumes_partitions_in_the_order_they_opened():
    q = FeedQueue()
    q.open(1)
    q.open(2)
    q.put(2, ["later"])
    q.end(2)
    assert q.take(5, partition_bound=True).records == []  # partition 1 is the head and has nothing yet
    q.put(1, ["first"])
    q.end(1)
    assert q.take(5, partition_bound=True).records == ["first"]
    assert q.take(5, partition_bound=True).records == ["later"]


def test_training_does_not_wait_for_a_silent_partition():
    q = FeedQueue()
    q.open(1)
    q.open(2)
    q.put(1, ["a"])
    q.put(2, ["b", "c"])
    q.end(2)
    t = q.take(5, partition_bound=False)
    assert t.records == ["a", "b", "c"] and t.finished == [2] and t.credits == {1: 1, 2: 1}
    assert q.partitions == [1]  # still open, its feeder may send more
    q.put(1, ["d"])
    q.end(1)
    t = q.take(5, partition_bound=False)
    assert t.records == ["d"] and t.finished == [1]


def test_a_partial_take_keeps_the_rest_of_the_batch_and_its_credit():
    q = FeedQueue()
    q.open(1)
    q.put(1, list(range(10)))
    t = q.take(4, partition_bound=False)
    assert t.records == [0, 1, 2, 3] and t.credits == {}
    assert q.buffered == 6
    t = q.take(100, partition_bound=False)
    assert t.records == [4, 5, 6, 7, 8, 9] and t.credits == {1: 1}


def test_eof_only_once_every_partition_is_done():
    q = FeedQueue()
    q.open(1)
    q.put(1, [1])
    q.set_eof()
    t = q.take(5, partition_bound=False)
    assert t.records == [1] and not t.eof
    q.end(1)
    assert q.take(5, partition_bound=False).eof


def test_a_dropped_partition_discards_what_was_not_taken():
    q = FeedQueue()
    q.open(1)
    q.put(1, [1, 2, 3])
    q.take(1, partition_bound=False)
    assert q.drop(1) == 2
    assert 1 not in q and q.buffered == 0
    assert q.drop(1) == 0


def test_queue_misuse_is_an_error():
    q = FeedQueue()
    q.open(1)
    with pytest.raises(ValueError, match="already open"):
        q.open(1)
    q.end(1)
    with pytest.raises(ValueError, match="after its end"):
        q.put(1, [1])
    with pytest.raises(KeyError):
        q.put(9, [1])


def test_memory_is_bounded_by_the_credit_window():
    """A feeder that only sends with credit never has more than the window queued."""
    q = FeedQueue()
    q.open(1)
    feeder = fw.FeederState(node="worker:0", qname="input", train=True, credit=fw.WINDOW_BATCHES)
    most = 0
    for step in range(100):
        while feeder.can_send:
            q.put(1, [step] * 10)
            feeder.sent(10)
        most = max(most, q.buffered)
        t = q.take(7, partition_bound=False)  # a slow consumer: less than a batch per step
        for _, n in t.credits.items():
            feeder.handle(fm.Credit(n=n))
    assert most <= fw.WINDOW_BATCHES * 10


# -- the feeder's state ---------------------------------------------------------------------


def test_feeder_needs_credit_to_send():
    s = fw.FeederState(node="worker:0", qname="input", train=True)
    assert not s.can_send
    s.handle(fm.Credit(n=2))
    s.sent(5)
    s.sent(5)
    assert not s.can_send and s.records_sent == 10
    with pytest.raises(fw.FeedError, match="without credit"):
        s.sent(1)


def test_training_feeder_finishes_when_the_node_says_done():
    s = fw.FeederState(node="worker:0", qname="input", train=True, credit=1)
    s.sent(3)
    s.ended = True
    assert not s.finished
    s.handle(fm.Keepalive())
    s.handle(fm.Done())
    assert s.finished


def test_inference_feeder_finishes_with_one_result_per_record():
    s = fw.FeederState(node="worker:0", qname="input", train=False, credit=2)
    s.sent(2)
    s.sent(1)
    s.ended = True
    assert s.handle(fm.Results(results=[1, 4])) == [1, 4]
    assert not s.finished
    s.handle(fm.Done())
    assert not s.finished  # done alone is not enough: the results are what the task returns
    s.handle(fm.Results(results=[9]))
    assert s.finished and s.results == [1, 4, 9]
    with pytest.raises(fw.FeedError, match="returned 4 results for 3 records"):
        s.handle(fm.Results(results=[0]))


def test_node_errors_raise_typed_errors_naming_node_and_queue():
    s = fw.FeederState(node="worker:1 (executor 1)", qname="input", train=True)
    with pytest.raises(fw.FeedTimeout, match="took no records"):
        s.handle(
            m.Error(
                id=None, code=ErrorCode.FEED_TIMEOUT, message="worker:1 took no records from queue 'input'"
            )
        )
    with pytest.raises(fw.FeedError, match=r"worker:1 \(executor 1\) \(queue 'input'\): boom"):
        s.handle(m.Error(id=None, code=ErrorCode.NODE_FAILED, message="boom"))
    with pytest.raises(RemoteProtocolError, match="unexpected"):
        s.handle(fm.Batch(records=[]))


def test_a_stop_finishes_the_feeder_at_once():
    s = fw.FeederState(node="worker:0", qname="input", train=True, credit=3)
    s.handle(fm.Stop(reason="job stopping"))
    assert s.finished and not s.can_send and s.stopped == "job stopping"
