"""lifecycle.py: submit, nodes' reports, a driver's stop and finish, and how a job ends."""

from __future__ import annotations

from tests.unit.statekit import (
    DRIVER,
    T0,
    TWO_WORKERS,
    Machine,
    await_job,
    await_stop,
    journaled,
    lines,
    refusal,
    register,
    reply,
    report,
    result,
    stop,
    submit,
    tick,
    waiter,
)
from tfcoord.client import messages as m
from tfcoord.client.vocab import ErrorCode, FailureReason, JobState, NodeState
from tfcoord.coordinator import state as s

PS_WORKERS = m.JobSpec(roles=(("ps", 1), ("worker", 2)))
N = NodeState


def test_submit_journals_the_job_and_a_resend_is_answered_the_same() -> None:
    sm = Machine()
    ev = submit()
    assert sm(ev) == [
        s.Journal(s.SubmitJob(now=T0, job="j", spec=TWO_WORKERS)),
        s.Log("j", "submitted: 2 worker", state="SUBMITTED"),
        reply(ev, job="j", state="SUBMITTED", created=True),
    ]
    again = submit(now=T0 + 1)
    assert sm(again) == [reply(again, job="j", state="SUBMITTED", created=False)]
    other = submit(spec=PS_WORKERS)
    assert refusal(other, sm(other)).code == ErrorCode.JOB_EXISTS
    theirs = submit(owner=b"someone else")
    assert refusal(theirs, sm(theirs)).code == ErrorCode.JOB_EXISTS


def test_a_job_runs_once_every_node_runs_and_succeeds_once_its_workers_did() -> None:
    sm = Machine()
    sm.form(PS_WORKERS)
    done = await_job()
    assert sm(done) == []
    assert lines(sm.run(report(0), report(1))) == ["ps:0 RUNNING", "worker:0 RUNNING"]
    assert lines(sm(report(2))) == ["worker:1 RUNNING", "job READY -> RUNNING"]
    ps_stop = await_stop(0)
    assert sm(ps_stop) == []
    sm(report(1, state=N.SUCCEEDED))
    effects = sm(report(2, state=N.SUCCEEDED, now=T0 + 5))
    assert lines(effects) == ["worker:1 SUCCEEDED", "job RUNNING -> SUCCEEDED"]
    assert result(ps_stop, effects) == {
        "stop": True,
        "reason": "the job succeeded; its remaining nodes stop",
        "job_state": "SUCCEEDED",
    }
    assert result(done, effects)["state"] == "SUCCEEDED"
    assert sm.job().ended_at == T0 + 5


def test_a_failed_worker_fails_the_job_at_once_and_tells_everyone() -> None:
    sm = Machine()
    sm.start()
    peer_stop, done = await_stop(1), await_job()
    sm.run(peer_stop, done)
    ev = report(0, state=N.FAILED, error="Traceback (most recent call last):\nValueError: NaN", now=T0 + 3)
    effects = sm(ev)
    assert journaled(effects) == [s.ReportNode(now=T0 + 3, req=ev.req)]
    assert lines(effects) == ["worker:0 FAILED: ValueError: NaN", "job RUNNING -> FAILED"]
    failed = [e for e in effects if isinstance(e, s.Log) and e.state == "FAILED" and not e.node]
    assert [e.reason for e in failed] == [FailureReason.NODE_FAILED]
    job = sm.job()
    assert job.error.startswith("worker:0 (executor 0, host host0) failed:\nTraceback")
    assert result(peer_stop, effects) == {"stop": True, "reason": job.error, "job_state": "FAILED"}
    assert result(done, effects)["reason"] == "node_failed"
    assert result(ev, effects) == {"state": "FAILED", "job_state": "FAILED"}


def test_a_tolerated_role_fails_alone() -> None:
    sm = Machine()
    spec = m.JobSpec(roles=(("evaluator", 1), ("worker", 1)), tolerate_failure=("evaluator",))
    sm.start(spec)
    sm(report(0, state=N.FAILED, error="oom"))
    assert sm.job().state is JobState.RUNNING
    sm(report(1, state=N.SUCCEEDED))
    assert sm.job().state is JobState.SUCCEEDED


def test_a_stop_is_graceful_the_job_ends_stopped_once_its_nodes_did() -> None:
    sm = Machine()
    sm.start()
    node_stop = await_stop(0)
    sm(node_stop)
    ev = stop(reason="streaming ended", now=T0 + 1)
    effects = sm(ev)
    assert effects[0] == s.Journal(
        s.StopJobEvent(now=T0 + 1, job="j", reason="streaming ended", cause=FailureReason.STOPPED)
    )
    assert lines(effects) == ["job RUNNING -> STOPPING"]
    assert result(node_stop, effects) == {"stop": True, "reason": "streaming ended", "job_state": "STOPPING"}
    assert result(ev, effects)["state"] == "STOPPING"
    sm(report(0, state=N.STOPPED))
    assert lines(sm(report(1, state=N.STOPPED))) == ["worker:1 STOPPED", "job STOPPING -> STOPPED"]
    assert (sm.job().state, sm.job().reason) == (JobState.STOPPED, FailureReason.STOPPED)


def test_a_node_that_stops_unasked_failed() -> None:
    sm = Machine()
    sm.start()
    sm(report(0, state=N.STOPPED))
    assert sm.node(0).state is N.FAILED and sm.job().state is JobState.FAILED
    assert "stopped unasked" in sm.job().error


def test_finish_gives_the_serving_nodes_their_grace_then_the_job_succeeds() -> None:
    sm = Machine()
    sm.start(PS_WORKERS)
    w = waiter(DRIVER)
    finish = s.FinishJobEvent(now=T0, job="j", serving_grace_s=10.0, waiter=w)
    assert result(finish, sm(finish)) == {"job": "j", "state": "RUNNING", "serving_grace_s": 10.0}
    sm(report(1, state=N.SUCCEEDED, now=T0 + 1))
    effects = sm(report(2, state=N.SUCCEEDED, now=T0 + 2))
    assert lines(effects)[-1] == "its ps/evaluator nodes get 10 s to finish"
    assert sm.job().state is JobState.RUNNING
    assert sm(tick(T0 + 11.9)) == []
    effects = sm(tick(T0 + 12))
    assert journaled(effects) == [s.ServingGraceExpired(now=T0 + 12, job="j")]
    assert sm.job().state is JobState.SUCCEEDED


def test_a_reservation_that_times_out_fails_the_job_naming_every_missing_slot() -> None:
    sm = Machine()
    sm(submit(spec=PS_WORKERS))
    sm(register(1))
    sm(s.Disconnected(now=T0, conn=101))  # and never back: lost, its slot freed for a retry
    when = T0 + PS_WORKERS.reservation_timeout_s
    effects = sm(tick(when))
    assert journaled(effects) == [
        s.NodeLost(
            now=when,
            job="j",
            executor_id=1,
            attempt=0,
            reason="connection lost and not re-established within 3 s (process or host died?)",
        ),
        s.ReservationExpired(now=when, job="j"),
    ]
    job = sm.job()
    assert job.reason is FailureReason.RESERVATION_TIMEOUT
    assert job.error.splitlines() == [
        "reservation timed out after 600 s: 3 of 3 slots not filled:",
        "  - ps:0 (executor 0): never registered",
        "  - worker:0 (executor 1): attempt 0 registered from host host1, then LOST "
        "(connection lost and not re-established within 3 s (process or host died?))",
        "  - worker:1 (executor 2): never registered",
    ]


def test_reports_that_make_no_sense_are_refused() -> None:
    sm = Machine()
    sm(submit())
    sm(register(0))
    early = report(0)
    assert refusal(early, sm(early)).code == ErrorCode.NOT_READY
    sm(register(1))
    sm(report(0, state=N.SUCCEEDED))
    resent = report(0, state=N.SUCCEEDED)
    assert result(resent, sm(resent)) == {"state": "SUCCEEDED", "job_state": "READY"}
    changed = report(0, state=N.FAILED)
    assert refusal(changed, sm(changed)).code == ErrorCode.ALREADY_TERMINAL
