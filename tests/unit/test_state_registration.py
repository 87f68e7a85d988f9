"""registration.py: filling slots, refusing what may not take one, forming the cluster."""

from __future__ import annotations

from tests.unit.statekit import (
    T0,
    TWO_WORKERS,
    Machine,
    await_cluster,
    heartbeat,
    kinds,
    lines,
    node_conn,
    refusal,
    register,
    reply,
    result,
    submit,
)
from tfcoord.client import messages as m
from tfcoord.client.protocol import decode_spec
from tfcoord.client.vocab import ErrorCode, FailureReason, JobState, NodeState
from tfcoord.coordinator import state as s


def registered(ev: s.RegisterNode, state: str, sm: Machine, index: int | None = None) -> s.Send:
    """The answer to registration ``ev``: its slot, and the credential of the node holding it."""
    return reply(
        ev,
        job="j",
        role="worker",
        index=ev.req.executor_id if index is None else index,
        size=2,
        heartbeat_timeout_s=30.0,
        state=state,
        generation=0,
        restarts=0,
        max_restarts=0,
        credential=sm.credential(ev.req.executor_id),
    )


def test_the_first_registration_is_journaled_and_starts_the_reservation() -> None:
    sm = Machine()
    sm(submit())
    ev = register(0, task_id="t-0")
    assert sm(ev) == [
        s.Journal(s.RegisterNode(now=T0, req=ev.req)),
        s.Log("j", "job SUBMITTED -> RESERVING", state="RESERVING"),
        s.Log("j", "worker:0 REGISTERED from host0:2000 (task t-0)", node="worker:0", state="REGISTERED"),
        registered(ev, "RESERVING", sm),
    ]
    # The node's liveness deadline, then the reservation's.
    assert sm.state.next_deadline() == T0 + TWO_WORKERS.heartbeat_timeout_s
    sm(heartbeat(0, now=T0 + 29))
    sm(s.Tick(now=T0 + 30))
    assert sm.state.next_deadline() == T0 + 29 + TWO_WORKERS.heartbeat_timeout_s


def test_the_last_registration_forms_the_cluster_and_the_completion_goes_on_by_events() -> None:
    sm = Machine()
    sm(submit())
    sm(register(0))
    wait = await_cluster(0)
    assert sm(wait) == []  # pending
    last = register(1)
    assert sm(last) == [
        s.Journal(s.RegisterNode(now=T0, req=last.req)),
        s.Log("j", "worker:1 REGISTERED from host1:2001", node="worker:1", state="REGISTERED"),
        s.Log("j", "job RESERVING -> READY", state="READY"),
        s.Continue("j"),
        registered(last, "READY", sm),
    ]
    effects = sm(s.CompleteCluster(now=T0, job="j"))
    assert kinds(effects) == ["Log", "Send", "Log", "Journal"]
    assert lines(effects) == ["worker:0 READY", "worker:1 READY"]
    sent = effects[1]
    assert isinstance(sent, s.Send) and isinstance(sent.msg, m.ClusterReply)
    assert (sent.conn, sent.msg.id, sent.msg.role, sent.msg.index) == (*wait.waiter, "worker", 0)
    assert decode_spec(sent.msg.spec) == {"worker": ["host0:2000", "host1:2001"]}
    assert effects[-1] == s.Journal(s.CompleteCluster(now=T0, job="j", upto=2))
    # Once formed, a cluster wait is answered at once with the same bytes.
    late = await_cluster(1)
    [answer] = sm(late)
    assert isinstance(answer, s.Send) and isinstance(answer.msg, m.ClusterReply)
    assert answer.msg.spec == sent.msg.spec


def test_a_large_cluster_completes_a_chunk_of_nodes_per_event() -> None:
    sm = Machine(complete_per_event=2)
    spec = m.JobSpec(roles=(("worker", 5),))
    sm(submit(spec=spec))
    for eid in range(5):
        effects = sm(register(eid))
    assert s.Continue("j") in effects
    for upto in (2, 4, 5):
        effects = sm(s.CompleteCluster(now=T0, job="j"))
        assert effects[-1] == s.Journal(s.CompleteCluster(now=T0, job="j", upto=upto))
        assert (s.Continue("j") in effects) == (upto < 5)
    assert all(n.state is NodeState.READY for n in sm.job().nodes())


def test_the_same_node_again_gets_the_same_answer_and_nothing_changes() -> None:
    sm = Machine()
    sm(submit())
    first = register(0)
    sm(first)
    again = register(0, now=T0 + 5)
    assert sm(again) == [registered(again, "RESERVING", sm)]
    assert sm.node(0).last_seen == T0 + 5


def test_refusals_are_one_error_and_journal_nothing() -> None:
    sm = Machine()
    sm(submit())
    sm(register(0, gpus=["gpu-0"], host="h"))
    cases = [
        (register(0, host="elsewhere"), ErrorCode.DUPLICATE),
        (register(5), ErrorCode.BAD_SLOT),
        (register(1, gpus=["gpu-0"], host="h"), ErrorCode.GPU_CONFLICT),
        (register(0, attempt=1), ErrorCode.SLOT_HELD),  # the holder is connected and heartbeating
        (register(0, job="nope"), ErrorCode.UNKNOWN_JOB),
    ]
    for ev, code in cases:
        effects = sm(ev)
        assert kinds(effects) == ["Send"], code
        assert refusal(ev, effects).code == code
    # Another host's GPU of the same name is another GPU.
    elsewhere = register(1, gpus=["gpu-0"], host="h2")
    assert result(elsewhere, sm(elsewhere))["role"] == "worker"


def test_a_newer_attempt_takes_a_slot_whose_holder_is_gone() -> None:
    sm = Machine()
    sm(submit())
    sm(register(0))
    old_wait = await_cluster(0)
    sm(old_wait)
    # Connected but silent for its whole heartbeat timeout: no longer a holder to respect.
    newer = register(0, attempt=1, now=T0 + TWO_WORKERS.heartbeat_timeout_s)
    effects = sm(newer)
    assert refusal(old_wait, effects).code == ErrorCode.STALE_ATTEMPT
    assert lines(effects) == [
        "worker:0 STOPPED: superseded by attempt 1",
        "worker:0 REGISTERED from host0:2000",
    ]
    assert result(newer, effects)["index"] == 0
    [old] = sm.job().slots[0].history
    assert (old.attempt, old.state, old.error) == (0, NodeState.STOPPED, "superseded by attempt 1")
    # The older attempt is refused from now on.
    stale = register(0, attempt=0, now=T0 + 31)
    assert refusal(stale, sm(stale)).code == ErrorCode.STALE_ATTEMPT


def test_a_restart_after_the_cluster_formed_fails_the_job() -> None:
    sm = Machine()
    sm.form()
    sm(s.Disconnected(now=T0 + 1, conn=node_conn(1)))
    restarted = register(1, attempt=1, host="other", now=T0 + 1)
    effects = sm(restarted)
    assert s.Journal(s.RegisterNode(now=T0 + 1, req=restarted.req)) in effects
    assert refusal(restarted, effects).code == ErrorCode.JOB_FAILED
    job = sm.job()
    assert (job.state, job.reason) == (JobState.FAILED, FailureReason.MEMBERSHIP_CHANGED)
    assert "cannot change membership" in job.error


def test_a_slot_taken_too_often_is_refused() -> None:
    sm = Machine()
    sm(submit())
    for attempt in range(s.MAX_ATTEMPTS_PER_SLOT):
        ev = register(0, attempt=attempt, now=T0 + attempt)
        result(ev, sm(ev))
        sm(s.Disconnected(now=T0 + attempt, conn=node_conn(0, attempt)))
    loop = register(0, attempt=s.MAX_ATTEMPTS_PER_SLOT, now=T0 + 100)
    assert refusal(loop, sm(loop)).code == ErrorCode.TOO_MANY_ATTEMPTS


def test_a_wait_of_a_node_that_is_not_registered_is_refused() -> None:
    sm = Machine()
    sm(submit())
    ev = await_cluster(0)
    assert refusal(ev, sm(ev)).code == ErrorCode.NOT_REGISTERED
    sm(register(0))
    beat = heartbeat(0)
    assert result(beat, sm(beat)) == {"stop": False, "reason": "", "job_state": "RESERVING"}
