"""A node acts only as itself (issue 26, N1): events in, effects out.

Every member of a job holds the same job token, so the token cannot tell them apart. The
registration binds a slot to the connection it came on and answers with a credential for that
slot, attempt and generation; a message for the slot from another connection must carry it.
Another member's heartbeat, report, progress, logs, waits or copied registration are refused
(``not_slot_holder``), counted, and change nothing; the node itself, reconnected, goes on.
"""

from __future__ import annotations

from tfcoord.client import messages as m
from tfcoord.client.vocab import ErrorCode, JobState, NodeState
from tfcoord.coordinator import state as s

from .statekit import T0, Machine, node_conn, refusal, result

INTRUDER = 666


def _as(conn: int, req: m.Message, event: type) -> s.Event:
    return event(now=T0 + 1, req=req, conn=conn, waiter=(conn, req.id))  # type: ignore[call-arg,attr-defined]


def _req(cls: type, eid: int = 1, credential: str = "", **kw: object) -> m.Message:
    return cls(id=next(_ids), job="j", executor_id=eid, attempt=0, credential=credential, **kw)  # type: ignore[no-any-return]


_ids = iter(range(10_000, 20_000))


def _credential(state: s.CoordinatorState, eid: int, job: str = "j") -> str:
    """The credential node ``eid`` of ``job`` holds now (derived, as the coordinator does)."""
    node = state.jobs[job].node(eid)
    assert node is not None
    return state.ledger.credential_of(state.jobs[job], node)


def running() -> Machine:
    sm = Machine()
    sm.start()
    return sm


def test_another_member_cannot_report_heartbeat_or_send_for_a_node() -> None:
    sm = running()
    version = sm.job().version
    attacks = [
        _as(INTRUDER, _req(m.Report, state=NodeState.SUCCEEDED), s.ReportNode),
        _as(INTRUDER, _req(m.Report, state=NodeState.FAILED, error="forged"), s.ReportNode),
        _as(INTRUDER, _req(m.Heartbeat, meta={"tensorboard_url": "http://evil/"}), s.HeartbeatNode),
        _as(INTRUDER, _req(m.Progress, figures={"loss": 0.0}), s.ProgressNode),
        _as(INTRUDER, _req(m.NodeLogs, stream="stdout", lines=("forged",)), s.NodeLogsEvent),
        _as(INTRUDER, _req(m.AwaitCluster, timeout_s=60.0), s.AwaitClusterEvent),
        _as(INTRUDER, _req(m.AwaitStop, timeout_s=60.0), s.AwaitStopEvent),
    ]
    for ev in attacks:
        assert refusal(ev, sm(ev)).code == ErrorCode.NOT_SLOT_HOLDER
    node, job = sm.node(1), sm.job()
    assert (node.state, node.conn, node.meta.get("tensorboard_url"), job.state) == (
        NodeState.RUNNING,
        node_conn(1),
        None,
        JobState.RUNNING,
    )
    assert job.version == version and not job.figures and not job.logs
    assert sm.state.not_holder == len(attacks)


def test_a_copied_registration_does_not_take_the_slot_or_its_credential() -> None:
    sm = running()
    copy = m.Register(id=next(_ids), job="j", executor_id=1, attempt=0, host="host1", port=2001)
    ev = s.RegisterNode(now=T0 + 1, req=copy, conn=INTRUDER, waiter=(INTRUDER, copy.id))
    effects = sm(ev)
    assert refusal(ev, effects).code == ErrorCode.NOT_SLOT_HOLDER
    assert not [
        e for e in effects if isinstance(e, s.Send) and isinstance(e.msg, m.Reply)
    ]  # no credential out
    assert sm.node(1).conn == node_conn(1)


def test_the_node_itself_reconnected_goes_on_with_its_credential_and_a_new_one_each_generation() -> None:
    sm = Machine()
    sm.start(m.JobSpec(roles=(("worker", 2),), max_restarts=1))
    credential = _credential(sm.state, 1)
    assert len(credential) == 64 and credential != _credential(sm.state, 0)
    sm(s.Disconnected(now=T0 + 1, conn=node_conn(1)))
    back = _as(77, _req(m.Heartbeat, credential=credential), s.HeartbeatNode)
    assert result(back, sm(back))["stop"] is False
    assert sm.node(1).conn == 77
    # The job restarts (worker 0 killed): worker 1 rejoins and gets a new credential; the old
    # one proves nothing in the new generation.
    kill = _as(node_conn(0), _req(m.Report, eid=0, state=NodeState.FAILED, exit_code=-9), s.ReportNode)
    sm(kill)
    rejoin = m.Register(
        id=next(_ids), job="j", executor_id=1, attempt=0, host="host1", port=2011, generation=1
    )
    reg = result(
        rejoin_ev := s.RegisterNode(now=T0 + 2, req=rejoin, conn=77, waiter=(77, rejoin.id)), sm(rejoin_ev)
    )
    assert reg["generation"] == 1 and reg["credential"] not in ("", credential)
    stale = _as(
        INTRUDER,
        m.Heartbeat(id=next(_ids), job="j", executor_id=1, attempt=0, generation=1, credential=credential),
        s.HeartbeatNode,
    )
    assert refusal(stale, sm(stale)).code == ErrorCode.NOT_SLOT_HOLDER


def test_a_replayed_journal_gives_every_node_its_credential_again() -> None:
    sm = running()
    replayed = s.CoordinatorState()
    for ev in sm.journal:
        replayed.handle(ev)
    replayed.handle(s.Recovered(now=T0 + 5))
    assert [_credential(replayed, e) for e in (0, 1)] == [_credential(sm.state, e) for e in (0, 1)]
    keyed = s.CoordinatorState()
    keyed.set_credential_key(b"k" * 32)  # another coordinator secret: other credentials
    for ev in sm.journal:
        keyed.handle(ev)
    assert _credential(keyed, 1) != _credential(sm.state, 1)
