"""The coordinator service: server, journal, engines and HTTP API, assembled in one place.

``tfcoord serve`` runs a :class:`CoordinatorService` under ``asyncio.run``; the embedded
coordinator (:mod:`.embedded`) runs the same service on a loop in a background thread.
Both build one frozen :class:`ServiceConfig` at their entry point and hand it over; the
service owns start-up and the one shutdown order:

* start: journal replayed, protocol listener bound, then the HTTP API (it reads the state;
  Mesos tasks fetch the node archive from it), then each engine started (it may launch
  nodes that dial the listener);
* close: the reverse — HTTP first (no new reads of a state going away), engines (a Mesos
  framework tears down or detaches), then the server, which closes connections and
  commits and closes the journal last.

A start that fails part-way closes what it had started, so nothing half-started outlives
it: no framework left subscribed, no open port.

Engines are the launchers of nodes that the coordinator itself runs (today: Mesos). Each
plugs in through an :class:`EngineFactory` in the config; the server is told their names
at construction, so it refuses a job of an engine it does not run (see
``tfcoord.client.messages.DRIVER_ENGINES``) instead of leaving it waiting for nodes nobody
starts.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .journal import FILENAME, Journal, MemoryJournal, SqliteJournal, StateDirError
from .server import DEFAULT_MAX_HTTP_CONNECTIONS, CoordinatorServer, ServerConfig

log = logging.getLogger("tfcoord.coordinator")

#: Hosts that mean "every interface": never an address a node can dial.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class ArchiveSite:
    """Where engines' tasks fetch the node archive: the HTTP API's base URL and the Basic
    credential its archive route takes (see ``coordinator.http``)."""

    base_url: str
    username: str
    password: str


#: The user name of the archive's download credential unless one is configured.
ARCHIVE_USER = "tfcoord"


def archive_password(secret: bytes) -> str:
    """The archive's download password derived from the coordinator secret: it opens the
    archive route only, and stays the same across restarts (tasks keep fetching)."""
    import hashlib
    import hmac

    return hmac.new(secret, b"tfcoord node archive", hashlib.sha256).hexdigest()


class Engine(Protocol):
    """A running launcher of nodes, started after the listener and closed before it."""

    async def start(self) -> object:
        """Start launching: for Mesos, subscribe as a framework (raises if it cannot). What
        it returns (the engine itself, for chaining) is not used."""

    async def close(self) -> None:
        """Stop launching; release what the engine holds outside this process if it must."""


class EngineFactory(Protocol):
    """How the service builds one engine; frozen configuration, part of :class:`ServiceConfig`."""

    @property
    def name(self) -> str:
        """The ``JobSpec.engine`` whose jobs this engine launches."""
        ...

    @property
    def start_budget_s(self) -> float:
        """How long the engine's start may take (its first connection to the outside)."""
        ...

    def create(
        self, server: CoordinatorServer, address: str, *, durable: bool, archive: ArchiveSite | None = None
    ) -> Engine:
        """The engine for ``server``, whose nodes dial ``address``.

        ``durable``: the coordinator keeps a journal, so a restarted coordinator picks up
        what this engine leaves running; without one, close() must leave nothing behind.
        ``archive``: where its tasks can fetch the node archive (None: no HTTP API).
        """
        ...


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP API and dashboard (aiohttp), on a port of their own."""

    #: The bearer token every route but ``/healthz`` asks for.
    token: bytes
    host: str = "127.0.0.1"
    #: 0 picks a free port.
    port: int = 0
    #: Connections served at once, and the deadline for a whole request (None: the
    #: defaults of ``tfcoord.coordinator.http.start_http``).
    max_connections: int | None = None
    #: Connections one client address may hold (None: http's default).
    max_per_client: int | None = None
    keepalive_timeout_s: float | None = None
    #: The node archive's download credential (user, password); None derives one from the
    #: coordinator secret (:func:`archive_password`).
    archive_auth: tuple[str, str] | None = None
    #: Serve plain HTTP even though the coordinator serves TLS: for an embedded coordinator
    #: whose certificate is its own (its default ephemeral TLS), which no Mesos fetcher can verify.
    #: Only the public routes and the node archive (digest-checked by every task) are of any
    #: use then: give no one the bearer token.
    plaintext: bool = False
    #: A second bearer token that may also stop jobs (the dashboard's stop button); None: no one.
    admin_token: bytes | None = None


@dataclass(frozen=True)
class ServiceConfig:
    """Everything a coordinator service is: built once, at the entry point."""

    server: ServerConfig
    #: The journal's directory (SQLite in WAL mode); None keeps state in memory.
    state_dir: Path | None = None
    #: None: no HTTP API.
    http: HttpConfig | None = None
    engines: tuple[EngineFactory, ...] = ()
    #: The host nodes dial, when the listener's host is not one (a wildcard, an internal
    #: interface); default: the listener's host, or 127.0.0.1 for a wildcard.
    advertise_host: str | None = None

    @property
    def start_budget_s(self) -> float:
        """How long a start may take: binding is quick; engines say what they need."""
        return sum(e.start_budget_s for e in self.engines)


class ListenError(OSError):
    """The protocol listener could not bind its port (taken, or the host is not ours)."""


class HttpStartError(OSError):
    """The HTTP API could not bind its port (taken, or the host is not ours)."""


#: Beside the journal (its name starts with the journal's, so the directory stays a tfcoord
#: one): held with an exclusive ``flock`` while a coordinator uses the directory, and holding
#: that coordinator's PID. The kernel drops the lock with the process, ``kill -9`` included.
LOCK_FILENAME = f"{FILENAME}.lock"


def check_state_dir(state_dir: Path) -> None:
    """Refuse a state directory that is not this user's alone; a missing one passes (the
    coordinator makes it, mode 700).

    Raises:
        StateDirError: it is not a directory, belongs to another user, or group or others may
            write in it; the message says what to change.
    """
    try:
        st = state_dir.stat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise StateDirError(
            f"cannot use state directory {state_dir}: {e.strerror or e}; point --state-dir at a directory of yours"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"--state-dir {state_dir} is a file, not a directory; point it at a directory")
    me = os.geteuid()
    if st.st_uid != me:
        raise StateDirError(
            f"state directory {state_dir} belongs to uid {st.st_uid}, not to this user (uid {me}): "
            f"whoever owns it can replace the journal; run: chown {me} {state_dir}, or point "
            "--state-dir at a directory of yours"
        )
    if st.st_mode & 0o022:
        raise StateDirError(
            f"state directory {state_dir} may be written by other users (mode {st.st_mode & 0o777:o}): "
            f"they could replace the journal; run: chmod go-w {state_dir}"
        )


class StateDirLock:
    """A state directory claimed by this process: checked, then locked until :meth:`release`.

    Two coordinators on one journal would each replay it and then write over each other;
    a directory another user owns, or one others may write in, lets them replace the
    journal (and so every job, token owner and terminal state) under the coordinator.

    Raises:
        StateDirError: the directory cannot be made, belongs to another user, may be written
            by group or others, or another process holds its lock (named by its PID).
    """

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        try:
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except FileExistsError:
            pass  # not a directory: check_state_dir says so
        except OSError as e:
            raise StateDirError(
                f"cannot create state directory {state_dir}: {e.strerror or e}; "
                "point --state-dir at a directory of yours"
            ) from None
        check_state_dir(state_dir)
        path = state_dir / LOCK_FILENAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise StateDirError(
                f"cannot open the state directory's lock {path}: {e.strerror or e}; remove it if it is "
                "not a plain file of yours"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f"PID {holder}" if holder.isdigit() else "a process that has not written its PID yet"
            raise StateDirError(
                f"state directory {state_dir} is in use by another tfcoord serve ({who}): stop that "
                "one first, or give this one a --state-dir of its own"
            ) from None
        except OSError as e:
            os.close(fd)
            raise StateDirError(f"cannot lock {path}: {e.strerror or e}") from None
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlock (idempotent). The PID stays in the file: whoever locks it next overwrites it."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class CoordinatorService:
    """One running coordinator: ``await start()``, serve, ``await close()``.

    Attributes (once started): ``server``, ``host`` and ``port`` of the listener, ``address``
    (what nodes dial), ``http_port`` (0 without HTTP), ``replayed`` (journal events).
    """

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.server: CoordinatorServer | None = None
        self.engines: list[Engine] = []
        self.host = ""
        self.port = 0
        self.http_port = 0
        self.replayed = 0
        self._http_runner: Any = None
        self._http: HttpConfig | None = None
        self._state_lock: StateDirLock | None = None
        self._closed = False

    @property
    def address(self) -> str:
        """``host:port`` that nodes and drivers dial."""
        host = self.config.advertise_host or self.config.server.host
        if host in WILDCARD_HOSTS:
            host = "127.0.0.1"
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.server is not None and not self._closed

    async def start(self) -> CoordinatorService:
        """Replay, listen, start the engines, then serve HTTP.

        Raises:
            StateDirError: the state directory is not this user's alone, is in use by another
                coordinator, or holds no usable journal.
            ListenError: the listener's port cannot be bound.
            HttpStartError: the HTTP API's port cannot be bound.
            Exception: an engine could not start (a MesosError says why).
        """
        cfg = self.config
        journal: Journal = MemoryJournal()
        if cfg.state_dir is not None:
            self._state_lock = StateDirLock(cfg.state_dir)
            try:
                journal = SqliteJournal(cfg.state_dir)
            except BaseException:
                self._state_lock.release()
                raise
        self.server = CoordinatorServer(cfg.server, journal, engines=frozenset(e.name for e in cfg.engines))
        try:
            self.replayed = self.server.recover()
            try:
                self.host, self.port = await self.server.start()
            except OSError as e:
                raise ListenError(e.errno, e.strerror or str(e)) from None
            archive = None
            if cfg.http is not None:
                await self.start_http(cfg.http)
                archive = self.archive_site()
            for factory in cfg.engines:
                engine = factory.create(
                    self.server, self.address, durable=cfg.state_dir is not None, archive=archive
                )
                await engine.start()
                self.engines.append(engine)
        except BaseException:
            await self.close()
            raise
        return self

    async def start_http(self, http: HttpConfig) -> int:
        """Serve the HTTP API (if not already); returns its port.

        A coordinator has one HTTP server: asking again for the same one returns its port.

        Raises:
            ValueError: it already serves with another token, host or port.
            HttpStartError: the port cannot be bound.
        """
        import hmac

        # aiohttp's web stack only when asked for
        from .http import KEEPALIVE_TIMEOUT_S, start_http

        assert self.server is not None, "start() the service first"
        if self._http is not None:
            if not hmac.compare_digest(self._http.token, http.token):
                raise ValueError(
                    f"the HTTP API of this coordinator already serves on port {self.http_port} with "
                    "another bearer token; it keeps the first one (start a new coordinator to change it)"
                )
            if http.host != self._http.host or http.port not in (0, self.http_port):
                raise ValueError(
                    f"the HTTP API of this coordinator already serves on {self._http.host}:{self.http_port}, "
                    f"not {http.host}:{http.port}; one coordinator has one HTTP server"
                )
            return self.http_port
        try:
            # Unset limits keep start_http's defaults.
            self._http_runner, self.http_port = await start_http(
                self.server,
                http.host,
                http.port,
                http.token,
                None if http.plaintext else self.config.server.ssl_context,
                max_connections=(
                    DEFAULT_MAX_HTTP_CONNECTIONS if http.max_connections is None else http.max_connections
                ),
                keepalive_timeout_s=(
                    KEEPALIVE_TIMEOUT_S if http.keepalive_timeout_s is None else http.keepalive_timeout_s
                ),
                **({} if http.max_per_client is None else {"max_per_client": http.max_per_client}),
                archive_auth=http.archive_auth or (ARCHIVE_USER, archive_password(self.config.server.secret)),
                admin_token=http.admin_token,
            )
        except OSError as e:
            raise HttpStartError(e.errno, f"cannot serve HTTP on {http.host}:{http.port}: {e}") from None
        self._http = http
        return self.http_port

    def archive_site(self) -> ArchiveSite | None:
        """Where the HTTP API serves the node archive, as nodes reach it; None without HTTP."""
        if self._http is None or self.server is None:
            return None
        host = self.config.advertise_host or self._http.host
        if host in WILDCARD_HOSTS:
            host = self.address.rpartition(":")[0]
        elif ":" in host:
            host = f"[{host}]"
        tls = self.config.server.ssl_context is not None and not self._http.plaintext
        user, password = self._http.archive_auth or (
            ARCHIVE_USER,
            archive_password(self.config.server.secret),
        )
        return ArchiveSite(f"{'https' if tls else 'http'}://{host}:{self.http_port}", user, password)

    async def close(self) -> None:
        """Stop serving, in the one order (see the module's docstring). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        runner, self._http_runner = self._http_runner, None
        if runner is not None:
            await runner.cleanup()
        while self.engines:
            engine = self.engines.pop()
            try:
                await engine.close()
            except Exception:  # the server must close all the same: its journal holds the truth
                log.exception("closing engine %r failed", engine)
        try:
            if self.server is not None:
                await self.server.close()
        finally:
            if self._state_lock is not None:  # the journal is closed: another coordinator may have it
                self._state_lock.release()
