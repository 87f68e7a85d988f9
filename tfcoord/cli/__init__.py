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

The package holds one module per command (:mod:`.serve`, :mod:`.status`, :mod:`.logs`,
:mod:`.stop`, :mod:`.submit` with :mod:`.spark` and :mod:`.mesos`, :mod:`.env_check`), the
argparse tree (:mod:`.parser`, :mod:`.envflags`), what the client commands share
(:mod:`.connection`, :mod:`.credentials`, :mod:`.records`, :mod:`.output`) and the mapping of
an ending to one line and an exit code (:mod:`.errors`); ``main`` is here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tfcoord.cli.credentials import ADMIN_SECRET_FILE_ENV, ADMIN_SUFFIX
from tfcoord.cli.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UserScriptError,
    run_command,
)
from tfcoord.cli.parser import build_parser
from tfcoord.client.entry import run_entry, setup_logging

__all__ = [
    "ADMIN_SECRET_FILE_ENV",
    "ADMIN_SUFFIX",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "UserScriptError",
    "build_parser",
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error is one line on stderr and a documented exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def go() -> int:
        args = build_parser().parse_args(argv)
        setup_logging("json" if args.cmd == "serve" and args.json else args.log_format, args.log_level)
        return run_command(args)

    return run_entry(go, debug="--debug" in argv)
