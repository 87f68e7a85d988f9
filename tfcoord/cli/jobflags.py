"""``submit``'s flags as a job: the command after ``--``, the restart policy, each role's resources."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from tfcoord.client.entry import UsageError
from tfcoord.client.vocab import RestartOn


def job_command(args: argparse.Namespace) -> list[str]:
    """What follows ``--`` on the command line; it must not be empty."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("nothing to run: give the command after --, e.g. -- python train.py")
    return command


def is_python(prog: str) -> bool:
    """``python``, ``python3``, ``python3.11`` or this interpreter, by path or by name."""
    return prog == sys.executable or re.fullmatch(r"python(\d+(\.\d+)?)?", Path(prog).name) is not None


def restart_policy(args: argparse.Namespace) -> dict[str, Any]:
    """JobSpec's restart fields from ``--max-restarts``, ``--restart-on``, ``--restart-backoff``
    and ``--deadline`` (the JobSpec checks their ranges: a bad value is a usage error)."""
    return {
        "max_restarts": args.max_restarts,
        "restart_on": RestartOn(args.restart_on),
        "restart_backoff_s": args.restart_backoff,
        "deadline_s": args.deadline,
    }


def parse_role_resources(args: argparse.Namespace) -> dict[str, Any]:
    """``--role-resources worker:cpus=2,gpus=1`` (repeatable) as ``{role: Resources}``."""
    from tfcoord.driver.resources import ResourcesError, parse_flags

    try:
        return parse_flags(args.role_resources)
    except ResourcesError as e:
        raise UsageError(f"--role-resources {e}") from None
