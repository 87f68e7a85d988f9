"""TensorFlowOnSpark's ``reservation`` module: ``Reservations``, ``Server`` and ``Client``.

tfcoord's own clusters never use this: their driver runs an embedded coordinator, and the
nodes register there. The module keeps TensorFlowOnSpark's public classes working for the
programs (and tests) that use them directly:

* ``Reservations(required)``: a thread-safe list of node metadata that is ``done()`` once
  ``required`` entries arrived (``primary_keys`` makes ``upsert`` replace an entry).
* ``Server(count)``: a standalone reservation server for ``count`` nodes. ``start()`` listens
  on every interface, on ``TFOS_SERVER_PORT`` when set (a port, or ``LOW-HIGH``: the first
  free one), and returns ``(host, port)`` with host ``TFOS_SERVER_HOST`` or this host's
  address. It speaks tfcoord's framing (a 4-byte length and one msgpack map, bounded), so
  nothing received is ever unpickled, where TensorFlowOnSpark's server unpickles whatever
  reaches its port. Like TensorFlowOnSpark's, it is unauthenticated: anyone who reaches the
  port may register or stop it, so keep it inside the cluster's network.
* ``Client(addr)``: ``register``, ``get_reservations``, ``await_reservations``,
  ``request_stop``, ``close`` against such a server. ``utils/stop_streaming.py HOST PORT``
  gives it a tfcoord *driver's* address instead: when an embedded coordinator of this user
  listens on that port on this machine, ``request_stop()`` stops its jobs with the admin
  credential from the coordinator's connection file (:mod:`tfcoord.client.connfile`,
  readable only by the user who started the driver); from elsewhere use ``tfcoord stop JOB
  --address HOST:PORT --admin-secret-file FILE``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from tfcoord.client import DriverClient, TfcoordError, connfile
from tfcoord.client import messages as m
from tfcoord.client import tls as _tls
from tfcoord.client.errors import ProtocolError, RemoteProtocolError
from tfcoord.client.messages import MAX_ERROR_LEN, _any_map, _bool, _f, _seconds
from tfcoord.client.protocol import NEED_DATA, Connection
from tfcoord.client.vocab import ErrorCode

from . import util

log = logging.getLogger("tfcoord.compat")
_M = TypeVar("_M", bound=m.Message)

#: Why the jobs stop, as their status shows it.
STOP_REASON = "stop requested by reservation.Client.request_stop() (utils/stop_streaming.py)"
#: Connecting, and any one request but ``await_reservations``, take milliseconds.
TIMEOUT_S = 30.0
#: A node's metadata is a few hundred bytes; this bounds what one connection can make the
#: server hold, and ``count`` bounds the reservations.
MAX_FRAME_BYTES = 256 * 1024
#: Connections served at once (each is a thread); more are closed at once.
MAX_CONNECTIONS = 512
#: The most reservations one server takes (TensorFlowOnSpark's clusters are executors).
MAX_COUNT = 100_000


# -- the wire ------------------------------------------------------------------------------
#
#   client → server   reg {meta} | query | await {timeout_s} | stop
#   server → client   ok | reservations {nodes, done} | error {code, message}


@dataclass(frozen=True)
class _Register(m.Message):
    op: ClassVar[str] = "reg"
    meta: Mapping[str, Any] = _f(_any_map)


@dataclass(frozen=True)
class _Query(m.Message):
    op: ClassVar[str] = "query"


@dataclass(frozen=True)
class _Await(m.Message):
    """Answered once every reservation arrived, or after ``timeout_s`` with what is there."""

    op: ClassVar[str] = "await"
    timeout_s: float = _f(_seconds(0.0, 3600.0))


@dataclass(frozen=True)
class _Stop(m.Message):
    op: ClassVar[str] = "stop"


@dataclass(frozen=True)
class _Ok(m.Message):
    op: ClassVar[str] = "ok"


def _nodes(v: Any) -> None:
    if not isinstance(v, Sequence) or isinstance(v, (str, bytes)):
        raise ValueError("must be a list of maps")
    for x in v:
        _any_map(x)


@dataclass(frozen=True)
class _Reservations(m.Message):
    op: ClassVar[str] = "reservations"
    nodes: Sequence[Mapping[str, Any]] = _f(_nodes)
    done: bool = _f(_bool)


_OPS: dict[str, type[m.Message]] = {
    cls.op: cls for cls in (_Register, _Query, _Await, _Stop, _Ok, _Reservations, m.Error, m.Challenge)
}
_decode = m.decoder(_OPS, "reservation")


def _connection() -> Connection:
    return Connection(max_frame_bytes=MAX_FRAME_BYTES, decode=_decode)


# -- the reservations ----------------------------------------------------------------------


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

    def wait(self, timeout_s: float | None, stopped: Callable[[], bool] = lambda: False) -> bool:
        """Block until done, ``stopped()``, or ``timeout_s``; whether done."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while len(self.reservations) < self.required and not stopped():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
            return len(self.reservations) >= self.required

    def wake(self) -> None:
        """Wake every ``wait`` (the server stopped)."""
        with self._changed:
            self._changed.notify_all()


# -- the server ----------------------------------------------------------------------------


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


class Server:
    """A reservation server for ``count`` nodes (see the module's docstring).

    Attributes:
        done: the server was stopped (``Client.request_stop()`` or ``stop()``).
        reservations: the :class:`Reservations` it holds.
    """

    def __init__(self, count: int, primary_keys: Sequence[str] | None = None) -> None:
        self.reservations = Reservations(count, primary_keys)
        self.done = False
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    def get_server_ip(self) -> str:
        """``TFOS_SERVER_HOST``, else this host's address (what clients should dial)."""
        return os.environ.get("TFOS_SERVER_HOST") or util.get_ip_address()

    def get_server_ports(self) -> list[int]:
        """The ports ``TFOS_SERVER_PORT`` allows, else ``[0]`` (any free port).

        Raises:
            ValueError: ``TFOS_SERVER_PORT`` is neither a port nor a range of ports.
        """
        spec = os.environ.get("TFOS_SERVER_PORT", "").strip()
        return _port_spec(spec) if spec else [0]

    def start_listening_socket(self) -> socket.socket:
        """A socket listening on every interface, on the first free allowed port.

        Raises:
            OSError: every port ``TFOS_SERVER_PORT`` allows is taken.
        """
        ports = self.get_server_ports()
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("", port))
                s.listen(128)
            except OSError:
                s.close()
                continue
            self._listener = s
            return s
        raise OSError(
            f"no free port for the reservation server: every port TFOS_SERVER_PORT="
            f"{os.environ.get('TFOS_SERVER_PORT')!r} allows is in use; widen the range or free one"
        )

    def start(self) -> tuple[str, int]:
        """Listen and serve in a background thread; ``(host, port)`` for clients."""
        listener = self._listener or self.start_listening_socket()
        port = listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(listener,), name="tfos-reservation", daemon=True).start()
        addr = (self.get_server_ip(), port)
        log.info("reservation server listening at %s:%d for %d node(s)", *addr, self.reservations.required)
        return addr

    def await_reservations(
        self, sc: Any = None, status: Mapping[str, Any] | None = None, timeout: float = 600
    ) -> list[dict[str, Any]]:
        """Block until every node registered; their metadata.

        Raises:
            RuntimeError: ``status['error']`` was set meanwhile (a failed Spark job).
            TimeoutError: ``timeout`` seconds passed first (the message says how many came).
        """
        status = {} if status is None else status
        deadline = time.monotonic() + timeout
        r = self.reservations
        while not r.wait(min(1.0, max(0.0, deadline - time.monotonic())), lambda: self.done):
            if status.get("error"):
                raise RuntimeError(f"reservations failed: {status['error']}")
            if self.done:
                raise RuntimeError(
                    f"the reservation server stopped with {r.required - r.remaining()} of {r.required} reservations"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"reservation timed out after {timeout:g} s: {r.required - r.remaining()} of "
                    f"{r.required} nodes registered ({r.remaining()} missing)"
                )
        return r.get()

    def stop(self) -> None:
        """Stop listening, close every connection and wake every waiter."""
        with self._lock:
            self.done = True
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        for s in [listener, *conns]:
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        self.reservations.wake()

    def _accept(self, listener: socket.socket) -> None:
        while not self.done:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed by stop()
                return
            with self._lock:
                if self.done or len(self._conns) >= MAX_CONNECTIONS:
                    conn.close()
                    continue
                self._conns.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="tfos-reservation-conn", daemon=True
            ).start()

    def _serve(self, sock: socket.socket) -> None:
        proto = _connection()
        try:
            while True:
                event = proto.next_event()
                if event is NEED_DATA:
                    proto.receive_data(sock.recv(65536))
                    continue
                if not isinstance(event, m.Message):  # CLOSED
                    return
                reply = self._answer(event)
                sock.sendall(proto.send(reply))
                if isinstance(event, _Stop):
                    self.stop()  # after the answer, so the client sees it
                if isinstance(reply, m.Error):
                    return
        except RemoteProtocolError as e:
            with contextlib.suppress(OSError):
                sock.sendall(proto.send(m.Error(None, ErrorCode.PROTOCOL_ERROR, str(e)[:MAX_ERROR_LEN])))
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(sock)
            sock.close()

    def _answer(self, msg: m.Message) -> m.Message:
        r = self.reservations
        if isinstance(msg, _Register):
            try:
                r.upsert(msg.meta)
            except ValueError as e:
                return m.Error(None, ErrorCode.DUPLICATE, str(e)[:MAX_ERROR_LEN])
            return _Ok()
        if isinstance(msg, _Query):
            return _Reservations(r.get(), r.done())
        if isinstance(msg, _Await):
            r.wait(msg.timeout_s, lambda: self.done)
            return _Reservations(r.get(), r.done())
        if isinstance(msg, _Stop):
            self.done = True  # before the answer: the caller sees ``done`` once request_stop returns
            self.reservations.wake()
            return _Ok()
        return m.Error(None, ErrorCode.PROTOCOL_ERROR, f"a reservation server does not answer {msg.op!r}")


# -- the client ----------------------------------------------------------------------------


class Client:
    """Talks to the reservation server, or the tfcoord driver, at ``server_addr`` (``(host, port)``).

    Raises:
        ConnectionError: nothing listens there (the message says what was tried and what to
            do instead).
    """

    def __init__(self, server_addr: Any) -> None:
        host, port = server_addr
        self.server_addr = (host, int(port))
        self._driver: DriverClient | None = None
        self._sock: socket.socket | None = None
        self._proto = _connection()
        directory = connfile.runtime_dir(os.environ)
        found = [c for c in connfile.find(directory) if c.port == int(port)]
        if found:
            conn = found[0]
            context = _tls.client_context(ca_pem=conn.ca_pem) if conn.ca_pem else None
            self._driver = DriverClient(
                conn.address,
                conn.admin_secret,
                role="admin",
                ssl_context=context,
                connect_deadline_s=TIMEOUT_S,
                reconnect_deadline_s=TIMEOUT_S,
                fail_fast=True,
                request_timeout_s=TIMEOUT_S,
            ).connect()
            return
        try:
            self._sock = socket.create_connection(self.server_addr, timeout=TIMEOUT_S)
        except OSError as e:
            raise ConnectionError(
                f"nothing answers at {host}:{port} ({e.strerror or e}), and no tfcoord coordinator of yours "
                f"listens on that port on this machine (looked for its connection file in {directory}); "
                "check the address the driver logged, or use tfcoord stop JOB --address HOST:PORT "
                "--admin-secret-file FILE"
            ) from None

    def register(self, reservation: Mapping[str, Any]) -> str:
        """Add this node's metadata; ``'OK'``."""
        self._request(_Register(dict(reservation)), _Ok)
        return "OK"

    def get_reservations(self) -> list[dict[str, Any]]:
        """The reservations so far."""
        reply = self._request(_Query(), _Reservations)
        return [dict(n) for n in reply.nodes]

    def await_reservations(self) -> list[dict[str, Any]]:
        """Block until every node registered; their metadata (the server holds the call,
        answering at least every few seconds, so a dead server is noticed)."""
        while True:
            reply = self._request(_Await(5.0), _Reservations, timeout_s=TIMEOUT_S + 5.0)
            if reply.done:
                return [dict(n) for n in reply.nodes]

    def request_stop(self) -> list[str] | None:
        """Stop the server; against a tfcoord driver, stop every job that has not ended
        (a streaming job's ``shutdown(ssc)`` then stops the streaming context) and return
        the jobs told to stop."""
        if self._driver is None:
            self._request(_Stop(), _Ok)
            self.close()  # the server closes its side too
            return None
        stopped = []
        for job in self._driver.status().jobs:
            if not job.state.terminal:
                try:
                    self._driver.stop(job.job, STOP_REASON)
                except TfcoordError:  # it ended meanwhile
                    continue
                stopped.append(job.job)
        return stopped

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, msg: m.Message, expect: type[_M], timeout_s: float = TIMEOUT_S) -> _M:
        host, port = self.server_addr
        if self._sock is not None and self._sock.fileno() < 0:
            raise RuntimeError(f"this Client of {host}:{port} is closed (request_stop() closes it too)")
        if self._sock is None:
            raise RuntimeError(
                f"{host}:{port} is a tfcoord coordinator, which registers its nodes itself; "
                "of reservation.Client's calls it takes only request_stop()"
            )
        sock, proto = self._sock, self._proto
        try:
            frame = proto.send(msg)
        except (TypeError, ValueError, OverflowError, ProtocolError) as e:
            raise ValueError(f"cannot send {msg.op} to the reservation server: {e}") from None
        try:
            sock.settimeout(timeout_s)
            sock.sendall(frame)
            while (event := proto.next_event()) is NEED_DATA:
                proto.receive_data(sock.recv(65536))
        except (OSError, ProtocolError) as e:
            raise ConnectionError(f"the reservation server at {host}:{port} failed: {e}") from None
        if isinstance(event, expect):
            return event
        if isinstance(event, m.Error):
            raise RuntimeError(f"the reservation server at {host}:{port} refused {msg.op}: {event.message}")
        if isinstance(event, m.Challenge):
            raise ConnectionError(
                f"{host}:{port} is a tfcoord coordinator, not a reservation server, and no connection "
                "file of yours names it; use tfcoord stop JOB --address HOST:PORT --admin-secret-file FILE"
            )
        raise ConnectionError(f"the reservation server at {host}:{port} closed the connection")
