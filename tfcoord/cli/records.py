"""Run records of embedded coordinators whose driver ended (:mod:`tfcoord.client.runrecords`):
``status`` and ``logs`` answer from them when no coordinator is left to ask."""

from __future__ import annotations

import argparse
import os
import sys

from tfcoord.cli.output import fmt_time
from tfcoord.client import connfile, runrecords
from tfcoord.client.entry import ADDRESS_ENV, UsageError
from tfcoord.client.jobreplies import JobStatus


def ended_runs() -> list[runrecords.RunRecord]:
    try:
        return runrecords.ended(connfile.runtime_dir(os.environ))
    except runrecords.RunRecordError as e:
        raise UsageError(str(e)) from None


def ended_run(args: argparse.Namespace) -> runrecords.RunRecord | None:
    """The run record of ``args.job`` when no address was given and the embedded coordinator
    that ran it ended with its driver (see :mod:`tfcoord.client.runrecords`); else None."""
    if args.address or os.environ.get(ADDRESS_ENV) or not getattr(args, "job", None):
        return None
    try:
        record = runrecords.read(connfile.runtime_dir(os.environ), args.job)
    except runrecords.RunRecordError as e:
        raise UsageError(str(e)) from None
    return None if record is None or record.driver_alive else record


def say_ended(record: runrecords.RunRecord, st: JobStatus) -> None:
    """Where an ended run's answer came from, on stderr (stdout stays the job's)."""
    ended = "" if st.terminal else f"; the driver ended while the job was {st.state}, so it never finished"
    print(
        f"tfcoord: the driver of job {record.job} (pid {record.pid}) has ended: this is its run record, "
        f"written {fmt_time(record.written_at)} ({record.path}){ended}",
        file=sys.stderr,
    )
