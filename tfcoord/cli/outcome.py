"""How a submitted job reaches the user: progress lines on stderr, the final status, the exit code."""

from __future__ import annotations

import argparse
import json
import sys

from tfcoord.client.entry import ExitCode
from tfcoord.client.jobreplies import JobStatus
from tfcoord.client.terminal import TRACEBACK, printable
from tfcoord.client.vocab import JobState


def emit(line: str) -> None:
    """A progress or outcome line of ``submit`` on stderr; node text in it (a failed node's
    traceback) cannot drive the terminal."""
    print(f"tfcoord: {printable(line, keep=TRACEBACK)}", file=sys.stderr, flush=True)


def print_final(args: argparse.Namespace, status: JobStatus | None) -> None:
    if args.json and status is not None:
        print(json.dumps(dict(status.wire), indent=2, sort_keys=True), flush=True)


def job_exit(status: JobStatus) -> int:
    """How a job's end reads to a shell: 0 SUCCEEDED, 4 STOPPED, 1 FAILED."""
    if status.state == JobState.SUCCEEDED:
        return ExitCode.OK
    return ExitCode.STOPPED if status.state == JobState.STOPPED else ExitCode.FAILED
