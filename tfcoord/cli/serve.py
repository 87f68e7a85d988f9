"""``tfcoord serve``: the coordinator service, configured once from flags, environment and files."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import hmac
import logging
import os
import shlex
import signal
import socket
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfcoord.cli.credentials import ADMIN_SUFFIX, credential, secret_from, separate_http_token
from tfcoord.cli.gctuning import gc_housekeeping, tune_gc
from tfcoord.client import TlsError, __version__, tls
from tfcoord.client.entry import SECRET_FILE_ENV, UsageError
from tfcoord.coordinator.state import KEEP_FINISHED_JOBS, KEEP_FINISHED_S

log = logging.getLogger("tfcoord")

#: systemd names its readiness socket here (Type=notify); see coordinator/sdnotify.py.
NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"


@dataclass(frozen=True)
class ServeConfig:
    host: str
    port: int
    port_file: Path | None
    secret: bytes
    state_dir: Path | None
    #: The admin credential (``ServerConfig.admin_secret``).
    admin_secret: bytes | None
    log_format: str
    #: The HTTP API and dashboard; no HTTP server when ``http_port`` is None.
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    http_port_file: Path | None = None
    http_token: bytes | None = None
    #: Where the viewing token is kept: the log says how to open the dashboard with it.
    http_token_file: Path | None = None
    #: May also stop jobs over HTTP; None: no one may.
    http_admin_token: bytes | None = None
    notify_socket: str | None = None
    #: TLS for the TCP protocol and the HTTP API; None serves plaintext.
    ssl_context: ssl.SSLContext | None = None
    #: Run the Mesos framework (a ``MesosConfig``) for jobs of engine "mesos"; None: no Mesos.
    mesos: Any = None
    #: The address Mesos tasks dial back to (default: the bound host, or this host's name).
    advertise_host: str | None = None
    #: Finished jobs kept (see ``coordinator.state.KEEP_FINISHED_JOBS``): how many, how long.
    keep_finished_jobs: int = KEEP_FINISHED_JOBS
    keep_finished_s: float = KEEP_FINISHED_S
    #: Connection caps, checked against RLIMIT_NOFILE (``server.connection_budget``).
    max_connections: int = 20_000
    max_unauthenticated: int = 4096
    #: None: a quarter of max_unauthenticated (``server.per_source_budget``).
    max_unauthenticated_per_source: int | None = None
    http_max_connections: int = 256


def _write_port_file(path: Path, port: int) -> None:
    """Write the port atomically: a new file of a random name beside ``path``, renamed over it.

    The temporary file is created with O_EXCL (``mkstemp``), so a link planted at a name
    one could guess (``F.tmp``) is never followed: nothing is written anywhere but here.

    Raises:
        OSError: the directory is missing or not writable.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)  # a port is no secret: readable as the file always was
            f.write(f"{port}\n")
        os.replace(tmp, path)  # atomic: a reader never sees a half-written file
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _server_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The coordinator's TLS context; None only where plaintext was asked for by name."""
    if not args.tls_cert and not args.tls_key:
        if args.tls_ca:
            raise UsageError(
                "--tls-ca (mutual TLS) needs --tls-cert and --tls-key: the coordinator's own certificate"
            )
        if not args.plaintext:
            # Job tokens and registrations cross the network: unencrypted only on request.
            raise UsageError(
                "serve needs TLS: pass --tls-cert F --tls-key F (or TFCOORD_TLS_CERT, "
                "TFCOORD_TLS_KEY), or --plaintext (TFCOORD_PLAINTEXT=1) to serve unencrypted"
            )
        return None  # cmd_serve warns once every other check has passed
    if args.plaintext:
        raise UsageError("--plaintext contradicts --tls-cert/--tls-key: pass one or the other")
    if not (args.tls_cert and args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together: the certificate and its private key")
    try:
        return tls.server_context(args.tls_cert, args.tls_key, args.tls_ca)
    except TlsError as e:
        raise UsageError(str(e)) from None


def _service_config(cfg: ServeConfig) -> Any:
    """The one frozen configuration of the service ``tfcoord serve`` runs."""
    from tfcoord.coordinator.server import ServerConfig
    from tfcoord.coordinator.service import WILDCARD_HOSTS, HttpConfig, ServiceConfig

    engines: tuple[Any, ...] = ()
    if cfg.mesos is not None:
        from tfcoord.coordinator.mesos.plugin import MesosEngineFactory

        engines = (MesosEngineFactory(cfg.mesos),)
    http = None
    if cfg.http_port is not None:
        assert cfg.http_token is not None
        http = HttpConfig(
            token=cfg.http_token,
            host=cfg.http_host,
            port=cfg.http_port,
            max_connections=cfg.http_max_connections,
            # tfmesos2's TFMESOS2_CLIENT_USERNAME/PASSWORD: the node archive's download credential.
            archive_auth=(
                (cfg.mesos.archive_username, cfg.mesos.archive_password)
                if cfg.mesos is not None
                and cfg.mesos.archive_username is not None
                and cfg.mesos.archive_password is not None
                else None
            ),
            admin_token=cfg.http_admin_token,
        )
    server = ServerConfig(
        secret=cfg.secret,
        admin_secret=cfg.admin_secret,
        host=cfg.host,
        port=cfg.port,
        ssl_context=cfg.ssl_context,
        keep_finished_jobs=cfg.keep_finished_jobs,
        keep_finished_s=cfg.keep_finished_s,
        max_connections=cfg.max_connections,
        max_unauthenticated=cfg.max_unauthenticated,
        max_unauthenticated_per_source=cfg.max_unauthenticated_per_source,
    )
    # Where Mesos tasks dial back: the bound host, or this host's name for a wildcard.
    advertise = cfg.advertise_host or (socket.getfqdn() if cfg.host in WILDCARD_HOSTS else None)
    return ServiceConfig(
        server=server, state_dir=cfg.state_dir, http=http, engines=engines, advertise_host=advertise
    )


def _listen_hint(code: int | None, host_flag: str, port_flag: str, free: str) -> str:
    """What to change when a listener could not bind, by the error's ``errno``."""
    if code == errno.EADDRINUSE:
        return f"another process (a running tfcoord serve?) holds the port: stop it, or pick another {port_flag} {free}"
    if code == errno.EADDRNOTAVAIL:
        return (
            f"that is not an address of this machine: pass {host_flag} 0.0.0.0 for every interface, "
            "or one of this machine's own addresses"
        )
    if code == errno.EACCES:
        return f"ports below 1024 need root (or CAP_NET_BIND_SERVICE): pick {port_flag} 1024 or above {free}"
    if code is not None and code < 0:  # a getaddrinfo error: the name did not resolve
        return f"{host_flag} names no host this machine can resolve: give an IP address or a resolvable name"
    return f"check {host_flag} and {port_flag}"


async def _serve(cfg: ServeConfig) -> None:
    from tfcoord.coordinator.service import CoordinatorService, HttpStartError, ListenError

    service = CoordinatorService(_service_config(cfg))
    try:
        await service.start()
    except ListenError as e:  # the port is taken, or the host is not an address of this machine
        why = _listen_hint(e.errno, "--host", "--port", "(0 picks a free one, see --port-file)")
        raise UsageError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}; {why}") from None
    except HttpStartError as e:  # the port is taken, or the host is not ours
        why = _listen_hint(e.errno, "--http-host", "--http-port", "(0 picks a free one)")
        raise UsageError(f"{e.strerror}; {why}; the coordinator did not start") from None
    # The port files, like READY=1, say "serving": written only once every listener is up,
    # so a start that fails leaves none behind pointing at a dead coordinator.
    written: list[Path] = []
    for flag, path, port in (
        ("--port-file", cfg.port_file, service.port),
        ("--http-port-file", cfg.http_port_file, service.http_port),
    ):
        if path is None or not port:
            continue
        try:
            _write_port_file(path, port)
            written.append(path)
        except OSError as e:
            for done in written:
                done.unlink(missing_ok=True)
            await service.close()
            raise UsageError(
                f"cannot write {flag} {path}: {e.strerror or e}; give a path in an existing "
                "directory this user may write"
            ) from None
    # Said once every check has passed and the coordinator serves: a start refused for a
    # mistake is its one line alone.
    if cfg.ssl_context is None:
        log.warning(
            "serving plaintext (--plaintext): node, driver and HTTP traffic is unencrypted and "
            "unauthenticated after the handshake; use it only on a network you trust"
        )
    log.info(
        "tfcoord %s coordinator listening on %s:%d (%d journal events replayed, state in %s)",
        __version__,
        service.host,
        service.port,
        service.replayed,
        cfg.state_dir or "memory",
    )
    site = service.archive_site()
    if site is not None and cfg.http_token_file is not None:
        # The token stays in its file (tokens do not belong in logs): the line says how to
        # open the dashboard with it, ready to paste into a shell on this machine.
        log.info(
            "dashboard: %s/?token=$(cat %s)  (the page keeps the token in its tab and drops it from the address)",
            site.base_url,
            shlex.quote(str(cfg.http_token_file)),
        )
    status = f"listening on {service.host}:{service.port}"
    if service.http_port:
        status += f", HTTP on {cfg.http_host}:{service.http_port}"
    tune_gc()
    _sd_notify(cfg.notify_socket, READY=1, STATUS=status)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    housekeeping = asyncio.ensure_future(gc_housekeeping())
    try:
        await stop.wait()
    finally:
        housekeeping.cancel()
    log.info("shutting down")
    _sd_notify(cfg.notify_socket, STOPPING=1, STATUS="shutting down")
    await service.close()


def _sd_notify(socket_path: str | None, **fields: str | int) -> None:
    from tfcoord.coordinator.sdnotify import notify

    try:
        notify(socket_path, **fields)
    except OSError as e:  # systemd went away or the unit is misconfigured: keep serving
        log.warning("cannot notify systemd through %s: %s", socket_path, e)


def _raise_fd_limit() -> None:
    """One file descriptor per node connection: lift the soft limit to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _serve_mesos(args: argparse.Namespace) -> Any:
    """The Mesos framework's configuration when MESOS_MASTER (or --mesos-master) is set."""
    if not (args.mesos_master or os.environ.get("MESOS_MASTER")):
        return None
    from tfcoord.coordinator.mesos.config import MesosConfig
    from tfcoord.coordinator.mesos.errors import MesosConfigError

    try:
        return MesosConfig.from_env(os.environ, master=args.mesos_master)
    except MesosConfigError as e:
        raise UsageError(str(e)) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from tfcoord.coordinator.journal import StateDirError

    _raise_fd_limit()

    if args.keep_finished_jobs < 1 or not args.keep_finished_days > 0:
        raise UsageError("--keep-finished-jobs must be at least 1 and --keep-finished-days above 0")
    for flag, value in (
        ("--max-connections", args.max_connections),
        ("--http-max-connections", args.http_max_connections),
        ("--max-unauthenticated", args.max_unauthenticated),
        ("--max-unauthenticated-per-source", args.max_unauthenticated_per_source),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, not {value}")
    if args.http_port is None and (args.http_port_file or args.http_token_file or args.http_admin_token_file):
        raise UsageError(
            "--http-port-file, --http-token-file and --http-admin-token-file need --http-port "
            "(0 picks a free port)"
        )
    if args.http_port is not None and not args.http_token_file:
        raise UsageError(
            "--http-port needs --http-token-file: the API and dashboard require a bearer "
            "token (the file is created, mode 600, if missing)"
        )
    # Before any file is created: a start refused for want of TLS, or for a state directory
    # that is not this user's alone, leaves nothing behind.
    ssl_context = _server_tls(args)
    if args.state_dir:
        from tfcoord.coordinator.service import check_state_dir

        try:
            check_state_dir(Path(args.state_dir))
        except StateDirError as e:
            raise UsageError(str(e)) from None
    from tfcoord.coordinator.server import BudgetError, connection_budget, per_source_budget

    http_max = args.http_max_connections if args.http_port is not None else 0
    try:
        max_connections = connection_budget(args.max_connections, args.max_unauthenticated, http_max)
    except BudgetError as e:
        raise UsageError(str(e)) from None
    secret_file = args.secret_file or os.environ.get(SECRET_FILE_ENV)
    secret = secret_from(secret_file, create=True)
    admin_file = args.admin_secret_file or f"{secret_file}{ADMIN_SUFFIX}"
    admin_secret = credential(Path(admin_file), "admin secret", create=True)
    if hmac.compare_digest(admin_secret, secret):
        raise UsageError(
            f"--admin-secret-file {admin_file} holds the coordinator secret: the admin sees and "
            "stops every job, drivers only their own; give it a file of its own"
        )
    http_token = None
    if args.http_token_file:
        http_token = separate_http_token(args.http_token_file, secret_file, secret)
    http_admin_token = None
    if args.http_admin_token_file:
        http_admin_token = credential(Path(args.http_admin_token_file), "HTTP admin token", create=True)
        for other, name in (
            (http_token, "--http-token-file"),
            (secret, "the coordinator secret"),
            (admin_secret, "the admin secret"),
        ):
            if other is not None and hmac.compare_digest(http_admin_token, other):
                raise UsageError(
                    f"--http-admin-token-file {args.http_admin_token_file} holds the same key as {name}; "
                    "give it a file of its own (created if missing)"
                )
    cfg = ServeConfig(
        host=args.host,
        port=args.port,
        port_file=Path(args.port_file) if args.port_file else None,
        secret=secret,
        admin_secret=admin_secret,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        log_format=args.log_format,
        http_host=args.http_host,
        http_port=args.http_port,
        http_port_file=Path(args.http_port_file) if args.http_port_file else None,
        http_token=http_token,
        http_token_file=Path(args.http_token_file).resolve() if args.http_token_file else None,
        http_admin_token=http_admin_token,
        notify_socket=os.environ.get(NOTIFY_SOCKET_ENV) or None,
        ssl_context=ssl_context,
        mesos=_serve_mesos(args),
        advertise_host=args.advertise_host,
        keep_finished_jobs=args.keep_finished_jobs,
        keep_finished_s=args.keep_finished_days * 86400.0,
        max_connections=max_connections,
        max_unauthenticated=args.max_unauthenticated,
        max_unauthenticated_per_source=per_source_budget(
            args.max_unauthenticated, args.max_unauthenticated_per_source
        ),
        http_max_connections=args.http_max_connections,
    )
    try:
        asyncio.run(_serve(cfg))
    except StateDirError as e:
        raise UsageError(str(e)) from None
    return 0
