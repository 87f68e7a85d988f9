"""TFRecord framing in Python: the files ``tf.data.TFRecordDataset`` and Hadoop's TFRecord format read.

A TFRecord file is a sequence of records, each::

    uint64  length               little-endian
    uint32  masked_crc32c(length bytes)
    byte    data[length]
    uint32  masked_crc32c(data)

with ``masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8`` (mod 2**32): TensorFlow masks
the CRC so that a CRC of data that itself holds CRCs is not degenerate. No header, no
footer, no compression here (TensorFlowOnSpark's hadoop jar writes none either).

Pure: bytes in, records out, and records in, bytes out. The CRC comes from
``google-crc32c`` (C, with its own pure-Python fallback), so no TensorFlow is needed to
read or write the framing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO

try:
    import google_crc32c
except ImportError as e:  # pragma: no cover - the spark extra installs it
    raise ImportError(
        "TFRecord support needs the google-crc32c package: pip install google-crc32c "
        "(tfcoord's spark extra brings it)"
    ) from e

_MASK_DELTA = 0xA282EAD8
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
#: Header (length and its CRC) and footer (data CRC) around each record's data.
HEADER_SIZE = _LEN.size + _CRC.size
FOOTER_SIZE = _CRC.size
#: A length past this is a corrupt or foreign file, not a record to allocate memory for
#: (TensorFlow's own records are limited by protobuf's 2 GiB).
MAX_RECORD_BYTES = 2**31
#: Reading from a stream: how much to ask the file for at a time.
READ_CHUNK = 1 << 20


class TFRecordError(ValueError):
    """The bytes are not a valid TFRecord file (truncated, or a CRC does not match)."""


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TensorFlow's masked CRC32C of ``data``."""
    crc: int = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def encode(record: bytes | bytearray | memoryview) -> bytes:
    """One record, framed."""
    length = _LEN.pack(len(record))
    return b"".join(
        (length, _CRC.pack(masked_crc32c(length)), bytes(record), _CRC.pack(masked_crc32c(record)))
    )


def write(stream: BinaryIO, records: Iterable[bytes | bytearray]) -> int:
    """Write every record, framed, to ``stream``; returns how many were written."""
    n = 0
    for record in records:
        stream.write(encode(record))
        n += 1
    return n


def decode(data: bytes | bytearray | memoryview, name: str = "TFRecord data") -> Iterator[bytes]:
    """Every record in ``data`` (a whole file's bytes), checking both CRCs of each.

    Raises:
        TFRecordError: ``data`` ends inside a record, or a CRC does not match (the message
            names ``name`` and the byte offset).
    """
    view = memoryview(data)
    offset, end = 0, len(view)
    while offset < end:
        record, offset = _one(view, offset, name)
        yield record


def _header(view: memoryview, offset: int, name: str) -> int:
    """The data length of the record at ``offset``, its header checked."""
    if len(view) - offset < HEADER_SIZE:
        raise TFRecordError(f"{name}: truncated record header at byte {offset}")
    length_bytes = view[offset : offset + _LEN.size]
    (length,) = _LEN.unpack(length_bytes)
    (crc,) = _CRC.unpack_from(view, offset + _LEN.size)
    if crc != masked_crc32c(length_bytes):
        raise TFRecordError(
            f"{name}: corrupt record length at byte {offset} (CRC mismatch): not a TFRecord file?"
        )
    if length > MAX_RECORD_BYTES:
        raise TFRecordError(f"{name}: record of {length} bytes at byte {offset} is larger than any TFRecord")
    return int(length)


def _one(view: memoryview, offset: int, name: str) -> tuple[bytes, int]:
    length = _header(view, offset, name)
    start = offset + HEADER_SIZE
    stop = start + length
    if len(view) - stop < FOOTER_SIZE:
        raise TFRecordError(f"{name}: truncated record at byte {offset} ({length} bytes announced)")
    record = bytes(view[start:stop])
    (crc,) = _CRC.unpack_from(view, stop)
    if crc != masked_crc32c(record):
        raise TFRecordError(f"{name}: corrupt record data at byte {offset} (CRC mismatch)")
    return record, stop + FOOTER_SIZE


def read(stream: BinaryIO, name: str = "TFRecord stream") -> Iterator[bytes]:
    """Every record of a file opened for reading, in order, holding at most one chunk and one record."""
    buf = bytearray()
    while True:
        chunk = stream.read(READ_CHUNK)
        if chunk:
            buf += chunk
        view = memoryview(buf)
        offset = 0
        try:
            while len(view) - offset >= HEADER_SIZE:
                length = _header(view, offset, name)
                if chunk and len(view) - offset < HEADER_SIZE + length + FOOTER_SIZE:
                    break  # the rest of this record is in the next chunk
                record, offset = _one(view, offset, name)  # raises on a truncated last record
                yield record
            if not chunk and len(view) - offset > 0:
                _one(view, offset, name)  # a partial header: raises
        finally:
            view.release()
        del buf[:offset]
        if not chunk:
            return


__all__ = ["TFRecordError", "decode", "encode", "masked_crc32c", "read", "write"]
