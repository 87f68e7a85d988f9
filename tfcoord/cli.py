"""The ``tfcoord`` command line. Flags, environment and files are read here and only here.

    tfcoord serve   --host H --port P --port-file F --secret-file S [--state-dir D]
                    [--http-host H --http-port P --http-port-file F --http-token-file T]
                    [--http-admin-token-file A]
                    (--tls-cert F --tls-key F [--tls-ca F] | --plaintext)   (each flag also as TFCOORD_*)
    tfcoord env-check [--address A] [--secret-file S]
    tfcoord status  [JOB]
    tfcoord stop    JOB [--dry-run] [--reason TEXT]
    tfcoord logs    JOB [--node ROLE:I] [--follow]
    tfcoord submit  --engine local --workers N [--ps N] [--chief] [--evaluator] -- COMMAND...
    tfcoord submit  --engine spark --num-executors N -- [python] script.py [ARGS...]
    tfcoord submit  --engine mesos --job ps:1:cpus=1,mem=1024 --job worker:2:cpus=2,mem=4096,gpus=1 [-- COMMAND...]
    tfcoord node    --address A --job J --executor-id I (-- COMMAND... | --server-mode) (token in TFCOORD_TOKEN)

Clients find the coordinator through ``--address``/``TFCOORD_ADDRESS`` and its
secret through ``--secret-file``/``TFCOORD_SECRET_FILE``. ``submit`` without an
address starts an embedded coordinator for the job's lifetime. Against a coordinator
serving TLS, clients trust ``TFCOORD_TLS_CA`` and, for mutual TLS, present
``TFCOORD_TLS_CERT`` and ``TFCOORD_TLS_KEY``.

Every command takes ``--json``, ``--debug``, ``--log-level`` and ``--log-format``, before
or after its name; client commands take ``--timeout``. Exit codes: 0 done, 1 the job
failed or the coordinator refused the request, 2 a usage or configuration mistake, 3
the coordinator could not be reached (:data:`EXIT_UNREACHABLE`), 130 interrupted. Every
error is one line naming the cause and the fix; an internal traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hmac
import json
import logging
import os
import re
import shlex
import signal
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfcoord.client import (
    DriverClient,
    JobSpec,
    TfcoordError,
    TlsError,
    Unreachable,
    __version__,
    auth,
    connfile,
    make_roles,
    runrecords,
    tls,
)
from tfcoord.client.client import DEFAULT_RECONNECT_DEADLINE_S
from tfcoord.client.entry import (
    ADDRESS_ENV,
    LOG_LEVELS,
    SECRET_FILE_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    ExitCode,
    UsageError,
    client_tls,
    fail,
    run_entry,
    setup_logging,
)
from tfcoord.client.messages import MAX_LOGS_REPLY
from tfcoord.client.progress import describe
from tfcoord.client.replies import JobList, JobStatus
from tfcoord.client.terminal import TRACEBACK, printable
from tfcoord.client.vocab import JobState, RestartOn
from tfcoord.client.watcher import FOREVER_S, watch_until
from tfcoord.coordinator.state import KEEP_FINISHED_JOBS, KEEP_FINISHED_S
from tfcoord.driver.session import (
    INTERRUPT_REASON,
    CoordinatorLink,
    Interrupted,
    stop_and_wait,
    stop_interrupted,
)
from tfcoord.driver.sparksubmit import DEPLOY_MODES, SubmitOptions
from tfcoord.node import main as node_main

log = logging.getLogger("tfcoord")

#: The admin credential (sees and stops every job); by default beside the secret file.
ADMIN_SECRET_FILE_ENV = "TFCOORD_ADMIN_SECRET_FILE"
ADMIN_SUFFIX = ".admin"
#: systemd names its readiness socket here (Type=notify); see coordinator/sdnotify.py.
NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"


#: Exit codes, documented in docs/src/reference/cli.md (one table for every entry point).
EXIT_FAILED = ExitCode.FAILED
EXIT_USAGE = ExitCode.USAGE
EXIT_UNREACHABLE = ExitCode.UNREACHABLE
EXIT_INTERRUPTED = ExitCode.INTERRUPTED
#: Client commands give up on the coordinator after this long (--timeout): a coordinator
#: answers in milliseconds, so ten seconds means it is not there or badly overloaded.
DEFAULT_TIMEOUT_S = 10.0
#: A person at a terminal waits this long for a silent peer's challenge before probing
#: whether it speaks HTTP or expects TLS (the client library waits longer for nodes).
CLI_CHALLENGE_TIMEOUT_S = 1.5
#: A command that follows a job (submit, status --follow, logs --follow) keeps reconnecting
#: to a coordinator it lost for this long, or --timeout if longer: a coordinator killed and
#: restarted (systemd's Restart=) is back within seconds, journal replayed, and the job with it.
FOLLOW_RECONNECT_S = DEFAULT_RECONNECT_DEADLINE_S


class UserScriptError(Exception):
    """The user's own program failed before any job ran: its traceback, then exit code 1."""

    def __init__(self, traceback_text: str, summary: str) -> None:
        super().__init__(summary)
        self.traceback_text = traceback_text


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported as one line (argparse prints the usage too)."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{message}; see `{self.prog} --help`")


# -- configuration ------------------------------------------------------------------------


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


@dataclass(frozen=True)
class ClientConfig:
    address: str
    secret: bytes
    ssl_context: ssl.SSLContext | None = None


def _secret_from(path: str | None, *, create: bool = False) -> bytes:
    if not path:
        raise UsageError(f"no coordinator secret: pass --secret-file or set {SECRET_FILE_ENV}")
    return _credential(Path(path), "coordinator secret", create=create)


def _http_token_from(path: str) -> bytes:
    """The HTTP bearer token: a separate credential that only reads."""
    return _credential(Path(path), "HTTP bearer token", create=True)


def _separate_http_token(token_file: str, secret_file: str | None, secret: bytes) -> bytes:
    """The HTTP token, refused when it is the coordinator secret under another name.

    The token only reads, and it travels where the secret never may: in the dashboard's
    ``?token=`` URL, so in browser history and sometimes in proxy logs. Whoever holds the
    secret can submit and stop jobs and mint every job token.
    """
    why = (
        "the HTTP token travels in browser URLs (the dashboard's ?token=), while the secret lets its "
        "holder run and stop jobs; give --http-token-file a file of its own (created if missing)"
    )
    token_path, secret_path = Path(token_file), Path(secret_file or "")
    if token_path.resolve() == secret_path.resolve() or (
        token_path.exists() and secret_path.exists() and token_path.samefile(secret_path)
    ):
        raise UsageError(f"--http-token-file {token_file} is the coordinator secret file: {why}")
    token = _http_token_from(token_file)
    if hmac.compare_digest(token, secret):
        raise UsageError(f"--http-token-file {token_file} holds the coordinator secret: {why}")
    return token


def _credential(p: Path, what: str, *, create: bool) -> bytes:
    """A key file: created (mode 600) when missing and ``create``; refused if others can read it.

    Every way the file can be wrong is a :class:`UsageError` naming the file and the fix.
    """
    if p.is_symlink() and not p.exists():
        # Never created through the link: the secret would land wherever it points.
        fix = f"remove the link (a new {what} is then made in its place), or " if create else ""
        raise UsageError(
            f"{what} file {p} is a symbolic link to {os.readlink(p)}, which does not exist: "
            f"{fix}create the file it points to (mode 600)"
        )
    if not p.exists():
        if not create:
            raise UsageError(
                f"{what} file {p} does not exist: give the file the coordinator was started with "
                "(tfcoord serve --secret-file wrote it, mode 600), copied here if it runs elsewhere"
            )
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            auth.write_secret(p)
        except OSError as e:
            raise UsageError(
                f"cannot create the {what} file {p}: {e.strerror or e}; give a path in a "
                "directory of yours, or create the file (mode 600) yourself"
            ) from None
        log.info("created a new %s in %s (mode 600)", what, p)
    try:
        return auth.read_secret(p)
    except IsADirectoryError:
        raise UsageError(f"{what} file {p} is a directory; give the path of a file") from None
    except OSError as e:
        raise UsageError(f"{what} file {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"{what}: {e}") from None


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


def _client_config(args: argparse.Namespace) -> ClientConfig:
    address = args.address or os.environ.get(ADDRESS_ENV)
    if not address:
        raise UsageError(f"no coordinator address: pass --address HOST:PORT or set {ADDRESS_ENV}")
    _check_address(address)
    return ClientConfig(
        address, _secret_from(args.secret_file or os.environ.get(SECRET_FILE_ENV)), _client_tls()
    )


def _check_address(address: str) -> None:
    from tfcoord.client.client import parse_address

    try:
        parse_address(address)
    except ValueError:
        raise UsageError(
            f"coordinator address {address!r} must look like HOST:PORT, e.g. "
            f"{address.rstrip(':') or 'localhost'}:7070 (--address or {ADDRESS_ENV})"
        ) from None


def _connect(
    cfg: ClientConfig, args: argparse.Namespace, role: str = "driver", *, follow: bool = False
) -> DriverClient:
    """A connected client that gives up after ``--timeout``, and at once when its first
    connection is refused or the host does not resolve: a person is waiting.

    Once connected it rides out a coordinator restart, reconnecting until ``--timeout``; with
    ``follow`` (a command that follows a job to its end) for :data:`FOLLOW_RECONNECT_S` at
    least, and a request may wait as long for the coordinator to be back and answer it.
    """
    timeout_s = args.timeout
    patience_s = max(timeout_s, FOLLOW_RECONNECT_S) if follow else timeout_s
    client = DriverClient(
        cfg.address,
        cfg.secret,
        role=role,
        ssl_context=cfg.ssl_context,
        connect_deadline_s=timeout_s,
        reconnect_deadline_s=patience_s,
        fail_fast=True,
        challenge_timeout_s=min(CLI_CHALLENGE_TIMEOUT_S, timeout_s),
        request_timeout_s=patience_s,
    )
    return client.connect()


def _admin_config(args: argparse.Namespace) -> ClientConfig:
    """Address and the admin secret, for the commands that act on any job (status, stop).

    Without an address, an embedded coordinator this user runs on this machine (a Spark
    driver's) is found through its connection file (:mod:`tfcoord.client.connfile`).
    """
    address = args.address or os.environ.get(ADDRESS_ENV)
    if not address:
        local = _local_coordinator(args)
        if local is not None:
            return local
        raise UsageError(
            f"no coordinator address: pass --address HOST:PORT or set {ADDRESS_ENV} (no embedded "
            f"coordinator of yours runs on this machine: none in {connfile.runtime_dir(os.environ)})"
        )
    path = args.admin_secret_file or os.environ.get(ADMIN_SECRET_FILE_ENV)
    if not path:
        secret_file = args.secret_file or os.environ.get(SECRET_FILE_ENV)
        if not secret_file:
            raise UsageError(
                f"no admin credential: pass --admin-secret-file or set {ADMIN_SECRET_FILE_ENV} "
                f"(tfcoord serve keeps it beside its secret file, as SECRET_FILE{ADMIN_SUFFIX})"
            )
        path = secret_file + ADMIN_SUFFIX
    _check_address(address)
    if not Path(path).exists() and not Path(path).is_symlink():
        raise UsageError(_no_admin_secret(path, args))
    return ClientConfig(address, _credential(Path(path), "admin secret", create=False), _client_tls())


def _no_admin_secret(path: str, args: argparse.Namespace) -> str:
    """The one line for an admin secret file that is not there: what the credential is, where
    ``tfcoord serve`` wrote it, and how a driver's user sees their own jobs without it."""
    named = bool(args.admin_secret_file or os.environ.get(ADMIN_SECRET_FILE_ENV))
    where = (
        f"(from {'--admin-secret-file' if args.admin_secret_file else ADMIN_SECRET_FILE_ENV})"
        if named
        else f"(the default: the secret file's name + {ADMIN_SUFFIX})"
    )
    return (
        f"no admin secret at {path} {where}: `tfcoord {args.cmd}` needs the coordinator's admin "
        "secret, a credential apart from the coordinator secret that sees and stops every job; "
        f"`tfcoord serve` wrote it beside its secret file, as SECRET_FILE{ADMIN_SUFFIX} on the "
        "coordinator's machine (or at its --admin-secret-file): copy it here (mode 600) or pass "
        "--admin-secret-file PATH; without it, your own job is followed by the `tfcoord submit` "
        "that runs it (progress and outcome on stderr, --json for its final status), and with "
        "no --address `tfcoord status` finds the embedded coordinators of your jobs on this machine"
    )


def _local_coordinator(args: argparse.Namespace) -> ClientConfig | None:
    """The embedded coordinator of this user's on this machine: the one there is, or the one
    that holds ``args.job`` when there are several; None when there is none."""
    try:
        found = list(connfile.find(connfile.runtime_dir(os.environ)))
    except connfile.ConnectionFileError as e:
        raise UsageError(str(e)) from None
    configs = []
    for conn in found:
        try:
            context = _client_tls() or (tls.client_context(ca_pem=conn.ca_pem) if conn.ca_pem else None)
        except TlsError as e:
            raise UsageError(str(e)) from None
        configs.append((conn, ClientConfig(conn.address, conn.admin_secret, context)))
    if len(configs) <= 1:
        return configs[0][1] if configs else None
    job = getattr(args, "job", None)
    if job:
        for _, cfg in configs:
            try:
                with _connect(cfg, args, role="admin") as c:
                    c.status(job)
                return cfg
            except TfcoordError:  # not this one's job, or it is going away
                continue
    names = ", ".join(conn.address for conn, _ in configs)
    raise UsageError(
        f"{len(configs)} embedded coordinators of yours run here ({names}) and none was chosen"
        + (f" that holds job {job}" if job else "")
        + ": pass --address HOST:PORT"
    )


def _client_tls() -> ssl.SSLContext | None:
    """The client's TLS context from TFCOORD_TLS_*; None (plaintext) when none is set."""
    return client_tls(os.environ)


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


# -- logging ------------------------------------------------------------------------------


# -- serve --------------------------------------------------------------------------------


#: Allocations between young-generation collections in ``tfcoord serve`` (CPython: 700).
GC_GEN0_THRESHOLD = 20_000


def _tune_gc() -> None:
    """Collect less often in the coordinator process, which holds little but long-lived state.

    Jobs, nodes and connections live for a job's lifetime and form almost no cycles, yet
    CPython's defaults (a young collection every 700 allocations, full ones as the heap
    grows) spent a tenth of a 10,000-node rendezvous traversing them. What start-up and
    recovery built is frozen out of collection, and young collections run less often;
    the rare cycle is still collected.
    """
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


#: How often ``tfcoord serve`` moves what survived its young collections out of the
#: collector's sight (``gc.freeze``), and how often it thaws everything for one full
#: collection that reclaims any cycle among frozen objects. Each freeze is preceded by a
#: middle-generation pass over what survived since the last one: once a second, during a
#: 10,000-node registration burst, that pass took 15-25 ms (a turn every heartbeat waited
#: behind); ten times a second it walks a tenth as much.
GC_FREEZE_INTERVAL_S = 0.1
GC_FULL_INTERVAL_S = 3600.0


async def _gc_housekeeping() -> None:
    """Keep the collector's pauses short while the heap grows.

    A full collection walks every object it tracks: at 20,000 nodes (two jobs of 10,000,
    or a 10,000-node burst beside 100 steady jobs) one took 80-250 ms on this machine,
    which stalled every heartbeat behind it. Freezing survivors every tenth of a second
    leaves a collection only the objects made since to walk. Jobs, nodes and connections form
    no cycles (they are freed by reference counting, frozen or not); whatever cycle hides
    among frozen objects is reclaimed by the hourly thaw-and-collect, one longer pause.
    """
    loop = asyncio.get_running_loop()
    last_full = loop.time()
    while True:
        await asyncio.sleep(GC_FREEZE_INTERVAL_S)
        if loop.time() - last_full >= GC_FULL_INTERVAL_S:
            gc.unfreeze()
            gc.collect()
            last_full = loop.time()
        else:
            gc.collect(1)  # young cycles go first, not into the frozen set
        gc.freeze()


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


async def _serve(cfg: ServeConfig) -> None:
    from tfcoord.coordinator.service import CoordinatorService, HttpStartError, ListenError

    service = CoordinatorService(_service_config(cfg))
    try:
        await service.start()
    except ListenError as e:  # the port is taken, or the host is not an address of this machine
        raise UsageError(
            f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}; another process (a "
            "running tfcoord serve?) holds the port: stop it, or pick another --port "
            "(0 picks a free one, see --port-file)"
        ) from None
    except HttpStartError as e:  # the port is taken, or the host is not ours
        raise UsageError(f"{e.strerror}; the coordinator did not start") from None
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
    _tune_gc()
    _sd_notify(cfg.notify_socket, READY=1, STATUS=status)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    housekeeping = asyncio.ensure_future(_gc_housekeeping())
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
    secret = _secret_from(secret_file, create=True)
    admin_file = args.admin_secret_file or f"{secret_file}{ADMIN_SUFFIX}"
    admin_secret = _credential(Path(admin_file), "admin secret", create=True)
    if hmac.compare_digest(admin_secret, secret):
        raise UsageError(
            f"--admin-secret-file {admin_file} holds the coordinator secret: the admin sees and "
            "stops every job, drivers only their own; give it a file of its own"
        )
    http_token = None
    if args.http_token_file:
        http_token = _separate_http_token(args.http_token_file, secret_file, secret)
    http_admin_token = None
    if args.http_admin_token_file:
        http_admin_token = _credential(Path(args.http_admin_token_file), "HTTP admin token", create=True)
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


# -- client commands ----------------------------------------------------------------------


def _fmt_time(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def cmd_status(args: argparse.Namespace) -> int:
    if args.follow and args.job is None:
        raise UsageError("--follow follows one job: give its id, tfcoord status JOB --follow")
    record = _ended_run(args)
    if record is not None:
        st = JobStatus.decode(record.status)
        if args.json:
            print(json.dumps(dict(st.wire), indent=2, sort_keys=True))
        else:
            _print_status(st)
        _say_ended(record, st)
        return 0
    try:
        return _status(args)
    except KeyboardInterrupt:
        if not args.follow:
            raise
        return _stopped_following(args.job)


def _status(args: argparse.Namespace) -> int:
    # Without a job or an address: the jobs of this user's live embedded coordinator, and
    # those whose driver has ended, from their run records; either alone when that is all.
    ended = _ended_runs() if args.job is None and not (args.address or os.environ.get(ADDRESS_ENV)) else []
    if ended and _local_coordinator(args) is None:
        return _print_listing(args, None, ended)
    cfg = _admin_config(args)
    with _connect(cfg, args, role="admin", follow=args.follow) as c:
        if args.job is None:
            listing = c.status(None)
        else:
            st = c.status(args.job)
            if args.follow:
                return _follow_status(c, st, args)
    if args.job is None:
        return _print_listing(args, listing, ended)
    if args.json:
        print(json.dumps(dict(st.wire), indent=2, sort_keys=True))
        return 0
    _print_status(st)
    return 0


def _ended_runs() -> list[runrecords.RunRecord]:
    try:
        return runrecords.ended(connfile.runtime_dir(os.environ))
    except runrecords.RunRecordError as e:
        raise UsageError(str(e)) from None


def _print_listing(
    args: argparse.Namespace, listing: JobList | None, ended: list[runrecords.RunRecord]
) -> int:
    """``tfcoord status``'s table: a coordinator's jobs, then the runs whose driver ended
    (their state as last recorded; ENDED is when the driver ended for a job it never finished)."""
    live = {j.job for j in listing.jobs} if listing is not None else set()
    ended = [r for r in ended if r.job not in live]
    if args.json:
        body = dict(listing.wire) if listing is not None else {"jobs": []}
        body["ended_runs"] = [
            {
                "job": r.job,
                "state": r.status["state"],
                "pid": r.pid,
                "written_at": r.written_at,
                "record": str(r.path),
            }
            for r in ended
        ]
        print(json.dumps(body, indent=2, sort_keys=True))
        return 0
    # DRIVER only beside ended runs: the live jobs are then the embedded coordinator's, whose
    # driver runs.
    driver = ("DRIVER",) if ended else ()
    rows: list[tuple[str, ...]] = [("JOB", "NAME", "ENGINE", "STATE", "NODES", "SUBMITTED", "ENDED", *driver)]
    for j in listing.jobs if listing is not None else ():
        rows.append(
            (
                j.job,
                j.name or "-",
                j.engine,
                j.state,
                f"{j.registered}/{j.size}",
                _fmt_time(j.submitted_at),
                _fmt_time(j.ended_at),
                *(("running",) if ended else ()),
            )
        )
    for r in ended:
        st = JobStatus.decode(r.status)
        rows.append(
            (
                st.job,
                st.name or "-",
                st.engine,
                st.state,
                f"{st.registered}/{st.size}",
                _fmt_time(st.submitted_at),
                _fmt_time(st.ended_at if st.terminal else r.written_at),
                f"ended (pid {r.pid})",
            )
        )
    _table(rows)
    return 0


def _print_status(st: JobStatus) -> None:
    """One job's status for people. Everything a node wrote (errors, host names, results,
    timeline lines) goes through :func:`printable`: it cannot drive the terminal."""
    print(describe(st))
    if st.max_restarts:
        print(f"generation {st.generation}, restarts {st.restart_count}/{st.max_restarts}")
        for i, r in enumerate(st.restarts, 1):
            print(
                printable(f"  restart {i}: {r.node} {r.cause} (generation {r.generation}, {_fmt_time(r.at)})")
            )
    if st.error:
        print(f"error: {printable(st.error, keep=TRACEBACK)}")
    elif st.stop_reason:
        print(f"stop reason: {printable(st.stop_reason, keep=TRACEBACK)}")
    node_rows: list[tuple[str, ...]] = [
        ("EXECUTOR", "ROLE", "STATE", "HOST:PORT", "GPUS", "ATTEMPT", "LAST SEEN", "ERROR")
    ]
    for n in st.nodes:
        # The last line of a traceback names the exception; an error of blanks has none.
        err_lines = n.error.strip().splitlines()
        err = err_lines[-1][:60] if err_lines else ""
        node_rows.append(
            (
                str(n.executor_id),
                n.name,
                n.state,
                f"{n.host}:{n.port}",
                ",".join(n.gpus) or "-",
                str(n.attempt),
                _fmt_time(n.last_seen),
                err,
            )
        )
    _table(node_rows)
    for line in st.missing:
        print(f"missing: {printable(line)}")
    progress = [(n, n.figures) for n in st.nodes if n.figures]
    if progress:
        print("\nprogress (last reported):")
        for n, f in progress:
            print(
                printable(
                    f"  {n.name}  "
                    + "  ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in f.items())
                )
            )
    results = [(n, n.results) for n in st.nodes]
    if any(got for _, got in results):
        print("\nresults:")
        for n, got in results:
            if got:
                print(printable(f"  {n.name}  " + "  ".join(f"{k}={v}" for k, v in got.items())))
    if st.events:
        print("\ntimeline:")
        for t, text in st.events:
            print(f"  {_fmt_time(t)}  {printable(text)}")


def _follow_status(c: DriverClient, st: JobStatus, args: argparse.Namespace) -> int:
    """``status JOB --follow``: the status, then each change (the summary line when it changes,
    each new timeline line) until the job ends, riding out a coordinator restart; then how
    it ended. With ``--json``, one status document a line, at each change."""
    if args.json:
        print(json.dumps(dict(st.wire), sort_keys=True), flush=True)
    else:
        _print_status(st)
        sys.stdout.flush()
    last_line, last_event = describe(st), st.events[-1] if st.events else None

    def changed(new: JobStatus) -> None:
        nonlocal last_line, last_event
        if args.json:
            print(json.dumps(dict(new.wire), sort_keys=True), flush=True)
            return
        # The timeline is bounded (its oldest lines go): new lines are those after the last seen.
        events = list(new.events)
        fresh = events[events.index(last_event) + 1 :] if last_event in events else events
        for t, text in fresh:
            print(f"  {_fmt_time(t)}  {printable(text)}")
        if events:
            last_event = events[-1]
        line = describe(new)
        if line != last_line:
            print(line)
            last_line = line
        sys.stdout.flush()

    final = watch_until(c, st.job, timeout_s=FOREVER_S, since=st, on_change=changed)
    if not args.json and final.terminal and st.version != final.version:
        if final.error:
            print(f"error: {printable(final.error, keep=TRACEBACK)}")
        elif final.stop_reason:
            print(f"stop reason: {printable(final.stop_reason, keep=TRACEBACK)}")
    return 0


#: ``tfcoord logs --follow`` asks again this often while the job runs.
LOGS_POLL_S = 0.5


def _node_executor(st: JobStatus, node: str) -> int:
    """The executor id of ``ROLE:I`` in a job (its slot's, whether or not a node holds it)."""
    role, _, index = node.partition(":")
    slots = [(r, i) for r, c in st.wire["roles"] for i in range(c)]
    if not index.isdigit() or (role, int(index)) not in slots:
        names = ", ".join(f"{r}:0-{c - 1}" if c > 1 else f"{r}:0" for r, c in st.wire["roles"])
        raise UsageError(f"--node {node!r} is not a node of job {st.wire['job']}; its nodes are {names}")
    return slots.index((role, int(index)))


def _ended_run(args: argparse.Namespace) -> runrecords.RunRecord | None:
    """The run record of ``args.job`` when no address was given and the embedded coordinator
    that ran it ended with its driver (see :mod:`tfcoord.client.runrecords`); else None."""
    if args.address or os.environ.get(ADDRESS_ENV) or not getattr(args, "job", None):
        return None
    try:
        record = runrecords.read(connfile.runtime_dir(os.environ), args.job)
    except runrecords.RunRecordError as e:
        raise UsageError(str(e)) from None
    return None if record is None or record.driver_alive else record


def _say_ended(record: runrecords.RunRecord, st: JobStatus) -> None:
    """Where an ended run's answer came from, on stderr (stdout stays the job's)."""
    ended = "" if st.terminal else f"; the driver ended while the job was {st.state}, so it never finished"
    print(
        f"tfcoord: the driver of job {record.job} (pid {record.pid}) has ended: this is its run record, "
        f"written {_fmt_time(record.written_at)} ({record.path}){ended}",
        file=sys.stderr,
    )


def _print_log_line(
    args: argparse.Namespace, names: dict[int, str], t: float, e: int, stream: str, text: str
) -> None:
    if args.json:
        print(json.dumps({"time": t, "node": names.get(e, str(e)), "stream": stream, "text": text}))
    else:
        # Nodes escape their lines, and the coordinator refuses C0 controls in them;
        # escaped here all the same (C1 too: \x9b is a CSI), so no line can forge
        # another or drive the terminal, whoever sent it. Tabs are the program's own.
        where, shown = printable(str(names.get(e, e))), printable(text, keep="\t")
        print(f"{where} {'!' if stream == 'stderr' else '|'} {shown}")


def _print_dropped(
    args: argparse.Namespace, got: dict[str, Any], names: dict[int, str], warned: set[int]
) -> None:
    for n in got["nodes"]:
        if n["dropped"] and n["executor_id"] not in warned:
            warned.add(n["executor_id"])
            line = f"[{n['dropped']} earlier lines of {names[n['executor_id']]} dropped: the coordinator keeps the last ones]"
            print(
                json.dumps({"node": names[n["executor_id"]], "marker": line})
                if args.json
                else printable(line)
            )


def _logs_of_ended_run(args: argparse.Namespace, record: runrecords.RunRecord) -> int:
    """``tfcoord logs JOB`` of a run whose driver ended: the newest lines its record kept."""
    st = JobStatus.decode(record.status)
    eid = _node_executor(st, args.node) if args.node else -1
    got = record.logs
    names = {int(n["executor_id"]): f"{n['role']}:{n['index']}" for n in got["nodes"]}
    _print_dropped(args, {"nodes": [n for n in got["nodes"] if eid in (-1, n["executor_id"])]}, names, set())
    for _, t, e, stream, text in got["lines"]:
        if eid in (-1, e):
            _print_log_line(args, names, t, e, stream, text)
    _say_ended(record, st)
    return 0


def _stopped_following(job: str) -> int:
    """Ctrl-C in ``status --follow`` or ``logs --follow``: only the watching ends."""
    return fail(
        EXIT_INTERRUPTED,
        f"interrupted: stopped following job {job}, which goes on (tfcoord stop {job} ends it)",
    )


def cmd_logs(args: argparse.Namespace) -> int:
    record = _ended_run(args)
    if record is not None:
        return _logs_of_ended_run(args, record)
    try:
        return _logs(args)
    except KeyboardInterrupt:
        if not args.follow:
            raise
        return _stopped_following(args.job)


def _logs(args: argparse.Namespace) -> int:
    cfg = _admin_config(args)
    with _connect(cfg, args, role="admin", follow=args.follow) as c:
        st = c.status(args.job)
        eid = _node_executor(st, args.node) if args.node else -1
        since, warned = 0, set[int]()
        # A coordinator without a state directory keeps no output across a restart and
        # numbers what comes after from 0 again (one with it may reuse the numbers of the
        # last second's lines, which it had not kept yet): once the connection was re-established, the lines are asked for from the
        # start, and those already printed (numbered below the old ``since`` and no newer than
        # the last one printed) are skipped, so a reconnect to the same coordinator repeats nothing.
        reconnects, last_t = c.reconnects, 0.0
        seen: tuple[int, float] | None = None  # (since, last time) when the connection was lost
        while True:
            got = c.logs(args.job, executor_id=eid, since=since)
            if c.reconnects != reconnects:
                reconnects = c.reconnects
                if since:
                    seen, since = (max(since, seen[0] if seen else 0), last_t), 0
                    continue
            names = {n["executor_id"]: f"{n['role']}:{n['index']}" for n in got["nodes"]}
            _print_dropped(args, got, names, warned)
            for seq, t, e, stream, text in got["lines"]:
                if seen is not None and seq < seen[0] and t <= seen[1]:
                    continue  # printed before the connection was lost
                last_t = max(last_t, t)
                _print_log_line(args, names, t, e, stream, text)
            sys.stdout.flush()
            more = got["next"] > since and len(got["lines"]) >= MAX_LOGS_REPLY
            since = got["next"]
            if seen is not None and since >= seen[0]:
                seen = None  # past every line numbered before the reconnect
            if more:
                continue
            if not args.follow or JobState(got["state"]).terminal:
                return 0
            time.sleep(LOGS_POLL_S)


def _table(rows: Sequence[Sequence[str]]) -> None:
    """Rows as aligned columns; cells (host names, errors, job names) printed safe."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def cmd_stop(args: argparse.Namespace) -> int:
    cfg = _admin_config(args)
    with _connect(cfg, args, role="admin") as c:
        res = c.stop(args.job, args.reason, dry_run=args.dry_run)
    if args.json:
        print(json.dumps({**res.wire, "job": args.job, "dry_run": args.dry_run}, indent=2, sort_keys=True))
        return 0
    verb = "would stop" if args.dry_run else "stopping"
    if res.state.terminal:
        print(f"job {args.job} already ended {res.state}; nothing to stop")
        return 0
    print(f"job {args.job} ({res.state}): {verb} {len(res.nodes)} node(s)")
    for n in res.nodes:
        print(f"  {printable(n)}")
    if args.dry_run:
        print("dry run: nothing was sent; run again without --dry-run to stop the job")
    return 0


def _command(args: argparse.Namespace) -> list[str]:
    """What follows ``--`` on the command line; it must not be empty."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("nothing to run: give the command after --, e.g. -- python train.py")
    return command


def _emit(line: str) -> None:
    """A progress or outcome line of ``submit`` on stderr; node text in it (a failed node's
    traceback) cannot drive the terminal."""
    print(f"tfcoord: {printable(line, keep=TRACEBACK)}", file=sys.stderr, flush=True)


def _is_python(prog: str) -> bool:
    """``python``, ``python3``, ``python3.11`` or this interpreter, by path or by name."""
    return prog == sys.executable or re.fullmatch(r"python(\d+(\.\d+)?)?", Path(prog).name) is not None


def _local_command(command: list[str]) -> list[str]:
    """The command each local node runs; a script alone runs with this Python. A program
    that is not there is named now, not as each node's failure."""
    import shutil

    prog = command[0]
    if prog.endswith(".py"):
        command = [sys.executable, *command]
        prog = sys.executable
    found = shutil.which(prog)
    if found is None:
        where = "is not an executable file" if os.sep in prog else "is not on PATH"
        raise UsageError(
            f"{prog!r} {where}: give the command every node runs after --, e.g. -- python train.py"
        )
    if (
        _is_python(prog)
        and len(command) > 1
        and command[1].endswith(".py")
        and not Path(command[1]).is_file()
    ):
        raise UsageError(f"no script at {command[1]}: give the path of your training script after --")
    return command


def _spark_script(command: list[str]) -> tuple[str, list[str]]:
    """The script and its arguments from ``-- [python] script.py ARGS``: the shape both engines take."""
    if _is_python(command[0]):
        command = command[1:]
    if not command or not command[0].endswith(".py"):
        raise UsageError(
            "with --engine spark give the Python script after --: -- train.py [ARGS] "
            "(or -- python train.py [ARGS])"
        )
    return command[0], command[1:]


def _print_final(args: argparse.Namespace, status: JobStatus | None) -> None:
    if args.json and status is not None:
        print(json.dumps(dict(status.wire), indent=2, sort_keys=True), flush=True)


def _restart_policy(args: argparse.Namespace) -> dict[str, Any]:
    """JobSpec's restart fields from ``--max-restarts``, ``--restart-on``, ``--restart-backoff``
    and ``--deadline`` (the JobSpec checks their ranges: a bad value is a usage error)."""
    return {
        "max_restarts": args.max_restarts,
        "restart_on": RestartOn(args.restart_on),
        "restart_backoff_s": args.restart_backoff,
        "deadline_s": args.deadline,
    }


def _role_resources(args: argparse.Namespace) -> dict[str, Any]:
    """``--role-resources worker:cpus=2,gpus=1`` (repeatable) as ``{role: Resources}``."""
    from tfcoord.driver.resources import ResourcesError, parse_flags

    try:
        return parse_flags(args.role_resources)
    except ResourcesError as e:
        raise UsageError(f"--role-resources {e}") from None


def _check_engine_flags(args: argparse.Namespace) -> None:
    """Refuse a flag of another engine than ``--engine``'s: it would be accepted and ignored."""
    given = {
        engine: [a.option_strings[0] for a in actions if getattr(args, a.dest) != a.default]
        for engine, actions in args.engine_only.items()
        if engine != args.engine
    }
    if args.engine == "spark" and args.workers != 1:
        given.setdefault("local and mesos", []).append("--workers")
    for engine, flags in given.items():
        if flags:
            raise UsageError(
                f"{', '.join(flags)}: for --engine {engine} only, and this job runs on --engine "
                f"{args.engine}, which would ignore {'it' if len(flags) == 1 else 'them'}: drop "
                f"{'it' if len(flags) == 1 else 'them'}, or pass the engine"
                + (" (under Spark the cluster's size is --num-executors)" if "--workers" in flags else "")
            )


def cmd_submit(args: argparse.Namespace) -> int:
    from tfcoord.driver.local import run_local

    _check_engine_flags(args)
    if args.no_wait and (args.engine != "mesos" or not (args.address or os.environ.get(ADDRESS_ENV))):
        where = (
            "its nodes are processes of this command"
            if args.engine == "local"
            else "this command is the Spark driver"
            if args.engine == "spark"
            else "an embedded coordinator ends with this command"
        )
        raise UsageError(
            f"--no-wait needs --engine mesos and a running coordinator (--address or {ADDRESS_ENV}): "
            f"{where}; run it in the background instead (nohup tfcoord submit ... &) and follow "
            "it with tfcoord status JOB"
        )
    if args.engine == "mesos":
        return _submit_mesos(args)
    command = _command(args)
    if args.engine == "spark":
        return _submit_spark(args, command)
    command = _local_command(command)
    if args.workers < 0 or args.ps < 0 or (args.workers == 0 and not args.chief):
        raise UsageError(
            f"--workers {args.workers} --ps {args.ps}: a local job needs at least one worker "
            "(or --chief) and no negative count; e.g. --workers 2"
        )
    role_resources = _role_resources(args)
    try:
        roles = make_roles(
            args.workers, args.ps, chief="chief" if args.chief else None, evaluator=args.evaluator
        )
        if role_resources:
            from tfcoord.driver.resources import check_roles

            check_roles(role_resources, roles)
        spec = JobSpec(
            roles=roles,
            reservation_timeout_s=args.reservation_timeout,
            name=args.name,
            engine="local",
            **_restart_policy(args),
        )
    except (ValueError, TfcoordError) as e:
        raise UsageError(str(e)) from None
    if args.address or os.environ.get(ADDRESS_ENV):
        cfg = _client_config(args)
        link = CoordinatorLink(cfg.address, cfg.secret, cfg.ssl_context)
    else:
        # The connection file and run records: tfcoord status/logs/stop from another shell, and
        # status/logs after this driver has ended.
        link = CoordinatorLink.start_embedded(
            quiet=True, plaintext=args.plaintext, connection_dir=connfile.runtime_dir(os.environ)
        )  # which warns for plaintext
    node_env = None
    with link, contextlib.ExitStack() as cleanup:
        if link.ca_pem:
            # The nodes (tfcoord node, TFCOORD_TLS_CA) pin the embedded coordinator's own CA:
            # a public certificate, written where only they look, removed with the job.
            ca_dir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="tfcoord-ca-"))
            ca_file = Path(ca_dir, "ca.pem")
            ca_file.write_text(link.ca_pem)
            node_env = dict(os.environ, **{TLS_CA_ENV: str(ca_file)})
            node_env.pop(TLS_CERT_ENV, None)
            node_env.pop(TLS_KEY_ENV, None)
        with _connect(ClientConfig(link.address, link.secret, link.ssl_context), args, follow=True) as driver:
            # With --json stdout carries the final status alone; the nodes' output goes to stderr.
            out = sys.stderr.buffer if args.json else None
            status = run_local(
                driver, spec, command, emit=_emit, out=out, env=node_env, role_resources=role_resources
            )
    _print_final(args, status)
    return _job_exit(status)


def _job_exit(status: JobStatus) -> int:
    """How a job's end reads to a shell: 0 SUCCEEDED, 4 STOPPED, 1 FAILED."""
    if status.state == JobState.SUCCEEDED:
        return ExitCode.OK
    return ExitCode.STOPPED if status.state == JobState.STOPPED else ExitCode.FAILED


def _submit_spark(args: argparse.Namespace, command: list[str]) -> int:
    """Run ``main_fun(argv, ctx)`` from a script on Spark executors, one node per executor."""
    script, argv = _spark_script(command)
    options = _spark_options(args)
    role_resources = _role_resources(args)
    if not Path(script).is_file():
        raise UsageError(f"no script at {script}: give the path of your training script after --")
    if args.address or os.environ.get(ADDRESS_ENV):
        cfg = _client_config(args)
        # Dialled now, before Spark takes seconds to start: a wrong address, port or secret
        # is one line at once (it was reported only once Spark was up, after 30 s).
        _connect(cfg, args).close()
        os.environ.setdefault(SECRET_FILE_ENV, args.secret_file or os.environ.get(SECRET_FILE_ENV, ""))
        coordinator, secret = cfg.address, cfg.secret
    else:
        coordinator, secret = None, None
        logging.getLogger("tfcoord.coordinator").setLevel(max(logging.WARNING, logging.getLogger().level))
    from tfcoord import aliases
    from tfcoord.driver.script import ScriptFailed
    from tfcoord.driver.spark import submit_script
    from tfcoord.node.tlsfiles import TlsFiles

    # TensorFlowOnSpark's scripts import `tensorflowonspark`: tfcoord's, unless a real one is installed.
    aliases.install()
    _emit(aliases.describe("tensorflowonspark"))

    # The nodes reach a TLS coordinator as we do: the same files (checked above by
    # _client_config), by path, read by each node when it starts.
    ca, cert, key = (os.environ.get(k) or None for k in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV))
    tls = TlsFiles.of(ca, cert, key) if coordinator and (ca or cert or key) else None

    try:
        status = submit_script(
            args.master,
            script,
            argv,
            num_executors=args.num_executors,
            num_ps=args.ps,
            tensorboard=args.tensorboard,
            log_dir=args.log_dir,
            conf=dict(options.conf),
            options=options,
            executor_cores=args.executor_cores,
            executor_memory=args.executor_memory,
            reservation_timeout=args.reservation_timeout,
            **_restart_policy(args),
            master_node="chief" if args.chief else None,
            eval_node=args.evaluator,
            name=args.name,
            emit=_emit,
            coordinator=coordinator,
            secret=secret,
            tls=tls,
            role_resources=role_resources,
        )
    except ScriptFailed as e:
        raise UserScriptError(e.traceback_text, str(e)) from None
    except (FileNotFoundError, AttributeError) as e:
        raise UsageError(str(e)) from None
    except ValueError as e:  # run()'s arguments, as the script gave them: the cluster's shape
        raise UsageError(str(e)) from None
    _print_final(args, status)
    return 0 if status is None else _job_exit(status)


def _spark_options(args: argparse.Namespace) -> SubmitOptions:
    """Every flag of ``submit --engine spark``, checked before Spark starts (a mistake is one
    line in milliseconds, not a Java stack trace after seconds): the cluster's shape, the
    restart policy, spark-submit's flags (:meth:`SubmitOptions.of`), the master URL, and that
    a standalone master answers."""
    from tfcoord.driver.spark import cluster_roles
    from tfcoord.driver.sparksubmit import (
        LOCAL_STANDALONE,
        MasterUnreachable,
        SubmitError,
        check_master,
        check_master_reachable,
    )

    if args.num_executors is None:
        raise UsageError("--engine spark needs --num-executors N (the TensorFlow cluster's size)")
    if args.executor_cores < 1:
        raise UsageError(f"--executor-cores must be at least 1, not {args.executor_cores}")
    try:
        roles = cluster_roles(args.num_executors, args.ps, "chief" if args.chief else None, args.evaluator)
        # The restart policy and timeouts as the job will carry them.
        JobSpec(
            roles=roles,
            reservation_timeout_s=args.reservation_timeout,
            engine="spark",
            **_restart_policy(args),
        )
    except (ValueError, TfcoordError) as e:
        raise UsageError(
            str(e).replace("num_executors", "--num-executors").replace("num_ps", "--num-ps")
        ) from None
    try:
        options = SubmitOptions.of(
            deploy_mode=args.deploy_mode,
            executor_memory=args.executor_memory,
            driver_memory=args.driver_memory,
            conf=args.conf,
            py_files=args.py_files,
            files=args.files,
            archives=args.archives,
        )
        check_master(args.master)
        if args.master != LOCAL_STANDALONE:
            check_master_reachable(args.master)
    except MasterUnreachable as e:
        raise Unreachable(str(e)) from None
    except SubmitError as e:
        raise UsageError(str(e)) from None
    return options


def _submit_mesos(args: argparse.Namespace) -> int:
    """Run the cluster as Mesos tasks placed by the coordinator's framework (coordinator/mesos)."""
    from tfcoord.coordinator.mesos.config import MesosConfig
    from tfcoord.coordinator.mesos.errors import MesosConfigError
    from tfcoord.coordinator.mesos.jobs import MesosJob, parse_role
    from tfcoord.driver import mesos
    from tfcoord.driver.resources import ResourcesError, mesos_roles

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    role_resources = _role_resources(args)
    if args.job and role_resources:
        raise UsageError(
            "give the roles either as --job ROLE:N:cpus=C,mem=MB or as --ps/--workers/--chief/--evaluator "
            "with --role-resources, not both"
        )
    if not args.job and not role_resources:
        raise UsageError(
            "--engine mesos needs the cluster's roles: --job ps:1:cpus=1,mem=1024 "
            "--job worker:2:cpus=2,mem=4096, or --ps 1 --workers 2 --role-resources ps:cpus=1,memory=1g "
            "--role-resources worker:cpus=2,memory=4g (and the command after --, or none to serve)"
        )
    try:
        if args.job:
            roles = [parse_role(j) for j in args.job]
        else:
            counts = make_roles(
                args.workers, args.ps, chief="chief" if args.chief else None, evaluator=args.evaluator
            )
            roles = mesos_roles(counts, role_resources)
        mjob = MesosJob.of(roles, command, args.image, os.environ.get("MESOS_ATTRIBUTES", ""))
        spec = mjob.to_spec(
            name=args.name, reservation_timeout_s=args.reservation_timeout, **_restart_policy(args)
        )
    except (MesosConfigError, ResourcesError, TfcoordError) as e:
        raise UsageError(str(e)) from None
    if args.address or os.environ.get(ADDRESS_ENV):
        cfg = _client_config(args)  # that coordinator must run the framework (MESOS_MASTER)
        link = CoordinatorLink(cfg.address, cfg.secret, cfg.ssl_context)
    else:
        try:
            config = MesosConfig.from_env(os.environ, master=args.mesos_master)
        except MesosConfigError as e:
            raise UsageError(str(e)) from None
        # The job's timeline is printed instead of the framework's per-event log.
        logging.getLogger("tfcoord.mesos").setLevel(max(logging.WARNING, logging.getLogger().level))
        link = mesos.start_link(
            config, advertise_host=args.advertise_host, gpus=mjob.gpus, plaintext=args.plaintext
        )
    what = "serving tf.distribute.Server" if mjob.server_mode else f"running {' '.join(command)}"
    with (
        link,
        _connect(ClientConfig(link.address, link.secret, link.ssl_context), args, follow=True) as driver,
    ):
        job = driver.submit(spec)
        _emit(
            f"job {job} submitted to Mesos: "
            + ", ".join(f"{r.count} {r.role} ({r.resources_text()})" for r in mjob.roles)
            + f", {what}"
        )
        if args.no_wait:  # the coordinator's framework places and watches the tasks
            if args.json:
                print(json.dumps({"job": job}), flush=True)
            else:
                print(job, flush=True)
            _emit(f"not waiting: follow it with `tfcoord status {job}`, end it with `tfcoord stop {job}`")
            return 0
        try:
            if mjob.server_mode:
                status = mesos.wait_running(
                    driver, job, emit=_emit, timeout_s=args.reservation_timeout + mesos.RUNNING_GRACE_S
                )
                _emit(
                    f"cluster serving: {json.dumps(status.cluster)}; Ctrl-C or `tfcoord stop {job}` ends it"
                )
            status = mesos.await_state(driver, job, timeout_s=FOREVER_S, emit=_emit)
        except KeyboardInterrupt:
            if not mjob.server_mode:
                raise stop_interrupted(driver, job) from None
            # A serving cluster runs until Ctrl-C: that is its normal end.
            _emit("interrupted: stopping the cluster")
            status = stop_and_wait(driver, job, INTERRUPT_REASON, mesos.STOP_WAIT_S)
    if status.state == JobState.FAILED:
        _emit(f"job {job} failed: {status.error}")
    _print_final(args, status)
    if mjob.server_mode and status.state == JobState.STOPPED:
        return ExitCode.OK
    return _job_exit(status)


def cmd_env_check(args: argparse.Namespace) -> int:
    from tfcoord.envcheck import run_checks

    # The same TLS client settings as status and stop; a broken one is a FAIL line of the
    # report rather than an exit before any check ran.
    try:
        ssl_context, tls_problem = _client_tls(), None
    except UsageError as e:
        ssl_context, tls_problem = None, str(e)
    results = run_checks(
        os.environ,
        address=args.address or os.environ.get(ADDRESS_ENV) or None,
        secret_file=args.secret_file or os.environ.get(SECRET_FILE_ENV) or None,
        ssl_context=ssl_context,
        tls_problem=tls_problem,
        timeout_s=args.timeout,
    )
    if args.json:
        print(
            json.dumps(
                [{"status": r.status, "check": r.check, "detail": r.detail, "fix": r.fix} for r in results],
                indent=2,
            )
        )
    else:
        for r in results:
            print(r.line(), flush=True)
    return EXIT_FAILED if any(r.status == "FAIL" for r in results) else 0


# -- parser -------------------------------------------------------------------------------


def build_parser(env: Any = None) -> argparse.ArgumentParser:
    """The parser. Global flags (``--log-level``, ``--log-format``, ``--debug``) go before or
    after the command's name; each ``serve`` flag also reads ``TFCOORD_<FLAG>`` (see :func:`_env_flags`)."""
    env = os.environ if env is None else env
    p = _Parser(prog="tfcoord", description="Coordinator for distributed TensorFlow.")
    p.add_argument("--version", action="version", version=f"tfcoord {__version__}")
    p.add_argument("--json", action="store_true", help="machine-readable output (see each command's --help)")
    _global_flags(p, env)
    common = _Parser(add_help=False)
    _global_flags(common, env, suppress=True)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str, *, json_help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, parents=[common], description=help)
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
        return sp

    def client_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--address", help=f"coordinator HOST:PORT (default: ${ADDRESS_ENV})")
        sp.add_argument(
            "--secret-file", help=f"file holding the coordinator secret (default: ${SECRET_FILE_ENV})"
        )
        sp.add_argument(
            "--timeout",
            type=_positive,
            default=DEFAULT_TIMEOUT_S,
            metavar="S",
            help="give up on the coordinator after S seconds (connecting, and each request); "
            f"a refused connection or an unknown host fails at once (default {DEFAULT_TIMEOUT_S:g})",
        )

    sp = command("serve", "run the coordinator", json_help="log JSON lines (as --log-format json)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=7070, help="TCP port; 0 picks a free one (see --port-file)")
    sp.add_argument("--port-file", help="write the bound port here once listening")
    sp.add_argument("--secret-file", help="coordinator secret (created, mode 600, if missing)")
    sp.add_argument(
        "--admin-secret-file",
        help="admin credential, for tfcoord status/stop and operators "
        f"(created, mode 600, if missing; default: the secret file's name + {ADMIN_SUFFIX})",
    )
    sp.add_argument("--state-dir", help="journal directory; without it state lives in memory only")
    sp.add_argument("--http-host", default="127.0.0.1", help="interface of the HTTP API and dashboard")
    sp.add_argument(
        "--http-port",
        type=int,
        help="HTTP API and dashboard port; 0 picks a free one; without it no HTTP server runs",
    )
    sp.add_argument("--http-port-file", help="write the bound HTTP port here once listening")
    sp.add_argument(
        "--http-token-file",
        help="bearer token for the HTTP API and dashboard "
        "(created, mode 600, if missing; separate from the coordinator secret)",
    )
    sp.add_argument(
        "--http-admin-token-file",
        help="a second HTTP bearer token that may also stop jobs (the dashboard's stop button); "
        "created, mode 600, if missing; without it no one stops jobs over HTTP",
    )
    sp.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="authenticated connections (nodes, drivers) at once (default: 20000, or what "
        "RLIMIT_NOFILE leaves; a number that does not fit is refused)",
    )
    sp.add_argument(
        "--max-unauthenticated",
        type=int,
        default=4096,
        metavar="N",
        help="connections still in their handshake at once, a budget apart from nodes'",
    )
    sp.add_argument(
        "--max-unauthenticated-per-source",
        type=int,
        metavar="N",
        help="of those, from one source address (default: a quarter of --max-unauthenticated, so one "
        "host cannot take the whole budget; raise it where one host starts thousands of nodes at once)",
    )
    sp.add_argument(
        "--http-max-connections",
        type=int,
        default=256,
        metavar="N",
        help="HTTP API connections at once (beyond: 503)",
    )
    sp.add_argument("--tls-cert", help="serve TLS (TCP protocol and HTTP API) with this PEM certificate")
    sp.add_argument("--tls-key", help="the certificate's PEM private key (mode 600)")
    sp.add_argument("--tls-ca", help="mutual TLS: clients must present a certificate signed by this CA")
    sp.add_argument(
        "--plaintext",
        action="store_true",
        help="serve without TLS (logged as a warning); without it, --tls-cert and --tls-key are required",
    )
    sp.add_argument(
        "--mesos-master",
        help="run the Mesos framework against these masters, host:port[,host:port], or the leader "
        "ZooKeeper names, zk://host:2181[,host:2181]/mesos (default: $MESOS_MASTER; neither: no Mesos)",
    )
    sp.add_argument(
        "--advertise-host", help="address Mesos tasks dial back to (default: --host, or this host's name)"
    )
    sp.add_argument(
        "--keep-finished-jobs",
        type=int,
        default=KEEP_FINISHED_JOBS,
        metavar="N",
        help="finished jobs to keep (status, HTTP API, journal); older ones are forgotten, "
        f"each after at least 5 minutes (default {KEEP_FINISHED_JOBS})",
    )
    sp.add_argument(
        "--keep-finished-days",
        type=float,
        default=KEEP_FINISHED_S / 86400,
        metavar="D",
        help=f"forget finished jobs this many days after they ended (default {KEEP_FINISHED_S / 86400:g})",
    )
    _env_flags(sp, env, skip={"--mesos-master"})  # MESOS_MASTER keeps tfmesos2's name
    sp.set_defaults(fn=cmd_serve)

    sp = command(
        "env-check",
        "check this machine for Spark/Mesos/TensorFlow work: OK, WARN, FAIL",
        json_help="the report as a JSON list",
    )
    client_flags(sp)
    sp.set_defaults(fn=cmd_env_check)

    def admin_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--admin-secret-file",
            help=f"the coordinator's admin credential (default: "
            f"${ADMIN_SECRET_FILE_ENV}, else the secret file's name + {ADMIN_SUFFIX})",
        )

    sp = command(
        "status",
        "show jobs, or one job's nodes, results and timeline",
        json_help="the coordinator's full answer as JSON",
    )
    client_flags(sp)
    admin_flag(sp)
    sp.add_argument("job", nargs="?")
    sp.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="print each change of JOB (summary, timeline) until it ends; --json: a status a line",
    )
    sp.set_defaults(fn=cmd_status)

    sp = command(
        "logs",
        "show the output (stdout and stderr) of a job's nodes",
        json_help="one JSON object a line: time, node, stream, text",
    )
    client_flags(sp)
    admin_flag(sp)
    sp.add_argument("job")
    sp.add_argument("--node", metavar="ROLE:I", help="one node's output only (e.g. worker:1)")
    sp.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    sp.set_defaults(fn=cmd_logs)

    sp = command("stop", "stop a job gracefully (streaming jobs)", json_help="the answer as JSON")
    client_flags(sp)
    admin_flag(sp)
    sp.add_argument("job")
    sp.add_argument("--dry-run", action="store_true", help="show what would be stopped, change nothing")
    sp.add_argument("--reason", default="stop requested with tfcoord stop")
    sp.set_defaults(fn=cmd_stop)

    sp = command(
        "submit",
        "submit a job and follow it to its end",
        json_help="print the job's final status as JSON on stdout (progress and output on stderr)",
    )
    client_flags(sp)
    sp.add_argument("--engine", choices=("local", "spark", "mesos"), default="local")
    sp.add_argument("--workers", type=int, default=1, help="local: worker processes")
    sp.add_argument("--ps", "--num-ps", type=int, default=0)
    spark = sp.add_argument_group("spark engine")
    spark.add_argument(
        "--master",
        default="local-standalone",
        help="Spark master URL; local-standalone starts a master and worker here for the job",
    )
    spark.add_argument("--num-executors", type=int, help="TensorFlow nodes, one per Spark executor")
    spark.add_argument("--tensorboard", action="store_true", help="run TensorBoard beside the chief")
    spark.add_argument("--log-dir", help="TensorBoard log directory")
    spark.add_argument("--executor-cores", type=int, default=1)
    spark.add_argument(
        "--executor-memory", default="1g", help="each executor's memory, e.g. 4g (spark-submit's)"
    )
    spark.add_argument(
        "--driver-memory", metavar="SIZE", help="this driver's memory, e.g. 2g (spark-submit's)"
    )
    spark.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting; repeat for more"
    )
    for flag, what in (
        ("--py-files", "Python files (.py, .zip, .egg) for the executors, and this driver's sys.path"),
        ("--files", "files placed in each executor's working directory (SparkFiles.get(NAME))"),
        (
            "--archives",
            "archives unpacked in each executor's working directory (ARCHIVE#NAME names the directory)",
        ),
    ):
        spark.add_argument(
            flag, action="append", default=[], metavar="PATH[,PATH]", help=f"{what}; as spark-submit's"
        )
    spark.add_argument(
        "--deploy-mode",
        choices=DEPLOY_MODES,
        default="client",
        help="client (tfcoord submit is the driver); cluster is refused, with why",
    )
    mesos = sp.add_argument_group("mesos engine")
    mesos.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="ROLE:N[:cpus=C,mem=MB,gpus=G]",
        help="one role of the cluster and what each of its tasks needs; repeat per role",
    )
    mesos.add_argument("--image", help="task image (default: $DOCKER_IMAGE, else tfcoord-task:VERSION)")
    mesos.add_argument(
        "--mesos-master",
        help="Mesos masters host:port[,host:port], or zk://host:2181[,host:2181]/mesos (default: $MESOS_MASTER)",
    )
    mesos.add_argument(
        "--advertise-host", help="address Mesos tasks dial back to (default: this host's name, resolved)"
    )
    # What one engine alone reads: another engine would ignore it, so it is refused there.
    sp.set_defaults(engine_only={"spark": tuple(spark._group_actions), "mesos": tuple(mesos._group_actions)})
    sp.add_argument(
        "--plaintext",
        action="store_true",
        help="local and mesos engines, embedded coordinator: serve without TLS (logged as a warning); "
        "by default it serves TLS with a certificate of its own that its nodes pin",
    )
    sp.add_argument(
        "--role-resources",
        action="append",
        default=[],
        metavar="ROLE:cpus=N,gpus=N,memory=SIZE",
        help="what each task of a role needs; repeat per role (docs/src/resources.md). spark: the role "
        "runs as its own Spark job with a ResourceProfile; mesos: offers sized per role (with --ps, "
        "--workers); local: node processes pinned to that many CPUs",
    )
    sp.add_argument("--chief", action="store_true", help="add a chief task")
    sp.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    sp.add_argument("--name", default="")
    sp.add_argument("--reservation-timeout", type=float, default=600.0)
    restarts = sp.add_argument_group(
        "restarts", "a job that outlives its nodes (docs/src/fault-tolerance.md)"
    )
    restarts.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="restart the whole cluster from its last checkpoint up to N times when a node is lost "
        "or killed by a signal (default 0: the first failure ends the job)",
    )
    restarts.add_argument(
        "--restart-on",
        choices=[r.value for r in RestartOn],
        default=RestartOn.EXIT_CODE.value,
        help="exit-code: lost nodes and processes ended by a signal restart, a Python exception or "
        "exit code 1-127 is permanent (TFJob's ExitCode policy); any-failure: every failure restarts",
    )
    restarts.add_argument(
        "--restart-backoff",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="each node waits this long before it rejoins the restarted cluster (default 1)",
    )
    restarts.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="fail the job once it has run this long, restarts included (default: no deadline)",
    )
    sp.add_argument(
        "--no-wait",
        action="store_true",
        help="print the job id once submitted and exit 0 (mesos engine with a running coordinator)",
    )
    sp.add_argument("command", nargs=argparse.REMAINDER)
    sp.set_defaults(fn=cmd_submit)

    sp = sub.add_parser(
        "node", help="run one node (used by engines; token in TFCOORD_TOKEN)", parents=[common]
    )
    node_main.add_arguments(sp)
    sp.set_defaults(fn=node_main.cmd_node)

    sp = sub.add_parser(
        "completion",
        help='print a shell completion script: eval "$(tfcoord completion bash)"',
        parents=[common],
    )
    sp.add_argument("shell", choices=("bash", "zsh"))
    sp.set_defaults(fn=lambda args: cmd_completion(args, p))
    return p


def _global_flags(p: argparse.ArgumentParser, env: Any, *, suppress: bool = False) -> None:
    """The flags every command takes. After the command's name they are SUPPRESSed, so a
    flag given before the name is not reset by the command's parser."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        default=default(env.get("TFCOORD_LOG_LEVEL", "INFO").upper()),
        help=f"{', '.join(LOG_LEVELS)} (any case; default $TFCOORD_LOG_LEVEL or INFO)",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=default(env.get("TFCOORD_LOG_FORMAT", "text")),
        help="log lines as text or JSON (default $TFCOORD_LOG_FORMAT or text)",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="show the traceback of an internal error (a tfcoord bug; please report it)",
    )


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0 seconds")
    return value


def env_name(flag: str) -> str:
    """The environment variable of a ``serve`` flag: ``--http-port`` is ``TFCOORD_HTTP_PORT``."""
    return "TFCOORD_" + flag.lstrip("-").upper().replace("-", "_")


#: What ``TFCOORD_<SWITCH>`` may say: a switch set to "0" must not read as on.
_SWITCH_VALUES = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def _env_flags(sp: argparse.ArgumentParser, env: Any, *, skip: set[str]) -> None:
    """Let ``TFCOORD_<FLAG>`` set each flag of ``sp`` (a flag on the command line wins).

    argparse converts a string default with the flag's type, so a bad value is refused as
    the flag's would be; the message names the variable.
    """
    for action in sp._actions:  # argparse keeps no public list of a parser's actions
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if (
            flag is None
            or flag in skip
            or flag in ("--help", "--json")
            or action.dest in ("log_level", "log_format", "debug")
        ):
            continue
        name = env_name(flag)
        action.help = (action.help or "") + f" [${name}]"
        value = env.get(name)
        if value is None or value == "":
            continue
        if isinstance(action, argparse._StoreTrueAction):  # a switch: argparse keeps no public type for it
            if value.lower() not in _SWITCH_VALUES:
                raise UsageError(f"{name}={value!r} is not a switch: set it to 1 or 0 (true/false, yes/no)")
            action.default = _SWITCH_VALUES[value.lower()]
            continue
        if action.type is not None and action.type is not str:
            try:
                action.type(value)  # type: ignore[operator]
            except (ValueError, argparse.ArgumentTypeError):
                raise UsageError(
                    f"{name}={value!r} is not a valid {flag}: fix it in the environment "
                    "(or the service's tfcoord.env)"
                ) from None
        action.default = value


def cmd_completion(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from tfcoord.completion import script

    print(script(parser, args.shell))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error is one line on stderr and a documented exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def go() -> int:
        args = build_parser().parse_args(argv)
        setup_logging("json" if args.cmd == "serve" and args.json else args.log_format, args.log_level)
        try:
            return int(args.fn(args))
        except UserScriptError as e:
            sys.stderr.write(e.traceback_text)
            return fail(EXIT_FAILED, str(e))
        except Interrupted as e:  # Ctrl-C while a job ran: it was stopped first
            return fail(EXIT_INTERRUPTED, e.line())
        except KeyboardInterrupt:
            return fail(
                EXIT_INTERRUPTED,
                "interrupted before any job was submitted" if args.cmd == "submit" else "interrupted",
            )

    return run_entry(go, debug="--debug" in argv)
