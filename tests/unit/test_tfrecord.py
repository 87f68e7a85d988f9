"""TFRecord framing (tfcoord.compat.tfrecord): pure bytes in, records out, and back."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfcoord.compat import tfrecord


def test_the_crc_is_crc32c_masked_as_tensorflow_masks_it():
    # CRC32C("123456789") is 0xE3069283 (the standard check value); TensorFlow's mask
    # rotates it right by 15 bits and adds 0xa282ead8.
    crc = 0xE3069283
    assert tfrecord.masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_a_record_is_length_crc_data_crc():
    framed = tfrecord.encode(b"abc")
    assert len(framed) == 8 + 4 + 3 + 4
    assert framed[:8] == struct.pack("<Q", 3)
    assert framed[8:12] == struct.pack("<I", tfrecord.masked_crc32c(framed[:8]))
    assert framed[12:15] == b"abc"
    assert framed[15:] == struct.pack("<I", tfrecord.masked_crc32c(b"abc"))


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(1, 64))
def test_records_come_back_whole_and_in_order_whatever_the_read_size(records, chunk):
    stream = io.BytesIO()
    assert tfrecord.write(stream, records) == len(records)
    data = stream.getvalue()
    assert list(tfrecord.decode(data)) == records
    original = tfrecord.READ_CHUNK
    tfrecord.READ_CHUNK = chunk  # records straddle the reads
    try:
        assert list(tfrecord.read(io.BytesIO(data))) == records
    finally:
        tfrecord.READ_CHUNK = original


def test_a_corrupt_record_is_refused_with_its_offset():
    data = bytearray(tfrecord.encode(b"first") + tfrecord.encode(b"second"))
    data[len(tfrecord.encode(b"first")) + 12] ^= 0xFF  # a byte of the second record's data
    with pytest.raises(tfrecord.TFRecordError, match=r"part-0: corrupt record data at byte 21"):
        list(tfrecord.decode(bytes(data), "part-0"))
    with pytest.raises(tfrecord.TFRecordError, match="corrupt record data"):
        list(tfrecord.read(io.BytesIO(bytes(data))))


def test_a_file_that_is_not_tfrecords_is_refused_at_its_first_header():
    with pytest.raises(tfrecord.TFRecordError, match=r"corrupt record length at byte 0.*not a TFRecord file"):
        list(tfrecord.decode(b"label,pixel0,pixel1\n5,0,0\n"))


@pytest.mark.parametrize("cut", [3, 12, 14, 18])
def test_a_truncated_file_is_refused(cut):
    data = tfrecord.encode(b"abcdef")[:cut]
    with pytest.raises(tfrecord.TFRecordError, match="truncated"):
        list(tfrecord.decode(data))
    with pytest.raises(tfrecord.TFRecordError, match="truncated"):
        list(tfrecord.read(io.BytesIO(data)))
