"""``tfcoord status``: the jobs, or one job's nodes, results and timeline, once or followed."""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfcoord.cli.connection import admin_config, connect, local_coordinator
from tfcoord.cli.errors import stopped_following
from tfcoord.cli.output import fmt_time, table
from tfcoord.cli.records import ended_run, ended_runs, say_ended
from tfcoord.client import DriverClient, runrecords
from tfcoord.client.entry import ADDRESS_ENV, UsageError
from tfcoord.client.jobreplies import JobList, JobStatus
from tfcoord.client.progress import describe
from tfcoord.client.terminal import TRACEBACK, printable
from tfcoord.client.watcher import FOREVER_S, watch_until


def cmd_status(args: argparse.Namespace) -> int:
    if args.follow and args.job is None:
        raise UsageError("--follow follows one job: give its id, tfcoord status JOB --follow")
    record = ended_run(args)
    if record is not None:
        st = JobStatus.decode(record.status)
        if args.json:
            print(json.dumps(dict(st.wire), indent=2, sort_keys=True))
        else:
            _print_status(st)
        say_ended(record, st)
        return 0
    try:
        return _status(args)
    except KeyboardInterrupt:
        if not args.follow:
            raise
        return stopped_following(args.job)


def _status(args: argparse.Namespace) -> int:
    # Without a job or an address: the jobs of this user's live embedded coordinator, and
    # those whose driver has ended, from their run records; either alone when that is all.
    ended = ended_runs() if args.job is None and not (args.address or os.environ.get(ADDRESS_ENV)) else []
    if ended and local_coordinator(args) is None:
        return _print_listing(args, None, ended)
    cfg = admin_config(args)
    with connect(cfg, args, role="admin", follow=args.follow) as c:
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
                fmt_time(j.submitted_at),
                fmt_time(j.ended_at),
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
                fmt_time(st.submitted_at),
                fmt_time(st.ended_at if st.terminal else r.written_at),
                f"ended (pid {r.pid})",
            )
        )
    table(rows)
    return 0


def _print_status(st: JobStatus) -> None:
    """One job's status for people. Everything a node wrote (errors, host names, results,
    timeline lines) goes through :func:`printable`: it cannot drive the terminal."""
    print(describe(st))
    if st.max_restarts:
        print(f"generation {st.generation}, restarts {st.restart_count}/{st.max_restarts}")
        for i, r in enumerate(st.restarts, 1):
            print(
                printable(f"  restart {i}: {r.node} {r.cause} (generation {r.generation}, {fmt_time(r.at)})")
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
                fmt_time(n.last_seen),
                err,
            )
        )
    table(node_rows)
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
            print(f"  {fmt_time(t)}  {printable(text)}")


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
            print(f"  {fmt_time(t)}  {printable(text)}")
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
