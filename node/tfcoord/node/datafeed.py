"""A node's feed server and the ``DataFeed`` its ``map_fun`` reads (TensorFlowOnSpark's ``TFNode.DataFeed``).

The supervisor binds the feed port before it registers (advertising it as
``feed_address``) and the forked ``map_fun`` process inherits the listening socket, so
feeders that connect early simply wait in the backlog. Inside ``map_fun``'s process a
:class:`FeedServer` accepts feeding tasks (one thread per connection, reading batches
into a :class:`~tfcoord.node.feedqueue.FeedQueue` per queue name), and a watchdog
thread sends keepalives and fails the feeders of a queue whose consumer stalled for
``feed_timeout``. :class:`DataFeed` is the consumer's view: ``next_batch``,
``batch_results``, ``should_stop``, ``terminate``, and ``dataset`` for tf.data.

Stopping comes in three strengths:

* ``eof`` (the driver's ``shutdown``): the feed ends once the partitions being fed are done;
* ``stop`` (the job is stopping): feeders are told to send nothing more; what they already
  handed over is still consumed, then ``should_stop()`` turns true;
* ``terminate`` (``DataFeed.terminate()``): as ``stop``, and what is queued is dropped
  (TensorFlowOnSpark drains its queue the same way). It ends this node's feed only, as in
  TensorFlowOnSpark: its feeding tasks skip the rest of their partitions without error
  (also once ``map_fun`` has returned: the node's supervisor answers them until the job
  ends), while the other nodes are fed on. The node's status shows ``feed_terminated``,
  which a streaming job's ``shutdown(ssc)`` takes as its stop request.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfcoord.client import feedmessages as fm
from tfcoord.client import handshake
from tfcoord.client import messages as m
from tfcoord.client.errors import LocalProtocolError, RemoteProtocolError, TfcoordError
from tfcoord.client.vocab import ErrorCode

from . import feedtls
from . import feedwire as fw
from .feedqueue import FeedQueue
from .feedtls import FeedIdentity

log = logging.getLogger("tfcoord.feed")

#: A feeder must finish its handshake (TLS included) this soon after connecting, however it
#: trickles its bytes: a live one does in milliseconds (OpenSSH's LoginGraceTime).
HANDSHAKE_TIMEOUT_S = 10.0
#: Connections still in their handshake at once: feeding tasks connect a few at a time (one
#: per Spark task slot feeding this node), so beyond this the node closes new ones at once,
#: without a thread for them (OpenSSH's MaxStartups).
MAX_UNAUTHENTICATED = 16
#: Feeders connected at once: each is a thread; Spark runs at most one feeding task per core
#: of the application, so this is far above any real cluster's feeding of one node.
MAX_FEEDERS = 256
#: How often the watchdog looks for a stalled consumer: well under the smallest useful
#: feed_timeout (1 s), so a stall is reported within a fifth of a second of the deadline.
WATCHDOG_PERIOD_S = 0.2
#: How long ``next_batch`` sleeps between looks when nothing arrives (woken on any arrival).
WAIT_SLICE_S = 1.0
#: A feeder may be silent for long (its partition's upstream is slow), so feed connections
#: have no read timeout; TCP keepalive finds a feeder whose host died (idle, interval,
#: probes: about 25 s) so its partition does not hold the queue open forever.
KEEPALIVE_PROBE = (10, 5, 3)
#: How long the watchdog waits for the coordinator to hear of a stalled queue before it
#: answers the feeders anyway: a stop request takes milliseconds on a live coordinator.
STALL_REPORT_S = 10.0


@dataclass
class _Conn:
    pid: int
    sock: socket.socket
    qname: str
    train: bool
    feed_timeout_s: float
    qname_out: str = "output"
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Records taken by the consumer whose results have not come back (inference).
    owed: int = 0

    def send(self, frame: bytes) -> None:
        try:
            with self.lock:
                self.sock.sendall(frame)
        except OSError:
            pass  # the feeder went away; its reader thread cleans up


class FeedServer:
    """Serves feeding tasks on an already listening socket, inside ``map_fun``'s process.

    Args:
        listener: a listening TCP socket (inherited from the supervisor).
        token: the job token feeders must prove they hold.
        job: the job id feeders must name.
        node: how errors name this node (``worker:0 (executor 1, host h)``).
        on_terminate: called once with a reason when ``DataFeed.terminate()`` runs, to tell
            the node's supervisor (which shows it in the node's status).
        queues: the queue names the cluster declared (``run(..., queues=...)``); a DataFeed
            naming another is refused. None: any name.
        on_stall: called once with the message when a queue's consumer stalled for its
            ``feed_timeout``, before the feeders hear of it: it stops the job with the reason
            ``feed_timeout``, so the nodes do not wait for data that never comes (an
            inference's feeding Spark job fails lazily, in the user's action) and the
            driver's ``train()`` decides on that reason, not on Spark's failure text (a
            training feeder that Spark retries is told "stop" and ends quietly).
        tls: serve TLS with this identity (:mod:`.feedtls`: the job's coordinator traffic is
            TLS); a peer that does not complete the TLS handshake is dropped before a byte
            of the feed protocol. None: plaintext (an explicitly plaintext job).
    """

    def __init__(
        self,
        listener: socket.socket,
        token: bytes,
        job: str,
        node: str,
        on_terminate: Callable[[str], None] | None = None,
        on_stall: Callable[[str], None] | None = None,
        queues: tuple[str, ...] | None = None,
        tls: FeedIdentity | None = None,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        max_unauthenticated: int = MAX_UNAUTHENTICATED,
        max_feeders: int = MAX_FEEDERS,
    ) -> None:
        self._listener = listener
        self.handshake_timeout_s = handshake_timeout_s
        self.max_unauthenticated = max_unauthenticated
        self.max_feeders = max_feeders
        #: Connections in their handshake, and all connections being served (each a thread).
        self._unauthenticated = 0
        self._served = 0
        #: Connections closed at once because a cap was reached (counted for the tests' and
        #: the logs' sake).
        self.refused = 0
        self.queues = queues
        self._tls = tls
        self._token = token
        self._job = job
        self.node = node
        self._on_terminate = on_terminate
        self._on_stall = on_stall
        self._cond = threading.Condition()
        self._queues: dict[str, FeedQueue] = {}
        self._conns: dict[int, _Conn] = {}
        self._progress_at: dict[str, float] = {}
        self._next_pid = 0
        self._eof = False
        self._stopped = ""  # why the node takes no more data
        self._failed = ""  # map_fun's traceback, once it failed
        self._closed = threading.Event()
        #: Set once the driver said the feed is over (``eof``: its ``shutdown()``).
        self.feed_over = threading.Event()
        self.terminated = False
        #: Partitions fed from inside this process (``open_local``), and the results
        #: ``batch_results`` sent back for their records, by the queue they went to.
        self._local: set[int] = set()
        self._local_results: dict[str, deque[Any]] = {}

    def start(self) -> FeedServer:
        for target, name in (
            (self._accept_loop, "tfcoord-feed-accept"),
            (self._watchdog, "tfcoord-feed-watchdog"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self

    # -- consumer side (DataFeed) -------------------------------------------------------------

    def queue(self, name: str) -> FeedQueue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = FeedQueue(name)
            if self._eof or self._stopped:
                q.set_eof()
        return q

    def take(
        self, qname: str, n: int, partition_bound: bool
    ) -> tuple[list[Any], list[tuple[int, int]], bool]:
        """Block for the next batch: (records, segments, end of feed)."""
        records: list[Any] = []
        segments: list[tuple[int, int]] = []
        while True:
            with self._cond:
                q = self.queue(qname)
                t = q.take(n - len(records), partition_bound=partition_bound, have=len(records))
                if t.records or t.finished:
                    self._progress_at[qname] = time.monotonic()
                records += t.records
                for pid, k in t.segments:
                    c = self._conns.get(pid)
                    if c is not None and not c.train:
                        c.owed += k
                    if segments and segments[-1][0] == pid:
                        segments[-1] = (pid, segments[-1][1] + k)
                    else:
                        segments.append((pid, k))
                effects = [(self._conns.get(pid), fw.frame(fm.Credit(n=k))) for pid, k in t.credits.items()]
                effects += [(self._conns.get(pid), fw.frame(fm.Done())) for pid in t.finished]
                over = len(records) >= n or t.eof or (partition_bound and records and t.finished)
                if not over and not effects:
                    self._cond.wait(WAIT_SLICE_S)
            for conn, frame in effects:  # outside the lock: a send may block on a slow feeder
                if conn is not None:
                    conn.send(frame)
            if over:
                return records, segments, t.eof

    def check_queue(self, qname: str, what: str) -> None:
        """Refuse a queue name the cluster did not declare (``what``: the argument that named it)."""
        if self.queues is not None and qname not in self.queues:
            raise ValueError(
                f"unknown queue {qname!r} ({what}): this cluster's queues are {list(self.queues)}; "
                "declare it in run(..., queues=[...])"
            )

    def results(self, segments: list[tuple[int, int]], results: list[Any], qname_out: str = "output") -> None:
        """Send the results of the last batch back to the feeders its records came from.

        ``qname_out`` is the queue they go to: each feeder reads the results of the queue it
        named (``cluster.inference(..., qname_out=...)``, ``output`` by default).
        """
        total = sum(k for _, k in segments)
        if len(results) != total:
            raise ValueError(
                f"batch_results got {len(results)} results for a batch of {total} records: "
                "return exactly one result per record, in order"
            )
        with self._cond:
            readers = {
                c.qname_out for pid, _ in segments if (c := self._conns.get(pid)) is not None and not c.train
            }
        if readers - {qname_out}:
            raise ValueError(
                f"batch_results puts results on queue {qname_out!r} (DataFeed qname_out), but the feeding "
                f"tasks of this batch read queue {sorted(readers)[0]!r} (cluster.inference(..., qname_out=...)): "
                "name the same queue on both sides"
            )
        i = 0
        for pid, k in segments:
            chunk, i = results[i : i + k], i + k
            with self._cond:
                if pid in self._local:  # fed from this process: its readers get_local() them
                    self._local_results.setdefault(qname_out, deque()).extend(chunk)
                    self._cond.notify_all()
                    continue
                conn = self._conns.get(pid)
                if conn is None or conn.train:
                    continue
                conn.owed -= k
                self._progress_at[conn.qname] = time.monotonic()
            for frame in _result_frames(chunk):
                conn.send(frame)

    # -- producers and readers inside this process (TensorFlowOnSpark's TFManager queues) --

    def open_local(self, qname: str) -> int:
        """Open a partition fed from inside this process: no connection and no credit window,
        the producer is the consumer's own process (a ``TFManager`` queue's ``put``). Returns its
        id for :meth:`put_local` and :meth:`end_local`.

        Raises:
            ValueError: ``qname`` is not one of the declared queues.
        """
        self.check_queue(qname, "qname")
        with self._cond:
            pid, self._next_pid = self._next_pid, self._next_pid + 1
            self._local.add(pid)
            self.queue(qname).open(pid)
            self._progress_at.setdefault(qname, time.monotonic())
        return pid

    def put_local(self, pid: int, records: Sequence[Any]) -> None:
        """Queue ``records`` of a local partition; dropped once the feed was stopped, as a feeder's."""
        with self._cond:
            q = next((q for q in self._queues.values() if pid in q), None)
            if q is None or self._stopped:
                return
            if not q.buffered:  # the consumer's clock starts when data waits for it
                self._progress_at[q.name] = time.monotonic()
            q.put(pid, records)
            self._cond.notify_all()

    def end_local(self, pid: int) -> None:
        """End a local partition (TensorFlowOnSpark's ``EndPartition`` marker)."""
        with self._cond:
            for q in self._queues.values():
                if pid in q:
                    q.end(pid)
            self._cond.notify_all()

    def end_queue(self, qname: str) -> None:
        """End the feed of one queue once what is queued is taken (TensorFlowOnSpark's ``None``)."""
        with self._cond:
            self.queue(qname).set_eof()
            self._cond.notify_all()

    def local_size(self, qname: str) -> int:
        """Items :meth:`get_local` has for ``qname`` now."""
        with self._cond:
            q = self._queues.get(qname)
            return len(self._local_results.get(qname, ())) + (q.buffered if q is not None else 0)

    def get_local(self, qname: str, timeout_s: float | None = None) -> Any:
        """The next item of queue ``qname`` for a reader in this process: a result that
        ``batch_results`` sent back for locally fed records (inference's ``output``), else a record
        waiting in the queue; None once the queue's feed ended with nothing left.

        Raises:
            queue.Empty: nothing came within ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                results = self._local_results.get(qname)
                if results:
                    return results.popleft()
                q = self._queues.get(qname)
                if q is not None and q.buffered:
                    break
                if q is not None and q.eof and not q.partitions:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Empty
                self._cond.wait(WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S))
        records, _, _ = self.take(qname, 1, partition_bound=False)
        return records[0] if records else None

    def stop(self, reason: str, *, drop: bool = False) -> None:
        """Take no more data: feeders are told to stop; queued records stay unless ``drop``."""
        with self._cond:
            if not self._stopped:
                self._stopped = reason or "the node takes no more data"
            for q in self._queues.values():
                if drop:
                    q.clear()
                else:
                    for pid in q.partitions:
                        q.end(pid)
                q.set_eof()
            conns = list(self._conns.values())
            self._cond.notify_all()
        frame = fw.frame(fm.Stop(reason=self._stopped, terminated=self.terminated))
        for c in conns:
            c.send(frame)

    def terminate(self, reason: str = "") -> None:
        reason = reason or f"DataFeed.terminate() on {self.node}"
        first = not self.terminated
        self.terminated = True
        self.stop(reason, drop=True)
        if first and self._on_terminate is not None:
            self._on_terminate(reason)

    def end_of_feed(self) -> None:
        self.feed_over.set()
        with self._cond:
            self._eof = True
            for q in self._queues.values():
                q.set_eof()
            self._cond.notify_all()

    def fail(self, error: str) -> None:
        """map_fun failed: every feeder of this node hears why (then the process exits)."""
        with self._cond:
            self._failed = error
            conns = list(self._conns.values())
        frame = fw.frame(
            m.Error(
                id=None, code=ErrorCode.NODE_FAILED, message=_tail(f"map_fun on {self.node} failed:\n{error}")
            )
        )
        for c in conns:
            c.send(frame)

    def close(self) -> None:
        """Accept no more feeders and drop the connections still open (they see the feed end)."""
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._cond:
            conns = list(self._conns.values())
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def settle(self, timeout_s: float | None = None) -> bool:
        """Block until every feed connection still in its handshake has had its answer (the
        feed stopped, or why map_fun failed), at most the handshake deadline; True if none is
        left. The process serving the feed may end after this: ending it sooner cut such a
        feeder off mid-handshake, and it saw only a reset, not why (after ``terminate()`` its
        Spark task failed and was retried). Call after :meth:`stop` or :meth:`fail` and
        :meth:`close` (no new connection comes), so every connection left is answered."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._served <= len(self._conns),
                self.handshake_timeout_s if timeout_s is None else timeout_s,
            )

    # -- feeder side ---------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._cond:
                full = self._unauthenticated >= self.max_unauthenticated or self._served >= self.max_feeders
                if not full:
                    self._unauthenticated += 1
                    self._served += 1
                else:
                    self.refused += 1
            if full:
                # No thread, no read: closed at once (the feeding task fails saying the node
                # dropped the connection, and Spark retries it).
                log.warning("%s: too many feed connections at once; closed a new one", self.node)
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), name="tfcoord-feed-conn", daemon=True).start()

    def _authenticated(self) -> None:
        with self._cond:
            self._unauthenticated -= 1

    def _serve(self, sock: socket.socket) -> None:
        conn: _Conn | None = None
        stream = fw.FeedStream(sock, authenticated=False)
        # The whole handshake has one deadline: a per-read timeout alone is reset by every
        # byte, so a peer trickling its hello could hold the connection (and its thread).
        grace = threading.Timer(self.handshake_timeout_s, _cut, args=(sock,))
        grace.daemon = True
        grace.start()
        unauthenticated = True
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _keepalive(sock)
            sock.settimeout(self.handshake_timeout_s)
            if self._tls is not None:
                try:
                    sock = feedtls.accept(sock, self._tls)
                except (OSError, ValueError) as e:  # plaintext, or not TLS 1.3: refused
                    log.debug("refused a feed connection to %s that did not complete TLS: %s", self.node, e)
                    return
                grace.cancel()  # the TLS socket wraps the same descriptor: cut that one
                grace = threading.Timer(self.handshake_timeout_s, _cut, args=(sock,))
                grace.daemon = True
                grace.start()
                stream = fw.FeedStream(sock, authenticated=False)
            opening = self._handshake(stream)
            grace.cancel()
            if opening is None:
                return
            stream.authenticated()
            unauthenticated = False
            self._authenticated()
            if opening.kind == "eof":
                self.end_of_feed()
                stream.send(fm.Accepted(credit=0, node=self.node))
                return
            if opening.kind == "stop":
                self.stop(opening.reason or "the job is stopping")
                stream.send(fm.Accepted(credit=0, node=self.node))
                return
            early: m.Message | None = None
            with self._cond:
                if self._failed:
                    early = m.Error(
                        id=None,
                        code=ErrorCode.NODE_FAILED,
                        message=_tail(f"map_fun on {self.node} failed:\n{self._failed}"),
                    )
                elif self._stopped:
                    early = fm.Stop(reason=self._stopped, terminated=self.terminated)
                else:
                    pid, self._next_pid = self._next_pid, self._next_pid + 1
                    conn = _Conn(
                        pid,
                        sock,
                        opening.qname,
                        opening.train,
                        float(opening.feed_timeout_s),
                        opening.qname_out,
                    )
                    self._conns[pid] = conn
                    self._cond.notify_all()  # one fewer in its handshake (settle)
                    q = self.queue(conn.qname)
                    q.open(pid)
                    self._progress_at.setdefault(conn.qname, time.monotonic())
            if early is not None:
                stream.send(early)
                return
            assert conn is not None
            sock.settimeout(None)
            conn.send(fw.frame(fm.Accepted(credit=fw.WINDOW_BATCHES, node=self.node)))
            self._read_partition(conn, stream)
        except (OSError, TfcoordError, ValueError, KeyError) as e:
            log.debug("feed connection ended: %s", e)
        finally:
            grace.cancel()
            with self._cond:
                self._served -= 1
                if unauthenticated:
                    self._unauthenticated -= 1
                self._cond.notify_all()  # settle
            if conn is not None:
                with self._cond:
                    self._conns.pop(conn.pid, None)
                    dropped = self.queue(conn.qname).drop(conn.pid)
                    self._cond.notify_all()
                if dropped:
                    log.warning(
                        "a feeder of %s left with %d records of its partition untaken; dropped",
                        self.node,
                        dropped,
                    )
            sock.close()

    def _handshake(self, stream: fw.FeedStream) -> fm.Open | None:
        """The shared handshake as the accepting side, then the feeder's Open; None if refused."""
        accepting = handshake.Accepting(fw.FEED_VERSION, (m.FEEDER_ROLE,), self._key_for)
        stream.send(accepting.challenge())
        try:
            hello = stream.recv()
            if hello is None:
                return None
            stream.send(accepting.accept(hello))
        except handshake.HandshakeRefused as e:
            stream.send(m.Error(id=None, code=e.code, message=e.message))
            return None
        except RemoteProtocolError as e:
            stream.send(m.Error(id=None, code=ErrorCode.PROTOCOL_ERROR, message=str(e)))
            return None
        try:
            opening = stream.recv()
        except RemoteProtocolError as e:  # a bad queue name or timeout: the message says which
            stream.send(m.Error(id=None, code=ErrorCode.REFUSED, message=str(e)))
            return None
        if not isinstance(opening, fm.Open):
            if opening is not None:
                stream.send(
                    m.Error(id=None, code=ErrorCode.REFUSED, message=f"expected open, not {opening.op}")
                )
            return None
        return opening

    def _key_for(self, role: str, job: str | None) -> handshake.KeyFor:
        if job != self._job:
            raise handshake.HandshakeRefused(
                ErrorCode.REFUSED, f"this node belongs to job {self._job}, not {job!r}"
            )
        return handshake.KeyFor(self._token, "this job's token")

    def _read_partition(self, conn: _Conn, stream: fw.FeedStream) -> None:
        while True:
            msg = stream.recv()
            if msg is None:
                return
            if isinstance(msg, fm.Batch):
                with self._cond:
                    if self._stopped or conn.pid not in self._queues[conn.qname]:
                        continue  # told to stop; batches already in flight are not taken
                    q = self._queues[conn.qname]
                    if not q.buffered:  # the consumer's clock starts when data waits for it
                        self._progress_at[conn.qname] = time.monotonic()
                    q.put(conn.pid, msg.records)  # a list, as msgpack decoded it
                    self._cond.notify_all()
            elif isinstance(msg, fm.End):
                with self._cond:
                    if conn.pid in self._queues[conn.qname]:
                        self._queues[conn.qname].end(conn.pid)
                    self._cond.notify_all()
            else:
                raise fw.FeedError(f"unexpected feed message {msg.op!r}")

    def _watchdog(self) -> None:
        next_keepalive = time.monotonic() + fw.KEEPALIVE_S
        keepalive = fw.frame(fm.Keepalive())
        while not self._closed.wait(WATCHDOG_PERIOD_S):
            now = time.monotonic()
            stalled: list[tuple[_Conn, bytes]] = []
            with self._cond:
                for qname, q in self._queues.items():
                    conns = [c for c in self._conns.values() if c.qname == qname]
                    if not conns:
                        continue
                    waiting, owed = q.buffered, sum(c.owed for c in conns)
                    if not waiting and not owed:
                        continue
                    timeout = min(c.feed_timeout_s for c in conns)
                    idle = now - self._progress_at.get(qname, now)
                    if idle < timeout:
                        continue
                    what = (
                        f"took no records from queue {qname!r} for {idle:.1f} s while {waiting} were waiting"
                        if waiting
                        else f"returned no results for {owed} records of queue {qname!r} for {idle:.1f} s"
                    )
                    message = (
                        f"feed_timeout ({timeout:g} s): {self.node} {what}; is map_fun reading "
                        f"ctx.get_data_feed(qname_in={qname!r}) until should_stop()?"
                    )
                    frame = fw.frame(m.Error(id=None, code=ErrorCode.FEED_TIMEOUT, message=message))
                    for c in conns:
                        q.drop(c.pid)
                        del self._conns[c.pid]
                        stalled.append((c, frame))
            if stalled and self._on_stall is not None:
                on_stall, self._on_stall = self._on_stall, None
                self._report_stall(on_stall, message)
            for c, frame in stalled:
                c.send(frame)
                try:
                    c.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if now >= next_keepalive:
                next_keepalive = now + fw.KEEPALIVE_S
                with self._cond:
                    conns = list(self._conns.values())
                for c in conns:
                    c.send(keepalive)

    @staticmethod
    def _report_stall(on_stall: Callable[[str], None], message: str) -> None:
        """Tell the coordinator of a stall before the feeders hear of it: their Spark job
        fails only after this, so the driver finds the job's reason (``feed_timeout``) as
        data when it looks. Bounded: an unreachable coordinator delays the feeders' answer
        (and the keepalives of other queues) by at most :data:`STALL_REPORT_S`."""
        reporter = threading.Thread(target=on_stall, args=(message,), name="tfcoord-feed-stall", daemon=True)
        reporter.start()
        reporter.join(STALL_REPORT_S)


def _result_frames(results: list[Any]) -> list[bytes]:
    """``results`` frames holding ``results`` in order, each within the frame limit."""
    try:
        return [fw.frame(fm.Results(results=results))]
    except LocalProtocolError:  # too large for one frame: halve until each half fits
        if len(results) == 1:
            raise fw.FeedError(
                f"one inference result is over the {fw.MAX_FRAME_BYTES}-byte frame limit"
            ) from None
        half = len(results) // 2
        return _result_frames(results[:half]) + _result_frames(results[half:])
    except (TypeError, ValueError) as e:
        raise fw.UnsupportedRecord(
            f"inference results cannot be sent back: {e}; return None, bools, numbers, str, bytes, "
            "numpy arrays or scalars, lists or dicts"
        ) from None


def _cut(sock: socket.socket) -> None:
    """End a connection whose handshake ran past its deadline: its reader wakes and fails."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # the peer closed it first: already cut


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    opts = ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT")
    for name, value in zip(opts, KEEPALIVE_PROBE, strict=True):
        if hasattr(socket, name):  # Linux; elsewhere the system's defaults apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _tail(text: str, limit: int = 64 * 1024) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


class DataFeed:
    """What ``map_fun`` reads fed data from (TensorFlowOnSpark's ``TFNode.DataFeed``).

    Args:
        server: the node's feed server (``ctx.mgr``).
        train_mode: batches may run across partitions; with False (inference) a batch
            never spans two partitions, and ``batch_results`` must follow each batch.
        qname_in: the queue to read (``cluster.train(..., qname=...)``).
        qname_out: the queue ``batch_results`` puts results on: the feeding tasks of
            ``cluster.inference(..., qname_out=...)`` (``output`` by default) read it, so both
            must name the same queue.
        input_mapping: ``{column: tensor_name}``; when given, ``next_batch`` returns
            ``{tensor_name: [values]}`` with columns taken in sorted column order.
    """

    def __init__(
        self,
        server: FeedServer,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(server, FeedServer):
            raise RuntimeError(
                "this node has no data feed: start the cluster with input_mode=InputMode.SPARK "
                "and feed it with cluster.train() or cluster.inference()"
            )
        server.check_queue(qname_in, "qname_in")
        server.check_queue(qname_out, "qname_out")
        self.server = server
        self.train_mode = train_mode
        self.qname_in = qname_in
        self.qname_out = qname_out
        self.input_tensors = [t for _, t in sorted(input_mapping.items())] if input_mapping else None
        self.done_feeding = False
        self._segments: list[tuple[int, int]] = []

    def next_batch(self, batch_size: int) -> Any:
        """Up to ``batch_size`` records; fewer at the end of the feed (or of a partition, inference).

        Blocks until records arrive or the feed ends.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        records, self._segments, eof = self.server.take(self.qname_in, batch_size, not self.train_mode)
        if eof:
            self.done_feeding = True
        if self.input_tensors is None:
            return records
        return {t: [r[i] for r in records] for i, t in enumerate(self.input_tensors)}

    def should_stop(self) -> bool:
        """True once the feed has ended (shutdown, a stop, or ``terminate``)."""
        return self.done_feeding

    def batch_results(self, results: Any) -> None:
        """Return one result per record of the last batch, in order (inference)."""
        self.server.results(self._segments, list(results), self.qname_out)

    def terminate(self) -> None:
        """End this node's feed early: queued records are dropped and its feeding tasks skip
        the rest of their partitions; other nodes are fed on (TensorFlowOnSpark's semantics)."""
        self.server.terminate()
        self.done_feeding = True

    def records(self, batch_size: int = 1024) -> Iterator[Any]:
        """Every fed record, one at a time, until the feed ends."""
        while not self.should_stop():
            batch = self.next_batch(batch_size)
            yield from batch if self.input_tensors is None else zip(*batch.values(), strict=True)

    def dataset(self, output_signature: Any, batch_size: int = 1024) -> Any:
        """The feed as a ``tf.data.Dataset`` of single records (``from_generator``).

        ``output_signature`` describes one record, e.g.
        ``(tf.TensorSpec((), tf.float32), tf.TensorSpec((), tf.int64))``. Batch the
        dataset yourself; training mode only (inference needs ``batch_results``).
        """
        import tensorflow as tf

        def gen() -> Iterator[Any]:
            for r in self.records(batch_size):
                yield tuple(r) if isinstance(r, list) else r

        return tf.data.Dataset.from_generator(gen, output_signature=output_signature)
