"""``tfcoord logs``: a job's node output, from the coordinator or an ended run's record."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tfcoord.cli.connection import admin_config, connect
from tfcoord.cli.errors import stopped_following
from tfcoord.cli.records import ended_run, say_ended
from tfcoord.client import runrecords
from tfcoord.client.entry import UsageError
from tfcoord.client.jobreplies import JobStatus
from tfcoord.client.messages import MAX_LOGS_REPLY
from tfcoord.client.terminal import printable
from tfcoord.client.vocab import JobState

#: ``tfcoord logs --follow`` asks again this often while the job runs.
LOGS_POLL_S = 0.5


def _node_executor(st: JobStatus, node: str) -> int:
    """The executor id of ``ROLE:I`` in a job (its slot's, whether or not a node holds it)."""
    role, _, index = node.partition(":")
    slots = [(r, i) for r, c in st.wire["roles"] for i in range(c)]
    if not index.isdigit() or (role, int(index)) not in slots:
        names = ", ".join(f"{r}:0-{c - 1}" if c > 1 else f"{r}:0" for r, c in st.wire["roles"])
        raise UsageError(f"--node {node!r} is not a node of job {st.wire['job']}; its nodes are {names}")
    return slots.index((role, int(index)))


def _print_log_line(
    args: argparse.Namespace, names: dict[int, str], t: float, e: int, stream: str, text: str
) -> None:
    if args.json:
        print(json.dumps({"time": t, "node": names.get(e, str(e)), "stream": stream, "text": text}))
    else:
        # Nodes escape their lines, and the coordinator refuses C0 controls in them;
        # escaped here all the same (C1 too: \x9b is a CSI), so no line can forge
        # another or drive the terminal, whoever sent it. Tabs are the program's own.
        where, shown = printable(str(names.get(e, e))), printable(text, keep="\t")
        print(f"{where} {'!' if stream == 'stderr' else '|'} {shown}")


def _print_dropped(
    args: argparse.Namespace, got: dict[str, Any], names: dict[int, str], warned: set[int]
) -> None:
    for n in got["nodes"]:
        if n["dropped"] and n["executor_id"] not in warned:
            warned.add(n["executor_id"])
            line = f"[{n['dropped']} earlier lines of {names[n['executor_id']]} dropped: the coordinator keeps the last ones]"
            print(
                json.dumps({"node": names[n["executor_id"]], "marker": line})
                if args.json
                else printable(line)
            )


def _logs_of_ended_run(args: argparse.Namespace, record: runrecords.RunRecord) -> int:
    """``tfcoord logs JOB`` of a run whose driver ended: the newest lines its record kept."""
    st = JobStatus.decode(record.status)
    eid = _node_executor(st, args.node) if args.node else -1
    got = record.logs
    names = {int(n["executor_id"]): f"{n['role']}:{n['index']}" for n in got["nodes"]}
    _print_dropped(args, {"nodes": [n for n in got["nodes"] if eid in (-1, n["executor_id"])]}, names, set())
    for _, t, e, stream, text in got["lines"]:
        if eid in (-1, e):
            _print_log_line(args, names, t, e, stream, text)
    say_ended(record, st)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    record = ended_run(args)
    if record is not None:
        return _logs_of_ended_run(args, record)
    try:
        return _logs(args)
    except KeyboardInterrupt:
        if not args.follow:
            raise
        return stopped_following(args.job)


def _logs(args: argparse.Namespace) -> int:
    cfg = admin_config(args)
    with connect(cfg, args, role="admin", follow=args.follow) as c:
        st = c.status(args.job)
        eid = _node_executor(st, args.node) if args.node else -1
        since, warned = 0, set[int]()
        # A coordinator without a state directory keeps no output across a restart and
        # numbers what comes after from 0 again (one with it may reuse the numbers of the
        # last second's lines, which it had not kept yet): once the connection was re-established, the lines are asked for from the
        # start, and those already printed (numbered below the old ``since`` and no newer than
        # the last one printed) are skipped, so a reconnect to the same coordinator repeats nothing.
        reconnects, last_t = c.reconnects, 0.0
        seen: tuple[int, float] | None = None  # (since, last time) when the connection was lost
        while True:
            got = c.logs(args.job, executor_id=eid, since=since)
            if c.reconnects != reconnects:
                reconnects = c.reconnects
                if since:
                    seen, since = (max(since, seen[0] if seen else 0), last_t), 0
                    continue
            names = {n["executor_id"]: f"{n['role']}:{n['index']}" for n in got["nodes"]}
            _print_dropped(args, got, names, warned)
            for seq, t, e, stream, text in got["lines"]:
                if seen is not None and seq < seen[0] and t <= seen[1]:
                    continue  # printed before the connection was lost
                last_t = max(last_t, t)
                _print_log_line(args, names, t, e, stream, text)
            sys.stdout.flush()
            more = got["next"] > since and len(got["lines"]) >= MAX_LOGS_REPLY
            since = got["next"]
            if seen is not None and since >= seen[0]:
                seen = None  # past every line numbered before the reconnect
            if more:
                continue
            if not args.follow or JobState(got["state"]).terminal:
                return 0
            time.sleep(LOGS_POLL_S)
