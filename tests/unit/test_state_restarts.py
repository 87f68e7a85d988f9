"""Restart generations: a failure the job's policy may retry restarts its whole cluster.

Events in, effects out (see ``statekit``): a lost node, or a process ended by a signal,
moves a job with restarts left to a new generation — every node leaves its slot, live ones
are told by push to stop their work and rejoin, the slots are reserved again, and the new
generation forms as the first did. Messages of an older generation are refused and cannot
change the new one; a permanent failure, or one past the last restart, fails the job with
every restart listed. All of it replays from the journal.
"""

from __future__ import annotations

from typing import Any

from tfcoord.client import messages as m
from tfcoord.client.vocab import ErrorCode, FailureReason, JobState, NodeState, RestartOn
from tfcoord.coordinator import state as s

from .statekit import T0, Machine, journaled, node_conn, refusal, result, submit, tick, waiter

RESTARTING = m.JobSpec(roles=(("worker", 2),), max_restarts=2, restart_backoff_s=0.5)


def register(eid: int, *, attempt: int = 0, generation: int = -1, now: float = T0) -> s.RegisterNode:
    conn = node_conn(eid, attempt)
    w = waiter(conn)
    req = m.Register(
        id=w[1],
        job="j",
        executor_id=eid,
        attempt=attempt,
        host=f"host{eid}",
        port=2000 + eid + 10 * max(generation, 0),
        generation=generation,
    )
    return s.RegisterNode(now=now, req=req, conn=conn, waiter=w)


def node_req(cls: type[Any], eid: int, *, attempt: int = 0, generation: int = 0, **kw: Any) -> Any:
    conn = node_conn(eid, attempt)
    w = waiter(conn)
    return conn, w, cls(id=w[1], job="j", executor_id=eid, attempt=attempt, generation=generation, **kw)


def report(
    eid: int,
    state: NodeState,
    *,
    generation: int = 0,
    attempt: int = 0,
    exit_code: int = 0,
    error: str = "",
    now: float = T0,
) -> s.ReportNode:
    conn, w, req = node_req(
        m.Report, eid, attempt=attempt, generation=generation, state=state, exit_code=exit_code, error=error
    )
    return s.ReportNode(now=now, req=req, conn=conn, waiter=w)


def heartbeat(eid: int, *, generation: int = 0, now: float = T0) -> s.HeartbeatNode:
    conn, w, req = node_req(m.Heartbeat, eid, generation=generation)
    return s.HeartbeatNode(now=now, req=req, conn=conn, waiter=w)


def await_stop(eid: int, *, generation: int = 0, now: float = T0) -> s.AwaitStopEvent:
    conn, w, req = node_req(m.AwaitStop, eid, generation=generation, timeout_s=3600.0)
    return s.AwaitStopEvent(now=now, req=req, conn=conn, waiter=w)


def await_cluster(eid: int, *, attempt: int = 0, generation: int = 0, now: float = T0) -> s.AwaitClusterEvent:
    conn, w, req = node_req(m.AwaitCluster, eid, attempt=attempt, generation=generation, timeout_s=600.0)
    return s.AwaitClusterEvent(now=now, req=req, conn=conn, waiter=w)


def running(sm: Machine, spec: m.JobSpec = RESTARTING) -> None:
    sm.run(submit("j", spec), register(0), register(1))
    sm.run(report(0, NodeState.RUNNING), report(1, NodeState.RUNNING))
    assert sm.job().state == JobState.RUNNING


def kill(
    sm: Machine, eid: int, *, exit_code: int = -9, generation: int = 0, now: float = T0 + 10
) -> list[s.Effect]:
    return sm.run(
        report(eid, NodeState.FAILED, exit_code=exit_code, generation=generation, error="Killed", now=now)
    )


def test_a_process_killed_by_a_signal_restarts_the_cluster_and_tells_the_survivor_to_rejoin() -> None:
    sm = Machine()
    running(sm)
    waiting = await_stop(0)
    assert sm(waiting) == []  # the survivor waits to be told to stop
    out = kill(sm, 1)
    job = sm.job()
    assert (job.state, job.generation, job.filled, job.spec_blob) == (JobState.RESERVING, 1, 0, None)
    assert job.restarts == [
        {
            "generation": 1,
            "at": T0 + 10,
            "node": "worker:1 (executor 1, host host1)",
            "executor_id": 1,
            "cause": "was killed by SIGKILL",
            "exit_code": -9,
            "lost": False,
        }
    ]
    told = result(waiting, out)
    assert told["stop"] is True and told["restart"] == 1 and told["backoff_s"] == 0.5
    assert "restarts as generation 1: worker:1" in told["reason"]
    assert (
        "restart 1/2: worker:1 (executor 1, host host1) was killed by SIGKILL; the cluster restarts as generation 1"
        in [e.text for e in out if isinstance(e, s.Log)]
    )
    # Both nodes of generation 0 are history now; the job is no one's failure.
    assert [n.state for sl in job.slots for n in sl.history] == [NodeState.STOPPED, NodeState.FAILED]
    assert (job.error, job.reason) == ("", FailureReason.NONE)


def test_old_generation_messages_are_refused_and_change_nothing() -> None:
    sm = Machine()
    running(sm)
    kill(sm, 1)
    version = sm.job().version
    # A heartbeat of the old generation hears it must rejoin; it keeps no slot alive.
    hb = heartbeat(0)
    told = result(hb, sm(hb))
    assert (told["stop"], told["restart"]) == (True, 1)
    # Its reports, and an await_cluster, are refused as of a stale generation.
    for ev in (report(0, NodeState.SUCCEEDED), await_cluster(0)):
        assert refusal(ev, sm(ev)).code == ErrorCode.STALE_GENERATION
    # Registering again for the old generation is refused too; -1 (current) or 1 are taken.
    old = register(0, generation=0)
    assert refusal(old, sm(old)).code == ErrorCode.STALE_GENERATION
    future = register(0, generation=5)
    assert refusal(future, sm(future)).code == ErrorCode.STALE_GENERATION
    job = sm.job()
    assert (job.generation, job.filled, job.state, job.version) == (1, 0, JobState.RESERVING, version)


def test_the_new_generation_forms_runs_and_succeeds() -> None:
    sm = Machine()
    running(sm)
    kill(sm, 1)
    # The survivor rejoins generation 1 as the same attempt; the replacement (a relaunched
    # process, a retried task) joins whatever generation is current, as a newer attempt.
    rejoin = register(0, generation=1, now=T0 + 12)
    out = sm.run(rejoin)
    assert result(rejoin, out)["generation"] == 1 and result(rejoin, out)["restarts"] == 1
    fresh = register(1, attempt=1, generation=-1, now=T0 + 13)
    assert result(fresh, sm.run(fresh))["generation"] == 1
    job = sm.job()
    assert job.state == JobState.READY and job.generation == 1
    assert s.CoordinatorState.cluster_spec(job) == {"worker": ["host0:2010", "host1:2001"]}
    ask = await_cluster(1, attempt=1, generation=1)
    assert isinstance(sm(ask)[0].msg, m.ClusterReply)  # type: ignore[attr-defined]
    sm.run(
        report(0, NodeState.RUNNING, generation=1),
        report(1, NodeState.RUNNING, attempt=1, generation=1),
        report(0, NodeState.SUCCEEDED, generation=1),
        report(1, NodeState.SUCCEEDED, attempt=1, generation=1),
    )
    assert sm.job().state == JobState.SUCCEEDED
    st = sm.state.status("j")
    assert (st["generation"], st["max_restarts"], len(st["restarts"])) == (1, 2, 1)
    assert [n["generation"] for n in st["nodes"]] == [1, 1]


def test_a_python_exception_is_permanent_and_fails_the_job_at_once() -> None:
    sm = Machine()
    running(sm)
    kill(sm, 1, exit_code=1)
    job = sm.job()
    assert (job.state, job.generation, job.reason) == (JobState.FAILED, 0, FailureReason.NODE_FAILED)
    assert "Killed" in job.error and "restart" not in job.error


def test_any_failure_restarts_under_that_policy() -> None:
    sm = Machine()
    running(sm, m.JobSpec(roles=(("worker", 2),), max_restarts=1, restart_on=RestartOn.ANY_FAILURE))
    kill(sm, 0, exit_code=1)
    assert (sm.job().state, sm.job().generation) == (JobState.RESERVING, 1)


def test_a_lost_node_restarts_and_exhausted_restarts_fail_with_every_cause_listed() -> None:
    sm = Machine()
    spec = m.JobSpec(roles=(("worker", 2),), max_restarts=1, heartbeat_timeout_s=5.0, reconnect_grace_s=1.0)
    running(sm, spec)
    sm(s.Disconnected(now=T0 + 1, conn=node_conn(1)))
    sm(tick(T0 + 2.5))
    job = sm.job()
    assert (job.state, job.generation) == (JobState.RESERVING, 1)
    assert job.restarts[0]["lost"] is True and job.restarts[0]["cause"].startswith(
        "was lost (connection lost"
    )
    sm.run(register(0, generation=1, now=T0 + 3), register(1, attempt=1, now=T0 + 3))
    sm.run(report(0, NodeState.RUNNING, generation=1, now=T0 + 3))
    kill(sm, 0, generation=1, now=T0 + 4)  # restarts are used up: this one fails the job
    job = sm.job()
    assert (job.state, job.reason, job.generation) == (JobState.FAILED, FailureReason.NODE_FAILED, 1)
    assert "after 1 restarts, no restarts left" in job.error
    assert "restart 1/1 (generation 1): worker:1 (executor 1, host host1) was lost" in job.error


def test_a_task_retried_after_the_cluster_formed_restarts_it_and_takes_the_slot() -> None:
    sm = Machine()
    running(sm)
    retry = register(1, attempt=1)  # Spark retried the task of executor 1
    out = sm.run(retry)
    job = sm.job()
    assert (job.generation, job.state, job.filled) == (1, JobState.RESERVING, 1)
    assert result(retry, out)["generation"] == 1
    assert job.restarts[0]["cause"] == "was replaced by attempt 1 on host host1 (its task was retried)"
    assert len(journaled(out)) == 1  # the registration that restarted the job, once


def test_without_restarts_a_retried_task_still_fails_the_formed_cluster() -> None:
    sm = Machine()
    running(sm, m.JobSpec(roles=(("worker", 2),)))
    sm.run(register(1, attempt=1))
    assert (sm.job().state, sm.job().reason) == (JobState.FAILED, FailureReason.MEMBERSHIP_CHANGED)


def test_the_deadline_fails_the_job_whatever_its_generation() -> None:
    sm = Machine()
    running(sm, m.JobSpec(roles=(("worker", 2),), max_restarts=3, deadline_s=100.0))
    kill(sm, 1, now=T0 + 50)
    out = sm(tick(T0 + 100))
    job = sm.job()
    assert (job.state, job.reason) == (JobState.FAILED, FailureReason.DEADLINE_EXCEEDED)
    assert "deadline of 100 s (deadline_s) in generation 1" in job.error
    assert "restart 1/3" in job.error
    assert any(isinstance(e, s.Journal) and isinstance(e.event, s.DeadlineExpired) for e in out)


def test_a_new_reservation_counts_from_the_restart_not_from_submission() -> None:
    sm = Machine()
    spec = m.JobSpec(roles=(("worker", 2),), max_restarts=1, reservation_timeout_s=100.0)
    running(sm, spec)
    kill(sm, 1, now=T0 + 90)
    sm(tick(T0 + 150))  # the first reservation's deadline has passed: not this one's
    assert sm.job().state == JobState.RESERVING
    sm(tick(T0 + 190))
    job = sm.job()
    assert (job.state, job.reason) == (JobState.FAILED, FailureReason.RESERVATION_TIMEOUT)


def test_a_replayed_journal_restarts_the_same_way() -> None:
    sm = Machine()
    running(sm)
    kill(sm, 1)
    sm.run(register(0, generation=1, now=T0 + 12))
    replayed = s.CoordinatorState()
    for ev in sm.journal:
        replayed.handle(ev)
    replayed.handle(s.Recovered(now=T0 + 20))
    replayed.validate()
    a, b = sm.job(), replayed.jobs["j"]
    assert (b.state, b.generation, b.restarts, b.filled) == (a.state, a.generation, a.restarts, a.filled)
    assert b.node(0) is not None and b.node(0).generation == 1  # type: ignore[union-attr]


def _task_ended(eid: int, task_id: str, now: float) -> s.EngineTaskUpdate:
    return s.EngineTaskUpdate(
        now=now,
        job="j",
        executor_id=eid,
        task_id=task_id,
        state="TASK_LOST",
        message="agent gone",
        ended=True,
    )


def test_an_engine_task_ended_under_its_node_restarts_as_lost_and_its_late_word_is_ignored() -> None:
    """A Mesos task that ends under a live node (TASK_LOST, its agent gone) counts as a lost node
    for the restart policy; the end of a task of the older generation, heard once the slot is
    being filled again, changes nothing."""
    sm = Machine()
    spec = m.JobSpec(roles=(("worker", 2),), max_restarts=1, engine="mesos")
    sm.run(submit("j", spec))
    for eid in range(2):
        conn = node_conn(eid)
        w = waiter(conn)
        req = m.Register(
            id=w[1],
            job="j",
            executor_id=eid,
            attempt=0,
            host=f"h{eid}",
            port=2000 + eid,
            task_id=f"t.{eid}.0",
        )
        sm.run(s.RegisterNode(now=T0, req=req, conn=conn, waiter=w))
    sm.run(report(0, NodeState.RUNNING), report(1, NodeState.RUNNING))
    sm(_task_ended(1, "t.1.0", T0 + 5))
    job = sm.job()
    assert (job.state, job.generation) == (JobState.RESERVING, 1)
    assert job.restarts[0]["lost"] is True and "TASK_LOST" in job.restarts[0]["cause"]
    version = job.version
    assert sm(_task_ended(1, "t.1.0", T0 + 6)) == []  # the same end, heard again: nothing
    assert (sm.job().state, sm.job().version) == (JobState.RESERVING, version)
