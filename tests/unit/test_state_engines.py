"""engines.py: what Mesos says of a slot's task is kept, shown, and can end a node or a job."""

from __future__ import annotations

from tests.unit.statekit import T0, Machine, journaled, lines, register, stop, submit
from tfcoord.client import messages as m
from tfcoord.client.vocab import FailureReason, JobState, NodeState
from tfcoord.coordinator import state as s

MESOS = m.JobSpec(roles=(("worker", 2),), engine="mesos")


def update(
    eid: int, task_id: str, state: str, *, message: str = "", ended: bool = False
) -> s.EngineTaskUpdate:
    return s.EngineTaskUpdate(
        now=T0, job="j", executor_id=eid, task_id=task_id, state=state, message=message, ended=ended
    )


def test_an_update_is_journaled_and_shown_with_the_missing_slot() -> None:
    sm = Machine()
    sm(submit(spec=MESOS))
    ev = update(1, "", "UNPLACED", message="no offer has 4 GPUs")
    effects = sm(ev)
    assert journaled(effects) == [ev]
    assert lines(effects) == ["worker:1 mesos: no offer has 4 GPUs"]
    assert sm.state.status("j")["missing"][1] == (
        "worker:1 (executor 1): never registered; mesos: no offer has 4 GPUs"
    )


def test_a_task_that_ends_before_its_node_registered_fails_the_job() -> None:
    sm = Machine()
    sm(submit(spec=MESOS))
    sm(update(0, "t0", "TASK_FAILED", message="exit 1", ended=True))
    job = sm.job()
    assert (job.state, job.reason) == (JobState.FAILED, FailureReason.NODE_FAILED)
    assert job.error == "worker:0 (executor 0) never registered: mesos task t0 ended TASK_FAILED: exit 1"


def test_an_ended_task_fails_its_node_unless_the_job_was_stopping() -> None:
    sm = Machine()
    sm(submit(spec=MESOS))
    sm.run(register(0, task_id="t0"), register(1, task_id="t1"))
    assert sm(update(0, "t-old", "TASK_LOST", ended=True)) == []  # a task this slot no longer runs
    sm(stop())
    sm(update(0, "t0", "TASK_KILLED", ended=True))
    assert sm.node(0).state is NodeState.STOPPED and sm.job().state is JobState.STOPPING
    sm(update(1, "t1", "TASK_KILLED", ended=True))
    assert sm.job().state is JobState.STOPPED


def test_an_engine_that_cannot_run_the_job_fails_it_once() -> None:
    sm = Machine()
    sm(submit(spec=MESOS))
    ev = s.EngineJobFailed(now=T0, job="j", reason="the master refused the framework")
    assert journaled(sm(ev)) == [ev]
    assert (sm.job().reason, sm.job().error) == (
        FailureReason.ENGINE_FAILED,
        "the master refused the framework",
    )
    assert sm(ev) == []  # already over
