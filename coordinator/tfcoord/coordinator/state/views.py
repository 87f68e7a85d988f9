"""What a job looks like to those who ask: its status (full and brief), the list of jobs,
its cluster spec, and what is known of each slot still missing.

Read-only functions of a job; ``status`` is what ``await_job``, ``watch_job``, ``status``
and the HTTP API answer with, so each form is built in one place.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from tfcoord.client.jobreplies import JobList, JobStatus, JobSummary, Restart
from tfcoord.client.vocab import NodeState

from .events import StatusEvent, Viewer, handles
from .jobs import Job, Slot
from .ledger import Ledger

#: A reservation timeout names every missing slot, but slots that never registered are
#: named as ranges (``worker:0-4999``), and at most this many lines are written out one
#: by one: a 100,000-slot job's message stays readable and inside one frame.
MAX_MISSING_LINES = 100
#: Missing slots a brief status names (progress lines show 8, then "and N more").
BRIEF_MISSING = 16


def cluster_spec(job: Job) -> dict[str, list[str]]:
    """Role → addresses ordered by task index, as TF_CONFIG's ``cluster`` wants."""
    spec: dict[str, list[str]] = {}
    for s in job.slots:
        assert s.node is not None
        host = f"[{s.node.host}]" if ":" in s.node.host else s.node.host  # IPv6, as TensorFlow wants it
        spec.setdefault(s.role, []).append(f"{host}:{s.node.port}")
    return spec


def _restart(r: dict[str, Any]) -> Restart:
    return Restart(
        generation=r["generation"],
        at=r["at"],
        node=r["node"],
        executor_id=r["executor_id"],
        cause=r["cause"],
        exit_code=r["exit_code"],
        lost=r["lost"],
    )


def status(job: Job) -> JobStatus:
    """One job's full status."""
    nodes = tuple(
        n.status(
            dict(job.figures.get(n.executor_id, {})),
            dict(job.usage.get(n.executor_id, {})) if n.live else {},
        )
        for n in job.nodes()
    )
    missing = tuple(describe_missing(job, s) for s in job.missing())
    return JobStatus(
        job=job.id,
        name=job.spec.name,
        engine=job.spec.engine,
        state=job.state,
        version=job.version,
        # Progress reports taken so far (a watch with ``reports`` waits for more).
        reports=job.reports,
        size=job.spec.size,
        roles=job.spec.roles,
        labels=dict(job.spec.labels),
        launch=job.spec.launch.to_wire() if job.spec.launch is not None else None,
        submitted_at=job.submitted_at,
        ended_at=job.ended_at,
        error=job.error,
        stop_reason=job.stop_reason,
        reason=job.reason,
        registered=job.filled,
        running=job.in_state.get(NodeState.RUNNING, 0),
        missing=missing,
        missing_count=len(missing),
        nodes=nodes,
        # Earlier attempts without their metadata: what they showed is of no use now,
        # and it is most of a node's size.
        history=tuple(n.status(meta=False) for s in job.slots for n in s.history),
        events=tuple(job.events),
        events_dropped=job.events_dropped,
        cluster=cluster_spec(job) if job.spec_blob is not None else None,
        generation=job.generation,
        max_restarts=job.spec.max_restarts,
        restarts=tuple(_restart(r) for r in job.restarts),
        restart_count=len(job.restarts),
    )


def brief(job: Job) -> JobStatus:
    """A job's status without its nodes, history and timeline: the same keys for the
    job itself, ``running`` and ``missing_count``, and only the first
    ``BRIEF_MISSING`` missing slots. Its size does not grow with the job."""
    # From the first slot that may be empty: slots fill mostly in order, and a scan from
    # slot 0 on every watcher's wake-up cost O(registered) per answer during a burst.
    slots = job.slots
    first = job.first_missing
    while first < len(slots) and slots[first].node is not None:
        first += 1
    job.first_missing = first
    shown = itertools.islice(
        (s for s in itertools.islice(slots, first, None) if s.node is None), BRIEF_MISSING
    )
    return JobStatus(
        job=job.id,
        name=job.spec.name,
        engine=job.spec.engine,
        state=job.state,
        version=job.version,
        size=job.spec.size,
        submitted_at=job.submitted_at,
        ended_at=job.ended_at,
        error=job.error,
        stop_reason=job.stop_reason,
        reason=job.reason,
        registered=job.filled,
        running=job.in_state.get(NodeState.RUNNING, 0),
        missing=tuple(describe_missing(job, s) for s in shown),
        missing_count=job.spec.size - job.filled,
        brief=True,
        generation=job.generation,
        max_restarts=job.spec.max_restarts,
        # The newest restart only: a brief answer's size does not grow with the job.
        restarts=(_restart(job.restarts[-1]),) if job.restarts else (),
        restart_count=len(job.restarts),
    )


def summary(jobs: Iterable[Job], viewer: Viewer = None) -> JobList:
    """One line per job ``viewer`` may see (every job for None)."""
    return JobList(
        jobs=tuple(
            JobSummary(
                job=j.id,
                name=j.spec.name,
                engine=j.spec.engine,
                state=j.state,
                size=j.spec.size,
                registered=j.filled,
                submitted_at=j.submitted_at,
                ended_at=j.ended_at,
                error=j.error,
            )
            for j in jobs
            if viewer is None or j.owner == viewer
        )
    )


def describe_missing(job: Job, slot: Slot) -> str:
    """A missing slot and the last thing seen of it, for people."""
    text = f"{slot.role}:{slot.index} (executor {job.executor_id(slot)})"
    engine = f"; {slot.task.describe(job.spec.engine)}" if slot.task is not None else ""
    if not slot.history:
        return text + ": never registered" + engine
    last = slot.history[-1]
    where = f"host {last.host}" + (f", task {last.task_id}" if last.task_id else "")
    return (
        f"{text}: attempt {last.attempt} registered from {where}, then {last.state.value}"
        + (f" ({last.error})" if last.error else "")
        + engine
    )


def missing_lines(job: Job) -> list[str]:
    """Every missing slot, for a message: slots that never registered (and of which the
    engine said nothing) as ranges per role, the others one by one, at most
    ``MAX_MISSING_LINES`` lines (then how many more, and where to see them)."""
    lines: list[str] = []
    run: list[Slot] = []  # consecutive never-registered slots of one role

    def close_run() -> None:
        if run:
            first, last = run[0], run[-1]
            e0, e1 = job.executor_id(first), job.executor_id(last)
            if first is last:
                lines.append(f"{first.role}:{first.index} (executor {e0}): never registered")
            else:
                lines.append(
                    f"{first.role}:{first.index}-{last.index} (executors {e0}-{e1}): never registered"
                )
            run.clear()

    for slot in job.missing():
        plain = not slot.history and slot.task is None
        if plain and run and run[-1].role == slot.role and run[-1].index + 1 == slot.index:
            run.append(slot)
            continue
        close_run()
        if plain:
            run.append(slot)
        else:
            lines.append(describe_missing(job, slot))
    close_run()
    if len(lines) > MAX_MISSING_LINES:
        more = len(lines) - MAX_MISSING_LINES
        lines = [
            *lines[:MAX_MISSING_LINES],
            f"... and {more} more (tfcoord status {job.id} lists every slot)",
        ]
    return lines


class Views:
    """Answers ``status``: one job's full status, or the list of jobs the caller may see."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @handles(StatusEvent)
    def status(self, ev: StatusEvent) -> None:
        if ev.job is None:
            self.ledger.reply(ev.waiter, summary(self.ledger.jobs.values(), ev.viewer))
        elif (job := self.ledger.job_or_error(ev.job, ev.waiter, ev.viewer)) is not None:
            self.ledger.reply(ev.waiter, status(job))
