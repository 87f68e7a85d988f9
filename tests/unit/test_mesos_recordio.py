"""RecordIO framing of the Mesos event stream (coordinator/mesos/recordio.py), sans-io."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfcoord.coordinator.mesos.errors import MesosProtocolError
from tfcoord.coordinator.mesos.recordio import RecordIODecoder, decode_event, encode_record

SUBSCRIBED = {
    "type": "SUBSCRIBED",
    "subscribed": {"framework_id": {"value": "f"}, "heartbeat_interval_seconds": 15},
}
ERROR = {"type": "ERROR", "error": {"message": "zażółć ✓"}}


def test_a_record_is_its_byte_length_a_newline_and_the_json() -> None:
    body = json.dumps(ERROR, separators=(",", ":"), ensure_ascii=False).encode()
    assert encode_record(ERROR) == str(len(body)).encode() + b"\n" + body
    assert len(body) > len(body.decode())  # the length counts bytes, not characters


def test_records_split_anywhere_and_packed_together_come_out_whole() -> None:
    stream = encode_record(SUBSCRIBED) + encode_record({"type": "HEARTBEAT"}) + encode_record(ERROR)
    for size in (1, 2, 3, 7, 64, len(stream)):
        decoder = RecordIODecoder()
        records = []
        for i in range(0, len(stream), size):
            records += decoder.feed(stream[i : i + size])
        assert [decode_event(r) for r in records] == [SUBSCRIBED, {"type": "HEARTBEAT"}, ERROR]
        assert decoder.buffered == 0


@given(
    st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=20), max_size=3), max_size=5),
    st.integers(1, 50),
)
def test_any_events_any_chunking(events: list[dict[str, str]], size: int) -> None:
    events = [{**e, "type": "X"} for e in events]
    stream = b"".join(encode_record(e) for e in events)
    decoder = RecordIODecoder()
    out = []
    for i in range(0, len(stream), size):
        out += decoder.feed(stream[i : i + size])
    assert [decode_event(r) for r in out] == events


def test_an_incomplete_record_waits_for_more() -> None:
    decoder = RecordIODecoder()
    assert decoder.feed(b"10\n01234") == []
    assert decoder.feed(b"56789") == [b"0123456789"]
    assert decoder.feed(b"0\n") == [b""]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"abc\n{}", "bad record length"),
        (b"-1\n", "bad record length"),
        (b"1" * 40, "does not start with a record length"),
        (b"99999999\n", "over the limit"),
        (b"999999999999\n", "does not start with a record length"),
    ],
)
def test_a_broken_stream_is_a_protocol_error(data: bytes, why: str) -> None:
    with pytest.raises(MesosProtocolError, match=why):
        RecordIODecoder().feed(data)


def test_the_limit_is_checked_before_the_body_arrives() -> None:
    decoder = RecordIODecoder(max_record_bytes=10)
    with pytest.raises(MesosProtocolError, match="11 bytes is over the limit of 10"):
        decoder.feed(b"11\n")


@pytest.mark.parametrize("record", [b"{not json", b"[1, 2]", b'{"no": "type"}', b"\xff\xfe"])
def test_an_event_must_be_a_json_object_with_a_type(record: bytes) -> None:
    with pytest.raises(MesosProtocolError):
        decode_event(record)


def test_records_before_bad_bytes_come_out_and_the_error_follows() -> None:
    decoder = RecordIODecoder()
    good = encode_record(SUBSCRIBED)
    assert decoder.feed(good + b"x1\n{}") == [good.split(b"\n", 1)[1]]  # SUBSCRIBED is not lost
    assert isinstance(decoder.broken, MesosProtocolError)
    with pytest.raises(MesosProtocolError, match="bad record length"):
        decoder.feed(encode_record(ERROR))
