"""TensorFlowOnSpark's ``reservation`` module: ``Reservations``, ``Server`` and ``Client``, served
by tfcoord's coordinator.

tfcoord's own clusters never use this: their driver runs an embedded coordinator and the
nodes register there. The module keeps TensorFlowOnSpark's public classes for the programs
(and tests) that use them directly, as a translation onto the same machinery:

* ``Server(count)``: ``start()`` starts an embedded coordinator of its own (TLS with an
  ephemeral certificate, every limit of the coordinator) on this host's address
  (``TFOS_SERVER_HOST``, else this host's address on its default route; never every
  interface), on ``TFOS_SERVER_PORT`` when set (a port, or ``LOW-HIGH``: the first free one),
  and submits one job of ``count`` slots: a reservation is a node registration.
  ``start()`` returns a :class:`ReservationAddress`: TensorFlowOnSpark's ``(host, port)``
  tuple, which also carries what a client needs to authenticate (the job, its node token,
  the job's reading credential and the pinned CA) and survives pickling into a Spark closure.
* ``Client(addr)``: ``register(meta)`` registers a node of that job (the first free slot,
  from ``meta['executor_id']`` on) with ``meta`` as its metadata; ``get_reservations()``
  is every registered node's metadata, ``await_reservations()`` the same once every slot
  is taken (pushed by the coordinator, never polled); ``request_stop()`` stops the job, and
  the server with it.
* ``Reservations(required)``: TensorFlowOnSpark's thread-safe list of metadata, for code
  that uses the class itself (the server keeps its reservations in the coordinator).

Reading and stopping use the coordinator's admin credential, which here covers exactly one
job: the coordinator is this server's own and holds nothing else (and an admin never
submits). Nothing received is ever unpickled: metadata travels as JSON (strings, numbers,
booleans, None, lists, maps and bytes, at most ``MAX_META_CHARS`` characters).

``utils/stop_streaming.py HOST PORT`` gives ``Client`` a plain ``(host, port)``: when a
coordinator of this user listens on that host and port on this machine (a tfcoord driver's,
or a ``Server``'s), ``request_stop()`` stops its jobs with the admin credential from the
coordinator's connection file (:mod:`tfcoord.client.connfile`, readable only by the user
who started it); from elsewhere use ``tfcoord stop JOB --address HOST:PORT
--admin-secret-file FILE``.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfcoord.client import DriverClient, JobSpec, NodeClient, RequestRejected, TfcoordError, connfile, tls
from tfcoord.client.errors import ConnectionClosed
from tfcoord.client.jobreplies import JobStatus, NodeStatus
from tfcoord.client.messages import MAX_NODES_PER_JOB, MAX_TEXT_LEN, MAX_TIMEOUT_S
from tfcoord.client.vocab import ErrorCode, JobState, NodeState
from tfcoord.client.watcher import watch_until
from tfcoord.coordinator.embedded import EmbeddedCoordinator

from . import util

log = logging.getLogger("tfcoord.compat")

#: Why the jobs stop, as their status shows it.
STOP_REASON = "stop requested by reservation.Client.request_stop() (utils/stop_streaming.py)"
#: Connecting, and any one request but a wait, take milliseconds.
TIMEOUT_S = 30.0
#: The most reservations one server takes: a job's slots.
MAX_COUNT = MAX_NODES_PER_JOB
#: The job's one role: reservations have no TensorFlow role (TensorFlowOnSpark's nodes say
#: theirs in their metadata).
ROLE = "reservation"
#: Where a node's metadata lives in its registration: ``Client.register``'s, and that of a
#: node started by ``TFSparkNode.run`` (whose host and port are its registration's).
META_KEY = "tfos.reservation"
NODE_META_KEY = "tfos.node"
#: A node's metadata, encoded, is one metadata value of the coordinator.
MAX_META_CHARS = MAX_TEXT_LEN
#: After a stop request, how long the server waits for the registered nodes to acknowledge
#: before it closes the coordinator anyway (a ``Client`` that registered and left never does).
STOP_GRACE_S = 5.0
#: Refusals of a registration that mean "this slot is taken": the next one is tried.
TAKEN = frozenset({ErrorCode.DUPLICATE, ErrorCode.SLOT_HELD, ErrorCode.ALREADY_TERMINAL})


# -- the address -----------------------------------------------------------------------------


class ReservationAddress(tuple[str, int]):
    """TensorFlowOnSpark's ``(host, port)``, carrying the credentials of one reservation job.

    It unpacks, compares and prints as the tuple (the credentials are never shown), and
    pickles with them, so a ``Client`` on an executor can authenticate.

    Attributes:
        job: the reservation job's id.
        size: its number of slots (the server's ``count``).
        token: the job's node token (registers a node of this job only).
        reader: the admin credential of the server's own coordinator, which holds this job
            alone: it reads and stops the job, never submits.
        ca_pem: the coordinator's ephemeral CA, pinned by every client (public).
    """

    job: str
    size: int
    token: bytes
    reader: bytes
    ca_pem: str

    def __new__(
        cls, host: str, port: int, *, job: str, size: int, token: bytes, reader: bytes, ca_pem: str
    ) -> ReservationAddress:
        self = super().__new__(cls, (host, int(port)))
        self.job, self.size, self.token, self.reader, self.ca_pem = job, size, token, reader, ca_pem
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_address, (self[0], self[1], self.job, self.size, self.token, self.reader, self.ca_pem))

    @property
    def address(self) -> str:
        """``host:port`` as tfcoord's clients take it."""
        host, port = self
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def context(self) -> ssl.SSLContext:
        """The TLS context toward the coordinator: its CA pinned."""
        return tls.client_context(ca_pem=self.ca_pem)


def _address(
    host: str, port: int, job: str, size: int, token: bytes, reader: bytes, ca_pem: str
) -> ReservationAddress:
    return ReservationAddress(host, port, job=job, size=size, token=token, reader=reader, ca_pem=ca_pem)


# -- metadata ----------------------------------------------------------------------------------


def _to_json(v: Any) -> Any:
    if isinstance(v, bytes):
        return {"__bytes__": base64.b64encode(v).decode("ascii")}
    if isinstance(v, Mapping):
        return {str(k): _to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_to_json(x) for x in v]
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    raise ValueError(f"{type(v).__name__} cannot travel in reservation metadata")


def _from_json(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"__bytes__"}:
            return base64.b64decode(v["__bytes__"])
        return {k: _from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    return v


def encode_meta(meta: Mapping[str, Any]) -> str:
    """A node's metadata as one registration value.

    Raises:
        ValueError: it holds something else than strings, numbers, booleans, None, lists,
            maps and bytes, or is over ``MAX_META_CHARS`` encoded.
    """
    text = json.dumps(_to_json(dict(meta)), separators=(",", ":"))
    if len(text) > MAX_META_CHARS:
        raise ValueError(
            f"reservation metadata is {len(text)} characters encoded; the limit is {MAX_META_CHARS}"
        )
    return text


def node_entry(node: NodeStatus) -> dict[str, Any] | None:
    """A registered node's reservation (TensorFlowOnSpark's metadata), None for another node."""
    raw = node.meta.get(META_KEY)
    if isinstance(raw, str):
        entry: dict[str, Any] = _from_json(json.loads(raw))
        return entry
    raw = node.meta.get(NODE_META_KEY)
    if isinstance(raw, str):  # a TFSparkNode: its address is the one it registered
        return {**_from_json(json.loads(raw)), "host": node.host, "port": node.port}
    return None


def reservations(status: JobStatus) -> list[dict[str, Any]]:
    """Every registered node's reservation, in the order they arrived."""
    nodes = sorted(status.nodes, key=lambda n: n.registered_at)
    return [e for e in map(node_entry, nodes) if e is not None]


# -- the reservations ----------------------------------------------------------------------------


class Reservations:
    """Node metadata from ``required`` nodes, safe to share between threads.

    Args:
        required: how many reservations make it ``done()``.
        primary_keys: the metadata keys that name a node; ``upsert`` replaces the entry
            whose values for them match (without, ``upsert`` adds).
    """

    def __init__(self, required: int, primary_keys: Sequence[str] | None = None) -> None:
        if isinstance(required, bool) or not isinstance(required, int) or not 0 <= required <= MAX_COUNT:
            raise ValueError(f"required must be a count of nodes from 0 to {MAX_COUNT}, not {required!r}")
        self.required = required
        self.primary_keys = tuple(primary_keys or ())
        self.reservations: list[dict[str, Any]] = []
        self._changed = threading.Condition()

    def add(self, meta: Mapping[str, Any]) -> None:
        """Add one node's metadata.

        Raises:
            ValueError: all ``required`` reservations already arrived.
        """
        with self._changed:
            if len(self.reservations) >= self.required:
                raise ValueError(
                    f"all {self.required} reservations already arrived; {dict(meta)!r} is one too many"
                )
            self.reservations.append(dict(meta))
            self._changed.notify_all()

    def upsert(self, meta: Mapping[str, Any]) -> None:
        """Replace the reservation with the same primary keys, else add this one."""
        with self._changed:
            if self.primary_keys:
                key = [meta.get(k) for k in self.primary_keys]
                for i, r in enumerate(self.reservations):
                    if [r.get(k) for k in self.primary_keys] == key:
                        self.reservations[i] = dict(meta)
                        self._changed.notify_all()
                        return
            self.add(meta)

    def done(self) -> bool:
        with self._changed:
            return len(self.reservations) >= self.required

    def get(self) -> list[dict[str, Any]]:
        """A copy of the reservations so far."""
        with self._changed:
            return [dict(r) for r in self.reservations]

    def remaining(self) -> int:
        with self._changed:
            return self.required - len(self.reservations)


# -- the server --------------------------------------------------------------------------------


def _port_spec(spec: str) -> list[int]:
    """``TFOS_SERVER_PORT``'s ports: ``"9999"`` or ``"9997-9999"``."""
    low, dash, high = spec.strip().partition("-")
    try:
        ports = list(range(int(low), int(high) + 1)) if dash else [int(low)]
    except ValueError:
        ports = []
    if not ports or not all(1 <= p <= 65535 for p in ports):
        raise ValueError(
            f"TFOS_SERVER_PORT must be a port (9999) or a range of ports (9997-9999), not {spec!r}"
        )
    return ports


@dataclass(frozen=True)
class _Running:
    coordinator: EmbeddedCoordinator
    driver: DriverClient
    address: ReservationAddress


class Server:
    """A reservation server for ``count`` nodes (see the module's docstring).

    Attributes:
        done: a stop was requested (``Client.request_stop()`` or ``stop()``).
    """

    def __init__(self, count: int, primary_keys: Sequence[str] | None = None) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            raise ValueError(f"count must be a number of nodes from 1 to {MAX_COUNT}, not {count!r}")
        self.count = count
        #: Accepted for TensorFlowOnSpark's signature: a node's slot is its registration's, so
        #: a node registering again (a Spark task retry) replaces its own entry without keys.
        self.primary_keys = tuple(primary_keys or ())
        self._listener: socket.socket | None = None
        self._running: _Running | None = None
        self._done = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped (a stop was requested, or ``stop()``); whether it has."""
        return self._closed.wait(timeout)

    def status(self) -> JobStatus | None:
        """The reservation job as tfcoord shows it (its nodes, their metadata); None unless serving."""
        running = self._running
        if running is None:
            return None
        try:
            return running.driver.status(running.address.job)
        except TfcoordError:  # stopped meanwhile
            return None

    def get_server_ip(self) -> str:
        """``TFOS_SERVER_HOST``, else this host's address (what clients dial, and what is bound)."""
        return os.environ.get("TFOS_SERVER_HOST") or util.get_ip_address()

    def get_server_ports(self) -> list[int]:
        """The ports ``TFOS_SERVER_PORT`` allows, else ``[0]`` (any free port).

        Raises:
            ValueError: ``TFOS_SERVER_PORT`` is neither a port nor a range of ports.
        """
        spec = os.environ.get("TFOS_SERVER_PORT", "").strip()
        return _port_spec(spec) if spec else [0]

    def start_listening_socket(self) -> socket.socket:
        """A socket listening on this host's address (:meth:`get_server_ip`), on the first free
        allowed port; ``start()`` serves on it.

        Raises:
            OSError: every port ``TFOS_SERVER_PORT`` allows is taken, or the address is not one
                of this host's.
        """
        host = self.get_server_ip()
        last: OSError | None = None
        for port in self.get_server_ports():
            try:
                s = socket.create_server((host, port), family=_family(host), backlog=128)
            except OSError as e:
                last = e
                continue
            with self._lock:
                old, self._listener = self._listener, s
            if old is not None:
                old.close()
            return s
        if last is not None and last.errno == errno.EADDRNOTAVAIL:
            raise OSError(
                last.errno,
                f"cannot listen on {host}: it is not an address of this host; set TFOS_SERVER_HOST to "
                "the address executors reach this driver at",
            )
        raise OSError(
            f"no free port for the reservation server: every port TFOS_SERVER_PORT="
            f"{os.environ.get('TFOS_SERVER_PORT')!r} allows is in use; widen the range or free one"
        )

    def start(self) -> ReservationAddress:
        """Serve: a coordinator of this server's own and one job of ``count`` slots.

        Returns:
            ``(host, port)`` for clients, with the job's credentials (:class:`ReservationAddress`).
        """
        with self._lock:
            if self._running is not None:
                return self._running.address
            listener, self._listener = self._listener, None
        listener = listener or self.start_listening_socket()
        with self._lock:
            self._listener = None
        host = self.get_server_ip()
        bound = listener.getsockname()[0]
        try:
            coord = EmbeddedCoordinator(
                host=bound,
                advertise_host=host,
                sock=listener,
                connection_dir=connfile.runtime_dir(os.environ),
            ).start()
        except BaseException:
            listener.close()
            raise
        try:
            driver = DriverClient(
                coord.address, coord.secret, ssl_context=coord.client_context(), fail_fast=True
            ).connect()
            spec = JobSpec(
                roles=((ROLE, self.count),),
                # TensorFlowOnSpark's reservations last as long as the server: no deadline, and a
                # client that registered and left still holds its reservation.
                reservation_timeout_s=MAX_TIMEOUT_S,
                heartbeat_timeout_s=MAX_TIMEOUT_S,
                reconnect_grace_s=MAX_TIMEOUT_S,
                name="tensorflowonspark-reservations",
            )
            job = driver.submit(spec)
            assert coord.ca_pem is not None  # the embedded coordinator's default: its own TLS
            addr = ReservationAddress(
                host,
                coord.port,
                job=job,
                size=self.count,
                token=driver.job_token(job),
                reader=coord.admin_secret,
                ca_pem=coord.ca_pem,
            )
        except BaseException:
            coord.stop()
            raise
        with self._lock:
            self._running = _Running(coord, driver, addr)
        threading.Thread(target=self._watch, args=(driver, job), name="tfos-reservation", daemon=True).start()
        log.info("reservation server listening at %s:%d for %d node(s)", host, coord.port, self.count)
        return addr

    @property
    def reservations(self) -> Reservations:
        """The reservations so far (TensorFlowOnSpark's attribute), as a :class:`Reservations`."""
        r = Reservations(self.count, self.primary_keys)
        status = self.status()
        for entry in reservations(status) if status is not None else ():
            r.upsert(entry)
        return r

    def await_reservations(
        self, sc: Any = None, status: Mapping[str, Any] | None = None, timeout: float = 600
    ) -> list[dict[str, Any]]:
        """Block until every node registered; their metadata.

        Raises:
            RuntimeError: ``status['error']`` was set meanwhile (a failed Spark job), or the
                server stopped first.
            TimeoutError: ``timeout`` seconds passed first (the message says how many came).
        """
        status = {} if status is None else status
        running = self._running
        if running is None:
            raise RuntimeError("start() the reservation server first")
        deadline = time.monotonic() + timeout
        job = running.address.job

        def settled(st: JobStatus) -> bool:
            return st.registered >= st.size or st.state == JobState.STOPPING or st.terminal

        seen: JobStatus | None = None
        while True:
            if status.get("error"):
                raise RuntimeError(f"reservations failed: {status['error']}")
            if self.done:
                raise RuntimeError(self._stopped_with(seen))
            left = deadline - time.monotonic()
            try:
                seen = watch_until(
                    running.driver, job, settled, timeout_s=max(0.0, min(1.0, left)), since=seen
                )
            except (ConnectionClosed, TfcoordError) as e:
                raise RuntimeError(f"the reservation server stopped: {e}") from None
            if seen.registered >= seen.size:
                return reservations(seen)
            if settled(seen):
                raise RuntimeError(self._stopped_with(seen))
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"reservation timed out after {timeout:g} s: {seen.registered} of "
                    f"{seen.size} nodes registered ({seen.size - seen.registered} missing)"
                )

    def _stopped_with(self, seen: JobStatus | None) -> str:
        got = f"{seen.registered} of {seen.size}" if seen is not None else f"? of {self.count}"
        return f"the reservation server stopped with {got} reservations"

    def stop(self) -> None:
        """Stop serving: the coordinator (and with it every connection) and the listening socket."""
        self._done.set()
        with self._lock:
            listener, self._listener = self._listener, None
            running, self._running = self._running, None
        if listener is not None:
            listener.close()
        if running is not None:
            running.driver.close()
            running.coordinator.stop()
        self._closed.set()

    def _watch(self, driver: DriverClient, job: str) -> None:
        """Until a stop is requested (then the server stops), or the server is stopped."""

        def stopping(st: JobStatus) -> bool:
            return st.state in (JobState.STOPPING, JobState.STOPPED)

        try:
            st = watch_until(driver, job, stopping, timeout_s=MAX_TIMEOUT_S, brief=True)
            if not stopping(st):
                return
            self._done.set()
            watch_until(driver, job, lambda s: s.terminal, timeout_s=STOP_GRACE_S, brief=True, since=st)
        except (ConnectionClosed, TfcoordError):  # stopped meanwhile
            return
        self.stop()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# -- the client --------------------------------------------------------------------------------


class Client:
    """Talks to the reservation server, or a tfcoord driver, at ``server_addr`` (``(host, port)``).

    Raises:
        ConnectionError: nothing answers there (the message says what was tried and what to
            do instead).
    """

    def __init__(self, server_addr: Any) -> None:
        host, port = server_addr
        self.server_addr = (str(host), int(port))
        self._addr = server_addr if isinstance(server_addr, ReservationAddress) else None
        self._node: NodeClient | None = None
        self._slot = -1
        if self._addr is not None:
            self._reader = self._connect(
                self._addr.address, self._addr.reader, self._addr.context(), f"{host}:{port}"
            )
            return
        directory = connfile.runtime_dir(os.environ)
        conn = next((c for c in connfile.find(directory) if _names(c, host, int(port))), None)
        if conn is None:
            raise ConnectionError(
                f"no tfcoord coordinator of yours listens at {host}:{port} on this machine (looked for its "
                f"connection file in {directory}); use the address reservation.Server.start() returned, "
                "check the address the driver logged, or use tfcoord stop JOB --address HOST:PORT "
                "--admin-secret-file FILE"
            )
        context = tls.client_context(ca_pem=conn.ca_pem) if conn.ca_pem else None
        self._reader = self._connect(conn.address, conn.admin_secret, context, f"{host}:{port}")

    @staticmethod
    def _connect(address: str, secret: bytes, context: ssl.SSLContext | None, shown: str) -> DriverClient:
        try:
            return DriverClient(
                address,
                secret,
                role="admin",
                ssl_context=context,
                connect_deadline_s=TIMEOUT_S,
                reconnect_deadline_s=TIMEOUT_S,
                fail_fast=True,
                request_timeout_s=TIMEOUT_S,
            ).connect()
        except TfcoordError as e:
            raise ConnectionError(f"nothing answers at {shown} as a reservation server: {e}") from None

    def _job(self, call: str) -> ReservationAddress:
        if self._addr is None:
            host, port = self.server_addr
            raise RuntimeError(
                f"{host}:{port} was given as a plain (host, port): of reservation.Client's calls it "
                f"takes only request_stop(); {call}() needs the address reservation.Server.start() returned"
            )
        return self._addr

    def register(self, reservation: Mapping[str, Any]) -> str:
        """Register a node with this metadata (the first free slot from its ``executor_id`` on);
        ``'OK'``.

        Raises:
            ValueError: the metadata cannot travel (see the module's docstring).
            RuntimeError: every slot is taken, or the server refused.
        """
        addr = self._job("register")
        try:
            value = encode_meta(reservation)
        except ValueError as e:
            raise ValueError(f"cannot send reg to the reservation server: {e}") from None
        if self._node is None:
            self._node = NodeClient(
                addr.address,
                addr.token,
                addr.job,
                0,
                ssl_context=addr.context(),
                connect_deadline_s=TIMEOUT_S,
                fail_fast=True,
            ).connect()
        node = self._node
        # Where the registration says the node is: the metadata keeps what the caller said.
        host = node.local_host()
        port = reservation.get("port")
        port = port if isinstance(port, int) and 0 < port < 65536 else addr[1]
        first = reservation.get("executor_id")
        first = first if isinstance(first, int) and first >= 0 else 0
        # A client of its own: never "the same node again" as another client's registration.
        task = f"reservation.Client {uuid.uuid4().hex[:12]}"
        slots = [self._slot] if self._slot >= 0 else [(first + k) % addr.size for k in range(addr.size)]
        for slot in slots:
            node.executor_id = slot
            try:
                node.register(host, port, task_id=task, meta={META_KEY: value})
            except RequestRejected as e:
                if e.code in TAKEN and self._slot < 0:
                    continue
                raise RuntimeError(f"the reservation server refused reg: {e.message}") from None
            self._slot = slot
            return "OK"
        raise RuntimeError(
            f"the reservation server refused reg: all {addr.size} reservations already arrived; "
            f"{dict(reservation)!r} is one too many"
        )

    def get_reservations(self) -> list[dict[str, Any]]:
        """Every node's metadata, registered so far."""
        addr = self._job("get_reservations")
        return reservations(self._status(addr.job))

    def await_reservations(self) -> list[dict[str, Any]]:
        """Block until every node registered; their metadata (the coordinator pushes the change).

        Raises:
            RuntimeError: the reservations were stopped first.
        """
        addr = self._job("await_reservations")

        def settled(st: JobStatus) -> bool:
            return st.registered >= st.size or st.state == JobState.STOPPING or st.terminal

        try:
            st = watch_until(self._reader, addr.job, settled, timeout_s=MAX_TIMEOUT_S)
        except TfcoordError as e:
            raise ConnectionError(f"the reservation server at {addr[0]}:{addr[1]} failed: {e}") from None
        if st.registered < st.size:
            raise RuntimeError(
                f"the reservation server stopped with {st.registered} of {st.size} reservations"
            )
        return reservations(st)

    def _status(self, job: str) -> JobStatus:
        try:
            return self._reader.status(job)
        except TfcoordError as e:
            host, port = self.server_addr
            raise ConnectionError(f"the reservation server at {host}:{port} failed: {e}") from None

    def request_stop(self) -> list[str] | None:
        """Stop the reservations (and their server); against a tfcoord driver, stop every job
        that has not ended (a streaming job's ``shutdown(ssc)`` then stops the streaming context)
        and return the jobs told to stop."""
        if self._addr is not None:
            with contextlib.suppress(TfcoordError):
                self._reader.stop(self._addr.job, STOP_REASON)
                if self._node is not None:  # acknowledge for our own node: it has nothing to stop
                    self._node.report(NodeState.STOPPED)
            self.close()
            return None
        stopped = []
        for job in self._reader.status().jobs:
            if not job.state.terminal:
                try:
                    self._reader.stop(job.job, STOP_REASON)
                except TfcoordError:  # it ended meanwhile
                    continue
                stopped.append(job.job)
        return stopped

    def close(self) -> None:
        if self._node is not None:
            self._node.close()
        self._reader.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _names(conn: connfile.Connection, host: str, port: int) -> bool:
    """Whether the coordinator of a connection file is the one at ``host:port``: the same port,
    and ``host`` is where it listens or what it advertises (as given or resolved)."""
    if conn.port != port:
        return False
    theirs = {a.rpartition(":")[0].strip("[]") for a in (conn.address, conn.advertised)}
    if host in theirs:
        return True
    try:
        resolved = {ai[4][0] for ai in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    return bool(resolved & theirs)
