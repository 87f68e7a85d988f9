"""The wire protocol, sans-io: bytes in, messages out; messages in, bytes out.

Theory of operation (after h11): a :class:`Connection` owns a receive buffer.
``receive_data(b)`` appends bytes (``b""`` means the peer closed);
``next_event()`` returns the next complete :class:`Message`, :data:`NEED_DATA`
when a frame is incomplete, or :data:`CLOSED` once the peer closed cleanly
between frames. ``send(msg)`` returns the bytes of one frame.

A frame is a 4-byte big-endian length followed by that many bytes holding one
msgpack map. The length is checked against ``max_frame_bytes`` as soon as the
four bytes are in, *before* any of the body is buffered, so a peer cannot make us
hold more than one maximal frame. Nothing is ever unpickled: msgpack decodes to
plain maps, lists, strings, bytes and numbers, and ``messages.decode`` validates
each field. After any protocol error the connection is unusable; the caller sends
an error frame (where possible) and closes.

The asyncio server, the blocking client and both ends of the data feed use this
class, so framing is written once.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from . import messages
from .errors import LocalProtocolError, RemoteProtocolError

#: The largest frame either side accepts. A cluster spec for 10,000 nodes is about
#: 200 KiB and a traceback is capped at 64 KiB; 8 MiB leaves room for 100,000-node
#: specs while bounding the memory one connection can pin.
DEFAULT_MAX_FRAME_BYTES: Final = 8 * 1024 * 1024

_HEADER = struct.Struct(">I")
#: Frames smaller than this are copied out of the receive buffer to be decoded (cheaper
#: than a view for the small frames of most requests); larger ones are read in place.
_COPY_BELOW = 4096


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA: Final = _Sentinel("NEED_DATA")
CLOSED: Final = _Sentinel("CLOSED")


def _unpackb(
    body: bytes | bytearray | memoryview,
    max_frame_bytes: int,
    ext_hook: Callable[[int, bytes], Any] | None = None,
) -> object:
    # strict_map_key: only str/bytes keys, so a map cannot smuggle tuples or floats as
    # keys; the max_*_len limits are msgpack's own guards for untrusted data. Extension
    # types only where the caller decodes them (the feed's numpy values, ndcodec).
    if ext_hook is not None:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=max_frame_bytes,
            max_bin_len=max_frame_bytes,
            max_array_len=messages.MAX_NODES_PER_JOB * 2,
            max_map_len=messages.MAX_NODES_PER_JOB,
            max_ext_len=max_frame_bytes,
            ext_hook=ext_hook,
        )
    return msgpack.unpackb(
        body,
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_str_len=max_frame_bytes,
        max_bin_len=max_frame_bytes,
        max_array_len=messages.MAX_NODES_PER_JOB * 2,
        max_map_len=messages.MAX_NODES_PER_JOB,
        max_ext_len=0,
    )


def encode_spec(cluster: dict[str, list[str]]) -> bytes:
    """A cluster spec as sent to nodes: msgpack, then zlib.

    The coordinator's egress for one job grows with N² (N nodes each receive N
    addresses), so the spec is compressed once per job: about 3.5x smaller for real
    addresses (hosts repeat, ports do not), at well under a millisecond per node to
    inflate. zlib's default level costs 8 ms once at 10,000 nodes and sends 12% fewer
    bytes than its fastest.
    """
    return zlib.compress(pack(cluster), 6)


def decode_spec(blob: bytes, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> dict[str, list[str]]:
    """Inverse of :func:`encode_spec`, refusing anything that inflates past ``max_bytes``."""
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(blob, max_bytes)
        if inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
            raise RemoteProtocolError(
                f"cluster spec inflates past {max_bytes} bytes, is truncated or has trailing bytes"
            )
    except zlib.error as e:
        raise RemoteProtocolError(f"cluster spec is not valid zlib data: {e}") from None
    spec = unpack(raw, max_bytes)
    # set(map(type, ...)) checks every address in C: at 10,000 nodes a generator over
    # isinstance() costs each node more than decoding the spec does.
    if not isinstance(spec, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and set(map(type, v)) <= {str} for k, v in spec.items()
    ):
        raise RemoteProtocolError("cluster spec must map role names to lists of addresses")
    return spec


def encode_frame(
    payload: dict[str, Any],
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    default: Callable[[Any], Any] | None = None,
) -> bytes:
    """Frame an already-built map (used to encode a cluster spec once per job).

    ``default`` is msgpack's hook for values it does not know (the feed's numpy values).
    """
    body: bytes = msgpack.packb(payload, use_bin_type=True, default=default)
    if len(body) > max_frame_bytes:
        raise LocalProtocolError(f"frame of {len(body)} bytes exceeds the {max_frame_bytes}-byte limit")
    return _HEADER.pack(len(body)) + body


class ClusterReplyFrames:
    """Frames of ``cluster`` replies whose spec is encoded once per job, not once per node.

    Every node of a job receives the same spec bytes (tens of KiB at 10,000 nodes);
    only the request id, role and index differ. :meth:`frame` returns a frame in two
    parts: a small head (length, id, role, index) packed per node, and a tail (the spec
    as a msgpack ``bin``) packed once per spec and shared by every node's frame, so the
    coordinator neither re-packs nor copies the spec per node: written as two buffers,
    the tail goes from this one object straight to each socket.

    Args:
        max_frame_bytes: a spec too large for one frame is refused here.
        keep: specs remembered (a few jobs completing at once); the oldest is dropped.
    """

    _KEYS = {k: msgpack.packb(k) for k in ("op", "cluster", "id", "role", "index", "spec")}

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, keep: int = 8) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.keep = keep
        # id(spec) -> (spec, tail): the spec itself is kept so its id cannot be reused.
        self._tails: dict[int, tuple[bytes, bytes]] = {}
        k = self._KEYS
        # A fixmap of 5 entries, then "op": "cluster".
        self._prefix = b"\x85" + k["op"] + k["cluster"]

    def tail(self, spec: bytes) -> bytes:
        """The packed ``"spec": <bin>`` entry of a frame, built once per spec object."""
        hit = self._tails.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        tail: bytes = self._KEYS["spec"] + msgpack.packb(spec, use_bin_type=True)
        if len(self._tails) >= self.keep:
            del self._tails[next(iter(self._tails))]
        self._tails[id(spec)] = (spec, tail)
        return tail

    def frame(self, msg: messages.ClusterReply) -> tuple[bytes, bytes]:
        """(head, tail): ``head + tail`` is exactly the frame ``Connection.send(msg)`` makes
        (the same map, keys in the same order).

        Raises:
            LocalProtocolError: the frame exceeds the frame limit.
        """
        k = self._KEYS
        tail = self.tail(msg.spec)
        body = b"".join(
            (
                self._prefix,
                k["id"],
                msgpack.packb(msg.id),
                k["role"],
                msgpack.packb(msg.role),
                k["index"],
                msgpack.packb(msg.index),
            )
        )
        size = len(body) + len(tail)
        if size > self.max_frame_bytes:
            raise LocalProtocolError(f"frame of {size} bytes exceeds the {self.max_frame_bytes}-byte limit")
        return _HEADER.pack(size) + body, tail


@dataclass(frozen=True)
class DecodeBudget:
    """What one frame from an untrusted peer may cost to decode, enforced while it decodes.

    The frame limit bounds bytes, not what they expand to: 8 MiB of empty maps is 8 million
    dicts (hundreds of MiB and most of a second of the event loop). A budget caps the maps
    and lists of one frame, the entries they hold together and each one's length, so a
    message costs a small, bounded amount whatever its bytes say. (Depth is bounded by
    msgpack itself, which refuses nesting past its stack.) A frame past it is a protocol
    error, as an oversized one is.
    """

    #: Maps and lists in one frame.
    max_containers: int
    #: Entries of all of them together (a map's pairs, a list's items).
    max_entries: int
    #: Entries of any one map or list.
    max_length: int


class _Spent:
    """The budget one frame has used so far (msgpack calls ``seen`` for every map and list)."""

    __slots__ = ("budget", "containers", "entries")

    def __init__(self, budget: DecodeBudget) -> None:
        self.budget, self.containers, self.entries = budget, 0, 0

    def seen(self, obj: Any) -> Any:
        self.containers += 1
        self.entries += len(obj)
        b = self.budget
        if self.containers > b.max_containers or self.entries > b.max_entries:
            raise ValueError(
                f"a frame may hold at most {b.max_containers} maps and lists with "
                f"{b.max_entries} entries in all"
            )
        return obj


def _budgeted(body: bytes | bytearray | memoryview, max_frame_bytes: int, budget: DecodeBudget) -> object:
    spent = _Spent(budget)
    return msgpack.unpackb(
        body,
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_str_len=max_frame_bytes,
        max_bin_len=max_frame_bytes,
        max_array_len=budget.max_length,
        max_map_len=budget.max_length,
        max_ext_len=0,
        object_hook=spent.seen,
        list_hook=spent.seen,
    )


def pack(obj: object) -> bytes:
    """msgpack-encode a value the way every frame does (str as str, bytes as bin)."""
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def unpack(data: bytes, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> object:
    """Decode msgpack bytes received from a peer, with the same limits as frames."""
    try:
        return _unpackb(data, max_bytes)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise RemoteProtocolError(f"undecodable msgpack: {e}") from None


class Connection:
    """One side of a tfcoord connection, without I/O.

    Args:
        max_frame_bytes: frames announcing a larger body are refused before it is read.
        decode: turns a received map into a message: the coordinator protocol's table by
            default; the data feed passes its own (``feedmessages.decode``), so both wires
            share this framing.
        default: msgpack's hook for values it cannot pack; the feed passes
            :mod:`.ndcodec`'s so numpy values cross. Without it (and ``ext_hook``)
            extension types are refused (the coordinator protocol carries none).
        ext_hook: msgpack's hook for extension types received, the inverse of ``default``.
        budget: what one received frame may cost to decode (see :class:`DecodeBudget`); the
            coordinator sets it for every peer. None: only the frame limit (a client reading
            its coordinator's answers, a full status of a 10,000-node job included).
    """

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        decode: Callable[[Any], messages.Message] = messages.decode,
        default: Callable[[Any], Any] | None = None,
        ext_hook: Callable[[int, bytes], Any] | None = None,
        budget: DecodeBudget | None = None,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.budget = budget
        # Every map or list takes at least a byte of the frame, every entry too: a frame
        # shorter than each of the budget's figures cannot exceed it, and is decoded without
        # counting (the hooks cost as much again as decoding a node's request).
        self._budget_bytes = (
            min(budget.max_containers, budget.max_entries, budget.max_length) if budget is not None else 0
        )
        self._decode = decode
        self._default = default
        self._ext_hook = ext_hook
        self._buf = bytearray()
        self._peer_closed = False
        self._broken = False

    def widen(self, max_frame_bytes: int, ext_hook: Callable[[int, bytes], Any] | None = None) -> None:
        """Lift the limits a peer had before it proved itself: a larger frame, and the
        extension types only an authenticated peer may send (bytes already buffered are
        decoded under the new limits)."""
        self.max_frame_bytes = max_frame_bytes
        self._ext_hook = ext_hook

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as messages."""
        return len(self._buf)

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer; ``b""`` says the peer closed its side."""
        if self._peer_closed:
            if data:
                raise RemoteProtocolError("data received after the peer closed")
            return
        if not data:
            self._peer_closed = True
        else:
            self._buf += data

    def next_event(self) -> messages.Message | _Sentinel:
        """The next complete message, or NEED_DATA, or CLOSED.

        Raises:
            RemoteProtocolError: oversized, truncated or undecodable frame, or an
                invalid message. The connection must then be closed.
        """
        if self._broken:
            raise RemoteProtocolError("the connection already failed; close it")
        buf = self._buf
        if len(buf) < 4:
            if self._peer_closed:
                if buf:
                    self._broken = True
                    raise RemoteProtocolError(
                        f"connection closed inside a frame header ({len(buf)} of 4 bytes)"
                    )
                return CLOSED
            return NEED_DATA
        (size,) = _HEADER.unpack_from(buf)
        if size > self.max_frame_bytes:
            self._broken = True
            raise RemoteProtocolError(f"frame of {size} bytes exceeds the {self.max_frame_bytes}-byte limit")
        if len(buf) < 4 + size:
            if self._peer_closed:
                self._broken = True
                raise RemoteProtocolError(
                    f"connection closed inside a frame ({len(buf) - 4} of {size} bytes)"
                )
            return NEED_DATA
        try:
            if self.budget is not None and self._ext_hook is None and size >= self._budget_bytes:
                with memoryview(buf) as whole, whole[4 : 4 + size] as body:
                    obj = _budgeted(body, self.max_frame_bytes, self.budget)
            elif size < _COPY_BELOW:
                obj = _unpackb(buf[4 : 4 + size], self.max_frame_bytes, self._ext_hook)
            else:
                # Read in place: a node's cluster reply is tens of KiB at 10,000 nodes, and
                # a copy of it per frame cost as much as decoding it. The views are released
                # before the buffer shrinks (a bytearray cannot resize while viewed).
                with memoryview(buf) as whole, whole[4 : 4 + size] as body:
                    obj = _unpackb(body, self.max_frame_bytes, self._ext_hook)
        except Exception as e:
            self._broken = True
            raise RemoteProtocolError(f"undecodable frame: {e}") from None
        finally:
            del buf[: 4 + size]
        try:
            return self._decode(obj)
        except RemoteProtocolError:
            self._broken = True
            raise

    def send(self, msg: messages.Message) -> bytes:
        """The bytes of one frame carrying ``msg``.

        Raises:
            LocalProtocolError: the encoded message exceeds the frame limit.
        """
        return encode_frame(msg.to_wire(), self.max_frame_bytes, self._default)
