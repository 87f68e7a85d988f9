"""A job's life: submitted, reserving, formed, running, and how it ends.

This part moves jobs along ``JOB_TRANSITIONS`` (:meth:`Lifecycle.set_job` is the only
place that does) and holds the rules of their ends: a required node that fails or is lost
fails the job at once, a stop is graceful (nodes are told, acknowledge, and the job ends
STOPPED), and a job succeeds once every node that decides it succeeded, its serving nodes
(ps, evaluator) given a grace first if the driver asked for one. Nodes report their own
states here too, since every report may end the job.
"""

from __future__ import annotations

import signal

from tfcoord.client.jobreplies import Finished, StopResult, Submitted
from tfcoord.client.replies import Reported
from tfcoord.client.vocab import (
    TERMINAL_JOB,
    ErrorCode,
    FailureReason,
    JobEvent,
    JobState,
    NodeState,
)

from .events import (
    DeadlineExpired,
    FinishJobEvent,
    ReportNode,
    ReservationExpired,
    ServingGraceExpired,
    StopJobEvent,
    SubmitJob,
    handles,
)
from .jobs import Job, Node, Slot
from .ledger import Ledger
from .retention import Retention
from .telemetry import Telemetry, thin_series, trim_logs
from .timers import TimerKey, TimerKind
from .transitions import JOB_TRANSITIONS, next_state
from .views import missing_lines
from .waits import Waits

J, N, E = JobState, NodeState, JobEvent


class Lifecycle:
    """Jobs' states, and the rules by which they end (see the module's docstring)."""

    def __init__(self, ledger: Ledger, waits: Waits, retention: Retention, telemetry: Telemetry) -> None:
        self.ledger = ledger
        self.waits = waits
        self.retention = retention
        self.telemetry = telemetry
        ledger.timers.on(TimerKind.RESERVE, self._reservation_due)
        ledger.timers.on(TimerKind.SERVING, self._serving_due)
        ledger.timers.on(TimerKind.DEADLINE, self._deadline_due)

    def set_job(self, job: Job, event: JobEvent, now: float) -> None:
        """Move ``job`` along ``JOB_TRANSITIONS`` by ``event``."""
        new = next_state(JOB_TRANSITIONS, job.state, event)
        old, job.state = job.state, new
        self.ledger.note(job, now, f"job {old.value} -> {new.value}", state=new.value, reason=job.reason)
        if new in TERMINAL_JOB:
            job.ended_at = now
            self.retention.ended(job, now)

    # -- submit ---------------------------------------------------------------------------

    @handles(SubmitJob)
    def submit(self, ev: SubmitJob) -> None:
        existing = self.ledger.jobs.get(ev.job)
        if existing is not None:
            if (
                existing.spec == ev.spec and existing.owner == ev.owner
            ):  # a driver resending after a reconnect
                self.ledger.reply(ev.waiter, Submitted(job=ev.job, state=existing.state, created=False))
            else:
                self.ledger.error(
                    ev.waiter,
                    ErrorCode.JOB_EXISTS,
                    f"job {ev.job!r} already exists with a different spec; pick another job id",
                )
            return
        job = Job(
            id=ev.job,
            spec=ev.spec,
            submitted_at=ev.now,
            slots=[Slot(role, i) for role, i in ev.spec.slots()],
            owner=ev.owner,
            reserving_since=ev.now,
        )
        self.ledger.jobs[ev.job] = job
        self.ledger.journal(SubmitJob(now=ev.now, job=ev.job, spec=ev.spec, owner=ev.owner))
        self.ledger.note(
            job,
            ev.now,
            f"submitted: {', '.join(f'{c} {r}' for r, c in ev.spec.roles)}",
            state=job.state.value,
        )
        self.arm_reservation(job)
        self.arm_deadline(job)
        self.ledger.reply(ev.waiter, Submitted(job=ev.job, state=job.state, created=True))

    def arm_reservation(self, job: Job) -> None:
        """The deadline by which every slot must be filled (counted from submission, or from
        the restart that emptied them)."""
        self.ledger.timers.push(
            job.reserving_since + job.spec.reservation_timeout_s, (TimerKind.RESERVE, job.id)
        )

    def arm_deadline(self, job: Job) -> None:
        """The job's deadline for its whole run, if it has one."""
        if job.spec.deadline_s > 0:
            self.ledger.timers.push(job.submitted_at + job.spec.deadline_s, (TimerKind.DEADLINE, job.id))

    def _reservation_due(self, when: float, key: TimerKey, now: float) -> None:
        job = self.ledger.jobs.get(key[1])
        # An entry of an earlier reservation (before a restart) is not this one's deadline.
        if (
            job is not None
            and job.state.reserving
            and when >= job.reserving_since + job.spec.reservation_timeout_s
        ):
            self.reservation_expired(ReservationExpired(now=now, job=job.id))

    def _deadline_due(self, when: float, key: TimerKey, now: float) -> None:
        self.deadline_expired(DeadlineExpired(now=now, job=key[1]))

    @handles(DeadlineExpired)
    def deadline_expired(self, ev: DeadlineExpired) -> None:
        job = self.ledger.jobs.get(ev.job)
        if job is None or job.terminal:
            return
        self.ledger.journal(ev)
        story = f"; its restarts:\n{job.restart_story()}" if job.restarts else ""
        self.fail_job(
            job,
            ev.now,
            FailureReason.DEADLINE_EXCEEDED,
            f"the job ran past its deadline of {job.spec.deadline_s:g} s (deadline_s) "
            f"in generation {job.generation}{story}",
        )

    @handles(ReservationExpired)
    def reservation_expired(self, ev: ReservationExpired) -> None:
        job = self.ledger.jobs.get(ev.job)
        if job is None or not job.state.reserving:
            return
        self.ledger.journal(ev)
        lines = [f"  - {line}" for line in missing_lines(job)]
        self.fail_job(
            job,
            ev.now,
            FailureReason.RESERVATION_TIMEOUT,
            f"reservation timed out after {job.spec.reservation_timeout_s:g} s: "
            f"{job.spec.size - job.filled} of {job.spec.size} slots not filled:\n" + "\n".join(lines),
        )

    # -- ends -----------------------------------------------------------------------------

    def fail_job(self, job: Job, now: float, reason: FailureReason, error: str) -> None:
        if job.terminal:
            return
        job.error, job.reason = error, reason
        self.set_job(job, E.FAIL, now)
        self.job_ended(job, now)

    def job_ended(self, job: Job, now: float) -> None:
        """Tell everyone waiting on a job that just reached a terminal state."""
        thin_series(job)
        trim_logs(job)
        self.waits.refuse_cluster(job)
        self.waits.wake_stops(job)
        self.waits.wake_watchers(job)

    def maybe_stopped(self, job: Job, now: float) -> None:
        if job.state == J.STOPPING and job.live_nodes() == 0:
            self.set_job(job, E.ALL_STOPPED, now)
            self.job_ended(job, now)

    def maybe_succeeded(self, job: Job, now: float) -> None:
        if not job.state.formed:
            return
        deciding = job.deciding()
        if not deciding or job.decided != deciding:
            return
        if job.serving_grace_s > 0 and job.live_nodes() > 0:
            # The work is done; the ps/evaluator nodes still running get their grace (a final
            # evaluation) before they are told to stop. They end it sooner by ending.
            if job.decided_at is None:
                job.decided_at = now
                self.ledger.timers.push(now + job.serving_grace_s, (TimerKind.SERVING, job.id))
                self.ledger.note(job, now, f"its ps/evaluator nodes get {job.serving_grace_s:g} s to finish")
            return
        self.succeed(job, now)

    def succeed(self, job: Job, now: float) -> None:
        self.set_job(job, E.SUCCEED, now)
        self.job_ended(job, now)

    def node_down(self, job: Job, node: Node, now: float, error: str, *, lost: bool | None = None) -> None:
        """A node failed or was lost: the job fails unless its role is tolerated or its restart
        policy restarts the cluster. ``lost``: the node's process is gone, whatever its state
        says (an engine's task ended under it); by default, its state is LOST."""
        if job.terminal:
            return
        if job.state.reserving and node.state == N.LOST:
            # Still reserving: free the slot so a retry (Spark task retry, Mesos relaunch) can
            # take it; the reservation deadline names it if nothing comes.
            slot = job.slots[node.executor_id]
            slot.remember(node)
            slot.node = None
            job.filled -= 1
            job.first_missing = min(job.first_missing, node.executor_id)
            self.ledger.count(job, node, -1)
            self.waits.refuse_node(
                job, node, ErrorCode.NODE_LOST, f"{node.describe()} was LOST: {node.error}"
            )
            return
        if job.tolerated(node):
            self.maybe_succeeded(job, now)
            return
        if job.state == J.STOPPING and node.state == N.LOST:
            self.maybe_stopped(job, now)
            return
        lost = node.state == N.LOST if lost is None else lost
        if job.state.formed and self.restartable(job, lost=lost, exit_code=node.exit_code):
            self.restart(job, node, now, _cause(node, lost), lost=lost)
            return
        why = FailureReason.NODE_LOST if lost else FailureReason.NODE_FAILED
        if job.restarts:
            left = "no restarts left" if job.restarts_left() <= 0 else "a failure that does not restart"
            error += f"\n(after {len(job.restarts)} restarts, {left}:\n{job.restart_story()})"
        self.fail_job(job, now, why, error)

    # -- restarts -------------------------------------------------------------------------

    def restartable(self, job: Job, *, lost: bool, exit_code: int) -> bool:
        """May a node's failure restart ``job``'s cluster instead of failing it (the job's
        restart policy, and restarts left)?"""
        return (
            job.restarts_left() > 0 and not job.stopping() and job.spec.restart_on.restarts(lost, exit_code)
        )

    def restart(self, job: Job, node: Node, now: float, cause: str, *, lost: bool) -> None:
        """Start a new generation of ``job``'s cluster: every node leaves its slot (live ones
        are told to stop their work and rejoin), the slots are reserved again, and the new
        generation forms as the first did. Messages of the older generation are refused from
        here on. Deterministic from the journaled event that caused it, so a replay restarts
        the same way."""
        job.generation += 1
        job.restarts.append(
            {
                "generation": job.generation,
                "at": now,
                "node": node.describe(),
                "executor_id": node.executor_id,
                "cause": cause,
                "exit_code": node.exit_code,
                "lost": lost,
            }
        )
        self.ledger.note(
            job,
            now,
            f"restart {len(job.restarts)}/{job.spec.max_restarts}: {node.describe()} {cause}; "
            f"the cluster restarts as generation {job.generation}",
            node=node.name,
        )
        for slot in job.slots:
            old = slot.node
            if old is None:
                continue
            if old.live:
                self.ledger.set_node(job, old, N.STOPPED, now, f"restarting as generation {job.generation}")
            self.waits.refuse_node(
                job, old, ErrorCode.STALE_GENERATION, f"{old.describe()}: the job restarted its cluster"
            )
            slot.remember(old)
            self.ledger.count(job, old, -1)
            slot.node = None
        job.filled, job.first_missing, job.completing = 0, 0, None
        job.spec_blob, job.decided_at = None, None
        job.reserving_since = now
        self.set_job(job, E.RESTART, now)
        self.arm_reservation(job)
        self.waits.wake_restart(job)
        self.waits.wake_watchers(job)

    # -- a driver's stop and finish ---------------------------------------------------------

    @handles(StopJobEvent)
    def stop_job(self, ev: StopJobEvent) -> None:
        job = self.ledger.job_or_error(ev.job, ev.waiter, ev.viewer)
        if job is None:
            return
        live = [n for n in job.nodes() if n.live]
        told = tuple(n.describe() for n in live)

        def result() -> StopResult:  # the job's state once the stop is taken
            return StopResult(state=job.state, job=job.id, nodes=told, dry_run=ev.dry_run)

        if job.terminal or ev.dry_run or job.state == J.STOPPING:
            self.ledger.reply(ev.waiter, result())
            return
        self.ledger.journal(StopJobEvent(now=ev.now, job=ev.job, reason=ev.reason, cause=ev.cause))
        if job.decided_at is not None:  # its work is done; only serving nodes were still given time
            self.succeed(job, ev.now)
            self.ledger.reply(ev.waiter, result())
            return
        job.stop_reason = ev.reason or "stop requested"
        job.reason = ev.cause
        self.set_job(job, E.STOP, ev.now)
        self.waits.refuse_cluster(job)
        self.maybe_stopped(job, ev.now)
        self.waits.wake_stops(job)
        self.waits.wake_watchers(job)
        self.ledger.reply(ev.waiter, result())

    @handles(FinishJobEvent)
    def finish_job(self, ev: FinishJobEvent) -> None:
        job = self.ledger.job_or_error(ev.job, ev.waiter, ev.viewer)
        if job is None:
            return
        if not job.terminal and job.decided_at is None and job.serving_grace_s != ev.serving_grace_s:
            self.ledger.journal(FinishJobEvent(now=ev.now, job=ev.job, serving_grace_s=ev.serving_grace_s))
            job.serving_grace_s = ev.serving_grace_s
        self.ledger.reply(
            ev.waiter, Finished(job=job.id, state=job.state, serving_grace_s=job.serving_grace_s)
        )

    def _serving_due(self, when: float, key: TimerKey, now: float) -> None:
        self.serving_grace_expired(ServingGraceExpired(now=now, job=key[1]))

    @handles(ServingGraceExpired)
    def serving_grace_expired(self, ev: ServingGraceExpired) -> None:
        job = self.ledger.jobs.get(ev.job)
        if job is None or job.decided_at is None or not job.state.formed:
            return
        self.ledger.journal(ev)
        self.succeed(job, ev.now)

    # -- a node's report ------------------------------------------------------------------

    @handles(ReportNode)
    def report(self, ev: ReportNode) -> None:
        r = ev.req
        found = self.ledger.node_or_error(r.job, r.executor_id, r.attempt, ev.waiter, r.generation)
        if found is None:
            return
        job, node = found
        if not self.ledger.holder(job, node, ev.conn, r.credential, ev.waiter):
            return
        if ev.conn is not None:
            self.ledger.bind(job, node, ev.conn)
            node.last_seen = ev.now
        if not node.live:
            if node.state == r.state:  # the same report resent: same answer
                self.ledger.reply(ev.waiter, Reported(state=node.state, job_state=job.state))
            else:
                self.ledger.error(
                    ev.waiter,
                    ErrorCode.ALREADY_TERMINAL,
                    f"{node.describe()} is already {node.state.value}; it cannot become {r.state.value}",
                )
            return
        if r.state == N.RUNNING and job.spec_blob is None:
            self.ledger.error(
                ev.waiter,
                ErrorCode.NOT_READY,
                f"{node.describe()} cannot run before the cluster is complete; call await_cluster first",
            )
            return
        if r.state == N.RUNNING and node.state == N.RUNNING:
            if self.telemetry.update_meta(job, node, r.meta):
                self.ledger.journal(ReportNode(now=ev.now, req=r))
            self.ledger.reply(ev.waiter, Reported(state=node.state, job_state=job.state))
            return
        self.ledger.journal(ReportNode(now=ev.now, req=r))
        self.telemetry.update_meta(job, node, r.meta)
        node.exit_code = r.exit_code
        self._reported(job, node, r.state, r.error, ev.now)
        self.waits.wake_stops(job)
        self.waits.wake_watchers(job)
        self.ledger.reply(ev.waiter, Reported(state=node.state, job_state=job.state))

    def _reported(self, job: Job, node: Node, state: NodeState, error: str, now: float) -> None:
        """A live node reported ``state`` (a change): move it, and the job if that ends it."""
        if state == N.RUNNING:
            self.ledger.set_node(job, node, N.RUNNING, now)
            if job.state == J.READY and not job.in_state.get(N.REGISTERED) and not job.in_state.get(N.READY):
                self.set_job(job, E.RUN, now)
        elif state == N.SUCCEEDED:
            self.ledger.set_node(job, node, N.SUCCEEDED, now)
            self.maybe_succeeded(job, now)
            self.maybe_stopped(job, now)
        elif state == N.FAILED:
            node.error = error if error.strip() else "failed without an error message"
            self.ledger.set_node(job, node, N.FAILED, now, node.error.strip().splitlines()[-1][:200])
            self.node_down(job, node, now, f"{node.describe()} failed:\n{node.error}")
        elif job.stopping() or job.must_stop(node):  # stopped, as it was told to
            self.ledger.set_node(job, node, N.STOPPED, now)
            self.maybe_stopped(job, now)
        else:
            node.error = error if error.strip() else "stopped although no stop was requested"
            self.ledger.set_node(job, node, N.FAILED, now, node.error)
            self.node_down(job, node, now, f"{node.describe()} stopped unasked: {node.error}")


def _cause(node: Node, lost: bool) -> str:
    """What happened to a node, in a few words, for a restart's line."""
    if lost:
        return f"was lost ({node.error})"
    if node.exit_code < 0:
        try:
            name = signal.Signals(-node.exit_code).name
        except ValueError:
            name = f"signal {-node.exit_code}"
        return f"was killed by {name}"
    last = node.error.strip().splitlines()[-1][:200] if node.error.strip() else "no error text"
    return f"ended with exit code {node.exit_code}: {last}"
