"""retention.py: finished jobs are kept by count and by age, then forgotten on a tick."""

from __future__ import annotations

from tests.unit.statekit import T0, Machine, heartbeat, register, report, result, submit, tick
from tfcoord.client.vocab import JobState, NodeState
from tfcoord.coordinator import state as s


def finish(sm: Machine, job: str, now: float) -> None:
    sm.start(job=job, now=now)
    sm.run(*(report(e, job, NodeState.SUCCEEDED, now=now) for e in range(2)))


def test_beyond_the_count_the_oldest_goes_once_past_its_grace() -> None:
    sm = Machine(keep_finished=1)
    finish(sm, "a", T0)
    finish(sm, "b", T0 + 1)
    assert list(sm.state.jobs) == ["a", "b"]  # never in the event that ended a job
    assert sm(tick(T0 + s.FORGET_GRACE_S - 1)) == []
    effects = sm(tick(T0 + s.FORGET_GRACE_S))
    assert s.Forget("a") in effects and list(sm.state.jobs) == ["b"]
    assert list(sm.state.retention.finished) == ["b"]


def test_past_its_age_a_job_goes_whatever_the_count() -> None:
    sm = Machine(keep_finished_s=60.0)
    finish(sm, "a", T0)
    effects = sm(tick(T0 + 60))
    assert [e for e in effects if isinstance(e, s.Forget)] == [s.Forget("a")]
    assert sm.state.jobs == {}


def test_after_a_restart_what_aged_meanwhile_is_forgotten() -> None:
    sm = Machine(keep_finished_s=60.0)
    finish(sm, "a", T0)
    restarted = Machine(keep_finished_s=60.0)
    for ev in sm.journal:
        restarted(ev)
    assert restarted.job("a").state is JobState.SUCCEEDED
    assert restarted(s.Recovered(now=T0 + 100)) == []  # forgetting waits for the tick
    assert restarted(tick(T0 + 100)) == [s.Forget("a")]


def test_a_forgotten_job_leaves_no_gpu_claim_behind() -> None:
    """A node still heartbeating when its job is forgotten held its GPU claim for ever: the
    same job id submitted again was refused that GPU by a node that no longer existed."""
    sm = Machine(keep_finished_s=60.0)
    sm(submit())
    sm.run(register(0, gpus=["gpu-0"], host="h"), register(1, host="h"))
    sm(report(1, state=NodeState.FAILED, error="boom"))
    sm(heartbeat(0, now=T0 + 40))  # its job ended; it has not stopped yet
    assert s.Forget("j") in sm(tick(T0 + 60))
    assert sm.state.ledger.gpu_owner == {}
    sm(submit(now=T0 + 61))
    again = register(0, gpus=["gpu-0"], host="h", now=T0 + 61)
    assert result(again, sm(again))["index"] == 0
