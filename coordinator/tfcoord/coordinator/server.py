"""The asyncio server: it only moves bytes (after uvicorn's h11_impl).

Each connection feeds received bytes to a sans-io :class:`Connection`, drains the
messages, turns each request into a state-machine event, and carries out the
effects: journal records are committed once per event-loop turn (group commit),
then the replies are written. Long waits are just requests whose reply comes
later, pushed when the state machine says so; the server never polls.

Bad input never reaches the state machine: frames are size-checked before they
are read, messages are validated field by field, and a node may act only within
the job its handshake named. Any protocol error gets an error frame and a close.

Slow or silent peers cost a socket for a bounded time and nothing else: each
connection has one watchdog timer, re-armed lazily (received bytes only note the
time), that enforces the handshake deadline, a deadline for finishing a frame once
it has started (a client that trickles a frame byte by byte, or stalls inside one),
and an idle timeout for authenticated connections with nothing pending. A peer
that does not read its replies is not read from either (write backpressure), so it
cannot make the coordinator buffer without bound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from tfcoord.client import auth
from tfcoord.client import messages as m
from tfcoord.client.errors import LocalProtocolError, ProtocolError
from tfcoord.client.handshake import Accepting, HandshakeRefused, KeyFor
from tfcoord.client.protocol import DEFAULT_MAX_FRAME_BYTES, ClusterReplyFrames, Connection, DecodeBudget
from tfcoord.client.vocab import ErrorCode

from . import state as s
from .journal import Journal, MemoryJournal, OutputBatch, SqliteJournal, event_job
from .keptoutput import OUTPUT_INTERVAL_S, OutputKeeper
from .logsafe import protect

log = protect(logging.getLogger("tfcoord.coordinator"))

#: A client must finish its hello within this; slow or silent peers cost a socket, no more.
HANDSHAKE_TIMEOUT_S = 10.0
#: Once a frame's first byte is in, the rest must follow within this. A client's largest
#: real frame is a failure report (a 64 KiB traceback), which even a 20 kbit/s link
#: delivers in 30 s; a peer that trickles a frame byte by byte is cut off here.
FRAME_TIMEOUT_S = 30.0
#: An authenticated connection with no request pending that sends nothing for this long
#: is closed. Nodes heartbeat every 2 s and keep an await_stop pending, and drivers keep
#: an await pending, so only abandoned connections (a client host that vanished without
#: a FIN, a leaked client) ever get here; a live blocking client simply reconnects.
IDLE_TIMEOUT_S = 600.0
#: After an error frame, the peer gets this long to read it before the socket is torn
#: down anyway: a peer that never reads must not keep a closing connection forever.
CLOSE_LINGER_S = 5.0
#: Each node keeps one connection; 20,000 covers the largest clusters we aim at. The
#: default is lowered to what the descriptor limit allows (see :func:`connection_budget`).
DEFAULT_MAX_CONNECTIONS = 20_000
#: Until a peer has proved itself it may send one hello, which is under 200 bytes: a
#: frame announcing more is refused before a byte of it is buffered, so unauthenticated
#: peers cannot make the coordinator hold megabytes each (the post-handshake limit).
PRE_AUTH_MAX_FRAME_BYTES = 4 * 1024
#: What one frame from any peer may cost to decode (see ``protocol.DecodeBudget``). The
#: largest real requests hold a few dozen maps and lists: a job spec's roles and launch
#: resources, a registration's metadata, 256 log lines. 1,024 containers and 65,536 entries
#: leave ample room, and keep the worst frame a token holder can send to a few milliseconds
#: of the loop that every job's heartbeats share (an 8 MiB frame of empty maps cost 0.7 s).
FRAME_BUDGET = DecodeBudget(max_containers=1024, max_entries=65_536, max_length=16_384)
#: Connections that have not finished their handshake, apart from the authenticated
#: ones: idle sockets of strangers fill this budget, never the one nodes and drivers use.
#: Honest clients spend milliseconds here, so even a reconnect storm of 10,000 nodes
#: (the load benchmark: 1,024 handshakes in flight) fits.
DEFAULT_MAX_UNAUTHENTICATED = 4096
#: Handshakes in flight from one source address: by default this fraction of the handshake
#: budget (a quarter: 1,024 of 4,096), so one host, however many idle sockets it opens,
#: leaves three quarters of the budget to every other host. Honest handshakes last
#: milliseconds, so even a host running many executors rarely has more than a few in
#: flight; one host that simulates thousands of nodes at once (the benchmarks) raises it
#: with ``serve --max-unauthenticated-per-source`` (``TFCOORD_MAX_UNAUTHENTICATED_PER_SOURCE``).
PER_SOURCE_SHARE = 4
DEFAULT_MAX_UNAUTHENTICATED_PER_SOURCE = DEFAULT_MAX_UNAUTHENTICATED // PER_SOURCE_SHARE
#: HTTP connections served at once, apart from the node port's budget: a few dashboards,
#: Prometheus and probes need tens. Beyond it a connection is answered 503 and closed.
#: Here, not in ``http``, so budgets can be checked without importing aiohttp.
DEFAULT_MAX_HTTP_CONNECTIONS = 256
#: Descriptors kept for everything but client connections: listeners, the journal and
#: its WAL, logs, the Mesos framework's HTTP client, Python's own.
RESERVED_FDS = 64
#: Accept failures (EMFILE when descriptors run out) are logged at most once per this
#: interval with a count: asyncio logs one per attempt, which was 780,000 lines in 90 s.
ACCEPT_ERROR_LOG_INTERVAL_S = 10.0
#: Outstanding requests per connection: a node needs ~3 (await_cluster, await_stop,
#: heartbeat); a driver a few watches. More is a misbehaving client.
MAX_PENDING_PER_CONNECTION = 64
#: A failed journal commit (a full or failing disk) is retried after this; its replies wait.
COMMIT_RETRY_S = 1.0
#: Liveness events: their replies skip the group commit when they depend on nothing
#: uncommitted, so a registration burst's commits never delay another job's heartbeats.
_LIVENESS = frozenset(
    {s.HeartbeatNode, s.ProgressNode, s.NodeLogsEvent, s.ReportNode, s.AwaitStopEvent, s.AwaitClusterEvent}
)
#: Requests read and handled whatever the bulk budget says (see ``bulk_allowed``).
_LIVENESS_OPS = frozenset({m.Heartbeat, m.Report})
#: Bulk work (handshakes, registrations, waits) per event-loop turn, and the time spent
#: writing committed replies per turn. Both run after the turn's reads (``_after_reads``),
#: so a heartbeat waits for at most the rest of the turn it arrived in: these two, the
#: accepts, and the reads of everything that arrived during the turn before, which grow
#: with the turn. 10 ms each gave turns of 40-80 ms in a 10,000-node burst, 5 ms about
#: half that; at 2 ms (with the accepts capped below and the reads first) the burst's
#: turns were 12-18 ms of CPU at p99 where they were 30-37 ms, and the burst took as long
#: (docs/benchmarks.md, Fairness).
BULK_BUDGET_S = 0.002
WRITE_BUDGET_S = 0.002
#: The kernel's queue of connections not yet accepted: a burst of 10,000 nodes from a few
#: hosts arrives faster than the coordinator accepts, and a full queue drops SYNs (each a
#: 1 s retransmit for its node).
LISTEN_BACKLOG = 4096
#: Connections accepted per loop turn. asyncio accepts as many per turn as the backlog it is
#: given, each with a task, a transport and a challenge (about 65 us): a queue of hundreds
#: at once was a turn of tens of milliseconds that every heartbeat waited behind. The rest
#: wait in the kernel's queue for the next turns.
ACCEPTS_PER_TURN = 16


def _after_reads(callback: Callable[[], None]) -> None:
    """Run ``callback`` in the next loop turn, after that turn's reads and accepts.

    asyncio runs a turn's callbacks in this order: those scheduled with ``call_soon`` during
    the turn before, then the reads and accepts its select found, then the timers due. The
    budgeted work (bulk requests, committed replies) scheduled with ``call_soon`` ran ahead
    of the reads, so a heartbeat that arrived during one turn's budgets waited for the next
    turn's budgets as well; as a timer due at once it runs after the next turn's reads, and
    a heartbeat waits for at most the rest of the turn it arrived in.
    """
    loop = asyncio.get_running_loop()
    loop.call_at(loop.time(), callback)


def per_source_budget(max_unauthenticated: int, per_source: int | None = None) -> int:
    """Handshakes in flight allowed from one source address: ``per_source`` if given, else
    :data:`PER_SOURCE_SHARE`'s fraction of ``max_unauthenticated`` (at least 1); never more
    than ``max_unauthenticated``."""
    if per_source is None:
        per_source = max(1, max_unauthenticated // PER_SOURCE_SHARE)
    return max(1, min(per_source, max_unauthenticated))


@dataclass(frozen=True)
class ServerConfig:
    secret: bytes
    #: The admin credential (sees and stops every job); None: no admin may connect.
    admin_secret: bytes | None = None
    host: str = "127.0.0.1"
    port: int = 0
    #: A socket already bound (and possibly listening) to serve on instead of binding
    #: ``host``/``port``: for a caller that must hold its port from the moment it picked it
    #: (TensorFlowOnSpark's ``reservation.Server`` takes the first free port of a range).
    sock: socket.socket | None = None
    #: Authenticated connections (nodes, drivers, admins).
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: Connections still in their handshake, in all and per source address.
    max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED
    #: None: :func:`per_source_budget` of ``max_unauthenticated`` (a quarter of it).
    max_unauthenticated_per_source: int | None = None
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    frame_timeout_s: float = FRAME_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    #: TLS (see ``tfcoord.client.tls.server_context``); the TLS handshake itself must also
    #: finish within ``handshake_timeout_s``.
    ssl_context: ssl.SSLContext | None = None
    #: Finished jobs kept, by count and by age (see ``state.KEEP_FINISHED_JOBS``).
    keep_finished_jobs: int = s.KEEP_FINISHED_JOBS
    keep_finished_s: float = s.KEEP_FINISHED_S


def _job_token_names(job: str) -> tuple[str, str]:
    """How a refused node handshake names the job token it did not prove, and what to check."""
    return (
        f"the job token of {job} (or there is no such job)",
        ". Check the secret file (TFCOORD_SECRET_FILE), and that the token belongs to this job",
    )


class BudgetError(ValueError):
    """The connection caps cannot fit the process's descriptor limit; the message says what to do."""


def fd_limit() -> int:
    """The soft RLIMIT_NOFILE of this process (a large number where there is none)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1 << 20
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_budget(
    max_connections: int | None, max_unauthenticated: int, http_connections: int, limit: int | None = None
) -> int:
    """The authenticated-connection cap to serve with, checked against the descriptor limit.

    Every connection costs a descriptor, and running out of them does not refuse the one
    connection too many: it stops accept() for everyone, and asyncio then logs without
    end. So the caps must add up to less than RLIMIT_NOFILE: ``max_connections`` None
    takes what is left (at most :data:`DEFAULT_MAX_CONNECTIONS`); a number is checked.

    Raises:
        BudgetError: the caps do not fit; the message names the figures and the fix.
    """
    limit = fd_limit() if limit is None else limit
    left = limit - RESERVED_FDS - max_unauthenticated - http_connections
    fix = (
        "raise the limit (ulimit -n, or LimitNOFILE= in the systemd unit) or lower the caps "
        "(--max-connections, --max-unauthenticated, --http-max-connections)"
    )
    if max_connections is None:
        if left < 16:
            raise BudgetError(
                f"the descriptor limit (RLIMIT_NOFILE {limit}) leaves {max(left, 0)} connections "
                f"after {max_unauthenticated} unauthenticated, {http_connections} HTTP and "
                f"{RESERVED_FDS} reserved; {fix}"
            )
        return min(DEFAULT_MAX_CONNECTIONS, left)
    if max_connections < 1 or max_connections > left:
        raise BudgetError(
            f"--max-connections {max_connections} does not fit the descriptor limit "
            f"(RLIMIT_NOFILE {limit}): {max_unauthenticated} unauthenticated, {http_connections} "
            f"HTTP and {RESERVED_FDS} reserved descriptors leave {max(left, 0)}; {fix}"
        )
    return max_connections


class _AcceptErrorLog:
    """The loop's exception handler, but failed accepts logged once per interval with a count."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._previous = loop.get_exception_handler()
        self._last = -ACCEPT_ERROR_LOG_INTERVAL_S
        self.suppressed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith("socket.accept()") or (
            "accept" in message and isinstance(context.get("exception"), OSError)
        ):
            now = time.monotonic()
            if now - self._last < ACCEPT_ERROR_LOG_INTERVAL_S:
                self.suppressed += 1
                return
            self._last = now
            more = f" ({self.suppressed} more since the last such line)" if self.suppressed else ""
            self.suppressed = 0
            log.error(
                "cannot accept connections: %s%s; out of file descriptors? see --max-connections",
                context.get("exception") or message,
                more,
            )
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)


class ServerObserver(Protocol):
    """Sees what the server does, for metrics, without the state machine knowing about it.

    Called on the event loop, on the hot path: it must be quick. An exception it raises
    is logged and otherwise ignored, so an observer can never break the coordinator.
    """

    def on_effects(self, event: s.Event, effects: Sequence[s.Effect]) -> None:
        """One event went through the state machine and produced these effects."""

    def on_commit(self, seconds: float) -> None:
        """The journal committed a group of events, taking this long."""


class _Peer(asyncio.Protocol):
    """One client connection.

    Slotted: 10,000 nodes hold 10,000 of these, and a per-instance dict would be a third
    of the coordinator's memory per node.
    """

    __slots__ = (
        "_connected_at",
        "_fd",
        "_frame_started",
        "_loop",
        "_stalled",
        "_tls_pending",
        "_unauth",
        "_watchdog",
        "_watchdog_at",
        "_write_paused",
        "closing",
        "handshake",
        "id",
        "idle_since",
        "job",
        "owner",
        "peername",
        "pending",
        "proto",
        "role",
        "server",
        "source",
        "transport",
    )

    def __init__(self, server: CoordinatorServer, conn_id: int) -> None:
        self.server = server
        self.id = conn_id
        # A hello's worth until the peer has proved itself (see ``authenticated``).
        self.proto = Connection(
            min(PRE_AUTH_MAX_FRAME_BYTES, server.config.max_frame_bytes), budget=FRAME_BUDGET
        )
        self.transport: asyncio.Transport | None = None
        #: Until the hello is answered; dropped then (a node keeps its connection for the
        #: whole job, and the nonce and checker serve no purpose after the handshake).
        self.handshake: Accepting | None = Accepting(m.PROTOCOL_VERSION, m.CLIENT_ROLES, server._key_for)
        self.role: str | None = None
        self.job: str | None = None
        #: A driver's owner digest: the jobs it submits are its own.
        self.owner = b""
        self.pending = 0
        self.closing = False
        self.peername = "?"
        self.source = "?"
        #: Counted among the unauthenticated connections (until the handshake succeeds).
        self._unauth = False
        self._loop = asyncio.get_running_loop()
        # Loop times (monotonic) the watchdog judges by.
        self._connected_at = 0.0
        #: Last bytes received, or the moment the last pending request was answered.
        self.idle_since = 0.0
        #: When the incomplete frame now in the buffer began, if there is one.
        self._frame_started: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_at = 0.0
        #: A decoded request waiting for a later loop turn's bulk budget (reading is paused
        #: meanwhile; later frames stay in ``proto``'s buffer, behind it).
        self._stalled: m.Message | None = None
        self._write_paused = False
        #: Accepted in plaintext and counted, its TLS handshake not yet done: nothing may be
        #: written to it (a plaintext frame would be garbage to a TLS peer).
        self._tls_pending = False
        #: The plaintext socket's descriptor, for a cluster reply's one vectored write (see
        #: ``write``); -1 under TLS, whose transport encrypts what it is given.
        self._fd = -1

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peername = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # Interned: the connections from one host (a node's executors, its drivers) share
        # one string, not one each (memory per node; interned strings go with their last user).
        self.source = sys.intern(str(peer[0]) if isinstance(peer, tuple) else str(peer))
        srv = self.server
        cfg = srv.config
        if srv.unauthenticated >= cfg.max_unauthenticated:
            srv.rejected_connections += 1
            self.fail(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"{cfg.max_unauthenticated} connections are in their handshake already; try again later",
            )
            return
        if srv.unauthenticated_from.get(self.source, 0) >= srv.per_source:
            srv.rejected_connections += 1
            self.fail(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"{srv.per_source} connections from "
                f"{self.source} are in their handshake already; try again later",
            )
            return
        self._count_unauth(+1)
        srv.peers[self.id] = self
        self._connected_at = self.idle_since = now = self._loop.time()
        self.arm(now + cfg.handshake_timeout_s)
        if cfg.ssl_context is not None:
            # TLS starts only now, on a connection the budgets above have counted: asyncio's
            # create_server(ssl=...) would run the handshake before connection_made, leaving
            # sockets in their TLS handshake outside every cap. Reading stays paused until
            # the TLS layer takes the transport over (start_tls resumes it).
            transport.pause_reading()
            self._tls_pending = True
            upgrade = self._loop.create_task(self._start_tls(transport, cfg.ssl_context))
            srv.tls_upgrades.add(upgrade)  # held: the loop keeps only weak references to tasks
            upgrade.add_done_callback(srv.tls_upgrades.discard)
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._fd = sock.fileno()
        self._greet()

    async def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        try:
            tls = await self._loop.start_tls(
                raw,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self.server.config.handshake_timeout_s,
            )
        except OSError as e:  # ssl.SSLError, timeouts and resets are OSErrors
            # start_tls closed the socket; our connection_lost (called through the TLS
            # layer) uncounts it. A bad TLS peer is an everyday event: no traceback.
            log.info("TLS handshake with %s failed: %s", self.peername, e or type(e).__name__)
            return
        finally:
            self._tls_pending = False
        if tls is None or self.closing:
            if tls is not None:
                tls.abort()
            return
        assert isinstance(tls, asyncio.Transport)
        self.transport = tls
        self._greet()

    def _greet(self) -> None:
        assert self.handshake is not None
        self.write(self.handshake.challenge())

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        now = self._loop.time()
        self.idle_since = now
        self.proto.receive_data(data)
        if self._stalled is None:
            self._process(now)
        elif self.transport is not None and self.transport.is_reading():
            # Its frames wait behind the stalled one; reading stops only now that more came
            # (see ``CoordinatorServer.defer``), so at most this one read is buffered.
            self.transport.pause_reading()

    def _process(self, now: float) -> None:
        """Dispatch the frames received, in order, until one must wait for a later turn."""
        framed = False
        srv = self.server
        try:
            while not self.closing:
                msg = self._stalled
                if msg is None:
                    event = self.proto.next_event()
                    if not isinstance(event, m.Message):  # NEED_DATA (never CLOSED: asyncio
                        break  # passes no empty data, the end of input is eof_received)
                    msg = event
                    framed = True
                # Bulk work (handshakes, registrations, waits) gets a budget per loop turn;
                # liveness (heartbeats, reports) never waits for it.
                if type(msg) not in _LIVENESS_OPS and not srv.bulk_allowed():
                    # Back in the queue: in front if it had already waited its turn.
                    srv.defer(self, front=self._stalled is not None)
                    self._stalled = msg
                    return
                self._stalled = None
                srv.dispatch(self, msg)
        except ProtocolError as e:
            self.server.rejected_frames += 1
            # Answer the valid requests this read carried before the bad frame first: their
            # effects are queued for the next flush, which would find the connection closed.
            self.server.flush_now()
            self.fail(ErrorCode.PROTOCOL_ERROR, f"{e}; closing the connection")
            return
        if self.closing:
            return
        if not self.proto.buffered:
            self._frame_started = None
            if self.role is not None and self.pending and self._watchdog is not None:
                # No deadline the watchdog judges applies now (authenticated, no partial
                # frame, requests pending: the idle clock starts once they are answered):
                # cancel its timer rather than leave it to the handshake's deadline, a
                # timer handle per connection (about 180 bytes a node) held that long.
                self._watchdog.cancel()
                self._watchdog = None
        elif framed or self._frame_started is None:  # a new frame began in these bytes
            self._frame_started = now
            self.arm(now + self.server.config.frame_timeout_s)

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def pause_writing(self) -> None:
        # The peer is not reading its replies: stop reading its requests until it does.
        self._write_paused = True
        if self.transport is not None and not self.closing:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.transport is not None and not self.closing and self._stalled is None:
            self.transport.resume_reading()

    def resume_stalled(self) -> None:
        """Its turn came (see ``CoordinatorServer.defer``): go on with the stalled frame."""
        if self.closing or self._stalled is None:
            return
        self._process(self._loop.time())
        self._resume_reading_unless_held()

    def _resume_reading_unless_held(self) -> None:
        """Read again once no frame waits for a turn and the peer reads its replies.

        A method of its own: mypy would keep ``resume_stalled``'s test of ``_stalled`` (made
        before ``_process`` changed it) and call the test below always false."""
        if (
            self._stalled is None
            and not self.closing
            and not self._write_paused
            and self.transport is not None
        ):
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self._unauth:
            self._count_unauth(-1)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.server.peers.pop(self.id, None) is not None and self.role is not None:
            self.server.authenticated -= 1
            self.server.apply(s.Disconnected(now=time.time(), conn=self.id))

    # the watchdog: one timer per connection, armed for the earliest deadline that applies

    def arm(self, when: float) -> None:
        """Make sure the watchdog runs no later than ``when`` (loop time)."""
        if self._watchdog is not None:
            if self._watchdog_at <= when:
                return
            self._watchdog.cancel()
        self._watchdog_at = when
        self._watchdog = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        self._watchdog = None
        if self.closing:
            return
        cfg = self.server.config
        now = self._loop.time()
        if self._stalled is not None:
            # A whole frame waits in our own queue for a turn (``CoordinatorServer.defer``):
            # it came in time, and these deadlines judge the peer, not our backlog (a starved
            # coordinator finding many hellos at once refused those it had not reached yet).
            self.arm(now + cfg.frame_timeout_s)
            return
        deadlines = []
        if self.role is None:
            deadlines.append(
                (
                    self._connected_at + cfg.handshake_timeout_s,
                    ErrorCode.HANDSHAKE_TIMEOUT,
                    f"no hello within {cfg.handshake_timeout_s:g} s",
                )
            )
        if self._frame_started is not None:
            deadlines.append(
                (
                    self._frame_started + cfg.frame_timeout_s,
                    ErrorCode.FRAME_TIMEOUT,
                    f"a frame stayed incomplete for {cfg.frame_timeout_s:g} s "
                    f"({self.proto.buffered} bytes received)",
                )
            )
        elif self.role is not None and self.pending == 0:
            deadlines.append(
                (
                    self.idle_since + cfg.idle_timeout_s,
                    ErrorCode.IDLE_TIMEOUT,
                    f"nothing sent and nothing pending for {cfg.idle_timeout_s:g} s",
                )
            )
        for when, code, message in deadlines:
            if now >= when:
                self.server.timed_out[code] = self.server.timed_out.get(code, 0) + 1
                self.fail(code, message)
                return
        if deadlines:
            self.arm(min(when for when, _, _ in deadlines))

    def nothing_pending(self) -> None:
        """The last pending request was answered: the idle clock starts now."""
        self.idle_since = now = self._loop.time()
        self.arm(now + self.server.config.idle_timeout_s)

    # helpers

    @property
    def viewer(self) -> s.Viewer:
        """Whose jobs this connection may see: a driver its own; admins and nodes (checked
        against their one job in ``dispatch``) every one."""
        return self.owner if self.role == "driver" else None

    def _count_unauth(self, delta: int) -> None:
        srv = self.server
        self._unauth = delta > 0
        srv.unauthenticated += delta
        left = srv.unauthenticated_from.get(self.source, 0) + delta
        if left:
            srv.unauthenticated_from[self.source] = left
        else:
            srv.unauthenticated_from.pop(self.source, None)

    def authenticated(self, role: str, job: str | None) -> bool:
        """Move this peer into the authenticated budget; False (and closed) if it is full."""
        srv = self.server
        self._count_unauth(-1)
        if srv.authenticated >= srv.config.max_connections:
            srv.rejected_connections += 1
            self.fail(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"the coordinator holds its maximum of "
                f"{srv.config.max_connections} connections; try again later",
            )
            return False
        srv.authenticated += 1
        # Interned: each hello decodes a string of its own, and 10,000 nodes of one job
        # would hold 10,000 copies of its id and of "node" (about 110 bytes a node).
        self.role, self.job = sys.intern(role), None if job is None else sys.intern(job)
        self.proto.max_frame_bytes = srv.config.max_frame_bytes
        return True

    def write(self, msg: m.Message) -> None:
        if self.transport is None or self.closing:
            return
        if type(msg) is m.ClusterReply:
            try:
                head, tail = self.server.cluster_frames.frame(msg)
            except LocalProtocolError as e:
                data = self._too_large(msg, e)
            else:
                self._write_parts(head, tail)
                return
        try:
            data = self.proto.send(msg)
        except LocalProtocolError as e:
            data = self._too_large(msg, e)
        if data:
            self.transport.write(data)

    def _write_parts(self, head: bytes, tail: bytes) -> None:
        """Write ``head + tail`` without joining them: the tail (a job's spec) is shared by
        every node of the job and goes from that one object to the socket.

        On a plaintext socket with nothing queued, one ``writev`` sends both: a send per
        part was a fifth more system calls in a 10,000-node rendezvous, and the node's
        side woke twice. What the socket does not take, and every other case (TLS, a
        queue behind a slow reader, a closing transport), goes through the transport,
        which copies only what it must keep and handles a failed socket as for any write.
        """
        transport = self.transport
        assert transport is not None
        if self._fd >= 0 and not transport.is_closing() and not transport.get_write_buffer_size():
            try:
                sent = os.writev(self._fd, (head, tail))
            except OSError:
                sent = 0  # full (EAGAIN) or failed: the transport's own write sees the same
            if sent >= len(head):
                if sent < len(head) + len(tail):
                    transport.write(memoryview(tail)[sent - len(head) :])
                return
            head = head[sent:]
        transport.write(head)
        transport.write(tail)

    def _too_large(self, msg: m.Message, e: LocalProtocolError) -> bytes:
        """A reply too large for one frame (the status of a job of tens of thousands of
        nodes): the request gets an error saying so; the connection and every other reply
        carry on. Returns the error frame (empty for a message without a request id)."""
        rid = getattr(msg, "id", None)
        log.warning("reply %s to %s not sent: %s", msg.op, self.peername, e)
        if rid is None:
            return b""
        return self.proto.send(
            m.Error(
                id=rid,
                code=ErrorCode.TOO_LARGE,
                message=(
                    f"the answer to this request is too large for one frame ({e}); ask for less "
                    "(one job's status instead of all, or the HTTP API's /v1/jobs/JOB/events pages)"
                ),
            )
        )

    def fail(self, code: ErrorCode, message: str) -> None:
        """Send a connection-level error frame and close."""
        if self.closing or self.transport is None:
            return
        if self._tls_pending or (
            self.server.config.ssl_context is not None and self.transport.get_extra_info("ssl_object") is None
        ):
            # Before TLS (refused by a budget, or its TLS handshake too slow): a plaintext
            # frame would be garbage to a TLS client, which treats the plain close as a
            # dropped connection and retries later.
            self.closing = True
            log.info("closing connection from %s before TLS: %s: %s", self.peername, code, message)
            self.transport.abort()
            return
        try:
            self.transport.write(self.proto.send(m.Error(id=None, code=code, message=message)))
        except ProtocolError:
            pass
        self.closing = True
        log.info("closing connection from %s: %s: %s", self.peername, code, message)
        self.transport.close()
        self._loop.call_later(CLOSE_LINGER_S, self.transport.abort)  # a no-op once it is closed


#: Each request a peer may send once authenticated, and the state event it becomes (from the
#: peer, the request and the time): dispatch is this explicit table keyed by message class.
_REQUEST_EVENTS: dict[type, Any] = {
    m.Submit: lambda p, r, now: s.SubmitJob(
        now=now, job=r.job, spec=r.spec, waiter=(p.id, r.id), owner=p.owner
    ),
    m.AwaitJob: lambda p, r, now: s.AwaitJobEvent(now=now, req=r, waiter=(p.id, r.id), viewer=p.viewer),
    m.WatchJob: lambda p, r, now: s.AwaitJobEvent(now=now, req=r, waiter=(p.id, r.id), viewer=p.viewer),
    m.StopJob: lambda p, r, now: s.StopJobEvent(
        now=now,
        job=r.job,
        reason=r.reason,
        cause=r.cause,
        dry_run=r.dry_run,
        waiter=(p.id, r.id),
        viewer=p.viewer,
    ),
    m.Finish: lambda p, r, now: s.FinishJobEvent(
        now=now, job=r.job, serving_grace_s=r.serving_grace_s, waiter=(p.id, r.id), viewer=p.viewer
    ),
    m.Status: lambda p, r, now: s.StatusEvent(now=now, job=r.job, waiter=(p.id, r.id), viewer=p.viewer),
    m.Register: lambda p, r, now: s.RegisterNode(now=now, req=r, conn=p.id, waiter=(p.id, r.id)),
    m.Report: lambda p, r, now: s.ReportNode(now=now, req=r, conn=p.id, waiter=(p.id, r.id)),
    m.Heartbeat: lambda p, r, now: s.HeartbeatNode(now=now, req=r, conn=p.id, waiter=(p.id, r.id)),
    m.Progress: lambda p, r, now: s.ProgressNode(now=now, req=r, conn=p.id, waiter=(p.id, r.id)),
    m.NodeLogs: lambda p, r, now: s.NodeLogsEvent(now=now, req=r, conn=p.id, waiter=(p.id, r.id)),
    m.GetLogs: lambda p, r, now: s.GetLogsEvent(now=now, req=r, waiter=(p.id, r.id), viewer=p.viewer),
    m.AwaitCluster: lambda p, r, now: s.AwaitClusterEvent(now=now, req=r, conn=p.id, waiter=(p.id, r.id)),
    m.AwaitStop: lambda p, r, now: s.AwaitStopEvent(now=now, req=r, conn=p.id, waiter=(p.id, r.id)),
}


class CoordinatorServer:
    """The coordinator: state machine + journal behind the TCP protocol."""

    def __init__(
        self,
        config: ServerConfig,
        journal: Journal | None = None,
        state: s.CoordinatorState | None = None,
        engines: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        #: The engines this coordinator runs (see ``messages.COORDINATOR_ENGINES``): their
        #: jobs are admitted, those of other coordinator engines refused.
        self.engine_names = engines
        self.state = state or s.CoordinatorState(config.keep_finished_jobs, config.keep_finished_s)
        self.state.set_credential_key(auth.credential_key(config.secret))
        self.journal = journal or MemoryJournal()
        self.peers: dict[int, _Peer] = {}
        #: Peers' TLS handshakes under way (see ``_Peer._start_tls``).
        self.tls_upgrades: set[asyncio.Task[None]] = set()
        self._next_conn = 1
        self._server: asyncio.base_events.Server | None = None
        self._outbox: list[s.Send] = []
        #: A job's cluster spec packed once, shared by every node's ``cluster`` reply.
        self.cluster_frames = ClusterReplyFrames(config.max_frame_bytes)
        #: The last node key made (see ``_node_key``).
        self._last_token: tuple[str, bytes, KeyFor] | None = None
        self._flush_scheduled = False
        # Group commit (see ``_flush``): journal records appended so far, and per job the
        # number of its latest one not yet committed.
        self._appended = 0
        self._dirty: dict[str, int] = {}
        #: The commit in flight: (its future, None when synchronous; the batch; the records
        #: it covers, up to; the replies waiting for it).
        self._inflight: tuple[Any, Any, int, list[s.Send]] | None = None
        #: Committed replies not yet written (see ``_write_out``).
        self._ready_out: deque[s.Send] = deque()
        self._write_out_scheduled = False
        #: Fairness (see ``bulk_allowed``): the end of this turn's bulk budget, and the
        #: connections whose next request waits for a later turn, oldest first.
        self._bulk_until: float | None = None
        self._deferred: deque[_Peer] = deque()
        #: Jobs whose cluster completion goes on (``state.Continue``), served first each turn.
        self._completing: deque[str] = deque()
        #: One thread, so commits run one at a time and in order.
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="tfcoord-journal")
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        #: With a state directory, the nodes' output is kept beside the journal
        #: (:mod:`.keptoutput`), on the committer's thread, one write at a time.
        self._keeper = OutputKeeper(self.state, journal) if isinstance(journal, SqliteJournal) else None
        self._keeping: tuple[Any, OutputBatch] | None = None
        self._keep_timer: asyncio.TimerHandle | None = None
        self.rejected_frames = 0
        self.rejected_connections = 0
        #: Connections by budget: authenticated, and still in their handshake (per source too).
        self.authenticated = 0
        self.unauthenticated = 0
        self.unauthenticated_from: dict[str, int] = {}
        #: Of those, allowed from one source address.
        self.per_source = per_source_budget(config.max_unauthenticated, config.max_unauthenticated_per_source)
        self._accept_errors: _AcceptErrorLog | None = None
        self.auth_failures = 0
        #: Connections closed by the watchdog, by code (handshake, frame, idle timeout).
        self.timed_out: dict[str, int] = {}
        self.observers: list[ServerObserver] = []
        #: The running engines, by name (the Mesos framework registers itself as "mesos").
        self.engines: dict[str, Any] = {}
        self.stopped = asyncio.Event()
        self._handlers = _REQUEST_EVENTS

    # -- life cycle ---------------------------------------------------------------------

    def recover(self) -> int:
        """Replay the journal into the state; returns the number of events replayed."""
        n = 0
        for event in self.journal.replay():
            # A cluster completion goes on as journaled (CompleteCluster records); one the
            # coordinator was stopped in the middle of is finished by Recovered.
            self.state.handle(event)
            n += 1
        if self._keeper is not None:
            self._keeper.restore()  # before Recovered: its forgetting takes their lines too
        # What came due meanwhile (reservation deadlines, jobs to forget) is carried out by
        # the first Tick once the server runs (``start`` arms the timer).
        self.state.handle(s.Recovered(now=time.time()))
        return n

    async def start(self) -> tuple[str, int]:
        """Bind and listen (or listen on ``config.sock``); returns the bound (host, port). Port 0
        picks a free one."""
        loop = asyncio.get_running_loop()
        if not isinstance(loop.get_exception_handler(), _AcceptErrorLog):
            self._accept_errors = _AcceptErrorLog(loop)
            loop.set_exception_handler(self._accept_errors)
        if self.config.sock is not None:
            self._server = await loop.create_server(
                self._new_peer, sock=self.config.sock, backlog=ACCEPTS_PER_TURN
            )
        else:
            self._server = await loop.create_server(
                self._new_peer,
                self.config.host,
                self.config.port,
                # No ssl= here: each peer starts TLS itself once it is counted (_Peer.connection_made).
                reuse_address=True,
                backlog=ACCEPTS_PER_TURN,
            )
        # asyncio listened with the backlog it accepts per turn; the kernel's queue is made
        # long again (listen on a listening socket only sets its backlog).
        for listening in self._server.sockets:
            with listening.dup() as sock:
                sock.listen(LISTEN_BACKLOG)
        sockname = self._server.sockets[0].getsockname()
        self._arm_timer()
        if self._keeper is not None:
            self._keep_output()
        return sockname[0], sockname[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for peer in list(self.peers.values()):
            if peer.transport is not None:
                peer.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
        if self._timer is not None:
            self._timer.cancel()
        if self._keep_timer is not None:
            self._keep_timer.cancel()
        if self._inflight is not None and self._inflight[0] is not None:
            await asyncio.wrap_future(self._inflight[0])
        self.flush_now()
        self._committer.shutdown()
        if self._keeper is not None:  # the last lines, once every other write is done
            self._write_output(self._keeper.collect())
        self.journal.close()
        self.stopped.set()

    def _keep_output(self) -> None:
        """Every :data:`OUTPUT_INTERVAL_S`: hand the new output lines to the committer's
        thread (never more than one such write in flight)."""
        assert self._keeper is not None
        loop = asyncio.get_running_loop()
        self._keep_timer = loop.call_later(OUTPUT_INTERVAL_S, self._keep_output)
        if self._keeping is not None:
            done, last = self._keeping
            if not done.done():
                return
            if not done.result():
                self._keeper.failed(last)  # here on the loop, where it collects
        batch = self._keeper.collect()
        self._keeping = None if batch is None else (self._committer.submit(self._write_output, batch), batch)

    def _write_output(self, batch: OutputBatch | None) -> bool:
        if batch is None or self._keeper is None:
            return True
        try:
            self._keeper.journal.write_output(batch)
        except Exception:
            # Output is not the job's state: nothing waits on it; it is written whole next time.
            log.exception("keeping %d output lines in the state directory failed", len(batch.lines))
            return False
        return True

    def _new_peer(self) -> _Peer:
        cid = self._next_conn
        self._next_conn += 1
        return _Peer(self, cid)

    # -- requests -----------------------------------------------------------------------

    def dispatch(self, peer: _Peer, msg: m.Message) -> None:
        if peer.role is None:
            self._hello(peer, msg)
            return
        if not isinstance(msg, m.Request):
            peer.fail(ErrorCode.PROTOCOL_ERROR, f"a client may not send {msg.op!r} frames")
            return
        if type(msg) not in m.ALLOWED_OPS[peer.role]:
            peer.write(
                m.Error(
                    id=msg.id,
                    code=ErrorCode.FORBIDDEN,
                    message=(f"op {msg.op!r} is not allowed for a connection of role {peer.role!r}"),
                )
            )
            return
        job = getattr(msg, "job", None)
        if peer.role == "node" and job != peer.job:
            peer.write(
                m.Error(
                    id=msg.id,
                    code=ErrorCode.FORBIDDEN,
                    message=(f"this connection is authenticated for job {peer.job} only, not {job}"),
                )
            )
            return
        if peer.pending >= MAX_PENDING_PER_CONNECTION:
            peer.write(
                m.Error(
                    id=msg.id,
                    code=ErrorCode.TOO_MANY_REQUESTS,
                    message=(f"{MAX_PENDING_PER_CONNECTION} requests are already pending on this connection"),
                )
            )
            return
        if (
            isinstance(msg, m.Submit)
            and msg.spec.engine in m.COORDINATOR_ENGINES
            and msg.spec.engine not in self.engine_names
        ):
            peer.write(
                m.Error(
                    id=msg.id,
                    code=ErrorCode.NO_ENGINE,
                    message=(
                        f"this coordinator does not run the {msg.spec.engine} engine; start it with that engine "
                        f"configured (for Mesos: MESOS_MASTER set for tfcoord serve), or submit without "
                        f"TFCOORD_ADDRESS to use an embedded coordinator"
                    ),
                )
            )
            return
        peer.pending += 1
        self.apply(self._handlers[type(msg)](peer, msg, time.time()))

    def _hello(self, peer: _Peer, msg: m.Message) -> None:
        if isinstance(msg, m.Hello) and msg.role == "driver" and not msg.owner:
            peer.fail(
                ErrorCode.AUTH_FAILED,
                "a driver must send its owner key in hello; upgrade tfcoord on the driver",
            )
            return
        assert peer.handshake is not None
        try:
            welcome = peer.handshake.accept(msg)
        except HandshakeRefused as e:
            if e.bad_proof:
                self.auth_failures += 1
            peer.fail(e.code, e.message)
            return
        assert isinstance(msg, m.Hello)
        peer.handshake = None
        if not peer.authenticated(msg.role, msg.job):
            return
        if msg.role == "driver":
            peer.owner = auth.owner_digest(msg.owner)
        peer.write(welcome)
        # The idle clock starts at the welcome, as at any answer: a hello that waited for
        # the bulk budget (``defer``) longer than the idle timeout arrived at a time that
        # says nothing of the peer, and the watchdog closed a connection just welcomed
        # (welcome and IDLE_TIMEOUT in one read: "sent data before the first request").
        peer.nothing_pending()

    def _key_for(self, role: str, job: str | None) -> KeyFor:
        """What a peer claiming ``role`` (and ``job``) must prove it holds.

        A node's job token is bound to the driver that submitted its job (``auth``): for a
        job this coordinator does not hold, there is no token to prove, and a random key
        stands in so the refusal reads (and costs) the same as a wrong token. The admin
        proves the admin secret; a coordinator without one has no admin.
        """
        if role == "node":
            if not job:
                raise HandshakeRefused(ErrorCode.AUTH_FAILED, "a node must name its job in hello")
            known = self.state.jobs.get(job)
            if known is None:
                return KeyFor(auth.new_secret(), *_job_token_names(job))
            return self._node_key(job, known.owner)
        if role == "admin":
            return KeyFor(
                self.config.admin_secret or auth.new_secret(),
                "the admin secret",
                ". Check the admin secret file (TFCOORD_ADMIN_SECRET_FILE)"
                + (
                    ""
                    if self.config.admin_secret
                    else "; this coordinator has none (serve --admin-secret-file)"
                ),
            )
        return KeyFor(
            self.config.secret, "the coordinator secret", ". Check the secret file (TFCOORD_SECRET_FILE)"
        )

    def _node_key(self, job: str, owner: bytes) -> KeyFor:
        """``auth.job_token`` for the job whose nodes are connecting: a burst's 10,000
        handshakes name the same job, so the last token is kept (keyed by job and owner,
        so a resubmitted job id of another driver gets its own)."""
        cached = self._last_token
        if cached is not None and cached[0] == job and cached[1] == owner:
            return cached[2]
        key = KeyFor(auth.job_token(self.config.secret, job, owner), *_job_token_names(job))
        self._last_token = (job, owner, key)
        return key

    # -- fairness: bulk work per loop turn ------------------------------------------------

    def bulk_allowed(self) -> bool:
        """May bulk work (a handshake, a registration, a wait) run in this loop turn?

        Each turn gets ``BULK_BUDGET_S`` of it; what comes after waits for the next turn
        (``defer``), so a burst of 10,000 registrations is spread over many short turns and
        every other connection's heartbeat is read and answered in between.
        """
        now = time.perf_counter()
        if self._bulk_until is None:
            self._bulk_until = now + BULK_BUDGET_S
            _after_reads(self._next_turn)
            return True
        return now < self._bulk_until

    def defer(self, peer: _Peer, front: bool = False) -> None:
        """``peer`` holds a request the budget did not allow: queue it.

        Reading from it stops only if it sends more meanwhile (``data_received``): a node
        sends one request and waits for the answer, so pausing at once would cost two
        epoll changes per deferred request (a fifth of the coordinator's time in a
        10,000-node burst) for nothing.
        """
        if front:
            self._deferred.appendleft(peer)
        else:
            self._deferred.append(peer)

    def _next_turn(self) -> None:
        """A new loop turn: a new budget, spent first on cluster completions that go on (a
        chunk of nodes per event), then on the connections that waited longest."""
        self._bulk_until = None
        while self._completing and self.bulk_allowed():
            self.apply(s.CompleteCluster(now=time.time(), job=self._completing.popleft()))
        while self._deferred and self.bulk_allowed():
            self._deferred.popleft().resume_stalled()

    # -- effects ------------------------------------------------------------------------

    def apply(self, event: s.Event) -> None:
        """Run one event through the state machine and carry out (or queue) its effects."""
        effects = self.state.handle(event)
        log_changes = log.isEnabledFor(logging.INFO)
        journaled = False
        sends: list[s.Send] = []
        for eff in effects:
            if isinstance(eff, s.Send):
                sends.append(eff)
            elif isinstance(eff, s.Journal):
                self.journal.append(eff.event)
                self._appended += 1
                self._dirty[event_job(eff.event)] = self._appended
                journaled = True
            elif isinstance(eff, s.Forget):
                self.journal.forget(eff.job)
                self._appended += 1
                self._dirty[eff.job] = self._appended
                journaled = True
            elif isinstance(eff, s.Continue):
                # The rest of a cluster completion, on later turns (``_next_turn``): what a
                # turn does in between is every other connection's liveness traffic.
                self._completing.append(eff.job)
                self.bulk_allowed()  # makes sure a next turn is scheduled
            elif log_changes:
                # One line per state change, the job (and node, state) also as fields for JSON logs.
                log.info(
                    "job %s: %s",
                    eff.job,
                    eff.text,
                    extra={"job": eff.job, "node": eff.node or None, "state": eff.state or None},
                )
        for obs in self.observers:
            try:
                obs.on_effects(event, effects)
            except Exception:
                log.exception("observer %r failed on %s", obs, type(event).__name__)
        if sends:
            # Liveness traffic goes out now, ahead of any registration burst's commit, when
            # it changed nothing durable and its job has nothing uncommitted that the answer
            # could reflect (a heartbeat's "stop" of a failure not yet committed waits).
            if type(event) in _LIVENESS and not journaled and event.req.job not in self._dirty:  # type: ignore[attr-defined]
                for send in sends:
                    self._deliver(send)
            else:
                self._outbox += sends
        # A change with no one to answer (a node lost on a timer) is committed all the same.
        if (self._outbox or journaled) and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        self._arm_timer()

    def flush_now(self) -> None:
        """Commit and write what is queued now, rather than at the end of this loop turn
        (waiting for a commit in flight first): blocks the loop, so only for rare paths."""
        if self._inflight is not None:
            self._committed(self._inflight[0])
        if self._outbox or self._flush_scheduled:
            self._flush(sync=True)
        self._write_out(everything=True)

    def _flush(self, sync: bool = False) -> None:
        """Group commit: take what the journal queued, commit it, then write every reply
        queued meanwhile. The commit runs on the journal thread; the loop goes on serving
        (and queueing the next group) until it is done. Replies that depend on nothing
        uncommitted are written at once."""
        self._flush_scheduled = False
        if self._inflight is not None:
            return  # the next group starts when this commit ends (``_committed``)
        batch = self.journal.take()
        outbox, self._outbox = self._outbox, []
        if batch is None:
            self._finish(0.0, self._appended, outbox)
            return
        upto = self._appended
        if sync:
            self._inflight = (None, batch, upto, outbox)
            try:
                took = self.journal.write(batch)
            except Exception:
                self._commit_failed()
                return
            self._inflight = None
            self._finish(took, upto, outbox)
            return
        done = self._committer.submit(self.journal.write, batch)
        self._inflight = (done, batch, upto, outbox)
        loop = asyncio.get_running_loop()
        done.add_done_callback(lambda f: loop.call_soon_threadsafe(self._committed, f))

    def _committed(self, done: Any) -> None:
        """The commit ``done`` ended (called on the loop; or by ``flush_now``, which waits)."""
        if self._inflight is None or self._inflight[0] is not done:
            return  # already handled
        try:
            took = done.result()
        except Exception:
            self._commit_failed()
            return
        _, _, upto, outbox = self._inflight
        self._inflight = None
        self._finish(took, upto, outbox)
        if self._outbox or self._appended > upto:
            self._flush()  # what queued up during this commit: the next group, at once

    def _commit_failed(self) -> None:
        """Nothing of the batch is durable: its replies wait, and it is retried shortly."""
        assert self._inflight is not None
        _, batch, _, outbox = self._inflight
        self._inflight = None
        log.exception("journal commit of %d records failed; retrying in %g s", len(batch), COMMIT_RETRY_S)
        self.journal.requeue(batch)
        self._outbox[:0] = outbox
        self._flush_scheduled = True
        asyncio.get_running_loop().call_later(COMMIT_RETRY_S, self._flush)

    def _finish(self, took: float, upto: int, outbox: list[s.Send]) -> None:
        """Records up to ``upto`` are committed: write the replies that waited for them."""
        if took:
            for obs in self.observers:
                try:
                    obs.on_commit(took)
                except Exception:
                    log.exception("observer %r failed on a commit", obs)
        if self._dirty:
            self._dirty = {job: n for job, n in self._dirty.items() if n > upto}
        self._ready_out += outbox
        self._schedule_write_out()

    def _write_out(self, everything: bool = False) -> None:
        """Write committed replies in order, at most ``WRITE_BUDGET_S`` of them per loop
        turn: the 10,000 cluster replies of a completed job (600 MB at 10,000 nodes) go out
        over many turns, with every other connection served in between."""
        out = self._ready_out
        until = time.perf_counter() + WRITE_BUDGET_S
        n = 0
        while out:
            self._deliver(out.popleft())
            n += 1
            if not everything and n % 16 == 0 and time.perf_counter() >= until:
                break
        if out:
            self._schedule_write_out()

    def _schedule_write_out(self) -> None:
        if self._ready_out and not self._write_out_scheduled:
            self._write_out_scheduled = True
            _after_reads(self._write_out_later)

    def _write_out_later(self) -> None:
        self._write_out_scheduled = False
        self._write_out()

    def _deliver(self, send: s.Send) -> None:
        peer = self.peers.get(send.conn)
        if peer is None:
            return
        if getattr(send.msg, "id", None) is not None and peer.pending > 0:
            peer.pending -= 1
            if peer.pending == 0:
                peer.nothing_pending()
        peer.write(send.msg)

    def _arm_timer(self) -> None:
        deadline = self.state.next_deadline()
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = deadline
        self._timer = loop.call_at(loop.time() + max(0.0, deadline - time.time()) + 0.001, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, None
        self.apply(s.Tick(now=time.time()))
