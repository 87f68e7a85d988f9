"""How a command's ending reads to a shell: one line on stderr and an exit code.

Usage mistakes (:class:`~tfcoord.client.entry.UsageError`), an unreachable coordinator and
internal errors are mapped by :func:`~tfcoord.client.entry.run_entry` around every entry
point; what only the command line meets (the user's script failing, Ctrl-C while a job ran
or while following one) is mapped here.
"""

from __future__ import annotations

import argparse
import sys

from tfcoord.client.entry import ExitCode, fail
from tfcoord.driver.session import Interrupted

#: Exit codes, documented in docs/src/reference/cli.md (one table for every entry point).
EXIT_FAILED = ExitCode.FAILED
EXIT_USAGE = ExitCode.USAGE
EXIT_UNREACHABLE = ExitCode.UNREACHABLE
EXIT_INTERRUPTED = ExitCode.INTERRUPTED


class UserScriptError(Exception):
    """The user's own program failed before any job ran: its traceback, then exit code 1."""

    def __init__(self, traceback_text: str, summary: str) -> None:
        super().__init__(summary)
        self.traceback_text = traceback_text


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command (``args.fn``); its script's failure and Ctrl-C become one line
    and their exit code."""
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


def stopped_following(job: str) -> int:
    """Ctrl-C in ``status --follow`` or ``logs --follow``: only the watching ends."""
    return fail(
        EXIT_INTERRUPTED,
        f"interrupted: stopped following job {job}, which goes on (tfcoord stop {job} ends it)",
    )
