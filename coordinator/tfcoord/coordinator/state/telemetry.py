"""What nodes show of their work while it runs: metadata, progress figures, output lines.

None of it changes a job's life cycle. Metadata (a TensorBoard URL, what map_fun returned)
is merged into the node and journaled when it changes; progress points (``ctx.report``) and
output lines are kept per node in bounded buffers and never journaled as events (a restarted
coordinator shows the next progress points; a ``tfcoord serve`` with a state directory copies
the output buffers beside its journal, see ``coordinator/keptoutput.py``). Once a job ends
its buffers are thinned, so a thousand finished jobs stay small.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from tfcoord.client import messages as m
from tfcoord.client.jobreplies import Logs, LogSource, NodeSeries, Series
from tfcoord.client.replies import Ack
from tfcoord.client.vocab import ErrorCode

from .events import GetLogsEvent, NodeLogsEvent, ProgressNode, handles
from .jobs import Job, Node
from .ledger import Ledger
from .waits import Waits

#: What a node shows about itself (TensorBoard URL, progress figures) is a few hundred
#: characters; its merged metadata is kept under this, oldest keys dropped first.
MAX_META_CHARS = 8 * 1024
#: Progress points (``ctx.report``) kept per node while its job runs: at the node's default
#: pace of one every 2 s, the last 8 minutes; the oldest go first.
SERIES_POINTS_PER_NODE = 240
#: ... and per job, whatever its size: a 10,000-node job keeps 20 points a node, not 240.
SERIES_POINTS_PER_JOB = 200_000
#: Once a job ends its series are thinned to this many points in all (every k-th kept): a
#: finished job's charts stay readable, and a thousand finished jobs stay small.
SERIES_POINTS_FINISHED = 4_000
#: Output lines of its work kept per node (the newest; a marker says how many went) ...
LOG_LINES_PER_NODE = 2_000
#: ... and per job: a 1,000-node job keeps 100 lines a node.
LOG_LINES_PER_JOB = 100_000
#: Once a job ends each node keeps its last lines of these, shared (at least 50 a node).
LOG_LINES_FINISHED = 20_000


def same(a: Any, b: Any) -> bool:
    """Equal, counting NaN equal to NaN (a loss of NaN sent with every heartbeat is no change)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def meta_chars(meta: Mapping[str, Any]) -> int:
    return sum(len(k) + (len(v) if isinstance(v, str) else 8) for k, v in meta.items())


def series(job: Job, executor_id: int | None = None, since: float = 0.0) -> Series:
    """A job's progress points per node; ``since`` keeps only later points (a dashboard
    polling for what is new)."""
    nodes = []
    for eid, points in sorted(job.series.items()):
        if executor_id is not None and eid != executor_id:
            continue
        slot = job.slots[eid]
        nodes.append(
            NodeSeries(
                executor_id=eid,
                role=slot.role,
                index=slot.index,
                points=tuple((t, dict(f)) for t, f in points if t > since),
            )
        )
    return Series(job=job.id, state=job.state, nodes=tuple(nodes))


def logs(job: Job, executor_id: int = -1, since: int = 0, limit: int = m.MAX_LOGS_REPLY) -> Logs:
    """A job's node output from line ``since`` on, oldest first, at most ``limit`` lines."""
    picked: list[tuple[int, float, int, str, str]] = []
    nodes = []
    for eid, lines in sorted(job.logs.items()):
        if executor_id >= 0 and eid != executor_id:
            continue
        slot = job.slots[eid]
        nodes.append(
            LogSource(executor_id=eid, role=slot.role, index=slot.index, dropped=job.logs_dropped.get(eid, 0))
        )
        for seq, t, stream, text in reversed(lines):
            if seq < since:
                break
            picked.append((seq, t, eid, stream, text))
    picked.sort()
    more = len(picked) > limit
    picked = picked[:limit]
    return Logs(
        job=job.id,
        state=job.state,
        nodes=tuple(nodes),
        lines=tuple(picked),
        next=picked[-1][0] + 1 if more else max(since, job.log_seq),
    )


def trim_logs(job: Job) -> None:
    """A job ended: each node keeps its last lines of ``LOG_LINES_FINISHED``, shared."""
    if not job.logs:
        return
    keep = max(50, LOG_LINES_FINISHED // len(job.logs))
    for eid, lines in job.logs.items():
        if (lines.maxlen or 0) > keep:
            gone = max(0, len(lines) - keep)
            if gone:
                job.logs_dropped[eid] = job.logs_dropped.get(eid, 0) + gone
            job.logs[eid] = deque(list(lines)[-keep:], maxlen=keep)


def thin_series(job: Job) -> None:
    """A job ended: keep evenly spaced points, the first and last of each node among them."""
    if sum(len(p) for p in job.series.values()) <= SERIES_POINTS_FINISHED:
        return
    keep = max(2, SERIES_POINTS_FINISHED // len(job.series))
    for eid, points in job.series.items():
        n = len(points)
        if n > keep:
            picked = [points[round(i * (n - 1) / (keep - 1))] for i in range(keep)]
            job.series[eid] = deque(picked, maxlen=keep)


class Telemetry:
    """Takes what nodes show of their work, and answers ``get_logs``."""

    def __init__(self, ledger: Ledger, waits: Waits) -> None:
        self.ledger = ledger
        self.waits = waits

    def update_meta(self, job: Job, node: Node, meta: Mapping[str, Any]) -> bool:
        """Merge what a node says about itself; True (and watchers woken) if anything changed."""
        if all(same(node.meta.get(k), v) for k, v in meta.items()):
            return False
        node.meta.update(meta)
        # Each update is bounded by the wire (MAX_META_ENTRIES); their union must be too, or
        # heartbeats naming new keys would grow a node without end: the oldest keys go.
        while len(node.meta) > m.MAX_META_ENTRIES or (
            len(node.meta) > 1 and meta_chars(node.meta) > MAX_META_CHARS
        ):
            del node.meta[next(iter(node.meta))]
        job.version += 1
        self.waits.wake_watchers(job)
        return True

    def _sender(self, r: m.NodeRequest, ev: ProgressNode | NodeLogsEvent, what: str) -> Job | None:
        """The job, if the sender of ``r`` is the node now in its slot (same attempt, same
        generation): only that node may tell about its work (else ``ev`` is refused)."""
        job = self.ledger.job_or_error(r.job, ev.waiter)
        if job is None:
            return None
        executor_id, attempt = r.executor_id, r.attempt
        node = job.current(executor_id, attempt, r.generation)
        if node is not None and not self.ledger.holder(job, node, ev.conn, r.credential, ev.waiter):
            return None
        if node is None:
            self.ledger.error(
                ev.waiter,
                ErrorCode.NOT_REGISTERED,
                f"executor {executor_id} attempt {attempt} of job {job.id} is not the registered "
                f"node of its slot; only that node may {what}",
            )
            return None
        return job

    @handles(ProgressNode)
    def progress(self, ev: ProgressNode) -> None:
        r = ev.req
        job = self._sender(r, ev, "report progress")
        if job is None:
            return
        # A finished job's series are thinned and final: late figures are answered, not kept.
        if not job.terminal and r.usage:
            job.usage[r.executor_id] = dict(r.usage)
            job.reports += 1
        if not job.terminal and r.figures:
            figures = dict(r.figures)
            job.figures[r.executor_id] = figures
            job.reports += 1
            points = job.series.get(r.executor_id)
            if points is None:
                cap = max(8, min(SERIES_POINTS_PER_NODE, SERIES_POINTS_PER_JOB // job.spec.size))
                points = job.series[r.executor_id] = deque(maxlen=cap)
            points.append((ev.now, figures))
        if not job.terminal and (r.usage or r.figures):
            self.waits.wake_watchers(job)
        self.ledger.reply(ev.waiter, Ack())

    @handles(NodeLogsEvent)
    def node_logs(self, ev: NodeLogsEvent) -> None:
        r = ev.req
        job = self._sender(r, ev, "send its output")
        if job is None:
            return
        # Kept after the job ended too (its last words often come then), within the bound.
        lines = job.logs.get(r.executor_id)
        if lines is None:
            cap = max(50, min(LOG_LINES_PER_NODE, LOG_LINES_PER_JOB // job.spec.size))
            lines = job.logs[r.executor_id] = deque(maxlen=cap)
        dropped = r.dropped + max(0, len(lines) + len(r.lines) - (lines.maxlen or 0))
        if dropped:
            job.logs_dropped[r.executor_id] = job.logs_dropped.get(r.executor_id, 0) + dropped
        for text in r.lines:
            lines.append((job.log_seq, ev.now, r.stream, text))
            job.log_seq += 1
        self.ledger.reply(ev.waiter, Ack())

    @handles(GetLogsEvent)
    def get_logs(self, ev: GetLogsEvent) -> None:
        r = ev.req
        job = self.ledger.job_or_error(r.job, ev.waiter, ev.viewer)
        if job is not None:
            self.ledger.reply(ev.waiter, logs(job, r.executor_id, r.since, r.limit))

    def validate(self) -> None:
        for job in self.ledger.jobs.values():
            for n in job.nodes():
                assert len(n.meta) <= m.MAX_META_ENTRIES, (job.id, n.executor_id)
                assert len(n.meta) <= 1 or meta_chars(n.meta) <= MAX_META_CHARS, (job.id, n.executor_id)
