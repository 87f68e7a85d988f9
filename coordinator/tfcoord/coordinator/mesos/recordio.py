"""RecordIO, the framing of the Mesos v1 event stream: sans-io, bytes in, records out.

Each record is its length in bytes as decimal digits, a newline, then exactly that many
bytes of JSON, with nothing between records. Records arrive split across and packed into
HTTP chunks in any way, so the decoder buffers: :meth:`RecordIODecoder.feed` returns every
record completed by the bytes given and keeps the rest. The length is checked against a
limit before any body is buffered, as msgpack's ``max_buffer_size`` advises for data from
the network. Bad bytes after good records do not lose the good ones: ``feed`` returns them
and keeps the error in :attr:`RecordIODecoder.broken`, raising it from the next ``feed``
(a SUBSCRIBED followed by garbage in one chunk still tells the framework it subscribed).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import MesosProtocolError

#: An OFFERS event lists every agent offered in one round: a few KiB per agent, so even a
#: 10,000-agent cluster stays far below this. A larger length is a broken stream.
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: Digits of the largest allowed length, plus room for a broken stream to show itself.
_MAX_HEADER = len(str(MAX_RECORD_BYTES))


class RecordIODecoder:
    """Split a RecordIO byte stream into records."""

    def __init__(self, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self._buf = bytearray()
        self._need: int | None = None  # body length of the record being read, once known
        self._max = max_record_bytes
        self._broken: MesosProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def broken(self) -> MesosProtocolError | None:
        """The error found after the records the last ``feed`` returned; the stream is unusable."""
        return self._broken

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every record they complete, in order.

        Raises:
            MesosProtocolError: a length that is not digits, or is over the limit (at once
                when no record came before it in this call, else from the next call).
        """
        if self._broken is not None:
            raise self._broken
        self._buf += data
        out: list[bytes] = []
        try:
            self._split(out)
        except MesosProtocolError as e:
            if not out:
                raise
            self._broken = e
        return out

    def _split(self, out: list[bytes]) -> None:
        while True:
            if self._need is None:
                newline = self._buf.find(b"\n", 0, _MAX_HEADER + 1)
                if newline < 0:
                    if len(self._buf) > _MAX_HEADER:
                        raise MesosProtocolError(
                            f"the event stream does not start with a record length: {bytes(self._buf[:40])!r}"
                        )
                    return
                header = bytes(self._buf[:newline])
                if not header.isdigit():
                    raise MesosProtocolError(f"bad record length {header[:40]!r} in the event stream")
                length = int(header)
                if length > self._max:
                    raise MesosProtocolError(
                        f"a record of {length} bytes is over the limit of {self._max}; is this a Mesos master?"
                    )
                del self._buf[: newline + 1]
                self._need = length
            if len(self._buf) < self._need:
                return
            out.append(bytes(self._buf[: self._need]))
            del self._buf[: self._need]
            self._need = None


def decode_event(record: bytes) -> dict[str, Any]:
    """One record's JSON as an event map with a ``type``.

    Raises:
        MesosProtocolError: not JSON, not an object, or no ``type``.
    """
    try:
        event = json.loads(record)
    except (ValueError, UnicodeDecodeError) as e:
        raise MesosProtocolError(f"an event is not JSON ({e}): {record[:80]!r}") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise MesosProtocolError(f"an event must be a JSON object with a type: {record[:80]!r}")
    return event


def encode_record(event: dict[str, Any]) -> bytes:
    """The record for one event (used by tests and tools that play the master's side)."""
    body = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
    return str(len(body)).encode() + b"\n" + body
