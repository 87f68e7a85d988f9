"""The data-feed wire: how a Spark task streams a partition's records to a TensorFlow node.

Theory of operation. Each node that trains (chief, master, worker) listens on a feed
port of its own and advertises it as ``feed_address`` in its node metadata. The driver
reads those addresses from the coordinator once per ``train``/``inference`` call and
ships them to the feeding tasks, which pick their node by partition index
(:func:`assign`, round-robin as TensorFlowOnSpark assigns). So a feeding task never
needs to share a Python worker, or even an executor, with its node.

One TCP connection carries one partition; for a job whose coordinator traffic is TLS it is
a TLS 1.3 connection to the node's own certificate, pinned by fingerprint
(:mod:`tfcoord.node.feedtls`). It speaks the coordinator protocol's framing
(:class:`tfcoord.client.protocol.Connection`) and handshake (:mod:`tfcoord.client.handshake`:
the feeder proves it holds the job token, role ``feeder``, and the node proves it in
turn), then the feed's own typed messages (:mod:`tfcoord.client.feedmessages`)::

    feeder → node    open      {kind, partition, qname, train, feed_timeout_s, reason}
    node   → feeder  accepted  {credit, node}  |  stop {reason}  |  error {code, message}
    feeder → node    batch     {records}  ...  end
    node   → feeder  credit {n} | results {results} | done | stop {reason} | keepalive | error

Only tasks of the same job can feed a node. Flow control is by
credit: a feeder may send one ``batch`` per credit; the node grants :data:`WINDOW_BATCHES`
at ``welcome`` and one more each time its consumer has taken a whole batch, so a slow
trainer bounds what is buffered at ``WINDOW_BATCHES`` batches per partition. ``done``
says the consumer reached the partition's end; ``stop`` that the node takes no more data
(the job is stopping, or its ``DataFeed.terminate()`` ran: the feeder then skips the rest of
its partition, as TensorFlowOnSpark's does); ``keepalive`` keeps a feeder queued
behind another partition from timing out while the node makes progress.

Records and results travel as msgpack: None, bools, numbers, strings, bytes, lists/tuples
and maps of those, and numpy arrays and scalars as extension types that decode back to
numpy (:mod:`tfcoord.client.ndcodec`: dtype, shape and raw bytes), so a node's numpy
results reach Spark as numpy values, as TensorFlowOnSpark's do. Anything else is refused
with an error that names its type, rather than pickled: the feed port is reachable by
anyone on the network, and unpickling is code execution.

This module holds the pure parts (batching, assignment, the feeder's credit state) and
the blocking message I/O both ends share (:class:`FeedStream`).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from tfcoord.client import feedmessages as fm
from tfcoord.client import messages as m
from tfcoord.client import ndcodec
from tfcoord.client.errors import RemoteProtocolError, TfcoordError
from tfcoord.client.feedmessages import FEED_VERSION
from tfcoord.client.protocol import CLOSED, DEFAULT_MAX_FRAME_BYTES, NEED_DATA, Connection
from tfcoord.client.vocab import ErrorCode

__all__ = ["FEED_VERSION"]
#: One recv: a batch is about 256 KiB; a larger read empties the socket in fewer calls.
RECV_BYTES = 262144
#: The largest frame either end accepts: the coordinator protocol's limit.
MAX_FRAME_BYTES = DEFAULT_MAX_FRAME_BYTES
#: A frame from a feeder that has not proved itself yet: a hello (about 200 bytes) fits with
#: room to spare, and an unauthenticated peer can make the node read no more than this.
PRE_AUTH_FRAME_BYTES = 4 * 1024
#: A batch is closed at this many bytes: large enough that framing and per-frame Python
#: work vanish next to the records (1M small records are ~250 frames), small enough that
#: a window of them is a few MiB per partition.
BATCH_BYTES = 256 * 1024
#: ... or at this many records, so tiny records still flow in bounded steps.
MAX_BATCH_RECORDS = 8192
#: Batches a feeder may have in flight per partition before it needs more credit. Two
#: keep the socket busy while the consumer works on the previous; four absorb jitter.
WINDOW_BATCHES = 4
#: A node tells queued feeders it is alive this often; a feeder that hears nothing for
#: several of these (and its feed_timeout) gives up on the node.
KEEPALIVE_S = 2.0
#: What a feeder waits on top of ``feed_timeout`` before deciding the node itself is gone
#: (the node's own watchdog reports a stalled consumer at ``feed_timeout``).
SILENCE_SLACK_S = 3 * KEEPALIVE_S
#: Connecting to a node's feed port: a listening node accepts in milliseconds.
CONNECT_TIMEOUT_S = 10.0
#: Roles that consume fed data (TensorFlowOnSpark feeds its training nodes).
FEED_ROLES = ("chief", "master", "worker")
#: The metadata key a node advertises its feed port under.
FEED_META = "feed_address"
#: The metadata key set (to 1) once a node's ``DataFeed.terminate()`` ran: its own feed is
#: over (its feeding tasks skip their partitions); a streaming job takes it as the request to
#: stop the stream (TensorFlowOnSpark's ``request_stop``).
FEED_TERMINATED_META = "feed_terminated"

_HEADER = struct.Struct(">I")


class FeedError(TfcoordError):
    """Feeding a partition to a node failed; the message names the node and the queue."""


class FeedTimeout(FeedError, TimeoutError):
    """A node took no records from its queue for ``feed_timeout`` seconds."""


class FeedStopped(FeedError):
    """The node takes no more data: its job is stopping or its feed was terminated."""


class UnsupportedRecord(FeedError, TypeError):
    """A record holds a value the feed cannot carry (the message names its type)."""


def assign(partition: int, num_nodes: int) -> int:
    """Which feed node (0..num_nodes-1) receives ``partition``: round-robin by index."""
    if num_nodes < 1:
        raise ValueError("the cluster has no node that takes fed data (no chief, master or worker)")
    if partition < 0:
        raise ValueError(f"partition index {partition} is negative")
    return partition % num_nodes


def check_slots(slots: int, node_tasks: int, fed_nodes: int) -> None:
    """Refuse to train a cluster that could only deadlock for want of Spark task slots.

    Synchronous training (MultiWorkerMirroredStrategy) blocks a node in every step until
    all nodes take part, so every fed node needs a feeding task of its own running at
    once: with fewer free slots than fed nodes, the nodes that got data block in their
    first all-reduce while the feeding tasks of the others wait for a slot that never
    frees. Partitions 0..N-1 go to nodes 0..N-1 (:func:`assign`) and Spark starts a
    stage's tasks in partition order, so N free slots start one feeder per node.

    Args:
        slots: the application's task slots (Spark's maxNumConcurrentTasks).
        node_tasks: those the nodes hold while feeding runs (0 for background nodes,
            InputMode.SPARK's; nodes on the driver hold none either).
        fed_nodes: the chief, master and worker nodes, which each take a share of the data.

    Raises:
        ValueError: fewer free slots than fed nodes; the message says what to change.
    """
    free = slots - node_tasks
    if free >= fed_nodes:
        return
    held = f"the {node_tasks} TensorFlow node(s) hold {node_tasks} of them, " if node_tasks else ""
    raise ValueError(
        f"training needs {fed_nodes} free Spark task slot(s), one feeding task per fed node running at "
        f"once (synchronous training waits for every node in each step), but the application has "
        f"{slots} slot(s), {held}leaving {max(free, 0)}. Give the application at least "
        f"{node_tasks + fed_nodes} slots (spark.cores.max / spark.executor.instances x spark.executor.cores), "
        f"e.g. one executor per node as TensorFlowOnSpark does"
    )


# -- records ------------------------------------------------------------------------------


def _default(obj: Any) -> Any:
    """msgpack's hook for types it does not know: numpy as ndcodec's extensions, else refuse."""
    if ndcodec.is_numpy(obj) and hasattr(obj, "dtype"):
        return ndcodec.encode(obj)
    module = type(obj).__module__
    raise UnsupportedRecord(
        f"cannot feed a value of type {module}.{type(obj).__qualname__}: records must hold None, "
        "bools, numbers, str, bytes, lists/tuples, dicts or numpy arrays (convert it in a map() first)"
    )


class BatchPacker:
    """Packs records one at a time into ``batch`` frames of about :data:`BATCH_BYTES`.

    ``add`` returns ``(frame, n_records)`` when a batch is complete, else None; ``flush``
    returns the last partial one. Each record is encoded once, straight into the frame.
    """

    # A batch frame is the map of fm.Batch, {"op": "batch", "records": [...]}; its head is fixed.
    _HEAD = b"\x82" + msgpack.packb("op") + msgpack.packb(fm.Batch.op) + msgpack.packb("records")
    #: Room for the head and the array header inside a maximal frame.
    _ROOM = MAX_FRAME_BYTES - 64

    def __init__(self, batch_bytes: int = BATCH_BYTES, max_records: int = MAX_BATCH_RECORDS) -> None:
        self._packer = msgpack.Packer(default=_default, use_bin_type=True, autoreset=True)
        self._parts: list[bytes] = []
        self._size = 0
        self.batch_bytes = batch_bytes
        self.max_records = max_records
        self.records = 0  #: records packed so far, in all frames

    def add(self, record: Any) -> tuple[bytes, int] | None:
        try:
            b = self._packer.pack(record)
        except UnsupportedRecord:
            raise
        except (TypeError, ValueError, OverflowError) as e:
            raise UnsupportedRecord(f"record {self.records} cannot be fed: {e}") from None
        if len(b) > self._ROOM:
            raise UnsupportedRecord(
                f"record {self.records} is {len(b)} bytes packed; the feed's frame limit is "
                f"{MAX_FRAME_BYTES} bytes: split it"
            )
        # A record that would overflow the frame closes the batch before it (rare: huge records).
        out = self.flush() if self._parts and self._size + len(b) > self._ROOM else None
        self._parts.append(b)
        self._size += len(b)
        self.records += 1
        if out is None and (self._size >= self.batch_bytes or len(self._parts) >= self.max_records):
            out = self.flush()
        return out

    def flush(self) -> tuple[bytes, int] | None:
        if not self._parts:
            return None
        n = len(self._parts)
        body = b"".join([self._HEAD, self._packer.pack_array_header(n), *self._parts])
        self._parts = []
        self._size = 0
        return _HEADER.pack(len(body)) + body, n


def batches(records: Iterable[Any], packer: BatchPacker | None = None) -> Iterator[tuple[bytes, int]]:
    """(frame, records in it) for every batch of ``records``, in order."""
    packer = packer or BatchPacker()
    for r in records:
        out = packer.add(r)
        if out is not None:
            yield out
    out = packer.flush()
    if out is not None:
        yield out


# -- frames -------------------------------------------------------------------------------


class FeedStream:
    """One end of a feed connection: the shared framing (:class:`Connection` with the feed's
    decoder) over a blocking socket. ``send`` a message, ``send_frame`` a frame already
    packed (a batch), ``recv`` the next message (None once the peer closed between frames).

    ``recv`` raises RemoteProtocolError for an oversized, truncated or undecodable frame or
    a bad message, and TimeoutError when the socket's timeout passes.
    """

    def __init__(self, sock: socket.socket, *, authenticated: bool = True) -> None:
        self.sock = sock
        self._conn = connection(authenticated=authenticated)
        self._lock = threading.Lock()  # a node's consumer and its watchdog both write

    def authenticated(self) -> None:
        """The peer proved itself: its frames may be as large as the feed allows, and carry
        numpy values."""
        self._conn.widen(MAX_FRAME_BYTES, ndcodec.decode)

    def send(self, msg: m.Message) -> None:
        self.send_frame(self._conn.send(msg))

    def send_frame(self, frame: bytes) -> None:
        with self._lock:
            self.sock.sendall(frame)

    def recv(self) -> m.Message | None:
        while True:
            msg = self._conn.next_event()
            if msg is CLOSED:
                return None
            if msg is not NEED_DATA:
                return msg  # type: ignore[return-value]
            self._conn.receive_data(self.sock.recv(RECV_BYTES))


def frame(msg: m.Message) -> bytes:
    """The bytes of one feed frame carrying ``msg``.

    Raises:
        LocalProtocolError: it exceeds the frame limit.
    """
    return _FRAMER.send(msg)


def connection(*, authenticated: bool = True) -> Connection:
    """The feed's framing: its messages, and numpy values both ways. Before its peer proved
    itself (``authenticated=False``, the node's side of a new connection): frames of at most
    :data:`PRE_AUTH_FRAME_BYTES` and no extension types, until :meth:`FeedStream.authenticated`."""
    if not authenticated:
        return Connection(PRE_AUTH_FRAME_BYTES, decode=fm.decode, default=_default)
    return Connection(MAX_FRAME_BYTES, decode=fm.decode, default=_default, ext_hook=ndcodec.decode)


#: Sending is stateless: one Connection frames every message sent with :func:`frame`.
_FRAMER = connection()


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# -- the feeder's side of flow control ------------------------------------------------------


@dataclass
class FeederState:
    """What a feeder knows about its partition's exchange with the node, without I/O.

    ``handle(frame)`` takes each frame from the node; ``sent(n)`` records a batch of ``n``
    records going out. ``can_send`` says whether a credit is left; ``finished`` whether
    the exchange is over (train: the node consumed the partition; inference: every
    record's result is back).
    """

    node: str
    qname: str
    train: bool
    credit: int = 0
    records_sent: int = 0
    ended: bool = False
    done: bool = False
    stopped: str = ""
    #: The stop was the node's own ``DataFeed.terminate()``: what it did not take is not wanted.
    terminated: bool = False
    results: list[Any] | None = None

    def __post_init__(self) -> None:
        if not self.train:
            self.results = []

    @property
    def can_send(self) -> bool:
        return self.credit > 0 and not self.stopped

    @property
    def finished(self) -> bool:
        if self.stopped:
            return True
        if not self.ended:
            return False
        if self.train:
            return self.done
        assert self.results is not None
        return len(self.results) >= self.records_sent

    def sent(self, n: int) -> None:
        if self.credit <= 0:
            raise FeedError(f"sent a batch to {self.node} without credit (a bug in the feeder)")
        self.credit -= 1
        self.records_sent += n

    def handle(self, msg: m.Message) -> Sequence[Any]:
        """Apply one message from the node; returns results that arrived (inference)."""
        if isinstance(msg, fm.Credit):
            self.credit += msg.n
        elif isinstance(msg, fm.Results):
            if self.results is None:
                raise RemoteProtocolError(f"{self.node} sent results to a training feed")
            if len(self.results) + len(msg.results) > self.records_sent:
                raise FeedError(
                    f"{self.node} returned {len(self.results) + len(msg.results)} results for "
                    f"{self.records_sent} records of queue {self.qname!r}"
                )
            self.results.extend(msg.results)
            return msg.results
        elif isinstance(msg, fm.Done):
            self.done = True
        elif isinstance(msg, fm.Stop):
            self.stopped = msg.reason or "the node takes no more data"
            self.terminated = msg.terminated
        elif isinstance(msg, m.Error):
            if msg.code == ErrorCode.FEED_TIMEOUT:
                raise FeedTimeout(msg.message)
            raise FeedError(f"{self.node} (queue {self.qname!r}): {msg.message}")
        elif not isinstance(msg, fm.Keepalive):
            raise RemoteProtocolError(f"{self.node} sent an unexpected feed message {msg.op!r}")
        return []
