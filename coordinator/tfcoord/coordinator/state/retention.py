"""Finished jobs, and when they are forgotten.

A long-running coordinator keeps a finished job for its status, the HTTP API and the
journal, by count and by age (``KEEP_FINISHED_*``), then forgets it: its waits and its
journal records go (a :class:`Forget` effect), so memory and restart time do not grow with
every job ever run. Forgetting happens on a :class:`Tick`, never in the event that ended the
job, so that job's own waiters are answered first.
"""

from __future__ import annotations

from collections import deque

from .events import Forget
from .jobs import Job
from .ledger import Ledger
from .timers import TimerKey, TimerKind
from .waits import Waits

#: Finished jobs a long-running coordinator keeps (status, the HTTP API, the journal),
#: by count and by age; older ones are forgotten, journal records included, so memory
#: and restart time do not grow with every job ever run.
KEEP_FINISHED_JOBS = 1000
KEEP_FINISHED_S = 7 * 24 * 3600.0
#: A finished job is kept at least this long whatever the count, so its nodes and its
#: driver can still ask about it while they wind down.
FORGET_GRACE_S = 300.0

_FORGET: TimerKey = (TimerKind.FORGET,)


class Retention:
    """The finished jobs, oldest first, and the rule that forgets them."""

    def __init__(
        self,
        ledger: Ledger,
        waits: Waits,
        keep_finished: int = KEEP_FINISHED_JOBS,
        keep_finished_s: float = KEEP_FINISHED_S,
    ) -> None:
        self.ledger = ledger
        self.waits = waits
        self.keep_finished = keep_finished
        self.keep_finished_s = keep_finished_s
        #: Finished jobs in the order they ended (oldest first): the ones to forget first.
        self.finished: deque[str] = deque()
        ledger.timers.on(TimerKind.FORGET, self._due)

    def ended(self, job: Job, now: float) -> None:
        """``job`` just reached a terminal state: keep it, and arm the deadlines that forget."""
        self.finished.append(job.id)
        timers = self.ledger.timers
        # Forgetting waits for a Tick: this job's own waiters are answered first.
        timers.push(now + self.keep_finished_s, _FORGET)
        if len(self.finished) > self.keep_finished:
            oldest = self.ledger.jobs[self.finished[0]]
            assert oldest.ended_at is not None
            timers.push(max(now, oldest.ended_at + FORGET_GRACE_S), _FORGET)

    def recovered(self, now: float) -> None:
        """The coordinator restarted: forget what aged while it was down."""
        self.ledger.timers.push(now, _FORGET)

    def _due(self, when: float, key: TimerKey, now: float) -> None:
        self.forget_old(now)

    def forget_old(self, now: float) -> None:
        """Forget finished jobs past their age, or beyond the count once past the grace."""
        jobs = self.ledger.jobs
        while self.finished:
            oldest = jobs[self.finished[0]]
            assert oldest.ended_at is not None
            if oldest.ended_at + self.keep_finished_s > now:  # not too old: too many?
                if len(self.finished) <= self.keep_finished:
                    return
                if oldest.ended_at + FORGET_GRACE_S > now:
                    self.ledger.timers.push(oldest.ended_at + FORGET_GRACE_S, _FORGET)
                    return
            self.finished.popleft()
            del jobs[oldest.id]
            self._release_gpus(oldest)
            self.waits.drop_job(oldest.id)
            self.ledger.emit(Forget(oldest.id))

    def _release_gpus(self, job: Job) -> None:
        """The GPU claims of a forgotten job's nodes still live (told to stop, not yet gone):
        kept, they would refuse that GPU to a job submitted again under the same id."""
        owner = self.ledger.gpu_owner
        for node in job.nodes():
            if node.live:
                for g in node.gpus:
                    if owner.get((job.id, node.host, g)) == node.executor_id:
                        del owner[(job.id, node.host, g)]

    def validate(self) -> None:
        jobs = self.ledger.jobs
        finished = [jobs[i] for i in self.finished]
        assert len(finished) == len(set(self.finished)) == sum(1 for j in jobs.values() if j.terminal)
        assert all(j.terminal for j in finished), "a job in the finished queue is not finished"
