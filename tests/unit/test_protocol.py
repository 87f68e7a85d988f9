"""The client side's pure layers: sans-io framing, message validation, job specs and auth.

No sockets: bytes go straight from one :class:`Connection`'s ``send`` into another's
``receive_data`` (h11's tests/helpers.py style). Every protocol error must be a typed
:class:`ProtocolError` whose message names the offending field, and a connection that
saw one stays broken.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import struct
import zlib
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfcoord.client import auth
from tfcoord.client import messages as m
from tfcoord.client.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from tfcoord.client.messages import JobSpec, make_roles
from tfcoord.client.protocol import (
    CLOSED,
    DEFAULT_MAX_FRAME_BYTES,
    NEED_DATA,
    ClusterReplyFrames,
    Connection,
    decode_spec,
    encode_frame,
    encode_spec,
)
from tfcoord.client.vocab import FailureReason, NodeState

#: Deterministic property runs: same examples every time, no example database on disk.
FUZZ = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NONCE = bytes(range(32))
SPEC = JobSpec(
    roles=(("ps", 1), ("chief", 1), ("evaluator", 1), ("worker", 2)),
    reservation_timeout_s=60.0,
    tolerate_failure=("evaluator",),
    name="demo",
    engine="spark",
    labels={"app": "app-20240101", "cores": 4, "mem_gb": 1.5},
)

REGISTER = m.Register(
    id=7,
    job="job-1",
    executor_id=3,
    attempt=1,
    host="10.0.0.3",
    port=2222,
    gpus=("GPU-a1b2", "GPU-c3d4"),
    task_id="4.3.1",
    meta={"pid": 4242, "tb": "http://h:6006", "x": 0.5},
)

HELLO = m.Hello(version=1, role="node", job="job-1", proof=b"p" * 32, cnonce=b"c" * 32)
SUBMIT = m.Submit(id=1, job="job-1", spec=SPEC)
AWAIT_JOB = m.AwaitJob(id=2, job="job-1", timeout_s=1.5)
STOP = m.StopJob(id=4, job="job-1", reason="streaming ended", dry_run=True)
REPORT = m.Report(
    id=9,
    job="job-1",
    executor_id=2,
    attempt=0,
    state="failed",
    error="Traceback (most recent call last):\n  ...\nValueError: boom",
    meta={"rc": 1},
)
HEARTBEAT = m.Heartbeat(id=10, job="job-1", executor_id=1, attempt=2)
REPLY = m.Reply(id=12, result={"state": "RUNNING", "nodes": [{"host": "h", "gpus": []}], "error": None})
CLUSTER_REPLY = m.ClusterReply(
    id=m.MAX_REQUEST_ID, role="worker", index=1, spec=encode_spec({"worker": ["h0:1", "h1:2"]})
)
ERROR = m.Error(id=14, code="stale_attempt", message="attempt 0 was superseded")

#: One instance (or more) of every message type, with non-default values wherever possible.
SAMPLES: list[m.Message] = [
    m.Challenge(version=m.PROTOCOL_VERSION, nonce=NONCE),
    HELLO,
    m.Hello(version=1, role="driver", job=None, proof=b"p" * 32, cnonce=b"c" * 32),
    m.Welcome(proof=b"w" * 32),
    SUBMIT,
    AWAIT_JOB,
    m.WatchJob(id=3, job="job-1", version=12, timeout_s=0),
    STOP,
    m.Finish(id=4, job="job-1", serving_grace_s=60.0),
    m.Status(id=5),
    m.Status(id=6, job="job_2.x"),
    REGISTER,
    m.AwaitCluster(id=8, job="job-1", executor_id=0, attempt=0, timeout_s=30.0),
    REPORT,
    HEARTBEAT,
    m.Progress(id=12, job="job-1", executor_id=1, attempt=2, figures={"step": 40, "loss": 0.125}),
    m.NodeLogs(id=13, job="job-1", executor_id=1, attempt=2, stream="stderr", lines=("a", "b\tc"), dropped=3),
    m.GetLogs(id=14, job="job-1", executor_id=1, since=10, limit=100),
    m.AwaitStop(id=11, job="job-1", executor_id=1, attempt=2, timeout_s=3600),
    REPLY,
    CLUSTER_REPLY,
    ERROR,
    m.Error(id=None, code="auth", message="bad proof"),
]


# -- helpers ------------------------------------------------------------------------------


def raw_frame(body: bytes) -> bytes:
    """A frame around arbitrary bytes (no validation, unlike ``encode_frame``)."""
    return struct.pack(">I", len(body)) + body


def drain(conn: Connection) -> tuple[list[m.Message], object]:
    """Every complete message, then the sentinel (NEED_DATA or CLOSED) that ended the drain."""
    out: list[m.Message] = []
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA or ev is CLOSED:
            return out, ev
        out.append(ev)  # type: ignore[arg-type]


def receive(payload: Any) -> m.Message:
    """Feed one frame holding ``payload`` (a msgpack-able value) and return the decoded message."""
    conn = Connection()
    conn.receive_data(raw_frame(msgpack.packb(payload, use_bin_type=True)))
    return conn.next_event()  # type: ignore[return-value]


def wire(msg: m.Message, **changes: Any) -> dict[str, Any]:
    """``msg`` as the map a peer would send, with some keys replaced."""
    return {**msg.to_wire(), **changes}


def stream(msgs: list[m.Message]) -> bytes:
    sender = Connection()
    return b"".join(sender.send(x) for x in msgs)


# -- framing ------------------------------------------------------------------------------


def test_samples_cover_every_op() -> None:
    assert {type(x).op for x in SAMPLES} == set(m.OPS)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda x: type(x).op)
def test_every_message_round_trips(msg: m.Message) -> None:
    receiver = Connection()
    receiver.receive_data(Connection().send(msg))
    assert receiver.next_event() == msg
    assert receiver.next_event() is NEED_DATA
    assert receiver.buffered == 0


def test_stream_split_at_every_byte_boundary_yields_the_same_messages() -> None:
    msgs = [x for x in SAMPLES if not isinstance(x, (m.Submit, m.Report, m.Reply))]  # keep it short
    data = stream(msgs)
    for cut in range(len(data) + 1):
        conn = Connection()
        head, tail = data[:cut], data[cut:]
        if head:  # receive_data(b"") would mean EOF
            conn.receive_data(head)
        first, sentinel = drain(conn)
        assert sentinel is NEED_DATA
        if tail:
            conn.receive_data(tail)
        conn.receive_data(b"")
        rest, sentinel = drain(conn)
        assert first + rest == msgs, cut
        assert sentinel is CLOSED


def test_stream_fed_one_byte_at_a_time() -> None:
    data = stream(SAMPLES[:6])
    conn = Connection()
    got: list[m.Message] = []
    for i in range(len(data)):
        conn.receive_data(data[i : i + 1])
        msgs, sentinel = drain(conn)
        assert sentinel is NEED_DATA
        got += msgs
    assert got == SAMPLES[:6]


@FUZZ
@given(cuts=st.lists(st.integers(min_value=0, max_value=4096), max_size=12))
def test_property_arbitrary_splits_of_a_multi_frame_stream(cuts: list[int]) -> None:
    data = stream(SAMPLES)
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    conn = Connection()
    got: list[m.Message] = []
    for a, b in itertools.pairwise(bounds):
        conn.receive_data(data[a:b])
        got += drain(conn)[0]
    conn.receive_data(b"")
    rest, sentinel = drain(conn)
    assert got + rest == SAMPLES
    assert sentinel is CLOSED


def test_partial_frame_needs_data() -> None:
    frame = Connection().send(REGISTER)
    conn = Connection()
    for part in (frame[:2], frame[2:4], frame[4:-1]):
        conn.receive_data(part)
        assert conn.next_event() is NEED_DATA
    conn.receive_data(frame[-1:])
    assert conn.next_event() == REGISTER


def test_clean_eof_between_frames_is_closed_and_stays_closed() -> None:
    conn = Connection()
    conn.receive_data(Connection().send(REGISTER))
    conn.receive_data(b"")
    assert conn.next_event() == REGISTER
    assert conn.next_event() is CLOSED
    assert conn.next_event() is CLOSED
    conn.receive_data(b"")  # a second EOF is harmless
    assert conn.next_event() is CLOSED


def test_data_after_eof_is_refused() -> None:
    conn = Connection()
    conn.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="after the peer closed"):
        conn.receive_data(b"\x00")


@pytest.mark.parametrize(
    ("keep", "match"),
    [
        (2, r"inside a frame header \(2 of 4 bytes\)"),
        (4, r"inside a frame \(0 of"),
        (10, r"inside a frame \(6 of"),
    ],
)
def test_truncated_frame_at_eof_is_a_remote_error(keep: int, match: str) -> None:
    conn = Connection()
    conn.receive_data(Connection().send(REGISTER)[:keep])
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match=match):
        conn.next_event()


def test_oversized_header_is_refused_before_the_body_arrives() -> None:
    conn = Connection(max_frame_bytes=1024)
    conn.receive_data(struct.pack(">I", 1025))  # the header only: not one byte of body
    with pytest.raises(RemoteProtocolError, match="frame of 1025 bytes exceeds the 1024-byte limit"):
        conn.next_event()


def test_default_limit_refuses_a_4_gib_announcement() -> None:
    conn = Connection()
    conn.receive_data(b"\xff\xff\xff\xff")
    with pytest.raises(RemoteProtocolError, match=f"exceeds the {DEFAULT_MAX_FRAME_BYTES}-byte limit"):
        conn.next_event()


def test_frame_of_exactly_the_limit_is_accepted() -> None:
    frame = Connection().send(REGISTER)
    body_len = len(frame) - 4
    exact = Connection(max_frame_bytes=body_len)
    exact.receive_data(frame)
    assert exact.next_event() == REGISTER
    short = Connection(max_frame_bytes=body_len - 1)
    short.receive_data(frame)
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        short.next_event()


def test_sending_an_oversized_message_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError, match="exceeds the 64-byte limit"):
        Connection(max_frame_bytes=64).send(m.Submit(id=1, job="j", spec=SPEC))
    with pytest.raises(LocalProtocolError, match="exceeds"):
        encode_frame({"blob": b"x" * 100}, max_frame_bytes=50)


def test_connection_stays_broken_after_an_error() -> None:
    conn = Connection()
    conn.receive_data(raw_frame(b"\xc1") + Connection().send(REGISTER))
    with pytest.raises(RemoteProtocolError, match="undecodable"):
        conn.next_event()
    # The valid frame behind the bad one is never handed out, and more bytes don't help.
    for _ in range(2):
        with pytest.raises(RemoteProtocolError, match="already failed"):
            conn.next_event()
        conn.receive_data(Connection().send(REGISTER))


def test_invalid_message_also_breaks_the_connection() -> None:
    conn = Connection()
    conn.receive_data(encode_frame({"op": "nope"}) + Connection().send(REGISTER))
    with pytest.raises(RemoteProtocolError, match="unknown op"):
        conn.next_event()
    with pytest.raises(RemoteProtocolError, match="already failed"):
        conn.next_event()


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"", "undecodable frame"),  # a zero-length frame
        (b"\xc1", "undecodable frame"),  # 0xc1 is never valid msgpack
        (b"\x81\xa2op", "undecodable frame"),  # a map cut short inside the frame
        (msgpack.packb({"op": "status", "id": 1}) + b"\x01", "undecodable frame"),  # trailing bytes
        (msgpack.packb({1.5: "x"}), "undecodable frame"),  # float keys are refused
        (msgpack.packb(msgpack.ExtType(1, b"py")), "undecodable frame"),  # no extension types
        (msgpack.packb([1, 2]), "must hold a map, not list"),
        (msgpack.packb("status"), "must hold a map, not str"),
        (msgpack.packb(None), "must hold a map, not NoneType"),
    ],
)
def test_garbage_and_non_map_frames_are_remote_errors(body: bytes, match: str) -> None:
    conn = Connection()
    conn.receive_data(raw_frame(body))
    with pytest.raises(RemoteProtocolError, match=match):
        conn.next_event()


@FUZZ
@given(data=st.binary(min_size=1, max_size=300), eof=st.booleans())
def test_property_garbage_only_ever_raises_protocol_errors(data: bytes, eof: bool) -> None:
    conn = Connection(max_frame_bytes=256)
    conn.receive_data(data)
    if eof:
        conn.receive_data(b"")
    try:
        _, sentinel = drain(conn)
    except ProtocolError:
        return
    assert sentinel is (CLOSED if eof else NEED_DATA)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=40)
)
_values = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=8,
)


@FUZZ
@given(
    op=st.sampled_from([*m.OPS, "", "bogus"]),
    fields=st.dictionaries(
        st.sampled_from(sorted({f for cls in m.OPS.values() for f in m._FIELDS[cls]} | {"extra"})), _values
    ),
)
def test_property_any_decodable_map_is_a_message_or_a_remote_error(op: str, fields: dict[str, Any]) -> None:
    try:
        msg = receive({"op": op, **fields})
    except RemoteProtocolError:
        return
    assert isinstance(msg, m.Message)
    assert msg.op == op


@FUZZ
@given(
    msg=st.sampled_from(SAMPLES),
    key=st.sampled_from(["id", "job", "executor_id", "spec", "role", "proof"]),
    value=_values,
)
def test_property_corrupting_one_field_of_a_valid_message(msg: m.Message, key: str, value: Any) -> None:
    try:
        got = receive(wire(msg, **{key: value}))
    except RemoteProtocolError:
        return
    assert type(got) is type(msg)


# -- cluster spec blobs -------------------------------------------------------------------

CLUSTER = {"ps": ["10.0.0.1:2222"], "worker": [f"10.0.0.{i}:{2223 + i}" for i in range(50)]}


def test_cluster_spec_blob_round_trips_and_is_compressed() -> None:
    blob = encode_spec(CLUSTER)
    assert decode_spec(blob) == CLUSTER
    assert list(decode_spec(blob)) == ["ps", "worker"]
    assert len(blob) < len(msgpack.packb(CLUSTER))


@pytest.mark.parametrize(
    ("req_id", "role", "index"), [(0, "ps", 0), (127, "worker", 128), (m.MAX_REQUEST_ID, "worker", 65535)]
)
def test_cluster_reply_frames_are_the_frames_send_makes(req_id: int, role: str, index: int) -> None:
    blob = encode_spec(CLUSTER)
    msg = m.ClusterReply(id=req_id, role=role, index=index, spec=blob)
    head, tail = ClusterReplyFrames().frame(msg)
    assert head + tail == Connection().send(msg)
    conn = Connection()
    conn.receive_data(head + tail)
    assert conn.next_event() == msg


def test_cluster_reply_frames_pack_each_spec_once() -> None:
    frames = ClusterReplyFrames(keep=2)
    a, b, c = (encode_spec({"worker": [f"h:{i}"] * n}) for i, n in enumerate((3, 4, 5)))
    tail = frames.frame(m.ClusterReply(id=1, role="worker", index=0, spec=a))[1]
    # The same spec again: the very same tail, not packed anew.
    assert frames.frame(m.ClusterReply(id=2, role="worker", index=1, spec=a))[1] is tail
    frames.frame(m.ClusterReply(id=3, role="worker", index=0, spec=b))
    frames.frame(m.ClusterReply(id=4, role="worker", index=0, spec=c))  # a is dropped: at most 2 kept
    again = frames.frame(m.ClusterReply(id=5, role="worker", index=0, spec=a))[1]
    assert again == tail and again is not tail


def test_cluster_reply_frames_refuse_a_spec_over_the_frame_limit() -> None:
    msg = m.ClusterReply(id=1, role="worker", index=0, spec=encode_spec(CLUSTER))
    with pytest.raises(LocalProtocolError, match="exceeds the 64-byte limit"):
        ClusterReplyFrames(max_frame_bytes=64).frame(msg)


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"not zlib at all", "cluster spec is not valid zlib data"),
        (encode_spec(CLUSTER)[:-4], "inflates past .*, is truncated"),
        (zlib.compress(b"\xc1"), "undecodable msgpack"),
        (zlib.compress(msgpack.packb(["10.0.0.1:1"])), "must map role names to lists of addresses"),
        (zlib.compress(msgpack.packb({"worker": "10.0.0.1:1"})), "must map role names to lists of addresses"),
        (zlib.compress(msgpack.packb({"worker": [1]})), "must map role names to lists of addresses"),
    ],
)
def test_bad_cluster_spec_blobs_are_remote_errors(blob: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        decode_spec(blob)


def test_a_cluster_spec_that_inflates_past_the_limit_is_refused() -> None:
    bomb = zlib.compress(b"\x00" * 1_000_000, 9)  # about 1 KiB that inflates to 1 MB
    assert len(bomb) < 2_000
    with pytest.raises(RemoteProtocolError, match="inflates past 65536 bytes"):
        decode_spec(bomb, max_bytes=65536)


@FUZZ
@given(blob=st.binary(max_size=200) | st.builds(zlib.compress, st.binary(max_size=200)))
def test_property_cluster_spec_garbage_only_raises_protocol_errors(blob: bytes) -> None:
    try:
        spec = decode_spec(blob, max_bytes=4096)
    except RemoteProtocolError:
        return
    assert isinstance(spec, dict)


# -- message validation -------------------------------------------------------------------

#: (message, field, bad value, what the error must say)
BAD_FIELDS: list[tuple[m.Message, str, Any, str]] = [
    (REGISTER, "executor_id", "3", "register.executor_id must be an integer, not str"),
    (REGISTER, "executor_id", True, "register.executor_id must be an integer, not bool"),
    (REGISTER, "executor_id", 3.0, "register.executor_id must be an integer, not float"),
    (REGISTER, "executor_id", -1, "register.executor_id is -1"),
    (REGISTER, "executor_id", m.MAX_NODES_PER_JOB, "register.executor_id is 100000"),
    (REGISTER, "id", -1, "register.id is -1"),
    (REGISTER, "id", 2**32, "register.id is 4294967296"),
    (REGISTER, "attempt", -2, "register.attempt is -2"),
    (REGISTER, "port", 65536, "register.port is 65536"),
    (REGISTER, "host", "", "register.host must not be empty"),
    (REGISTER, "host", "h" * 256, "register.host is 256 characters long; the limit is 255"),
    (REGISTER, "job", "job 1", "register.job 'job 1' must be letters"),
    (REGISTER, "job", "a/b", "register.job 'a/b' must be letters"),
    (REGISTER, "job", "../etc", "register.job '../etc' must be letters"),
    (REGISTER, "job", "-x", "register.job '-x' must be letters"),
    (REGISTER, "job", "job\n", "register.job 'job\\n' must be letters"),
    (REGISTER, "job", "", "register.job must not be empty"),
    (REGISTER, "job", "j" * 129, "register.job is 129 characters long"),
    (REGISTER, "job", None, "register.job must be a string, not NoneType"),
    (REGISTER, "gpus", "GPU-0", "register.gpus must be a list"),
    (REGISTER, "gpus", ["GPU-0", 1], "register.gpus must be a string, not int"),
    (REGISTER, "gpus", ["g"] * 65, "register.gpus must be a list of at most 64"),
    (REGISTER, "task_id", "t" * 1025, "register.task_id is 1025 characters long"),
    (REGISTER, "meta", {"k": [1]}, "register.meta entry 'k' must be a string or a number"),
    (REGISTER, "meta", {"k": True}, "register.meta entry 'k' must be a string or a number"),
    (REGISTER, "meta", [1], "register.meta must be a map"),
    (REGISTER, "meta", {f"k{i}": i for i in range(33)}, "register.meta must be a map of at most 32"),
    (AWAIT_JOB, "timeout_s", math.nan, "await_job.timeout_s is nan"),
    (AWAIT_JOB, "timeout_s", math.inf, "await_job.timeout_s is inf"),
    (AWAIT_JOB, "timeout_s", -1.0, "await_job.timeout_s is -1.0"),
    (AWAIT_JOB, "timeout_s", m.MAX_TIMEOUT_S + 1, "await_job.timeout_s is 604801"),
    (AWAIT_JOB, "timeout_s", "5", "await_job.timeout_s must be a number of seconds, not str"),
    (AWAIT_JOB, "timeout_s", False, "await_job.timeout_s must be a number of seconds, not bool"),
    (REPORT, "state", "exploded", "report.state is 'exploded'; expected one of RUNNING"),
    (REPORT, "error", "e" * (m.MAX_ERROR_LEN + 1), "report.error is 65537 characters long"),
    (STOP, "dry_run", 1, "stop_job.dry_run must be true or false, not int"),
    (STOP, "reason", b"bytes", "stop_job.reason must be a string, not bytes"),
    (HELLO, "role", "root", "hello.role is 'root'; expected one of node, driver, admin"),
    (HELLO, "proof", b"short", "hello.proof must be 32 bytes"),
    (HELLO, "proof", "p" * 32, "hello.proof must be 32 bytes"),
    (HELLO, "version", 2**16 + 1, "hello.version is 65537"),
    (ERROR, "code", "", "error.code must not be empty"),
    (CLUSTER_REPLY, "role", "no-such", "cluster.role 'no-such' is not a TensorFlow job name"),
    (CLUSTER_REPLY, "spec", "not bytes", "cluster.spec must be bytes"),
    (REPLY, "result", [1], "reply.result must be a map, not list"),
    (SUBMIT, "spec", {"roles": [["9lives", 1]]}, "role '9lives' is not a TensorFlow job name"),
    (
        SUBMIT,
        "spec",
        {"roles": [["worker", "2"]]},
        "invalid job spec: the count of role 'worker' must be an integer, not str",
    ),
    (SUBMIT, "spec", {"roles": "worker"}, "roles must be a list"),
    (SUBMIT, "spec", {"roles": [["worker", 1]], "heartbeat_timeout_s": math.nan}, "is nan"),
    (SUBMIT, "spec", {"roles": [["worker", 1]], "owner": "x"}, "unexpected keys ['owner']"),
    (SUBMIT, "spec", {"name": "x"}, "missing 1 required positional argument: 'roles'"),
    (SUBMIT, "spec", ["worker", 1], "invalid job spec: must be a map"),
]


@pytest.mark.parametrize(
    ("msg", "key", "value", "match"),
    BAD_FIELDS,
    ids=[f"{msg.op}.{key}-{i}" for i, (msg, key, _, _) in enumerate(BAD_FIELDS)],
)
def test_bad_field_is_a_remote_error_naming_the_field(
    msg: m.Message, key: str, value: Any, match: str
) -> None:
    conn = Connection()
    conn.receive_data(encode_frame(wire(msg, **{key: value})))
    with pytest.raises(RemoteProtocolError, match=re.escape(match)):
        conn.next_event()


def test_unknown_or_missing_op() -> None:
    with pytest.raises(RemoteProtocolError, match="unknown op 'launch'"):
        receive({"op": "launch", "id": 1})
    with pytest.raises(RemoteProtocolError, match="unknown op None"):
        receive({"id": 1})
    with pytest.raises(RemoteProtocolError, match="unknown op 7"):
        receive({"op": 7})


def test_missing_fields_are_named() -> None:
    partial = {k: v for k, v in REGISTER.to_wire().items() if k not in ("host", "port")}
    with pytest.raises(RemoteProtocolError, match="register is missing host, port"):
        receive(partial)


def test_fields_with_defaults_may_be_omitted() -> None:
    got = receive(
        {"op": "register", "id": 1, "job": "j", "executor_id": 0, "attempt": 0, "host": "h", "port": 1}
    )
    assert got == m.Register(id=1, job="j", executor_id=0, attempt=0, host="h", port=1)
    assert got.gpus == () and got.meta == {}  # type: ignore[attr-defined]


def test_unexpected_fields_are_named() -> None:
    with pytest.raises(RemoteProtocolError, match="register has no field 'admin'"):
        receive(wire(REGISTER, admin=True))
    with pytest.raises(RemoteProtocolError, match=r"register has no field b'host'"):
        receive({**wire(REGISTER), b"host": "h"})
    with pytest.raises(RemoteProtocolError, match="heartbeat has no field 'op2'"):
        receive(wire(HEARTBEAT, op2="x"))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: m.Register(id=1, job="a b", executor_id=0, attempt=0, host="h", port=1), "register.job"),
        (
            lambda: m.Register(id=1, job="j", executor_id=-1, attempt=0, host="h", port=1),
            "register.executor_id",
        ),
        (
            lambda: m.Register(id=1, job="j", executor_id=0, attempt=0, host="h", port=1, gpus=["g"]),
            "register.gpus",
        ),
        (lambda: m.Register(id=1, job="j", executor_id=0, attempt=0, host="h", port=0), "register.port"),
        (
            lambda: m.Register(id=1, job="j", executor_id=0, attempt=0, host="h\nworker:9", port=1),
            "register.host 'h\\nworker:9' is not a host name or address",
        ),
        (lambda: m.Register(id=1, job="j", executor_id=0, attempt=0, host="a b", port=1), "register.host"),
        (lambda: m.AwaitJob(id=1, job="j", timeout_s=math.inf), "await_job.timeout_s"),
        (lambda: m.Report(id=1, job="j", executor_id=0, attempt=0, state="done"), "report.state"),
        (lambda: m.Challenge(version=1, nonce=b"short"), "challenge.nonce"),
        (lambda: m.Submit(id=1, job="j", spec=SPEC.to_wire()), "submit.spec must be a job spec"),
        (lambda: m.Error(id=-5, code="x", message=""), "error.id"),
    ],
)
def test_building_an_invalid_message_locally_is_a_local_error(build: Any, match: str) -> None:
    with pytest.raises(LocalProtocolError, match=re.escape(match)):
        build()


def test_huge_integer_timeout_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError, match=re.escape("await_job.timeout_s")):
        m.AwaitJob(id=1, job="j", timeout_s=10**400)


# -- job specs ----------------------------------------------------------------------------


def test_slots_follow_tensorflowonspark_order() -> None:
    spec = JobSpec(roles=make_roles(3, 2, chief="master", evaluator=True))
    assert spec.slots() == [
        ("ps", 0),
        ("ps", 1),
        ("master", 0),
        ("evaluator", 0),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]
    assert spec.size == 7


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"roles": ()}, "roles must name at least one role"),
        ({"roles": [("worker", 1)]}, "roles must name at least one role"),
        (
            {"roles": (("job/x", 1),)},
            "'job/x' is not a TensorFlow job name (a letter, then letters, digits or '_',",
        ),
        (
            {"roles": (("reader", 1), ("worker", 1))},
            "roles must be listed in the order ps, chief, master, evaluator, worker, then custom",
        ),
        ({"roles": (("worker", 1), ("worker", 2))}, "role 'worker' is listed twice"),
        ({"roles": (("chief", 2),)}, "at most one chief, not 2"),
        ({"roles": (("evaluator", 2), ("worker", 1))}, "at most one evaluator"),
        ({"roles": (("chief", 1), ("master", 1))}, "use either chief or master, not both"),
        ({"roles": (("ps", 0), ("worker", 0))}, "the cluster has no tasks"),
        ({"roles": (("worker", 2), ("ps", 1))}, "roles must be listed in the order ps, chief"),
        ({"roles": (("evaluator", 1), ("chief", 1))}, "roles must be listed in the order"),
        ({"roles": (("worker", -1),)}, "is -1; it must be between 0 and 100000"),
        ({"roles": (("worker", True),)}, "must be an integer, not bool"),
        ({"roles": (("worker",),)}, "each role must be a [name, count] pair"),
        ({"roles": (("ps", 60_000), ("worker", 60_000))}, "120000 tasks is over the limit"),
        ({"roles": (("worker", 1),), "reservation_timeout_s": 0}, "is 0; it must be between 0.001"),
        ({"roles": (("worker", 1),), "heartbeat_timeout_s": math.inf}, "is inf"),
        ({"roles": (("worker", 1),), "reconnect_grace_s": -1}, "is -1"),
        (
            {"roles": (("worker", 1),), "tolerate_failure": ("boss",)},
            "tolerate_failure names unknown role 'boss'",
        ),
        ({"roles": (("worker", 1),), "engine": "e" * 33}, "is 33 characters long"),
        ({"roles": (("worker", 1),), "labels": {"k": [1]}}, "entry 'k' must be a string or a number"),
    ],
)
def test_invalid_job_specs_are_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(LocalProtocolError, match=r"^invalid job spec: .*" + re.escape(match)):
        JobSpec(**kw)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"roles": (("worker", 1),), "reservation_timeout_s": -5}, "reservation_timeout_s"),
        ({"roles": (("worker", 1),), "heartbeat_timeout_s": math.nan}, "heartbeat_timeout_s"),
        ({"roles": (("worker", 1),), "reconnect_grace_s": "3"}, "reconnect_grace_s"),
        ({"roles": (("worker", 1),), "engine": "e" * 33}, "engine"),
        ({"roles": (("worker", 1),), "name": 5}, "name"),
        ({"roles": (("worker", 1),), "labels": {"k": [1]}}, "labels"),
        ({"roles": (("worker", "2"),)}, "worker"),
    ],
)
def test_job_spec_errors_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(LocalProtocolError, match=re.escape(field)):
        JobSpec(**kw)


def test_job_spec_wire_round_trip() -> None:
    wired = msgpack.unpackb(msgpack.packb(SPEC.to_wire()))
    assert JobSpec.from_wire(wired) == SPEC
    assert JobSpec.from_wire({"roles": [["worker", 2]]}) == JobSpec(roles=(("worker", 2),))


@pytest.mark.parametrize(
    ("wired", "match"),
    [
        ([["worker", 1]], "must be a map"),
        ({"roles": [["worker", 1]], "secret": "x"}, r"unexpected keys \['secret'\]"),
        ({"roles": "worker"}, "roles must be a list of"),
        ({"roles": [["worker", 1]], "tolerate_failure": "evaluator"}, "tolerate_failure must be a list"),
        ({"roles": [{"worker": 1}]}, r"each role must be a \[name, count\] pair"),
    ],
)
def test_job_spec_from_bad_wire(wired: Any, match: str) -> None:
    with pytest.raises(LocalProtocolError, match=match):
        JobSpec.from_wire(wired)


@pytest.mark.parametrize(
    ("args", "kw", "roles"),
    [
        ((2,), {}, (("worker", 2),)),
        ((2, 1), {}, (("ps", 1), ("worker", 2))),
        (
            (3, 2),
            {"chief": "chief", "evaluator": True},
            (("ps", 2), ("chief", 1), ("evaluator", 1), ("worker", 3)),
        ),
        ((0,), {"chief": "master"}, (("master", 1),)),
        ((0,), {}, ()),
    ],
)
def test_make_roles(args: tuple[int, ...], kw: dict[str, Any], roles: tuple[tuple[str, int], ...]) -> None:
    assert make_roles(*args, **kw) == roles
    if roles:
        assert JobSpec(roles=roles).roles == roles


def test_make_roles_refuses_an_unknown_chief_role() -> None:
    with pytest.raises(ValueError, match="chief role must be 'chief' or 'master', not 'boss'"):
        make_roles(2, chief="boss")


# -- auth ---------------------------------------------------------------------------------

SECRET = b"0123456789abcdef0123456789abcdef"


def test_job_tokens_differ_per_job_and_per_secret() -> None:
    a = auth.job_token(SECRET, "job-a")
    assert a == auth.job_token(SECRET, "job-a")
    assert len(a) == 32
    assert a != auth.job_token(SECRET, "job-b")
    assert a != auth.job_token(b"another secret, also 32 bytes!!!", "job-a")
    assert a != SECRET


def test_client_proof_is_bound_to_key_role_job_and_nonce() -> None:
    token = auth.job_token(SECRET, "job-a")
    proof = auth.client_proof(token, NONCE, "node", "job-a")
    assert auth.verify(auth.client_proof(token, NONCE, "node", "job-a"), proof)
    others = [
        auth.client_proof(token, NONCE, "node", "job-b"),  # another job
        auth.client_proof(auth.job_token(SECRET, "job-b"), NONCE, "node", "job-a"),  # another job's token
        auth.client_proof(token, NONCE, "driver", "job-a"),  # another role
        auth.client_proof(token, bytes(32), "node", "job-a"),  # another nonce (a replay)
        auth.client_proof(SECRET, NONCE, "node", "job-a"),  # the coordinator secret itself
        auth.server_proof(token, NONCE),  # the server's proof over the same nonce
    ]
    assert len({proof, *others}) == len(others) + 1
    assert not any(auth.verify(o, proof) for o in others)


def test_driver_proof_has_no_job_and_differs_from_admin() -> None:
    driver = auth.client_proof(SECRET, NONCE, "driver", None)
    assert driver == auth.client_proof(SECRET, NONCE, "driver", None)
    assert driver != auth.client_proof(SECRET, NONCE, "admin", None)


def test_nonces_and_secrets_are_fresh() -> None:
    assert len(auth.new_nonce()) == auth.NONCE_BYTES
    assert auth.new_nonce() != auth.new_nonce()
    secret = auth.new_secret()
    assert len(secret) >= auth.MIN_SECRET_BYTES and secret != auth.new_secret()
    secret.decode("ascii")  # printable, so it can live in a text file


def test_write_then_read_secret(tmp_path: Any) -> None:
    path = tmp_path / "secret"
    secret = auth.write_secret(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert auth.read_secret(path) == secret


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o620])
def test_read_secret_refuses_files_open_to_group_or_others(tmp_path: Any, mode: int) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    path.chmod(mode)
    with pytest.raises(ValueError, match=rf"mode {mode:o}\); run: chmod 600 {re.escape(str(path))}"):
        auth.read_secret(path)
    assert auth.read_secret(path, check_mode=False) == SECRET


def test_read_secret_strips_whitespace_and_refuses_short_secrets(tmp_path: Any) -> None:
    path = tmp_path / "secret"
    auth.write_secret(path, b"  " + SECRET + b"\n\n")
    assert auth.read_secret(path) == SECRET
    path.unlink()
    auth.write_secret(path, b"x" * (auth.MIN_SECRET_BYTES - 1) + b"   ")
    with pytest.raises(ValueError, match="is 15 bytes; use at least 16"):
        auth.read_secret(path)


# -- key files (issue 16, attack 10) --------------------------------------------------------


def test_a_secret_file_of_another_user_is_refused(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a 0600 secret owned by someone else was accepted, so its owner chose our secret."""
    path = tmp_path / "secret"
    auth.write_secret(path, SECRET)
    owner = os.stat(path).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # as seen by another user (root reads all)
    with pytest.raises(ValueError, match=rf"belongs to uid {owner}, not to this user \(uid {owner + 1}\)"):
        auth.read_secret(path)


def test_creating_a_secret_never_follows_a_symlink(tmp_path: Any) -> None:
    """Before: a dangling symlink at the secret's path made us write the secret at its target."""
    target = tmp_path / "elsewhere" / "planted"
    target.parent.mkdir()
    link = tmp_path / "secret"
    link.symlink_to(target)
    with pytest.raises(FileExistsError):
        auth.write_secret(link)
    assert not target.exists()


def test_the_journal_is_owner_only_inside_an_open_state_dir(tmp_path: Any) -> None:
    """Before: the journal (tracebacks, host names) was created 0644 in an existing 0755 dir."""
    from tfcoord.coordinator.journal import FILENAME, SqliteJournal

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    old = os.umask(0o022)
    try:
        journal = SqliteJournal(state)
        journal.set_meta("probe", "1")
        journal.commit()
        made = sorted(p.name for p in state.iterdir())
        assert FILENAME in made
        for name in made:
            assert os.stat(state / name).st_mode & 0o777 == 0o600, name
        journal.close()
    finally:
        os.umask(old)


def test_report_states_travel_in_one_casing_and_older_lower_case_still_decodes() -> None:
    report = m.Report(id=1, job="j", executor_id=0, attempt=0, state=NodeState.SUCCEEDED)
    assert report.to_wire()["state"] == "SUCCEEDED" and type(report.to_wire()["state"]) is str
    older = {**report.to_wire(), "state": "succeeded"}  # what nodes before the vocabulary sent
    assert m.decode(older) == report and m.decode(older).state is NodeState.SUCCEEDED


def test_a_stop_cause_is_a_failure_reason_and_defaults_to_a_requested_stop() -> None:
    stop = m.StopJob(id=1, job="j", reason="Spark failed", cause=FailureReason.ENGINE_FAILED)
    assert m.decode(stop.to_wire()) == stop
    plain = {k: v for k, v in stop.to_wire().items() if k != "cause"}
    assert m.decode(plain).cause is FailureReason.STOPPED  # type: ignore[attr-defined]
    with pytest.raises(RemoteProtocolError, match=re.escape("stop_job.cause")):
        m.decode({**stop.to_wire(), "cause": "node_lost"})


def test_large_frames_are_read_in_place_and_the_buffer_moves_on() -> None:
    """A frame past the copy threshold (a cluster reply) decodes from a view of the buffer,
    whether it arrives whole or in pieces, and what follows it decodes after it."""
    spec = os.urandom(100_000)
    big = m.ClusterReply(id=7, role="worker", index=3, spec=spec)
    small = m.Reply(id=8, result={"ok": True})
    wire = Connection().send(big) + Connection().send(small)
    for step in (len(wire), 4096, 1):
        conn = Connection()
        got: list[m.Message] = []
        for i in range(0, len(wire), step):
            conn.receive_data(wire[i : i + step])
            while isinstance(ev := conn.next_event(), m.Message):
                got.append(ev)
        assert got == [big, small] and conn.buffered == 0


def test_decode_refuses_an_unhashable_choice_as_a_protocol_error() -> None:
    with pytest.raises(RemoteProtocolError, match="stop_job"):
        m.decode({"op": "stop_job", "id": 1, "job": "j", "reason": "r", "cause": [1]})


@given(st.text(max_size=12))
def test_host_check_refuses_spaces_control_characters_and_delimiters(host: str) -> None:
    ok = bool(host) and not any(c.isspace() or not c.isprintable() or c in "/[]@" for c in host)
    try:
        m.Register(id=1, job="j", executor_id=0, attempt=0, host=host, port=1)
    except LocalProtocolError:
        assert not ok
    else:
        assert ok


# -- the generated validators ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("executor_id", True, "register.executor_id must be an integer, not bool"),
        ("executor_id", 2.0, "register.executor_id must be an integer, not float"),
        ("port", 0, "register.port is 0; it must be between 1 and 65535"),
        ("job", b"job-1", "register.job must be a string, not bytes"),
        ("job", "job 1", "register.job 'job 1' must be letters, digits"),
        ("credential", "A" * m.CREDENTIAL_HEX, "register.credential must be empty or 64 lower-case hex"),
    ],
)
def test_a_refused_field_is_named_whichever_check_refuses_it(field, value, words):
    fields: dict[str, Any] = {"id": 1, "job": "job-1", "executor_id": 0, "attempt": 0, "host": "h", "port": 1}
    good = m.Register(**fields).to_wire()
    m.decode(good)  # 'job-1' is now among the identifiers already found valid
    with pytest.raises(RemoteProtocolError, match="^" + re.escape(words)):
        m.decode({**good, field: value})
    with pytest.raises(LocalProtocolError, match="^" + re.escape(words)):
        m.Register(**{**fields, field: value})


def test_each_message_class_gets_its_own_validator():
    # Request's validator checks only an id; Register's every field of its own too.
    m.Request(id=1)
    with pytest.raises(LocalProtocolError, match=r"^register\.host"):
        m.Register(id=1, job="j", executor_id=0, attempt=0, host="a b", port=1)


def test_the_memo_of_valid_identifiers_stays_bounded():
    for i in range(m.MAX_GOOD_IDS + 100):
        m.decode({"op": "heartbeat", "id": 1, "job": f"job-{i}", "executor_id": 0, "attempt": 0})
    assert 0 < len(m._GOOD_IDS) <= m.MAX_GOOD_IDS
