"""``tfcoord env-check``: this machine's readiness for Spark, Mesos and TensorFlow work."""

from __future__ import annotations

import argparse
import json
import os

from tfcoord.cli.connection import client_tls_from_env
from tfcoord.cli.errors import EXIT_FAILED
from tfcoord.client.entry import ADDRESS_ENV, SECRET_FILE_ENV, UsageError


def cmd_env_check(args: argparse.Namespace) -> int:
    from tfcoord.envcheck import run_checks

    # The same TLS client settings as status and stop; a broken one is a FAIL line of the
    # report rather than an exit before any check ran.
    try:
        ssl_context, tls_problem = client_tls_from_env(), None
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
