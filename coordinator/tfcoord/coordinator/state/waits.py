"""Requests left pending until something happens: waiting is push, never poll.

A node's ``await_cluster`` waits for the cluster spec, its ``await_stop`` to be told to
stop; a driver's ``await_job`` waits for its job to end, its ``watch_job`` for the job to
change. Each pending request is a :class:`Wait` under its waiter, indexed by job and kind,
by node, and by connection, so waking one kind never scans the others (a 10,000-node job
has 10,000 cluster waits while its nodes register), and a disconnect or a superseded node
touches only its own waits. Both of those indexes hold one or two waits per key nearly
always, so neither keeps a set per key (see :mod:`.oneorset`; a connection's waits are
a list, as the server caps them at 64 per connection). Each wait has a deadline in the timer heap; when it passes the
wait gets its kind's answer (a stop wait: "not yet"; a watch: the status as it is) or a
timeout error.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcoord.client import messages as m
from tfcoord.client.jobreplies import JobStatus
from tfcoord.client.replies import StopAnswer
from tfcoord.client.vocab import ErrorCode, NodeState, WaitKind

from .events import AwaitJobEvent, AwaitStopEvent, Waiter, handles
from .jobs import Job, Node, stop_answer
from .ledger import Ledger
from .oneorset import OneOrSet
from .timers import TimerKey, TimerKind
from .views import brief, missing_lines, status

K = WaitKind


@dataclass(slots=True)  # one per pending request: every node keeps an await_stop pending
class Wait:
    kind: WaitKind
    job: str
    deadline: float
    executor_id: int = -1
    attempt: int = -1
    version: int = 0
    brief: bool = False
    #: A watch that progress reports answer too: the job's ``reports`` it has seen; -1: none.
    reports: int = -1
    #: A node's wait: the cluster generation the node belongs to.
    generation: int = 0


class Waits:
    """Every pending wait, and the rules that answer them (see the module's docstring)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.pending: dict[Waiter, Wait] = {}
        #: job -> wait kind -> waiters.
        self.by_job: dict[str, dict[WaitKind, set[Waiter]]] = {}
        #: (job, kind, executor id) -> waiters of one node (nearly always one).
        self.by_node: OneOrSet[tuple[str, WaitKind, int], Waiter] = OneOrSet()
        #: connection -> its waiters: a list, not a set (a node's connection holds two
        #: during its rendezvous, and an empty set alone is 216 bytes), which the server's
        #: MAX_PENDING_PER_CONNECTION (64) keeps short enough to search.
        self.by_conn: dict[int, list[Waiter]] = {}
        ledger.timers.on(TimerKind.WAIT, self._deadline, self._armed)

    # -- the index ------------------------------------------------------------------------

    def add(self, waiter: Waiter, wait: Wait) -> None:
        if waiter in self.pending:
            # A request id reused while its wait is pending: the new wait replaces the old
            # one in every index (the connection's list would otherwise hold it twice).
            self.pop(waiter)
        self.pending[waiter] = wait
        self.by_job.setdefault(wait.job, {}).setdefault(wait.kind, set()).add(waiter)
        self.by_conn.setdefault(waiter[0], []).append(waiter)
        if wait.executor_id >= 0:
            self.by_node.add((wait.job, wait.kind, wait.executor_id), waiter)
        self.ledger.timers.push(wait.deadline, (TimerKind.WAIT, waiter))

    def pop(self, waiter: Waiter) -> Wait | None:
        """Remove a wait (answered, or its connection gone); None if it was not pending."""
        wait = self.pending.pop(waiter, None)
        if wait is not None:
            self.ledger.timers.dropped()
            self._unlist(waiter)
            if wait.executor_id >= 0:
                self.by_node.discard((wait.job, wait.kind, wait.executor_id), waiter)
            kinds = self.by_job[wait.job]
            kinds[wait.kind].discard(waiter)
            if not kinds[wait.kind]:
                del kinds[wait.kind]
                if not kinds:
                    del self.by_job[wait.job]
        return wait

    def _unlist(self, waiter: Waiter) -> None:
        """Take ``waiter`` off its connection's list (dropped with its last wait)."""
        conn_waits = self.by_conn.get(waiter[0])
        if conn_waits is not None:
            conn_waits.remove(waiter)
            if not conn_waits:
                del self.by_conn[waiter[0]]

    def of_job(self, job_id: str, kind: WaitKind) -> list[Waiter]:
        return list(self.by_job.get(job_id, {}).get(kind, ()))

    def of_node(self, job_id: str, kind: WaitKind, executor_id: int) -> list[Waiter]:
        return list(self.by_node.get((job_id, kind, executor_id)))

    def drop_conn(self, conn: int) -> None:
        """Forget the waits of a closed connection (nobody is left to answer)."""
        for w in self.by_conn.pop(conn, ()):
            self.pop(w)

    def drop_job(self, job_id: str) -> None:
        """Forget every wait on a job that is being forgotten (none should be left)."""
        for kind in list(self.by_job.get(job_id, {})):
            for w in self.of_job(job_id, kind):
                self.pop(w)

    def take_cluster(self, job_id: str, executor_id: int) -> list[tuple[Waiter, Wait]]:
        """Remove and return one node's cluster waits, for the cluster completion to answer.

        Their timer entries go stale: the caller counts them (``Timers.dropped``) once per
        chunk, not per wait.
        """
        mine = self.by_node.pop((job_id, K.CLUSTER, executor_id))
        if not mine:
            return []
        kinds = self.by_job[job_id]
        cluster = kinds[K.CLUSTER]
        taken = []
        for w in mine:
            taken.append((w, self.pending.pop(w)))
            cluster.discard(w)
            self._unlist(w)
        if not cluster:
            del kinds[K.CLUSTER]
            if not kinds:
                del self.by_job[job_id]
        return taken

    # -- answers --------------------------------------------------------------------------

    def refuse_cluster(self, job: Job) -> None:
        """A job that fails or stops before its cluster forms never will: say so to its waiters."""
        for w in self.of_job(job.id, K.CLUSTER):
            self.pop(w)
            self.ledger.error(
                w,
                ErrorCode.job_is(job.state),
                f"job {job.id} is {job.state.value}: {job.error or job.stop_reason}",
            )

    def refuse_node(self, job: Job, node: Node, code: ErrorCode, message: str) -> None:
        """Refuse the cluster waits of this attempt of ``node`` (superseded, or lost)."""
        for w in self.of_node(job.id, K.CLUSTER, node.executor_id):
            wait = self.pending[w]
            if wait.attempt == node.attempt:
                self.pop(w)
                self.ledger.error(w, code, message)

    def wake_stops(self, job: Job, executor_id: int | None = None) -> None:
        """Answer the stop waits whose answer is now "stop": every one of a stopping job,
        else only those of ``executor_id`` (its node was superseded or its slot freed; no
        other node's answer changed)."""
        if executor_id is not None:
            waits = self.of_node(job.id, K.STOP, executor_id)
        elif job.stopping():
            waits = self.of_job(job.id, K.STOP)
        else:
            return
        for w in waits:
            wait = self.pending[w]
            node = job.current(wait.executor_id, wait.attempt, wait.generation)
            if node is None or job.must_stop(node):
                self.pop(w)
                self.ledger.reply(
                    w, stop_answer(job, job.node(wait.executor_id), wait.attempt, wait.generation)
                )

    def wake_restart(self, job: Job) -> None:
        """The job restarted: every node of an older generation waiting for its stop is told
        to stop its work and rejoin (their slots are empty now)."""
        for w in self.of_job(job.id, K.STOP):
            wait = self.pending[w]
            if wait.generation < job.generation:
                self.pop(w)
                self.ledger.reply(w, stop_answer(job, None, wait.attempt, wait.generation))

    def wake_watchers(self, job: Job) -> None:
        """Answer the job waits of an ended job, and the watches that have not seen its
        latest version (or progress reports)."""
        wake = self.of_job(job.id, K.JOB) if job.terminal else []
        wake += [
            w
            for w in self.of_job(job.id, K.WATCH)
            if job.version > self.pending[w].version or 0 <= self.pending[w].reports < job.reports
        ]
        answers: dict[bool, JobStatus] = {}  # each form built (and encoded) once, however many wait
        for w in wake:
            wait = self.pop(w)
            assert wait is not None
            if wait.brief not in answers:
                answers[wait.brief] = brief(job) if wait.brief else status(job)
            self.ledger.reply(w, answers[wait.brief])

    # -- requests -------------------------------------------------------------------------

    @handles(AwaitStopEvent)
    def await_stop(self, ev: AwaitStopEvent) -> None:
        r = ev.req
        job = self.ledger.job_or_error(r.job, ev.waiter)
        if job is None:
            return
        node = job.node(r.executor_id)
        current = job.current(r.executor_id, r.attempt, r.generation)
        if current is not None and not self.ledger.holder(job, current, ev.conn, r.credential, ev.waiter):
            return
        answer = stop_answer(job, node, r.attempt, r.generation)
        # A node whose work succeeded waits on (a ps or evaluator serving, a worker of a job
        # that may still restart): its stop comes when the job ends or restarts.
        if answer.stop or (node is not None and not node.live and node.state != NodeState.SUCCEEDED):
            self.ledger.reply(ev.waiter, answer)
        else:
            wait = Wait(
                K.STOP, job.id, ev.now + r.timeout_s, r.executor_id, r.attempt, generation=r.generation
            )
            self.add(ev.waiter, wait)

    @handles(AwaitJobEvent)
    def await_job(self, ev: AwaitJobEvent) -> None:
        r = ev.req
        job = self.ledger.job_or_error(r.job, ev.waiter, ev.viewer)
        if job is None:
            return
        if isinstance(r, m.WatchJob):
            if job.version > r.version or job.terminal or 0 <= r.reports < job.reports:
                self.ledger.reply(ev.waiter, brief(job) if r.brief else status(job))
            else:
                deadline = ev.now + r.timeout_s
                watch = Wait(K.WATCH, job.id, deadline, version=r.version, brief=r.brief, reports=r.reports)
                self.add(ev.waiter, watch)
        elif job.terminal:
            self.ledger.reply(ev.waiter, status(job))
        else:
            self.add(ev.waiter, Wait(K.JOB, job.id, ev.now + r.timeout_s))

    # -- deadlines ------------------------------------------------------------------------

    def _armed(self, when: float, key: TimerKey) -> bool:
        wait = self.pending.get(key[1])
        return wait is not None and wait.deadline == when

    def _deadline(self, when: float, key: TimerKey, now: float) -> None:
        waiter: Waiter = key[1]
        wait = self.pending.get(waiter)
        if wait is None or wait.deadline > now:
            return
        self.pop(waiter)
        job = self.ledger.jobs.get(wait.job)
        if job is None:
            return
        if wait.kind == K.CLUSTER:
            missing = "; ".join(missing_lines(job))
            self.ledger.error(
                waiter,
                ErrorCode.TIMEOUT,
                f"cluster of job {job.id} not complete before the deadline; still missing: {missing}",
            )
        elif wait.kind == K.STOP:
            self.ledger.reply(waiter, StopAnswer(stop=False, reason="", job_state=job.state))
        elif wait.kind == K.WATCH:
            self.ledger.reply(waiter, brief(job) if wait.brief else status(job))
        else:
            self.ledger.error(
                waiter, ErrorCode.TIMEOUT, f"job {job.id} is still {job.state.value} at the deadline"
            )

    # -- invariants -----------------------------------------------------------------------

    def validate(self) -> None:
        jobs = self.ledger.jobs
        for w, wait in self.pending.items():
            assert wait.job in jobs or wait.kind == K.JOB, w
            if wait.kind == K.CLUSTER and jobs[wait.job].spec_blob is not None:
                # A formed cluster's waits are answered slot by slot: only the ones its
                # completion (see ``Continue``) has not reached yet are left.
                going = jobs[wait.job].completing
                assert going is not None and wait.executor_id >= going, (w, going)
            assert w in self.by_job.get(wait.job, {}).get(wait.kind, ()), w
            if wait.executor_id >= 0:
                assert w in self.by_node.get((wait.job, wait.kind, wait.executor_id)), w
            assert w in self.by_conn.get(w[0], ()), w
        assert self.by_node.count() == sum(1 for wait in self.pending.values() if wait.executor_id >= 0), (
            "per-node wait index out of step"
        )
        assert sum(len(ws) for ws in self.by_conn.values()) == len(self.pending), "per-connection index"
        for job_id, kinds in self.by_job.items():
            for kind, ws in kinds.items():
                assert ws and all(self.pending[w].kind == kind for w in ws), (job_id, kind)
