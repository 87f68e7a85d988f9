"""The blocking client: stdlib sockets and the sans-io protocol, nothing else.

One :class:`Client` is one authenticated connection, safe to share between
threads: a reader thread matches replies to requests by id, so a node can block
in ``await_cluster`` while its heartbeat thread keeps beating on the same
connection. When the connection drops, the reader reconnects with jittered
exponential backoff until ``reconnect_deadline_s`` passes and resends every
pending request; the protocol makes each of them idempotent (a node registering
again with the same job, slot and attempt gets the same answer).

:class:`DriverClient` submits and awaits jobs; :class:`NodeClient` registers a
node, waits for the cluster and reports how it ends.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, overload

from . import auth, handshake, tls
from . import messages as m
from .errors import (
    AuthenticationFailed,
    ClusterRestarted,
    ConnectionClosed,
    DeadlineExceeded,
    ProtocolError,
    RemoteProtocolError,
    RequestRejected,
    TlsError,
    Unreachable,
)
from .protocol import CLOSED, NEED_DATA, Connection, decode_spec
from .replies import Ack, JobFailed, JobStopped, Registration, Reported, StopAnswer
from .terminal import TRACEBACK, printable
from .vocab import TRANSIENT_CLOSES, ErrorCode, FailureReason, JobState, NodeState

if TYPE_CHECKING:
    # A DriverClient's methods import them when called (see DriverClient): a node imports
    # this module before it registers and never builds the answers about jobs.
    from .jobreplies import JobList, JobStatus, JobSummary, StopResult

log = logging.getLogger("tfcoord.client")

#: How long to keep trying to reach a coordinator that refuses connections: long enough
#: to ride out a coordinator restart under systemd (a few seconds), short enough that a
#: wrong address fails a job in well under a minute.
DEFAULT_CONNECT_DEADLINE_S = 30.0
#: Same budget for re-establishing a connection that dropped mid-job.
DEFAULT_RECONNECT_DEADLINE_S = 30.0
#: A single TCP connect + handshake; loopback or a LAN answers in milliseconds.
HANDSHAKE_TIMEOUT_S = 10.0
#: A coordinator writes its challenge the moment it accepts a connection: milliseconds,
#: even in a reconnect storm of thousands of nodes. A coordinator serving TLS writes
#: nothing at all to a plaintext client (it waits for a TLS ClientHello), so silence
#: this long on a first connection means TLS, and says so instead of hanging.
CHALLENGE_TIMEOUT_S = 5.0
#: How long a first connection waits, after the challenge failed to come, for an answer
#: to the HTTP request it then sends: an HTTP server answers one at once.
HTTP_PROBE_TIMEOUT_S = 1.0
#: Errors of a connect that no retry within seconds can heal: a host name that does not
#: resolve (EAI_AGAIN, a resolver that timed out, is the exception: it is retried).
_UNRESOLVED = frozenset(
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_NODATA", "EAI_FAIL", "EAI_SERVICE")
    if hasattr(socket, name)
)
#: Backoff between connection attempts: starts small, doubles, capped, with full jitter
#: so a hundred executors that lost the coordinator together do not return in lockstep.
#: The cap bounds how long a node stays away once the coordinator is back: a restarted
#: coordinator listens within half a second, and with a 1 s cap every node is back
#: within 2 s of the kill (benchmarks/load.py, restart phase), while full jitter still
#: spreads 10,000 reconnects over a second.
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 1.0
#: The coordinator answers a wait at its deadline; allow this much on top for the reply
#: to travel before the client gives up on its own.
REPLY_SLACK_S = 10.0
#: Requests that are not waits are answered at once; a reply slower than this means the
#: coordinator is overloaded or gone.
DEFAULT_REQUEST_TIMEOUT_S = 30.0
#: Heartbeat period; the coordinator's default heartbeat timeout (30 s) allows many misses.
DEFAULT_HEARTBEAT_INTERVAL_S = 2.0


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); raises ValueError saying what is wrong."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"coordinator address {address!r} must look like HOST:PORT")
    return host.strip("[]"), int(port)


def backoff_delays(initial_s: float = BACKOFF_INITIAL_S, cap_s: float = BACKOFF_MAX_S) -> Iterator[float]:
    """Full-jitter exponential backoff: uniform(0, min(cap, initial * 2**n))."""
    n = 0
    while True:
        yield random.uniform(0, min(cap_s, initial_s * 2**n))
        n += 1


class _Refused(Exception):
    """The coordinator sent a connection-level error frame; it closes the connection next."""


class _ClosedIdle(ConnectionClosed):
    """The coordinator closed a connection that sat idle (or stalled mid-frame): reconnect."""


@dataclass
class _Pending:
    msg: m.Request
    future: Future[m.Message]
    deadline: float  # monotonic


class Client:
    """One authenticated connection to a coordinator.

    Args:
        address: ``host:port`` of the coordinator.
        key: the coordinator secret (driver, admin) or the job token (node).
        role: ``driver``, ``node`` or ``admin``.
        job: the job a node acts in (required for nodes).
        ssl_context: wrap the socket in TLS with this context (see :mod:`tfcoord.client.tls`).
        challenge_timeout_s: how long a first connection waits for the coordinator's
            challenge before concluding that the peer expects TLS or speaks HTTP.
        fail_fast: report a refused first connection, or a host with no route to it, at
            once instead of retrying until ``connect_deadline_s``: a person at a terminal
            wants to know now. Once connected, every client rides out a coordinator restart
            (reconnecting until ``reconnect_deadline_s``), fail_fast or not. A host name that
            does not resolve always fails at once.
        request_timeout_s: how long a request that is not a wait may take to be answered.
    """

    def __init__(
        self,
        address: str,
        key: bytes,
        *,
        role: str,
        job: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        connect_deadline_s: float = DEFAULT_CONNECT_DEADLINE_S,
        reconnect_deadline_s: float = DEFAULT_RECONNECT_DEADLINE_S,
        challenge_timeout_s: float = CHALLENGE_TIMEOUT_S,
        fail_fast: bool = False,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        owner_key: bytes = b"",
    ) -> None:
        if role not in m.CLIENT_ROLES:
            raise ValueError(f"role must be one of {m.CLIENT_ROLES}")
        if role == "node" and not job:
            raise ValueError("a node client must name its job")
        self.address = address
        self._hostport = parse_address(address)
        self._key = key
        self._owner_key = owner_key
        self.role = role
        self.job = job
        self._ssl = ssl_context
        self._connect_deadline_s = connect_deadline_s
        self._reconnect_deadline_s = reconnect_deadline_s
        self._challenge_timeout_s = challenge_timeout_s
        self._fail_fast = fail_fast
        self._request_timeout_s = request_timeout_s
        #: Set once a handshake succeeded: from then on the transport is known to match, and
        #: a silent coordinator is a slow one (retried), not a TLS mismatch.
        self._handshaken = False
        self._lock = threading.Lock()  # guards the socket for writing, _pending, _ids
        self._sock: socket.socket | None = None
        self._pending: dict[int, _Pending] = {}
        self._next_id = 1
        self._closed = threading.Event()
        self._reader: threading.Thread | None = None
        self.reconnects = 0

    # -- connection ---------------------------------------------------------------------

    def connect(self) -> Self:
        """Connect and authenticate, retrying refused connections until the deadline.

        Raises:
            AuthenticationFailed: the coordinator refused our proof (not retried).
            TlsError: one side speaks TLS and the other does not, or a certificate was
                refused (not retried).
            Unreachable: no connection before the deadline, or at once for a host name that
                does not resolve (and, with ``fail_fast``, a refused connection); chained from
                the cause. A ``ConnectionClosed``.
        """
        self._sock = self._dial(self._connect_deadline_s)
        self._reader = threading.Thread(
            target=self._read_loop, name=f"tfcoord-{self.role}-reader", daemon=True
        )
        self._reader.start()
        return self

    def _dial(self, budget_s: float) -> socket.socket:
        deadline = time.monotonic() + budget_s
        last: BaseException | None = None
        for delay in backoff_delays():
            if self._closed.is_set():
                break
            try:
                return self._handshake(max(0.05, min(HANDSHAKE_TIMEOUT_S, deadline - time.monotonic())))
            except (AuthenticationFailed, ProtocolError, TlsError):
                raise
            except socket.gaierror as e:
                if e.errno in _UNRESOLVED:
                    raise Unreachable(
                        f"cannot reach the tfcoord coordinator at {self.address}: the host name "
                        f"{self._hostport[0]!r} does not resolve ({e.strerror}); check the address "
                        "(--address, TFCOORD_ADDRESS)"
                    ) from e
                last = e
            except OSError as e:
                last = e
                # Only a first connection fails fast: once a handshake succeeded, a refused
                # connection is a coordinator restarting, ridden out until the deadline.
                if self._fail_fast and not self._handshaken and _hopeless(e):
                    raise Unreachable(
                        f"cannot reach the tfcoord coordinator at {self.address}: {_why(e)}; is "
                        "`tfcoord serve` running there, and is that its --port (--address, TFCOORD_ADDRESS)?"
                    ) from e
            if time.monotonic() + delay > deadline:
                break
            time.sleep(delay)
        raise Unreachable(
            f"could not reach the tfcoord coordinator at {self.address} within {budget_s:g} s "
            f"({_why(last)}); is it running, and is the address right (--address, TFCOORD_ADDRESS)?"
        ) from last

    def _handshake(self, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> socket.socket:
        sock = socket.create_connection(self._hostport, timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._hostport[0])
            conn = Connection()
            shake = handshake.Connecting(
                self._key,
                self.role,
                self.job,
                m.PROTOCOL_VERSION,
                f"the coordinator at {self.address}",
                owner_key=self._owner_key,
            )
            sock.sendall(conn.send(shake.hello(self._await_challenge(sock, conn))))
            shake.welcome(_recv_one(sock, conn))
            sock.settimeout(None)  # the reader thread blocks; deadlines live in the futures
            if conn.buffered:
                raise RemoteProtocolError("coordinator sent data before the first request")
            self._handshaken = True
            return sock
        except ssl.SSLError as e:
            sock.close()
            explained = tls.explain(e, self.address)
            if explained is not None:
                raise explained from e
            raise  # the connection broke mid-handshake: retried like any lost connection
        except BaseException:
            sock.close()
            raise

    def _await_challenge(self, sock: socket.socket, conn: Connection) -> m.Message:
        """The coordinator's first frame, telling a TLS mismatch or a wrong service apart."""
        sock.settimeout(self._challenge_timeout_s)
        try:
            first = _recv_one(sock, conn)
        except TimeoutError:
            if self._ssl is None and not conn.buffered and not self._handshaken:
                if _speaks_http(sock):
                    raise RemoteProtocolError(
                        f"{self.address} is an HTTP server (the coordinator's HTTP API and dashboard, "
                        "--http-port?), not the coordinator's protocol port: use the port `tfcoord serve "
                        "--port` listens on (7070 by default)"
                    ) from None
                raise TlsError(
                    f"the coordinator at {self.address} accepted the connection but sent no challenge "
                    f"within {self._challenge_timeout_s:g} s. TLS? A coordinator started with "
                    "--tls-cert waits for a TLS handshake first: set TFCOORD_TLS_CA to the CA file "
                    "that signed its certificate (or pass ssl_context=tfcoord.client.tls.client_context(...))"
                ) from None
            raise
        except (ConnectionClosed, ConnectionResetError):
            # A mutual-TLS coordinator checks our certificate after the TLS 1.3 handshake has
            # completed on our side, and asyncio drops the connection without sending its alert.
            if self._ssl is not None and not conn.buffered and not self._handshaken:
                raise TlsError(
                    f"the coordinator at {self.address} closed the connection right after the TLS "
                    "handshake, before its challenge. TLS? It demands a client certificate signed by "
                    "its CA (mutual TLS, --tls-ca) and this client presented none or an untrusted "
                    "one: set TFCOORD_TLS_CERT and TFCOORD_TLS_KEY to a certificate that CA signed"
                ) from None
            raise
        except RemoteProtocolError as e:
            raise RemoteProtocolError(
                f"{self.address} answered with something that is not a tfcoord challenge ({e}); "
                "is it a tfcoord coordinator, and do both sides agree on TLS?"
            ) from None
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        return first

    def local_host(self) -> str:
        """The local address of our connection: an address the coordinator's side can route to."""
        sock = self._sock
        if sock is None:
            raise ConnectionClosed("not connected")
        host: str = sock.getsockname()[0]
        return host

    def close(self) -> None:
        """Close the connection; pending requests fail with ConnectionClosed."""
        self._closed.set()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        self._fail_pending(ConnectionClosed("client closed"))

    def __enter__(self) -> Self:
        if self._sock is None:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fail_pending(self, error: BaseException) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(error)

    def _read_loop(self) -> None:
        conn = Connection()
        while not self._closed.is_set():
            sock = self._sock
            try:
                if sock is None:
                    raise ConnectionClosed("not connected")
                data = sock.recv(256 * 1024)
                conn.receive_data(data)
                while True:
                    msg = conn.next_event()
                    if msg is NEED_DATA:
                        break
                    if msg is CLOSED:
                        raise ConnectionClosed("coordinator closed the connection")
                    self._deliver(msg)  # type: ignore[arg-type]
            except _Refused as e:
                # The coordinator closed us on purpose (protocol error, limit): resending
                # the same requests would be refused the same way, so fail them instead.
                log.error("%s", e)
                self._closed.set()
                self._fail_pending(ConnectionClosed(str(e)))
                return
            except (OSError, ProtocolError) as e:
                if self._closed.is_set():
                    return
                level = logging.INFO if isinstance(e, _ClosedIdle) else logging.WARNING
                log.log(level, "connection to coordinator %s lost (%s); reconnecting", self.address, e)
                conn = Connection()
                if not self._reconnect(e):
                    return
            except Exception as e:  # a bug: fail every caller now rather than leave them hanging
                log.exception("the reader of the connection to %s failed", self.address)
                self._closed.set()
                self._fail_pending(ConnectionClosed(f"the client's reader failed: {e!r}"))
                return

    def _reconnect(self, cause: BaseException) -> bool:
        old = self._sock
        if old is not None:
            old.close()
        try:
            sock = self._dial(self._reconnect_deadline_s)
        except Exception as e:
            if not isinstance(e, (ConnectionClosed, AuthenticationFailed)):
                e = ConnectionClosed(f"lost the coordinator at {self.address}: {e}")
            e.__cause__ = e.__cause__ or cause
            self._closed.set()
            self._fail_pending(e)
            return False
        now = time.monotonic()
        with self._lock:
            self._sock = sock
            self.reconnects += 1
            try:
                for p in self._pending.values():  # every request is idempotent: send it again
                    msg = p.msg
                    if hasattr(msg, "timeout_s"):
                        # What is left of the wait the server was asked for: the caller's
                        # deadline also holds REPLY_SLACK_S for the reply's trip, and the
                        # field refuses more than the first request asked (MAX_TIMEOUT_S).
                        left = p.deadline - REPLY_SLACK_S - now
                        msg = dataclasses.replace(msg, timeout_s=min(msg.timeout_s, max(0.0, left)))  # type: ignore[call-arg]
                    sock.sendall(Connection().send(self._resent(msg)))
            except OSError as e:  # lost again at once: the reader sees it and reconnects again
                log.info("resending to %s failed (%s)", self.address, e)
        return True

    def _resent(self, msg: m.Message) -> m.Message:
        """A pending request as it is sent again on a new connection (see NodeClient)."""
        return msg

    def _deliver(self, msg: m.Message) -> None:
        if isinstance(msg, m.Error) and msg.id is None:
            if msg.code in TRANSIENT_CLOSES:
                raise _ClosedIdle(f"coordinator closed the connection: {msg.code}: {msg.message}")
            raise _Refused(f"coordinator closed the connection: {msg.code}: {msg.message}")
        rid = getattr(msg, "id", None)
        with self._lock:
            p = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if p is None:
            log.debug("reply to unknown request %s dropped", rid)
            return
        if isinstance(msg, m.Error):
            p.future.set_exception(RequestRejected(msg.code, msg.message))
        else:
            p.future.set_result(msg)

    # -- requests -----------------------------------------------------------------------

    def request(self, build: Callable[[int], m.Request], timeout_s: float | None = None) -> m.Message:
        """Send the request ``build(id)`` and block for its reply.

        Raises:
            RequestRejected: the coordinator answered with an error.
            DeadlineExceeded: no reply within ``timeout_s`` (default: the client's
                ``request_timeout_s``).
            ConnectionClosed: the connection is gone and could not be re-established.
        """
        if timeout_s is None:
            timeout_s = self._request_timeout_s
        if self._closed.is_set() or self._sock is None:
            raise ConnectionClosed("the client is not connected; call connect() first")
        future: Future[m.Message] = Future()
        with self._lock:
            rid = self._next_id
            self._next_id = rid + 1 if rid < m.MAX_REQUEST_ID else 1
            msg = build(rid)
            self._pending[rid] = _Pending(msg, future, time.monotonic() + timeout_s)
            data = Connection().send(msg)
            sock = self._sock
            try:
                if sock is not None:
                    sock.sendall(data)
            except OSError:
                pass  # the reader notices, reconnects and resends everything pending
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            with self._lock:
                self._pending.pop(rid, None)
            raise DeadlineExceeded(
                f"no answer to {msg.op} from {self.address} within {timeout_s:g} s"
            ) from None


def _hopeless(e: OSError) -> bool:
    """A connect error that retrying for seconds will not heal (the caller chose not to wait
    for a restart): refused, or no route to the host or its network."""
    import errno

    return isinstance(e, ConnectionRefusedError) or e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)


def _why(e: BaseException | None) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused: nothing listens on that port"
    if isinstance(e, TimeoutError):
        return "no answer: a firewall, or a host that is down"
    return str(e) if e is not None else "closed"


def _speaks_http(sock: socket.socket) -> bool:
    """Whether a silent peer is an HTTP server: it answers a request where a TLS server,
    seeing no ClientHello, does not answer in HTTP."""
    try:
        sock.settimeout(HTTP_PROBE_TIMEOUT_S)
        sock.sendall(b"HEAD /healthz HTTP/1.0\r\n\r\n")
        return sock.recv(16).startswith(b"HTTP/")
    except OSError:
        return False


def _recv_one(sock: socket.socket, conn: Connection) -> m.Message:
    while True:
        msg = conn.next_event()
        if msg is CLOSED:
            raise ConnectionClosed("coordinator closed the connection during the handshake")
        if msg is not NEED_DATA:
            return msg  # type: ignore[return-value]
        conn.receive_data(sock.recv(65536))


def _result(reply: m.Message) -> Mapping[str, Any]:
    """A reply's result map, decoded by the typed answer the caller builds from it."""
    if not isinstance(reply, m.Reply):
        raise RemoteProtocolError(f"expected a reply from the coordinator, got {reply.op}")
    return reply.result


# -- drivers ------------------------------------------------------------------------------


class DriverClient(Client):
    """Submits jobs and awaits them. Authenticates with the coordinator secret.

    Each driver has an owner key of its own (``owner_key``, random unless given): the
    jobs it submits can be seen and stopped only by a driver with the same key, or by an
    admin (``role="admin"`` with the coordinator's admin secret as ``secret``), and their
    node tokens are bound to it.

    Its methods import the answers they decode (:mod:`.jobreplies`) when first called: a
    node imports this module before it registers, and would otherwise build every answer
    class about jobs that only drivers read.
    """

    def __init__(self, address: str, secret: bytes, *, owner_key: bytes | None = None, **kw: Any) -> None:
        role = kw.pop("role", "driver")
        if role == "driver":
            owner_key = owner_key or auth.new_owner_key()
        elif owner_key:
            raise ValueError("only a driver has an owner key; an admin sees every job")
        # The coordinator reads its secret file stripped (auth.read_secret); a secret read
        # here with Path.read_bytes() carries the file's newline and would never match.
        secret = secret.strip()
        super().__init__(address, secret, role=role, owner_key=owner_key or b"", **kw)
        self.secret = secret
        #: The digest the coordinator keeps with this driver's jobs (see ``auth.owner_digest``).
        self.owner = auth.owner_digest(owner_key) if owner_key else b""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kw: Any) -> DriverClient:
        """A client configured as the ``tfcoord`` command is, from the environment.

        ``TFCOORD_ADDRESS`` (``host:port``), ``TFCOORD_SECRET_FILE`` (read as ``tfcoord
        serve`` reads it: stripped, refused if others can read it) and, against a TLS
        coordinator, ``TFCOORD_TLS_CA`` and for mutual TLS ``TFCOORD_TLS_CERT`` and
        ``TFCOORD_TLS_KEY``. Keyword arguments go to the constructor (``role``, deadlines).
        Not connected yet: use it as a context manager or call ``connect()``.

        Raises:
            ValueError: a variable is missing or names an unusable file; the message says which.
            TlsError: the TLS files cannot be used.
        """
        import os

        env = os.environ if env is None else env
        address = env.get("TFCOORD_ADDRESS", "").strip()
        secret_file = env.get("TFCOORD_SECRET_FILE", "").strip()
        if not address:
            raise ValueError("TFCOORD_ADDRESS is not set: the coordinator's HOST:PORT")
        if not secret_file:
            raise ValueError("TFCOORD_SECRET_FILE is not set: the file holding the coordinator secret")
        try:
            secret = auth.read_secret(secret_file)
        except OSError as e:
            raise ValueError(f"TFCOORD_SECRET_FILE={secret_file}: {e.strerror or e}") from None
        ca, cert, key = (
            env.get(k) or None for k in ("TFCOORD_TLS_CA", "TFCOORD_TLS_CERT", "TFCOORD_TLS_KEY")
        )
        if "ssl_context" not in kw and (ca or cert or key):
            kw["ssl_context"] = tls.client_context(ca, cert, key)
        return cls(address, secret, **kw)

    def job_token(self, job: str) -> bytes:
        """The token nodes of ``job`` (submitted by this driver) authenticate with."""
        if self.role != "driver":
            raise ValueError("only the driver that submitted a job can make its node token")
        return auth.job_token(self.secret, job, self.owner)

    def submit(self, spec: m.JobSpec, job: str | None = None) -> str:
        """Submit a job; returns its id. Resubmitting the same id and spec is harmless."""
        from .jobreplies import Submitted

        job_id = job or new_job_id(spec.name)
        Submitted.decode(_result(self.request(lambda i: m.Submit(id=i, job=job_id, spec=spec))))
        return job_id

    @overload
    def status(self, job: str) -> JobStatus: ...
    @overload
    def status(self, job: None = None) -> JobList: ...

    def status(self, job: str | None = None) -> JobStatus | JobList:
        """One job's full status, or every job (:class:`JobList`) when ``job`` is None."""
        from .jobreplies import JobList, JobStatus

        result = _result(self.request(lambda i: m.Status(id=i, job=job)))
        return JobList.decode(result) if job is None else JobStatus.decode(result)

    def logs(
        self, job: str, *, executor_id: int = -1, since: int = 0, limit: int = m.MAX_LOGS_REPLY
    ) -> dict[str, Any]:
        """The output of a job's nodes from line ``since`` on (see ``GetLogs``): ``lines`` as
        ``[seq, time, executor_id, stream, text]``, ``nodes`` with their ``dropped`` counts,
        ``next`` for the following call."""
        from .jobreplies import Logs

        reply = self.request(
            lambda i: m.GetLogs(id=i, job=job, executor_id=executor_id, since=since, limit=limit)
        )
        return dict(Logs.decode(_result(reply)).wire)

    def jobs(self) -> tuple[JobSummary, ...]:
        """Every job this client may see."""
        return self.status(None).jobs

    def watch(
        self, job: str, version: int, timeout_s: float, *, brief: bool = False, reports: int = -1
    ) -> JobStatus:
        """Block until the job changes past ``version`` (or the timeout); returns its status.

        With ``brief``, its summary: no nodes, history or timeline, ``running`` and
        ``missing_count`` as numbers, the first missing slots only (progress lines need no
        more, and a 10,000-node job's full status is megabytes).

        With ``reports`` (a status's ``reports``), a node's progress figures or usage
        reported after that status answer too: they change no ``version``.
        """
        from .jobreplies import JobStatus

        reply = self.request(
            lambda i: m.WatchJob(
                id=i, job=job, version=version, timeout_s=timeout_s, brief=brief, reports=reports
            ),
            timeout_s + REPLY_SLACK_S,
        )
        return JobStatus.decode(_result(reply))

    def await_job(
        self, job: str, timeout_s: float = m.MAX_TIMEOUT_S, *, raise_on_failure: bool = True
    ) -> JobStatus:
        """Block until the job ends; returns its final status.

        Raises:
            JobFailed: the job FAILED; the message names the node and carries its error.
            JobStopped: the job was STOPPED (only with ``raise_on_failure``).
            DeadlineExceeded: still running at the deadline.
        """
        from .jobreplies import JobStatus

        try:
            reply = self.request(
                lambda i: m.AwaitJob(id=i, job=job, timeout_s=timeout_s), timeout_s + REPLY_SLACK_S
            )
        except RequestRejected as e:
            if e.code == ErrorCode.TIMEOUT:
                raise DeadlineExceeded(e.message) from None
            raise
        status = JobStatus.decode(_result(reply))
        if raise_on_failure:
            check_outcome(status)
        return status

    def stop(
        self,
        job: str,
        reason: str = "stop requested",
        *,
        dry_run: bool = False,
        cause: FailureReason = FailureReason.STOPPED,
    ) -> StopResult:
        """Ask every node of a job to stop; the job ends STOPPED once they acknowledge.

        ``reason`` says why to people; ``cause`` to programs (the job's ``reason`` once
        stopped): a stop someone asked for, or the engine running the nodes giving up.
        """
        from .jobreplies import StopResult

        reply = self.request(lambda i: m.StopJob(id=i, job=job, reason=reason, dry_run=dry_run, cause=cause))
        return StopResult.decode(_result(reply))

    def finish(self, job: str, serving_grace_s: float) -> JobState:
        """Wind the job down: once its chief/master/worker nodes have all succeeded, its ps
        and evaluator nodes get ``serving_grace_s`` to end on their own before they are told
        to stop (a stop from then on ends the job SUCCEEDED). Returns the job's state."""
        from .jobreplies import Finished

        reply = self.request(lambda i: m.Finish(id=i, job=job, serving_grace_s=float(serving_grace_s)))
        return Finished.decode(_result(reply)).state


def check_outcome(status: JobStatus) -> None:
    """Raise JobFailed / JobStopped for a terminal status that is not SUCCEEDED.

    The message carries the node's own error text (and its traceback), which whatever
    catches the error prints: its control characters are escaped, its lines kept.
    """
    if status.state == JobState.FAILED:
        message = printable(f"job {status.job} failed: {status.error}", keep=TRACEBACK)
        raise JobFailed(status.job, message, status)
    if status.state == JobState.STOPPED:
        message = printable(f"job {status.job} was stopped: {status.stop_reason}", keep=TRACEBACK)
        raise JobStopped(status.job, message, status)


def new_job_id(name: str = "") -> str:
    import uuid

    base = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40].strip("-_.") or "job"
    return f"{base}-{uuid.uuid4().hex[:10]}"


# -- nodes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterInfo:
    """What a node learns once its cluster is complete."""

    job: str
    executor_id: int
    role: str
    index: int
    #: role → ["host:port", ...] ordered by task index.
    cluster: dict[str, list[str]]

    @property
    def tf_config(self) -> dict[str, Any]:
        """The TF_CONFIG TensorFlow reads: always set, with task type and index."""
        return {"cluster": self.cluster, "task": {"type": self.role, "index": self.index}}

    def tf_config_json(self) -> str:
        return json.dumps(self.tf_config, separators=(",", ":"))

    @property
    def num_workers(self) -> int:
        """Training tasks: chief/master plus workers (TensorFlowOnSpark's num_workers)."""
        return sum(len(self.cluster.get(r, ())) for r in ("chief", "master", "worker"))

    @property
    def address(self) -> str:
        return self.cluster[self.role][self.index]


class NodeClient(Client):
    """One node of one job. Authenticates with the job token.

    Args:
        executor_id: the node's slot (TensorFlowOnSpark's executor id / worker_num).
        attempt: a higher attempt of the same slot supersedes a lower one while reserving.
    """

    def __init__(
        self, address: str, token: bytes, job: str, executor_id: int, attempt: int = 0, **kw: Any
    ) -> None:
        super().__init__(address, token, role="node", job=job, **kw)
        self.executor_id = executor_id
        self.attempt = attempt
        #: The cluster generation this node registered in (sent with every later request).
        self.generation = 0
        #: What the registration answered this node proves itself with after a reconnect
        #: (sent with every later request; never logged).
        self.credential = ""
        #: The connection (counted by ``reconnects``) the registration came on; None: not yet.
        self._registered_on: int | None = None
        #: The generation the next registration joins: -1, the job's current one.
        self._join = -1
        #: Told to stop because the job restarted: the generation to rejoin, and after how long.
        self.restart_to: int | None = None
        self.restart_backoff_s = 0.0
        self._on_stop: Callable[[str], None] | None = None
        #: Orders a stop answer's "is it about my generation?" against :meth:`rejoin`.
        self._generation_lock = threading.Lock()
        self._rewatch = False
        self._hb_interval_s = DEFAULT_HEARTBEAT_INTERVAL_S
        self.stop_event = threading.Event()
        self.stop_reason = ""
        self.heartbeat_error: BaseException | None = None
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()

    def _ids(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "executor_id": self.executor_id,
            "attempt": self.attempt,
            "generation": self.generation,
            "credential": self._proof(),
        }

    def _proof(self) -> str:
        """The credential, once this node speaks from another connection than the one it
        registered on (it reconnected); on that one, the connection itself says who it is."""
        return self.credential if self._registered_on != self.reconnects else ""

    def _resent(self, msg: m.Message) -> m.Message:
        # Requests made before a reconnect go again from a new connection: with the credential.
        if self.credential and hasattr(msg, "credential") and not msg.credential:
            return dataclasses.replace(msg, credential=self.credential)  # type: ignore[call-arg]
        return msg

    def _of_generation(self, build: Callable[[int], m.Request], timeout_s: float | None = None) -> m.Message:
        """Send a request of this node's generation. Refused as stale: the job restarted its
        cluster after this node's last answer and before this request (a peer was lost while
        this node forked its work, say). The node then asks where the job is, with a heartbeat
        of the generation it is in, which is answered as its stop watch is (stop, and rejoin
        generation N after the backoff), and raises :class:`ClusterRestarted`: without that
        answer it could only exit, and the new generation would wait for it in vain."""
        generation = self.generation
        try:
            return self.request(build, timeout_s)
        except RequestRejected as e:
            if e.code != ErrorCode.STALE_GENERATION or generation != self.generation:
                raise
            self.heartbeat()
            raise ClusterRestarted(e.code, e.message, self.restart_to) from None

    def register(
        self,
        host: str,
        port: int,
        *,
        gpus: Sequence[str] = (),
        task_id: str = "",
        meta: Mapping[str, Any] | None = None,
    ) -> Registration:
        """Claim this node's slot (in the generation :meth:`rejoin` named, else the job's
        current one); returns the role and index it holds, and its generation.

        Raises:
            ClusterRestarted: the generation to rejoin is over already (the job restarted its
                cluster again meanwhile).
        """
        join, job = self._join, self.job
        assert job is not None  # a node's client always names its job
        reply = self._of_generation(
            lambda i: m.Register(
                id=i,
                job=job,
                executor_id=self.executor_id,
                attempt=self.attempt,
                host=host,
                port=port,
                gpus=tuple(gpus),
                task_id=task_id,
                meta=dict(meta or {}),
                generation=join,
                credential=self._proof(),
            )
        )
        reg = Registration.decode(_result(reply))
        self.generation, self.credential = reg.generation, reg.credential
        self._registered_on = self.reconnects
        if self._rewatch:
            self._rewatch = False
            self._watch_stop()
        return reg

    def await_cluster(self, timeout_s: float = 600.0) -> ClusterInfo:
        """Block until every node of the job has registered; returns the cluster.

        Raises:
            DeadlineExceeded: not complete in time; the message names who is missing.
            ClusterRestarted: the job restarted its cluster before the request arrived.
            RequestRejected: the job failed or was stopped meanwhile.
        """
        try:
            reply = self._of_generation(
                lambda i: m.AwaitCluster(id=i, timeout_s=timeout_s, **self._ids()), timeout_s + REPLY_SLACK_S
            )
        except RequestRejected as e:
            if e.code == ErrorCode.TIMEOUT:
                raise DeadlineExceeded(e.message) from None
            raise
        assert isinstance(reply, m.ClusterReply)
        cluster = decode_spec(reply.spec)
        return ClusterInfo(self.job or "", self.executor_id, reply.role, reply.index, cluster)

    def report(
        self,
        state: NodeState | str,
        error: str = "",
        meta: Mapping[str, Any] | None = None,
        exit_code: int = 0,
    ) -> Reported:
        """Report RUNNING, SUCCEEDED, FAILED (with error text and the work's exit status,
        negative for a signal: it decides whether the failure restarts the cluster) or STOPPED.

        Raises:
            ClusterRestarted: the job restarted its cluster before the report arrived.
        """
        if len(error) > m.MAX_ERROR_LEN:  # keep the tail: the end of a traceback says what broke
            error = "...\n" + error[-(m.MAX_ERROR_LEN - 4) :]
        code = max(-255, min(255, exit_code))
        reply = self._of_generation(
            lambda i: m.Report(
                id=i,
                state=NodeState(state.upper()),
                error=error,
                meta=dict(meta or {}),
                exit_code=code,
                **self._ids(),
            )
        )
        return Reported.decode(_result(reply))

    def send_logs(self, stream: str, lines: Sequence[str], dropped: int = 0) -> None:
        """Send lines of the work's output (escaped, each at most ``MAX_LOG_LINE`` long)."""
        reply = self.request(
            lambda i: m.NodeLogs(id=i, stream=stream, lines=tuple(lines), dropped=dropped, **self._ids())
        )
        Ack.decode(_result(reply))

    def progress(
        self, figures: Mapping[str, int | float], usage: Mapping[str, int | float] | None = None
    ) -> None:
        """Send what the node's work reported (step, loss, ...) and what its supervisor
        measured of it (``usage``: CPU, memory); see ``tfcoord.node.reporting``."""
        reply = self.request(
            lambda i: m.Progress(id=i, figures=dict(figures), usage=dict(usage or {}), **self._ids())
        )
        Ack.decode(_result(reply))

    def heartbeat(self, meta: Mapping[str, Any] | None = None) -> StopAnswer:
        """One heartbeat (optionally updating the node's metadata); says whether to stop."""
        generation = self.generation
        reply = self.request(lambda i: m.Heartbeat(id=i, meta=dict(meta or {}), **self._ids()))
        answer = StopAnswer.decode(_result(reply))
        self._answered(answer, generation)
        return answer

    def await_stop(self, timeout_s: float = m.MAX_TIMEOUT_S) -> bool:
        """Block until this node must stop (True) or the timeout passes (False)."""
        generation = self.generation
        reply = self.request(
            lambda i: m.AwaitStop(id=i, timeout_s=timeout_s, **self._ids()), timeout_s + REPLY_SLACK_S
        )
        answer = StopAnswer.decode(_result(reply))
        self._answered(answer, generation)
        return answer.stop

    def _answered(self, answer: StopAnswer, generation: int) -> None:
        """A stop answer to a request made in ``generation``: an answer about a generation
        this node already left (it rejoined meanwhile) says nothing about the new one."""
        with self._generation_lock:
            if not answer.stop or generation != self.generation:
                return
            if answer.restart >= 0 and self.restart_to is None:
                self.restart_to, self.restart_backoff_s = answer.restart, answer.backoff_s
            self._stop(answer.reason)

    def rejoin(self) -> int:
        """After a stop that restarts the job's cluster (``restart_to``): forget the stop and
        make the next :meth:`register` join that generation (the stop watch starts again then).
        Returns the generation.

        Raises:
            RuntimeError: the node was not told to restart.
        """
        with self._generation_lock:
            if self.restart_to is None:
                raise RuntimeError(
                    "rejoin() without a restart: the coordinator did not ask this node to rejoin"
                )
            self._join, self.restart_to = self.restart_to, None
            self.generation = self._join
            self.stop_reason = ""
            self.stop_event.clear()
        # The stop watch starts again once registered: until then the slot is empty, and
        # an empty slot's answer is "stop".
        self._rewatch = self._hb_thread is not None
        return self._join

    def should_stop(self) -> bool:
        """Whether the coordinator has told this node to stop (no round trip)."""
        return self.stop_event.is_set()

    def _stop(self, reason: str) -> None:
        if not self.stop_event.is_set():
            self.stop_reason = reason
            self.stop_event.set()

    def start_heartbeats(
        self, interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S, on_stop: Callable[[str], None] | None = None
    ) -> None:
        """Heartbeat in a background thread; ``on_stop(reason)`` runs once when told to stop.

        A parallel ``await_stop`` wait delivers a stop the moment it is requested; the
        heartbeats prove liveness and are the fallback.
        """

        def beat() -> None:
            while not self._hb_stop.is_set() and not self._closed.is_set():
                try:
                    self.heartbeat()
                except Exception as e:  # reconnect already happened inside; record and go on
                    self.heartbeat_error = e
                    if isinstance(e, (ConnectionClosed, AuthenticationFailed)):
                        return
                self._hb_stop.wait(interval_s)

        self._on_stop, self._hb_interval_s = on_stop, interval_s
        self._hb_thread = threading.Thread(target=beat, name="tfcoord-heartbeat", daemon=True)
        self._hb_thread.start()
        self._watch_stop()

    def _watch_stop(self) -> None:
        """Wait for the coordinator's stop (``await_stop``, answered by push) in a thread of its
        own; ``on_stop`` runs once when it comes. Once per generation the node is in."""
        on_stop, interval_s = self._on_stop, self._hb_interval_s

        def watch_stop() -> None:
            while not self._hb_stop.is_set() and not self._closed.is_set():
                try:
                    if self.await_stop(timeout_s=3600.0):
                        break
                except Exception:
                    if self._closed.is_set():
                        return
                    self._hb_stop.wait(interval_s)
            if on_stop is not None and self.stop_event.is_set():
                on_stop(self.stop_reason)

        threading.Thread(target=watch_stop, name="tfcoord-stop-watch", daemon=True).start()

    def close(self) -> None:
        self._hb_stop.set()
        super().close()
