"""A coordinator inside the driver process: a background thread with its own event loop.

Drivers use it when no coordinator address is configured, so nothing has to be
started by hand: ``with start_embedded() as coord: ... coord.address, coord.secret``.
Its state lives in memory and ends with the driver.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from tfcoord.client import auth

from .server import CoordinatorServer, ServerConfig

if TYPE_CHECKING:
    from .mesos.config import MesosConfig
    from .mesos.engine import MesosEngine

#: Starting the loop and binding a socket takes milliseconds; this only guards a hang.
START_TIMEOUT_S = 30.0


class EmbeddedCoordinator:
    """A running in-process coordinator.

    Args:
        host: interface to bind (``0.0.0.0`` when executors on other hosts must reach it).
        advertise_host: the host nodes should dial, when it differs from ``host``.
        mesos: run a Mesos framework for jobs of engine "mesos" (torn down on stop).
        mesos_gpus: advertise GPU_RESOURCES from the start (a job that wants GPUs is coming).
        options: further :class:`ServerConfig` fields (limits, TLS).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | None = None,
        advertise_host: str | None = None,
        mesos: MesosConfig | None = None,
        mesos_gpus: bool = False,
        **options: Any,
    ) -> None:
        self.secret = secret or auth.new_secret()
        self._config = ServerConfig(secret=self.secret, host=host, port=port, **options)
        self._advertise = advertise_host
        self._mesos = mesos
        self._mesos_gpus = mesos_gpus
        self.engine: MesosEngine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.server: CoordinatorServer | None = None
        self.port = 0
        self._http_runner: Any = None
        #: The (token, host) the running HTTP server was started with.
        self._http_served: tuple[bytes, str] = (b"", "")
        self.http_port = 0

    @property
    def address(self) -> str:
        host = self._advertise or self._config.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def start(self) -> EmbeddedCoordinator:
        started: Future = Future()

        def run() -> None:
            # asyncio.Runner, not a bare loop: on the way out it cancels leftover tasks and
            # runs the callbacks that close transports (sockets) before the loop is closed.
            runner = asyncio.Runner()
            self._loop = runner.get_loop()

            async def main() -> None:
                self.server = CoordinatorServer(self._config)
                try:
                    _, self.port = await self.server.start()
                    if self._mesos is not None:
                        from .mesos.engine import MesosEngine  # aiohttp's client only when asked for

                        self.engine = MesosEngine(
                            self.server,
                            self._mesos,
                            self.address,
                            teardown_on_close=True,
                            gpu_resources=self._mesos_gpus,
                        )
                        await self.engine.start()
                except BaseException as e:
                    self.engine = None
                    await self.server.close()
                    started.set_exception(e)
                    return
                started.set_result(None)
                await self.server.stopped.wait()

            with runner:
                runner.run(main())

        self._thread = threading.Thread(target=run, name="tfcoord-embedded-coordinator", daemon=True)
        self._thread.start()
        budget = START_TIMEOUT_S
        if self._mesos is not None:  # the framework's first subscription has its own deadline
            budget += self._mesos.first_subscribe_deadline_s + self._mesos.connect_timeout_s
        started.result(timeout=budget)
        return self

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the coordinator's loop and return its result (for inspection)."""
        assert self._loop is not None
        fut: Future = Future()

        def go() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as e:
                fut.set_exception(e)

        self._loop.call_soon_threadsafe(go)
        return fut.result(timeout=START_TIMEOUT_S)

    def start_http(self, token: bytes, host: str = "127.0.0.1", port: int = 0, **limits: Any) -> int:
        """Serve the HTTP API and dashboard on this coordinator's loop; returns the bound port.

        With TLS configured (``ssl_context=``), the HTTP API is served over the same context.
        A second call with the same arguments returns the same port. ``limits`` are
        ``max_connections`` and ``keepalive_timeout_s`` of :func:`tfcoord.coordinator.http.start_http`.

        Raises:
            ValueError: the HTTP API already serves with another token, host or port; one
                coordinator has one HTTP server, so ``stop()`` and start a new coordinator.
        """
        import hmac

        from .http import start_http  # aiohttp's web stack only when asked for

        assert self._loop is not None and self.server is not None, "start() the coordinator first"
        if self._http_runner is not None:
            served_token, served_host = self._http_served
            if not hmac.compare_digest(served_token, token):
                raise ValueError(
                    f"the HTTP API of this coordinator already serves on port {self.http_port} with "
                    "another bearer token; it keeps the first one (start a new coordinator to change it)"
                )
            if host != served_host or port not in (0, self.http_port):
                raise ValueError(
                    f"the HTTP API of this coordinator already serves on {served_host}:{self.http_port}, "
                    f"not {host}:{port}; one coordinator has one HTTP server"
                )
            return self.http_port
        self._http_runner, self.http_port = asyncio.run_coroutine_threadsafe(
            start_http(self.server, host, port, token, self._config.ssl_context, **limits), self._loop
        ).result(timeout=START_TIMEOUT_S)
        self._http_served = (token, host)
        return self.http_port

    def stop(self) -> None:
        if self._loop is not None and self._http_runner is not None and not self._loop.is_closed():
            runner, self._http_runner = self._http_runner, None
            try:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), self._loop).result(timeout=START_TIMEOUT_S)
            except RuntimeError:
                pass
        if self._loop is not None and self.engine is not None and not self._loop.is_closed():
            engine, self.engine = self.engine, None
            try:  # TEARDOWN: the master kills whatever tasks are left
                asyncio.run_coroutine_threadsafe(engine.close(), self._loop).result(timeout=START_TIMEOUT_S)
            except RuntimeError:
                pass
        if self._loop is not None and self.server is not None and not self._loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(
                    timeout=START_TIMEOUT_S
                )
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)

    def __enter__(self) -> EmbeddedCoordinator:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded(**kw) -> EmbeddedCoordinator:
    """Start an in-process coordinator on a free port; returns it running."""
    return EmbeddedCoordinator(**kw).start()
