"""Finding and dialling the coordinator for the client commands: its address, the secret
or admin secret, TLS from ``TFCOORD_TLS_*``, an embedded coordinator of this user's found
through its connection file, and a client that gives up as a person at a terminal expects."""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from tfcoord.cli.credentials import ADMIN_SECRET_FILE_ENV, ADMIN_SUFFIX, credential, secret_from
from tfcoord.client import DriverClient, TfcoordError, TlsError, connfile, tls
from tfcoord.client.client import DEFAULT_RECONNECT_DEADLINE_S
from tfcoord.client.entry import ADDRESS_ENV, SECRET_FILE_ENV, UsageError, client_tls

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


@dataclass(frozen=True)
class ClientConfig:
    address: str
    secret: bytes
    ssl_context: ssl.SSLContext | None = None


def client_config(args: argparse.Namespace) -> ClientConfig:
    address = args.address or os.environ.get(ADDRESS_ENV)
    if not address:
        raise UsageError(f"no coordinator address: pass --address HOST:PORT or set {ADDRESS_ENV}")
    _check_address(address)
    return ClientConfig(
        address, secret_from(args.secret_file or os.environ.get(SECRET_FILE_ENV)), client_tls_from_env()
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


def connect(
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


def admin_config(args: argparse.Namespace) -> ClientConfig:
    """Address and the admin secret, for the commands that act on any job (status, stop).

    Without an address, an embedded coordinator this user runs on this machine (a Spark
    driver's) is found through its connection file (:mod:`tfcoord.client.connfile`).
    """
    address = args.address or os.environ.get(ADDRESS_ENV)
    if not address:
        local = local_coordinator(args)
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
    return ClientConfig(address, credential(Path(path), "admin secret", create=False), client_tls_from_env())


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


def local_coordinator(args: argparse.Namespace) -> ClientConfig | None:
    """The embedded coordinator of this user's on this machine: the one there is, or the one
    that holds ``args.job`` when there are several; None when there is none."""
    try:
        found = list(connfile.find(connfile.runtime_dir(os.environ)))
    except connfile.ConnectionFileError as e:
        raise UsageError(str(e)) from None
    configs = []
    for conn in found:
        try:
            context = client_tls_from_env() or (
                tls.client_context(ca_pem=conn.ca_pem) if conn.ca_pem else None
            )
        except TlsError as e:
            raise UsageError(str(e)) from None
        configs.append((conn, ClientConfig(conn.address, conn.admin_secret, context)))
    if len(configs) <= 1:
        return configs[0][1] if configs else None
    job = getattr(args, "job", None)
    if job:
        for _, cfg in configs:
            try:
                with connect(cfg, args, role="admin") as c:
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


def client_tls_from_env() -> ssl.SSLContext | None:
    """The client's TLS context from TFCOORD_TLS_*; None (plaintext) when none is set."""
    return client_tls(os.environ)
