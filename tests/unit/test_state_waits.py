"""waits.py: requests stay pending until their answer holds or their deadline passes."""

from __future__ import annotations

import dataclasses

from tests.unit.statekit import (
    DRIVER,
    T0,
    Machine,
    await_cluster,
    await_job,
    await_stop,
    progress,
    refusal,
    register,
    reply,
    report,
    result,
    stop,
    submit,
    tick,
    watch,
)
from tfcoord.client.vocab import ErrorCode, NodeState, WaitKind
from tfcoord.coordinator import state as s


def test_a_stop_wait_is_answered_when_the_job_stops_or_not_yet_at_its_deadline() -> None:
    sm = Machine()
    sm.start()
    early = await_stop(0, timeout_s=10.0)
    late = await_stop(1, timeout_s=100.0)
    assert sm.run(early, late) == []
    assert sm.state.waits.of_node("j", WaitKind.STOP, 0) == [early.waiter]
    assert sm(tick(T0 + 10)) == [reply(early, stop=False, reason="", job_state="RUNNING")]
    effects = sm(stop(now=T0 + 20))
    assert result(late, effects) == {"stop": True, "reason": "enough", "job_state": "STOPPING"}
    assert sm.state.waits.pending == {}


def test_a_watch_is_answered_by_the_next_change_and_a_brief_one_briefly() -> None:
    sm = Machine()
    sm.form()
    version = sm.job().version
    full, brief = watch(version), watch(version, brief=True)
    assert sm.run(full, brief) == []
    effects = sm(report(0))
    assert result(full, effects)["nodes"][0]["state"] == "RUNNING"
    assert result(brief, effects)["brief"] is True and "nodes" not in result(brief, effects)
    # An old version is answered at once; one watching progress reports wakes on one.
    stale = watch(version)
    assert result(stale, sm(stale))["version"] > version
    reports = watch(sm.job().version, reports=sm.job().reports)
    assert sm(reports) == []
    assert result(reports, sm(progress(0, figures={"step": 1})))["reports"] == 1


def test_a_job_wait_is_answered_when_the_job_ends_or_refused_at_its_deadline() -> None:
    sm = Machine()
    sm.start()
    patient, hasty = await_job(), await_job(timeout_s=5.0)
    sm.run(patient, hasty)
    assert refusal(hasty, sm(tick(T0 + 5))).code == ErrorCode.TIMEOUT
    sm(report(0, state=NodeState.SUCCEEDED))
    assert result(patient, sm(report(1, state=NodeState.SUCCEEDED)))["state"] == "SUCCEEDED"


def test_a_cluster_wait_names_what_is_missing_at_its_deadline() -> None:
    sm = Machine()
    sm(submit())
    sm(register(0))
    wait = await_cluster(0, timeout_s=5.0)
    sm(wait)
    error = refusal(wait, sm(tick(T0 + 5)))
    assert error.code == ErrorCode.TIMEOUT
    assert error.message.endswith("still missing: worker:1 (executor 1): never registered")


def test_a_closed_connection_takes_its_waits_with_it_unanswered() -> None:
    sm = Machine()
    sm(submit())
    waits = [await_job(conn=7), watch(0, conn=7), await_job(conn=DRIVER)]
    sm.run(*waits)
    assert len(sm.state.waits.pending) == 2  # the watch of version 0 was answered at once
    assert sm(s.Disconnected(now=T0, conn=7)) == []
    assert list(sm.state.waits.pending) == [waits[2].waiter]
    assert sm.state.waits.by_conn.get(7) is None


def test_a_job_that_stops_before_its_cluster_formed_refuses_its_cluster_waits() -> None:
    sm = Machine()
    sm(submit())
    sm(register(0))
    wait = await_cluster(0)
    sm(wait)
    effects = sm(stop())
    assert refusal(wait, effects).code == ErrorCode.JOB_STOPPING


def test_a_node_connection_s_waits_are_indexed_without_a_set_and_leave_with_it() -> None:
    sm = Machine()
    sm(submit())
    sm(register(0))
    stop_wait, cluster_wait = await_stop(0), await_cluster(0)
    sm.run(stop_wait, cluster_wait)
    conn = stop_wait.conn
    assert sorted(sm.state.waits.by_conn[conn]) == sorted([stop_wait.waiter, cluster_wait.waiter])
    assert sm.state.waits.of_node("j", WaitKind.STOP, 0) == [stop_wait.waiter]
    assert sm(s.Disconnected(now=T0, conn=conn)) == []
    assert conn not in sm.state.waits.by_conn and len(sm.state.waits.by_node) == 0
    assert conn not in sm.state.ledger.nodes_by_conn


def test_a_request_id_reused_while_its_wait_is_pending_replaces_that_wait() -> None:
    sm = Machine()
    sm.start()
    first = await_stop(0, timeout_s=100.0)
    again = s.AwaitStopEvent(
        now=T0, req=dataclasses.replace(first.req, timeout_s=10.0), conn=first.conn, waiter=first.waiter
    )
    sm.run(first, again)  # the Machine checks every index after each event
    assert sm.state.waits.by_conn[first.conn] == [first.waiter]
    assert sm(tick(T0 + 10)) == [reply(first, stop=False, reason="", job_state="RUNNING")]
    assert sm.state.waits.pending == {} and sm.state.waits.by_conn == {}
