"""What the engines that run a job's nodes (Mesos) say about their tasks.

An engine's word about a slot's task is kept with the slot and shown while the slot is
missing, so a reservation timeout names the task and its last state. A task that ended
for good fails its node (or, if it never registered, the job) unless the job is already
stopping; an engine that cannot run the job at all fails it.
"""

from __future__ import annotations

from tfcoord.client.vocab import FailureReason, NodeState

from .events import EngineJobFailed, EngineTaskUpdate, handles
from .jobs import EngineTask, Job, Slot
from .ledger import Ledger
from .lifecycle import Lifecycle
from .waits import Waits


class Engines:
    """Takes engines' task updates and failures (see the module's docstring)."""

    def __init__(self, ledger: Ledger, waits: Waits, lifecycle: Lifecycle) -> None:
        self.ledger = ledger
        self.waits = waits
        self.lifecycle = lifecycle

    @handles(EngineTaskUpdate)
    def task_update(self, ev: EngineTaskUpdate) -> None:
        job = self.ledger.jobs.get(ev.job)
        if job is None or job.terminal or not 0 <= ev.executor_id < len(job.slots):
            return  # the job's story is over (or never began): nothing to record
        slot = job.slots[ev.executor_id]
        node = slot.node
        if node is not None and node.task_id != ev.task_id:
            return  # about a task this slot no longer runs
        if node is None and ev.ended and any(h.task_id == ev.task_id for h in slot.history):
            return  # the end of a task of an earlier generation, whose slot is being filled again
        self.ledger.journal(ev)
        slot.task = EngineTask(ev.task_id, ev.state, ev.message)
        self.ledger.note(job, ev.now, f"{slot.role}:{slot.index} {slot.task.describe(job.spec.engine)}")
        if ev.ended:
            self._task_ended(job, slot, ev)
        self.waits.wake_watchers(job)

    def _task_ended(self, job: Job, slot: Slot, ev: EngineTaskUpdate) -> None:
        node = slot.node
        what = f"{job.spec.engine} task {ev.task_id} ended {ev.state}" + (
            f": {ev.message}" if ev.message else ""
        )
        if node is None:
            if not job.stopping():
                self.lifecycle.fail_job(
                    job,
                    ev.now,
                    FailureReason.NODE_FAILED,
                    f"{slot.role}:{slot.index} (executor {ev.executor_id}) never registered: {what}",
                )
        elif node.live:
            node.error = what
            if job.stopping():  # it was told to stop; the engine ending its task is how it did
                self.ledger.set_node(job, node, NodeState.STOPPED, ev.now, what)
                self.lifecycle.maybe_stopped(job, ev.now)
            else:
                self.ledger.set_node(job, node, NodeState.FAILED, ev.now, what)
                # Its task ended under it (lost, killed, its agent gone): for the job's restart
                # policy the node was lost, whatever the task's last word.
                self.lifecycle.node_down(job, node, ev.now, f"{node.describe()} failed: {what}", lost=True)
            self.waits.wake_stops(job)

    @handles(EngineJobFailed)
    def job_failed(self, ev: EngineJobFailed) -> None:
        job = self.ledger.jobs.get(ev.job)
        if job is None or job.terminal:
            return
        self.ledger.journal(ev)
        self.lifecycle.fail_job(job, ev.now, FailureReason.ENGINE_FAILED, ev.reason)
