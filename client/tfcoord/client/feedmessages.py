"""The data feed's messages: frozen, validated when built, one class per op.

The feed (a Spark task streaming a partition to a node's feed port, see
``tfcoord.node.feedwire``) speaks on the coordinator protocol's framing
(:class:`~.protocol.Connection` with :func:`decode`) and its handshake
(:mod:`.handshake`: Challenge, Hello with role ``feeder`` keyed by the job token,
Welcome). After the handshake::

    feeder → node    open      {kind, partition, qname, train, feed_timeout_s, reason}
    node   → feeder  accepted  {credit, node}   |  stop {reason, terminated}  |  error {code, message}
    feeder → node    batch     {records}  ...  end
    node   → feeder  credit {n} | results {results} | done | stop {reason, terminated} | keepalive | error
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from . import messages as m
from .messages import MAX_ERROR_LEN, MAX_TEXT_LEN, _bool, _choice, _f, _int, _seconds, _text

#: Bumped on any incompatible change of the feed's messages (2: the shared handshake).
FEED_VERSION = 2
#: What a feeding connection is for: a partition's records, or a word to the whole feed.
OPEN_KINDS = ("feed", "eof", "stop")
#: Queue names are short identifiers (TensorFlowOnSpark's defaults: input, output, error).
MAX_QNAME_LEN = 64
#: Credit granted at once: a window of a few batches; more is a confused node.
MAX_CREDIT = 1024
#: A partition index (Spark's are ints well below this).
MAX_PARTITION = 2**31 - 1


def _records(v: Any) -> None:
    if not isinstance(v, list):
        raise ValueError(f"must be a list, not {type(v).__name__}")


@dataclass(frozen=True)
class Open(m.Message):
    """Feeder → node, after the handshake: what this connection carries."""

    op: ClassVar[str] = "open"
    kind: str = _f(_choice(OPEN_KINDS))
    partition: int = _f(_int(0, MAX_PARTITION), default=0)
    qname: str = _f(_text(MAX_QNAME_LEN, empty=False), default="input")
    #: Inference: the queue whose results this feeder reads (the node's ``DataFeed(qname_out=...)``
    #: must name the same; TensorFlowOnSpark's feeders read ``output``).
    qname_out: str = _f(_text(MAX_QNAME_LEN, empty=False), default="output")
    train: bool = _f(_bool, default=True)
    feed_timeout_s: float = _f(_seconds(0.001), default=600.0)
    #: Why, for ``stop``.
    reason: str = _f(_text(MAX_TEXT_LEN), default="")


@dataclass(frozen=True)
class Accepted(m.Message):
    """Node → feeder: the feed is open; send up to ``credit`` batches."""

    op: ClassVar[str] = "accepted"
    credit: int = _f(_int(0, MAX_CREDIT))
    #: How the node names itself in errors.
    node: str = _f(_text(MAX_TEXT_LEN))


@dataclass(frozen=True)
class Batch(m.Message):
    """Feeder → node: records, any msgpack values. ``feedwire.BatchPacker`` packs the same
    map straight from the records, so this class is what the node decodes."""

    op: ClassVar[str] = "batch"
    records: Sequence[Any] = _f(_records)


@dataclass(frozen=True)
class End(m.Message):
    """Feeder → node: the partition has no more records."""

    op: ClassVar[str] = "end"


@dataclass(frozen=True)
class Credit(m.Message):
    """Node → feeder: ``n`` more batches may be sent."""

    op: ClassVar[str] = "credit"
    n: int = _f(_int(1, MAX_CREDIT))


@dataclass(frozen=True)
class Results(m.Message):
    """Node → feeder: results of the partition's records, in order (inference)."""

    op: ClassVar[str] = "results"
    results: Sequence[Any] = _f(_records)


@dataclass(frozen=True)
class Done(m.Message):
    """Node → feeder: the consumer reached the partition's end."""

    op: ClassVar[str] = "done"


@dataclass(frozen=True)
class Stop(m.Message):
    """Node → feeder: the node takes no more data."""

    op: ClassVar[str] = "stop"
    reason: str = _f(_text(MAX_ERROR_LEN + MAX_TEXT_LEN))
    #: The node's own ``DataFeed.terminate()`` ended its feed: the partitions it did not take
    #: are not wanted, so an inference feeder returns the results it has, without error
    #: (TensorFlowOnSpark's feeders skip them). False: the job is stopping.
    terminated: bool = _f(_bool, default=False)


@dataclass(frozen=True)
class Keepalive(m.Message):
    """Node → feeder: still alive, the queue is moving (for a feeder waiting its turn)."""

    op: ClassVar[str] = "keepalive"


OPS: dict[str, type[m.Message]] = {
    cls.op: cls
    for cls in (
        m.Challenge,
        m.Hello,
        m.Welcome,
        m.Error,
        Open,
        Accepted,
        Batch,
        End,
        Credit,
        Results,
        Done,
        Stop,
        Keepalive,
    )
}
#: A feed message from a received map (``Connection(decode=feedmessages.decode)``).
decode = m.decoder(OPS, "feed")
