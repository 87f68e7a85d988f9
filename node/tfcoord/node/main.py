"""The node's entry point: ``python -m tfcoord.node``, ``tfcoord-node`` and ``tfcoord node``.

A Spark executor, a Mesos task or the local engine runs this with the job token in
``TFCOORD_TOKEN``: it registers the node's slot, waits for the cluster, runs the command
(or, with ``--server-mode``, a ``tf.distribute.Server``) and reports how it ended. It needs
only tfcoord-client and tfcoord-node installed: a task image holds nothing heavier.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from tfcoord.client import tls
from tfcoord.client.auth import TOKEN_ENV
from tfcoord.client.client import DEFAULT_REQUEST_TIMEOUT_S
from tfcoord.client.entry import (
    ADDRESS_ENV,
    LOG_LEVELS,
    TLS_CA_ENV,
    UsageError,
    client_tls,
    run_entry,
    setup_logging,
)

from .runner import NodeConfig, run_node, server_command

log = logging.getLogger("tfcoord.node")

#: tfmesos2's task-side settings, honoured by a node where they have a meaning (docs/src/mesos.md):
#: the timeout of each request to the coordinator, and TLS without a CA when set to false.
TFMESOS2_REQUEST_TIMEOUT_ENV = "TFMESOS2_REQUEST_TIMEOUT"
TFMESOS2_VERIFY_SSL_ENV = "TFMESOS2_VERIFY_SSL"
#: The TensorFlow port a Mesos task was granted (tfmesos2's name).
PORT_ENV = "TENSORFLOW_PORT"


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported as one line (argparse prints the usage too)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see `{self.prog} --help`")


def add_arguments(sp: argparse.ArgumentParser) -> None:
    """The node's flags, on its own parser or on ``tfcoord node``'s."""
    sp.add_argument("--address")
    sp.add_argument("--job", required=True)
    sp.add_argument("--executor-id", type=int, required=True)
    sp.add_argument("--attempt", type=int, default=0)
    sp.add_argument("--task-id", default="")
    sp.add_argument("--host", help="address other nodes dial (default: our address toward the coordinator)")
    sp.add_argument("--port", type=int, help=f"TensorFlow port (default: ${PORT_ENV} or a free one)")
    sp.add_argument(
        "--gpus", help="GPU ids granted to this node (by a Mesos offer), for CUDA_VISIBLE_DEVICES"
    )
    sp.add_argument(
        "--server-mode",
        action="store_true",
        help="serve the node's role with tf.distribute.Server until stopped, instead of a command",
    )
    sp.add_argument("command", nargs=argparse.REMAINDER)


def _request_timeout(env: Mapping[str, str]) -> float:
    """TFMESOS2_REQUEST_TIMEOUT in seconds (tfmesos2's default, 30, when unset)."""
    raw = env.get(TFMESOS2_REQUEST_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_REQUEST_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 and value < float("inf")):
        raise UsageError(f"{TFMESOS2_REQUEST_TIMEOUT_ENV} must be a number of seconds > 0, not {raw!r}")
    return value


def _verify_ssl(env: Mapping[str, str]) -> bool | None:
    """TFMESOS2_VERIFY_SSL as tfmesos2 reads it (only ``true`` verifies); None when unset."""
    raw = env.get(TFMESOS2_VERIFY_SSL_ENV)
    if raw is None or not raw.strip():
        return None
    return raw.strip().lower() == "true"


def node_config(args: argparse.Namespace, env: Mapping[str, str]) -> NodeConfig:
    """The node's configuration from its flags and environment.

    Raises:
        UsageError: what to change, in one line.
    """
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.server_mode:
        if command:
            raise UsageError("--server-mode serves the node's role itself; give no command with it")
        command = list(server_command())
    elif not command:
        raise UsageError("nothing to run: give the command after --, e.g. -- python train.py")
    try:
        token = bytes.fromhex(env.get(TOKEN_ENV, ""))
    except ValueError:
        token = b""
    if len(token) != 32:
        raise UsageError(f"{TOKEN_ENV} must hold the job token as 64 hex digits")
    raw_port = env.get(PORT_ENV, "0") or "0"
    if args.port is None and not raw_port.isdigit():
        raise UsageError(f"{PORT_ENV} must be a port number, not {raw_port!r}")
    port = args.port if args.port is not None else int(raw_port)
    ssl_context = client_tls(env)
    if ssl_context is None and _verify_ssl(env) is False:
        log.warning(
            "%s=false and no coordinator CA: the node speaks TLS to its coordinator without "
            "checking its certificate (set %s to check it)",
            TFMESOS2_VERIFY_SSL_ENV,
            TLS_CA_ENV,
        )
        ssl_context = tls.unverified_client_context()
    address = args.address or env.get(ADDRESS_ENV, "")
    if not address:
        raise UsageError(f"no coordinator address: pass --address or set {ADDRESS_ENV}")
    return NodeConfig(
        address=address,
        token=token,
        job=args.job,
        executor_id=args.executor_id,
        attempt=args.attempt,
        task_id=args.task_id,
        host=args.host,
        port=port,
        command=tuple(command),
        server_mode=args.server_mode,
        gpus=tuple(g.strip() for g in (args.gpus or "").split(",") if g.strip()),
        ssl_context=ssl_context,
        request_timeout_s=_request_timeout(env),
    )


def cmd_node(args: argparse.Namespace) -> int:
    """Run one node to its end; its exit code is the node's outcome."""
    return run_node(node_config(args, os.environ))


def build_parser(prog: str = "tfcoord-node") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Run one tfcoord node (engines start it; token in TFCOORD_TOKEN).")
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        default=os.environ.get("TFCOORD_LOG_LEVEL", "INFO").upper(),
        help=f"{', '.join(LOG_LEVELS)} (any case; default $TFCOORD_LOG_LEVEL or INFO)",
    )
    p.add_argument(
        "--log-format", choices=("text", "json"), default=os.environ.get("TFCOORD_LOG_FORMAT", "text")
    )
    p.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "tfcoord-node") -> int:
    """``tfcoord-node [--log-level L] --job J --executor-id I ... -- COMMAND``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def go() -> int:
        args = build_parser(prog).parse_args(argv)
        setup_logging(args.log_format, args.log_level)
        return cmd_node(args)

    return run_entry(go, debug="--debug" in argv)
