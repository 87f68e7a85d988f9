"""liveness.py: heartbeats and connections feed one deadline per node; past it a node is lost."""

from __future__ import annotations

from tests.unit.statekit import (
    T0,
    TWO_WORKERS,
    Machine,
    heartbeat,
    journaled,
    lines,
    node_conn,
    refusal,
    register,
    result,
    submit,
    tick,
)
from tfcoord.client import messages as m
from tfcoord.client.vocab import ErrorCode, FailureReason, JobState, NodeState
from tfcoord.coordinator import state as s

TIMEOUT = TWO_WORKERS.heartbeat_timeout_s
GRACE = TWO_WORKERS.reconnect_grace_s


def test_a_heartbeat_moves_the_deadline_and_says_whether_to_stop() -> None:
    sm = Machine()
    sm.start()
    beat = heartbeat(0, now=T0 + 20)
    assert sm(beat) == [
        s.Send(
            beat.waiter[0],
            m.Reply(id=beat.waiter[1], result={"stop": False, "reason": "", "job_state": "RUNNING"}),
        )
    ]
    sm(heartbeat(1, now=T0 + 20))
    assert sm(tick(T0 + TIMEOUT)) == []  # the old deadline passed, the real one has not
    assert sm.state.next_deadline() == T0 + 20 + TIMEOUT


def test_a_silent_node_is_lost_and_fails_its_job() -> None:
    sm = Machine()
    sm.start()
    sm(heartbeat(0, now=T0 + 10))
    effects = sm(tick(T0 + TIMEOUT))
    reason = f"no heartbeat for {TIMEOUT:g} s (process hung or host unreachable?)"
    assert journaled(effects) == [
        s.NodeLost(now=T0 + TIMEOUT, job="j", executor_id=1, attempt=0, reason=reason)
    ]
    assert lines(effects) == [f"worker:1 LOST: {reason}", "job RUNNING -> FAILED"]
    assert (sm.job().state, sm.job().reason) == (JobState.FAILED, FailureReason.NODE_LOST)


def test_a_closed_connection_gets_a_short_grace_and_a_reconnect_keeps_the_node() -> None:
    sm = Machine()
    sm.start()
    sm(s.Disconnected(now=T0 + 1, conn=node_conn(0)))
    assert sm.state.next_deadline() == T0 + 1 + GRACE
    # Back, on a new connection of the same node, proving it with its credential.
    sm(heartbeat(0, credential=sm.credential(0), now=T0 + 2))
    assert sm(tick(T0 + 1 + GRACE)) == []
    sm(s.Disconnected(now=T0 + 5, conn=node_conn(1)))
    effects = sm(tick(T0 + 5 + GRACE))
    assert [e.executor_id for e in journaled(effects) if isinstance(e, s.NodeLost)] == [1]
    assert sm.node(0).state is NodeState.RUNNING and sm.node(1).state is NodeState.LOST


def test_a_node_lost_while_reserving_frees_its_slot_for_a_retry() -> None:
    sm = Machine()
    sm(submit())
    sm(register(0))
    sm(s.NodeLost(now=T0 + 1, job="j", executor_id=0, attempt=0, reason="task lost"))
    assert sm.job().slots[0].node is None and sm.job().state is JobState.RESERVING
    retry = register(0, attempt=1, now=T0 + 2)
    assert result(retry, sm(retry))["index"] == 0


def test_a_heartbeat_of_an_unknown_node_is_refused_and_an_older_attempt_told_to_stop() -> None:
    sm = Machine()
    sm(submit())
    unknown = heartbeat(0)
    assert refusal(unknown, sm(unknown)).code == ErrorCode.NOT_REGISTERED
    sm(register(0, attempt=1))
    older = heartbeat(0, attempt=0)
    assert result(older, sm(older)) == {
        "stop": True,
        "reason": "attempt 0 was superseded",
        "job_state": "RESERVING",
    }


def test_after_a_restart_every_live_node_gets_a_full_heartbeat_timeout() -> None:
    sm = Machine()
    sm.start()
    sm(s.Disconnected(now=T0 + 1, conn=node_conn(0)))
    assert sm(s.Recovered(now=T0 + 100)) == []
    assert all(n.conn is None and n.last_seen == T0 + 100 for n in sm.job().nodes())
    assert sm(tick(T0 + 100 + TIMEOUT - 1)) == []
    assert sm.state.next_deadline() == T0 + 100 + TIMEOUT
