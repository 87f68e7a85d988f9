"""The feeding side: a Spark task streaming one partition to its TensorFlow node.

The driver builds a :class:`FeedPlan` once per ``train``/``inference`` call from the
nodes' advertised ``feed_address`` (the coordinator holds it in node metadata) and the
plan travels to the tasks in their closure; each task picks its node by partition index
(:func:`feedwire.assign`). See :mod:`tfcoord.node.feedwire` for the exchange itself.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tfcoord.client import feedmessages as fm
from tfcoord.client import handshake
from tfcoord.client import messages as m
from tfcoord.client.errors import AuthenticationFailed, ConnectionClosed, ProtocolError, RemoteProtocolError
from tfcoord.client.vocab import ErrorCode

from . import feedtls
from . import feedwire as fw


@dataclass(frozen=True)
class FeedTarget:
    """A node that takes fed data: how errors name it, where its feed port is, and the
    fingerprint of the certificate it registered for its feed (:mod:`.feedtls`; empty when
    the node serves plaintext)."""

    node: str
    address: str
    tls: str = ""


@dataclass(frozen=True)
class FeedPlan:
    """Everything a feeding task needs; pickled into its closure."""

    job: str
    token: bytes
    targets: tuple[FeedTarget, ...]
    qname: str = "input"
    train: bool = True
    feed_timeout_s: float = 600.0
    #: Inference: the queue whose results the feeders read.
    qname_out: str = "output"
    #: The job's coordinator traffic is TLS, so its feed must be: every target must have
    #: registered a certificate, and feeders connect only to the node that presents it.
    tls: bool = False

    def target(self, partition: int) -> FeedTarget:
        return self.targets[fw.assign(partition, len(self.targets))]


def _handshake(stream: fw.FeedStream, plan: FeedPlan, target: FeedTarget, opening: fm.Open) -> m.Message:
    """The shared handshake as a feeder, then ``opening``; returns the node's answer to it."""
    peer = f"{target.node} at {target.address}"
    shake = handshake.Connecting(plan.token, m.FEEDER_ROLE, plan.job, fw.FEED_VERSION, peer)
    try:
        challenge = stream.recv()
        if challenge is None:
            raise fw.FeedError(f"{peer} closed the feed connection during the handshake")
        stream.send(shake.hello(challenge))
        welcome = stream.recv()
        if welcome is None:
            raise fw.FeedError(f"{peer} closed the feed connection during the handshake")
        shake.welcome(welcome)
    except RemoteProtocolError as e:
        raise fw.FeedError(f"{peer} did not answer like a tfcoord feed port ({e})") from None
    except (AuthenticationFailed, ConnectionClosed, ProtocolError) as e:
        raise fw.FeedError(f"{target.node} refused the feed: {e}") from None
    stream.send(opening)
    reply = stream.recv()
    if reply is None:
        raise fw.FeedError(f"{peer} closed the feed connection during the handshake")
    if isinstance(reply, m.Error):
        if reply.code == ErrorCode.NODE_FAILED:
            raise fw.FeedError(reply.message)
        raise fw.FeedError(f"{target.node} refused the feed: {reply.message}")
    return reply


def _open(plan: FeedPlan, target: FeedTarget) -> fw.FeedStream:
    if plan.tls and not target.tls:
        raise fw.FeedError(
            f"job {plan.job}'s feed is TLS (its coordinator traffic is), but {target.node} registered no "
            f"feed certificate: refusing to feed it in plaintext"
        )
    try:
        sock = fw.connect(target.address)
    except OSError as e:
        raise fw.FeedError(
            f"cannot reach the feed port of {target.node} at {target.address}: {e}; "
            "the node has ended or failed (see the job's status)"
        ) from None
    if target.tls:
        try:
            sock = feedtls.connect(sock, target.tls, f"{target.node} at {target.address}")
        except feedtls.FeedTlsError as e:
            raise fw.FeedError(str(e)) from None
        except OSError as e:
            raise fw.FeedError(
                f"{target.node} at {target.address} dropped the feed connection during the TLS handshake: "
                f"{e}; the node has ended or failed (see the job's status)"
            ) from None
    return fw.FeedStream(sock)


def feed(plan: FeedPlan, partition: int, records: Iterable[Any]) -> Iterator[Any]:
    """Stream ``records`` (partition ``partition``) to its node; yields results (inference).

    Training feeds return once the node's consumer has reached the partition's end.

    Raises:
        FeedError: the node failed (the message carries its traceback), went away, or
            refused the feed; FeedTimeout: its consumer stalled for ``feed_timeout``;
            UnsupportedRecord: a record cannot travel (the message names the type).
        FeedStopped: inference only, the job stopped before every result came back (after the
            node's own ``DataFeed.terminate()`` the results it gave are yielded, no error).
    """
    target = plan.target(partition)
    stream = _open(plan, target)
    sock = stream.sock
    state = fw.FeederState(node=target.node, qname=plan.qname, train=plan.train)
    silence_s = plan.feed_timeout_s + fw.SILENCE_SLACK_S

    def receive() -> Sequence[Any]:
        try:
            msg = stream.recv()
        except TimeoutError:
            raise fw.FeedError(
                f"no word from {target.node}'s feed port at {target.address} (queue "
                f"{plan.qname!r}) for {silence_s:g} s: is the node still running?"
            ) from None
        except OSError as e:
            raise fw.FeedError(
                f"lost the feed connection to {target.node} at {target.address}: {e}"
            ) from None
        if msg is None:
            raise fw.FeedError(
                f"{target.node} closed the feed connection of queue {plan.qname!r} before the "
                "partition was consumed (its map_fun ended?)"
            )
        return state.handle(msg)

    try:
        sock.settimeout(fw.CONNECT_TIMEOUT_S)
        try:
            opening = fm.Open(
                kind="feed",
                partition=partition,
                qname=plan.qname,
                qname_out=plan.qname_out,
                train=plan.train,
                feed_timeout_s=float(plan.feed_timeout_s),
            )
            welcome = _handshake(stream, plan, target, opening)
        except OSError as e:  # accepted by the kernel, but the node's process ended meanwhile
            raise fw.FeedError(
                f"{target.node} at {target.address} dropped the feed connection: {e}; "
                "the node has ended or failed (see the job's status)"
            ) from None
        if isinstance(welcome, fm.Accepted):
            state.credit = welcome.credit
        else:
            state.handle(welcome)  # a stop, or something no feeder expects here
        sock.settimeout(silence_s)
        packer = fw.BatchPacker()
        for record in records:
            out = packer.add(record)
            if out is None:
                continue
            while not state.can_send and not state.stopped:
                yield from receive()
            if state.stopped:
                break
            _send(sock, out[0], target)
            state.sent(out[1])
        else:
            out = packer.flush()
            if out is not None and not state.stopped:
                while not state.can_send and not state.stopped:
                    yield from receive()
                if not state.stopped:
                    _send(sock, out[0], target)
                    state.sent(out[1])
            if not state.stopped:
                _send(sock, fw.frame(fm.End()), target)
                state.ended = True
        while not state.finished:
            yield from receive()
        # A node that terminated its feed wants no more of it: the results it gave are all
        # there will be (TensorFlowOnSpark skips such partitions). A stopping job is an error.
        if state.stopped and not plan.train and not state.terminated:
            raise fw.FeedStopped(
                f"{target.node} stopped taking data ({state.stopped}) before every result of "
                f"the partition came back"
            )
    finally:
        sock.close()


def _send(sock: socket.socket, frame: bytes, target: FeedTarget) -> None:
    try:
        sock.sendall(frame)
    except OSError as e:
        raise fw.FeedError(f"lost the feed connection to {target.node} at {target.address}: {e}") from None


def control(plan: FeedPlan, target: FeedTarget, kind: str, reason: str = "") -> None:
    """Tell a node's feed ``eof`` (the feed is over) or ``stop`` (take no more data).

    Raises:
        FeedError: the node could not be reached or refused.
    """
    stream = _open(plan, target)
    try:
        stream.sock.settimeout(fw.CONNECT_TIMEOUT_S)
        _handshake(stream, plan, target, fm.Open(kind=kind, reason=reason[: m.MAX_TEXT_LEN]))
    except (OSError, RemoteProtocolError) as e:
        raise fw.FeedError(f"cannot tell {target.node} at {target.address} {kind}: {e}") from None
    finally:
        stream.sock.close()


def train_partition(plan: FeedPlan) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    """The function ``mapPartitionsWithIndex`` runs to train: feed, yield nothing."""

    def run(index: int, records: Iterable[Any]) -> Iterator[Any]:
        for _ in feed(plan, index, records):
            pass
        return iter(())

    return run


def inference_partition(plan: FeedPlan) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    """The function ``mapPartitionsWithIndex`` runs for inference: one result per record."""

    def run(index: int, records: Iterable[Any]) -> Iterator[Any]:
        return feed(plan, index, records)

    return run
