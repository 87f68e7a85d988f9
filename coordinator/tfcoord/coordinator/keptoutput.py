"""A ``tfcoord serve``'s node output, kept in its state directory.

Output lines are never journaled as events (a line is not a change of state, and a commit
per line would put an fsync on every ``print``): the coordinator holds them in bounded
buffers (:mod:`.state.telemetry`). With a ``--state-dir``, this keeper copies them into the
journal's database about once a second, so after the driver exits, the job ended long ago
or the coordinator restarted, ``tfcoord logs JOB`` still shows them.

What the database holds mirrors the buffers: lines the coordinator dropped (beyond a
node's or a job's bound, thinned once the job ended) are deleted from it too, and a job
forgotten by the retention rules (:mod:`.state.retention`) takes its lines with it (the
journal deletes them with its events). A coordinator killed outright loses at most the
last :data:`OUTPUT_INTERVAL_S` of output.
"""

from __future__ import annotations

from collections import deque

from .journal import OutputBatch, SqliteJournal
from .state.jobs import Job
from .state.machine import CoordinatorState
from .state.telemetry import LOG_LINES_PER_JOB, LOG_LINES_PER_NODE, trim_logs

#: How often new output is written: one small transaction (and fsync) a second at most.
OUTPUT_INTERVAL_S = 1.0


class OutputKeeper:
    """Copies the state's output buffers into ``journal``; collects on the event loop,
    writes wherever the caller runs :meth:`SqliteJournal.write_output`."""

    def __init__(self, state: CoordinatorState, journal: SqliteJournal) -> None:
        self.state = state
        self.journal = journal
        #: Per job id: the job as last collected (a job forgotten and submitted again under
        #: the same id is another object), the line numbers written below, whether it had ended.
        self._written: dict[str, tuple[Job, int, bool]] = {}

    def restore(self) -> int:
        """After the journal's replay: put the kept lines back into their jobs' buffers;
        returns how many. Lines of a job the journal no longer has are skipped."""
        kept = self.journal.read_output()
        jobs = self.state.jobs
        for job_id, eid, seq, t, stream, text in kept.lines:
            job = jobs.get(job_id)
            if job is None or not 0 <= eid < len(job.slots):
                continue
            lines = job.logs.get(eid)
            if lines is None:  # the bound telemetry.node_logs gives a running job's node
                cap = max(50, min(LOG_LINES_PER_NODE, LOG_LINES_PER_JOB // job.spec.size))
                lines = job.logs[eid] = deque(maxlen=cap)
            lines.append((seq, t, stream, text))
            job.log_seq = max(job.log_seq, seq + 1)
        for job_id, eid, _, dropped in kept.nodes:
            job = jobs.get(job_id)
            if job is not None and 0 <= eid < len(job.slots) and dropped:
                job.logs_dropped[eid] = dropped
        for job in jobs.values():
            if job.terminal:
                trim_logs(job)  # as when it ended: the database held no more than that
            self._written[job.id] = (job, job.log_seq, job.terminal)
        return len(kept.lines)

    def collect(self) -> OutputBatch | None:
        """On the loop: the lines that came since the last collect, and every changed job's
        nodes' floors (what it still holds); None when nothing changed."""
        batch = OutputBatch(lines=[], nodes=[])
        jobs = self.state.jobs
        for job_id in [j for j in self._written if j not in jobs]:
            del self._written[job_id]  # forgotten: the journal deletes its lines
        for job in jobs.values():
            seen = self._written.get(job.id)
            since = seen[1] if seen is not None and seen[0] is job else 0
            if seen is not None and seen[0] is job and (since, seen[2]) == (job.log_seq, job.terminal):
                continue
            for eid, lines in job.logs.items():
                new = []
                for seq, t, stream, text in reversed(lines):
                    if seq < since:
                        break
                    new.append((job.id, eid, seq, t, stream, text))
                batch.lines += reversed(new)
                floor = lines[0][0] if lines else job.log_seq
                batch.nodes.append((job.id, eid, floor, job.logs_dropped.get(eid, 0)))
            self._written[job.id] = (job, job.log_seq, job.terminal)
        return batch if batch.lines or batch.nodes else None

    def failed(self, batch: OutputBatch) -> None:
        """Writing ``batch`` failed: its jobs are collected whole next time (the writes are
        idempotent), so no line is lost to a transient error."""
        for job_id in {line[0] for line in batch.lines} | {node[0] for node in batch.nodes}:
            self._written.pop(job_id, None)
