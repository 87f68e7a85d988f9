"""A coordinator inside the driver process: a background thread with its own event loop.

Drivers use it when no coordinator address is configured, so nothing has to be
started by hand: ``with start_embedded() as coord: ... coord.address, coord.secret,
coord.client_context()`` (it serves TLS with a certificate of its own unless ``plaintext=True``).
Its state lives in memory and ends with the driver. It runs the same
:class:`~tfcoord.coordinator.service.CoordinatorService` as ``tfcoord serve``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tfcoord.client import auth, connfile, tls

from .recorder import RunRecorder
from .server import (
    DEFAULT_MAX_HTTP_CONNECTIONS,
    DEFAULT_MAX_UNAUTHENTICATED,
    RESERVED_FDS,
    CoordinatorServer,
    ServerConfig,
    connection_budget,
    fd_limit,
)
from .service import CoordinatorService, EngineFactory, HttpConfig, ServiceConfig

if TYPE_CHECKING:
    from .mesos.config import MesosConfig
    from .mesos.engine import FrameworkView

log = logging.getLogger("tfcoord.coordinator")
_T = TypeVar("_T")

#: Starting the loop and binding a socket takes milliseconds; this only guards a hang.
START_TIMEOUT_S = 30.0


def _descriptor_budget(max_connections: int | None, max_unauthenticated: int | None) -> tuple[int, int]:
    """(max_connections, max_unauthenticated) that fit this process's RLIMIT_NOFILE, as serve's.

    The soft limit is lifted to the hard one first, as ``tfcoord serve`` does: every node is
    a descriptor, and running out stops accept() for every node at once. A driver's
    process may still have a small hard limit; where the caller set no handshake budget,
    it shrinks to a quarter of the descriptors rather than refusing to start, and the
    node budget takes what is left. Caps the caller set are checked, never shrunk.

    Raises:
        BudgetError: the caps do not fit the limit; the message names the figures and the fix.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limit = fd_limit()
    if max_unauthenticated is None:
        spare = limit - RESERVED_FDS - DEFAULT_MAX_HTTP_CONNECTIONS
        max_unauthenticated = min(DEFAULT_MAX_UNAUTHENTICATED, max(16, spare // 4))
    budget = connection_budget(max_connections, max_unauthenticated, DEFAULT_MAX_HTTP_CONNECTIONS, limit)
    return budget, max_unauthenticated


class EmbeddedCoordinator:
    """A running in-process coordinator: a :class:`CoordinatorService` on a loop of its own.

    Args:
        host: interface to bind (``0.0.0.0`` when executors on other hosts must reach it).
        advertise_host: the host nodes should dial, when it differs from ``host``.
        mesos: run a Mesos framework for jobs of engine "mesos" (torn down on stop). Its tasks
            fetch the node archive from an HTTP port started for them (plain HTTP under
            the default ephemeral certificate; see ``HttpConfig.plaintext``); :meth:`start_http` then returns
            it only for the same token, which is no one's, so start no other.
        mesos_gpus: advertise GPU_RESOURCES from the start (a job that wants GPUs is coming).
        plaintext: serve without TLS, logged as a warning. By default the coordinator
            serves TLS with a certificate made now, for this coordinator only (see
            ``coordinator.ephemeral``); its CA is :attr:`ca_pem`, and its clients pin it
            (:meth:`client_context`). An ``ssl_context`` option serves that context instead.
        connection_dir: write a connection file there once serving (this user's alone,
            see :mod:`tfcoord.client.connfile`), removed on stop, so ``tfcoord stop`` in
            another shell finds this coordinator; a directory that is not safe is logged
            and skipped. Each job's run record is kept there too, written as the job goes
            (:mod:`.recorder`), so ``tfcoord status``/``logs`` show it after the driver ends.
        options: further :class:`ServerConfig` fields (limits, TLS). ``max_connections``
            and ``max_unauthenticated`` are checked against RLIMIT_NOFILE (see
            :func:`_descriptor_budget`); without them, they are derived from it.

    Raises:
        BudgetError: the connection caps do not fit the descriptor limit.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | None = None,
        advertise_host: str | None = None,
        mesos: MesosConfig | None = None,
        mesos_gpus: bool = False,
        admin_secret: bytes | None = None,
        plaintext: bool = False,
        connection_dir: Path | None = None,
        **options: Any,
    ) -> None:
        self.secret = secret or auth.new_secret()
        self._connection_dir = connection_dir
        #: The connection file written for this coordinator, while it serves.
        self.connection_file: Path | None = None
        self._recorder: RunRecorder | None = None
        #: With the default ephemeral TLS, the PEM of the coordinator's own CA: what its clients
        #: pin (:meth:`client_context`, ``TlsFiles(ca_pem=...)``).
        self.ca_pem: str | None = None
        if plaintext and options.get("ssl_context") is not None:
            raise ValueError("plaintext=True contradicts ssl_context: pass one or the other")
        if plaintext:
            log.warning(
                "the embedded coordinator serves PLAINTEXT (plaintext=True, --plaintext): anyone on the "
                "network between the driver and its nodes can read cluster specs and tracebacks and "
                "inject requests"
            )
        elif options.get("ssl_context") is None:
            import socket

            from .ephemeral import ephemeral_tls as make_tls

            names = [advertise_host or "", host, "127.0.0.1", "::1", "localhost", socket.gethostname()]
            options["ssl_context"], self.ca_pem = make_tls(n for n in names if n not in ("", "0.0.0.0", "::"))
        options["max_connections"], options["max_unauthenticated"] = _descriptor_budget(
            options.get("max_connections"), options.get("max_unauthenticated")
        )
        #: Sees and stops every job (drivers only their own); never given to executors.
        self.admin_secret = admin_secret or auth.new_secret()
        engines: tuple[EngineFactory, ...] = ()
        http = None
        if mesos is not None:
            engines, http = _mesos_engine(mesos, mesos_gpus, host, self.ca_pem)
        self.config = ServiceConfig(
            server=ServerConfig(
                secret=self.secret, admin_secret=self.admin_secret, host=host, port=port, **options
            ),
            engines=engines,
            advertise_host=advertise_host,
            http=http,
        )
        self.service = CoordinatorService(self.config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def client_context(self) -> ssl.SSLContext | None:
        """What a client of this coordinator passes as ``ssl_context``: its own CA pinned; None
        when it serves plaintext (``plaintext=True``).

        Raises:
            ValueError: it serves a TLS context the caller gave (``ssl_context=``), whose CA
                only the caller knows.
        """
        if self.ca_pem is not None:
            return tls.client_context(ca_pem=self.ca_pem)
        if self.config.server.ssl_context is not None:
            raise ValueError("this coordinator serves the ssl_context it was given: trust that context's CA")
        return None

    @property
    def server(self) -> CoordinatorServer:
        assert self.service.server is not None, "start() the coordinator first"
        return self.service.server

    @property
    def port(self) -> int:
        return self.service.port

    @property
    def http_port(self) -> int:
        return self.service.http_port

    @property
    def address(self) -> str:
        return self.service.address

    def start(self) -> EmbeddedCoordinator:
        started: Future[None] = Future()

        def run() -> None:
            # asyncio.Runner, not a bare loop: on the way out it cancels leftover tasks and
            # runs the callbacks that close transports (sockets) before the loop is closed.
            runner = asyncio.Runner()
            self._loop = runner.get_loop()

            async def main() -> None:
                try:
                    await self.service.start()
                except BaseException as e:
                    started.set_exception(e)
                    return
                started.set_result(None)
                assert self.service.server is not None
                await self.service.server.stopped.wait()

            with runner:
                runner.run(main())

        self._thread = threading.Thread(target=run, name="tfcoord-embedded-coordinator", daemon=True)
        self._thread.start()
        started.result(timeout=START_TIMEOUT_S + self.config.start_budget_s)
        if self._connection_dir is not None:
            self._write_connection_file(self._connection_dir)
            self._recorder = RunRecorder(self._connection_dir, self.call, lambda: self.server.state).start()
        return self

    def _write_connection_file(self, directory: Path) -> None:
        host = self.config.server.host
        local = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(host)
        conn = connfile.Connection(
            address=f"{local}:{self.port}" if local else self.address,
            advertised=self.address,
            port=self.port,
            admin_secret=self.admin_secret,
            ca_pem=self.ca_pem,
            pid=os.getpid(),
        )
        try:
            self.connection_file = connfile.write(directory, conn)
        except connfile.ConnectionFileError as e:
            log.warning("no connection file (tfcoord stop needs --address and credentials): %s", e)

    def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` on the coordinator's loop and return its result (for inspection)."""
        assert self._loop is not None
        fut: Future[_T] = Future()

        def go() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as e:
                fut.set_exception(e)

        self._loop.call_soon_threadsafe(go)
        return fut.result(timeout=START_TIMEOUT_S)

    def mesos_view(self, job: str) -> FrameworkView | None:
        """The Mesos framework as ``job``'s driver may see it (framework id, leading master,
        the job's tasks); None when no Mesos framework runs here (never configured, or shut down)."""
        from .mesos.engine import MesosEngine

        def view() -> FrameworkView | None:
            for engine in self.service.engines:
                running: object = engine  # the Engine protocol does not say which engine it is
                if isinstance(running, MesosEngine):
                    return running.view(job)
            return None

        if self._loop is None or self._loop.is_closed() or not self.service.running:
            return None
        return self.call(view)

    def start_http(
        self,
        token: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        admin_token: bytes | None = None,
        **limits: Any,
    ) -> int:
        """Serve the HTTP API and dashboard on this coordinator's loop; returns the bound port.

        With TLS configured (``ssl_context=``), the HTTP API is served over the same context.
        A second call with the same arguments returns the same port. ``admin_token`` holders
        may also stop jobs (the dashboard's stop button). ``limits`` are ``max_connections``,
        ``max_per_client`` and ``keepalive_timeout_s`` of :func:`tfcoord.coordinator.http.start_http`.

        Raises:
            ValueError: the HTTP API already serves with another token, host or port; one
                coordinator has one HTTP server, so ``stop()`` and start a new coordinator.
        """
        assert self._loop is not None and self.service.running, "start() the coordinator first"
        return asyncio.run_coroutine_threadsafe(
            self.service.start_http(HttpConfig(token, host, port, admin_token=admin_token, **limits)),
            self._loop,
        ).result(timeout=START_TIMEOUT_S)

    def stop(self) -> None:
        """Close the service (its one shutdown order) and end the loop's thread."""
        if self._recorder is not None:
            self._recorder.stop()  # the jobs' last state, while the loop still runs
            self._recorder = None
        if self.connection_file is not None:
            connfile.remove(self.connection_file, os.getpid())
            self.connection_file = None
        if self._loop is not None and not self._loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(self.service.close(), self._loop).result(
                    timeout=START_TIMEOUT_S + self.config.start_budget_s
                )
            except RuntimeError:  # the loop ended meanwhile
                pass
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)

    def __enter__(self) -> EmbeddedCoordinator:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded(**kw: Any) -> EmbeddedCoordinator:
    """Start an in-process coordinator on a free port; returns it running. It serves TLS (its
    clients pass ``ssl_context=coord.client_context()``) unless ``plaintext=True``."""
    return EmbeddedCoordinator(**kw).start()


def _mesos_engine(
    mesos: MesosConfig, gpus: bool, host: str, ca_pem: str | None
) -> tuple[tuple[EngineFactory, ...], HttpConfig | None]:
    """The Mesos framework an embedded coordinator runs, and the HTTP port its tasks fetch
    the node archive from (None when they do not)."""
    from .mesos.plugin import MesosEngineFactory

    if ca_pem is not None:
        import dataclasses

        # Its tasks run on other hosts: the CA they pin travels in their environment
        # (public, unlike the job token beside it).
        mesos = dataclasses.replace(mesos, env=(*mesos.env, (tls.CA_PEM_ENV, ca_pem)))
    engines: tuple[EngineFactory, ...] = (MesosEngineFactory(mesos, gpu_resources=gpus),)
    if not mesos.node_archive:
        return engines, None
    # Its tasks fetch the node archive from the HTTP port. Under an ephemeral
    # certificate that port speaks plain HTTP: no Mesos fetcher could verify the
    # certificate, and tasks check the archive's SHA-256 anyway. The bearer token is
    # made here and given to no one, so nothing but the archive and the public routes
    # answers there (see HttpConfig.plaintext).
    auth_pair = (
        (mesos.archive_username, mesos.archive_password)
        if mesos.archive_username is not None and mesos.archive_password is not None
        else None
    )
    http = HttpConfig(
        token=auth.new_secret(),
        host=host,
        port=0,
        archive_auth=auth_pair,
        plaintext=ca_pem is not None,
    )
    return engines, http
