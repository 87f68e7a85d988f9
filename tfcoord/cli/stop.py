"""``tfcoord stop``: stop a job gracefully, or say what would be stopped."""

from __future__ import annotations

import argparse
import json

from tfcoord.cli.connection import admin_config, connect
from tfcoord.client.terminal import printable


def cmd_stop(args: argparse.Namespace) -> int:
    cfg = admin_config(args)
    with connect(cfg, args, role="admin") as c:
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
