"""A small kit for the state machine's per-part tests (``test_state_<part>.py``).

Each test builds events with the functions here, hands them to a :class:`Machine` (a
``CoordinatorState`` that checks its invariants after every event) and asserts on the
effects that come out, exactly, the way dask's state-machine tests do. Every request gets
its own waiter ``(connection, request id)``, so a test reads ``ev.waiter`` to say which
answer it expects. Pure: no sockets, no sleeps, ``now`` is an argument.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from tfcoord.client import messages as m
from tfcoord.client.vocab import NodeState
from tfcoord.coordinator import state as s

T0 = 1_000.0
#: The connection drivers' requests come on.
DRIVER = 1
TWO_WORKERS = m.JobSpec(roles=(("worker", 2),))

_ids = itertools.count(1)


def node_conn(executor_id: int, attempt: int = 0) -> int:
    """The connection a node uses unless a test says otherwise: one per executor and attempt."""
    return 100 + executor_id + 1000 * attempt


def waiter(conn: int) -> s.Waiter:
    return (conn, next(_ids))


class Machine:
    """A ``CoordinatorState`` whose invariants are checked after every event."""

    def __init__(self, **kw: Any) -> None:
        self.state = s.CoordinatorState(**kw)
        #: Every event journaled so far: what a restarted coordinator replays.
        self.journal: list[s.Event] = []

    def __call__(self, event: s.Event) -> list[s.Effect]:
        effects = self.state.handle(event)
        self.state.validate()
        self.journal += journaled(effects)
        return effects

    def run(self, *events: s.Event) -> list[s.Effect]:
        """Hand in each event, finishing any cluster completion at once (as the server does
        on its next loop turns); the effects of them all."""
        out: list[s.Effect] = []
        for ev in events:
            effects = self(ev)
            out += effects
            going = [e.job for e in effects if isinstance(e, s.Continue)]
            while going:
                more = self(s.CompleteCluster(now=ev.now, job=going.pop()))
                out += more
                going += [e.job for e in more if isinstance(e, s.Continue)]
        return out

    def job(self, job: str = "j") -> s.Job:
        return self.state.jobs[job]

    def node(self, eid: int, job: str = "j") -> s.Node:
        node = self.job(job).node(eid)
        assert node is not None
        return node

    def credential(self, eid: int, job: str = "j") -> str:
        """The credential node ``eid`` holds now (its registration's answer carries it)."""
        return self.state.ledger.credential_of(self.job(job), self.node(eid, job))

    def form(self, spec: m.JobSpec = TWO_WORKERS, job: str = "j", now: float = T0) -> None:
        """Submit ``job`` and register every slot: it is READY, every node READY."""
        self.run(submit(job, spec, now=now), *(register(e, job, now=now) for e in range(spec.size)))

    def start(self, spec: m.JobSpec = TWO_WORKERS, job: str = "j", now: float = T0) -> None:
        """Form ``job`` and report every node RUNNING."""
        self.form(spec, job, now)
        self.run(*(report(e, job, now=now) for e in range(spec.size)))


# -- events -------------------------------------------------------------------------------


def submit(
    job: str = "j", spec: m.JobSpec = TWO_WORKERS, *, now: float = T0, owner: bytes = b""
) -> s.SubmitJob:
    return s.SubmitJob(now=now, job=job, spec=spec, waiter=waiter(DRIVER), owner=owner)


def register(
    eid: int,
    job: str = "j",
    *,
    attempt: int = 0,
    host: str | None = None,
    port: int | None = None,
    gpus: Iterable[str] = (),
    task_id: str = "",
    conn: int | None = None,
    now: float = T0,
) -> s.RegisterNode:
    conn = node_conn(eid, attempt) if conn is None else conn
    w = waiter(conn)
    req = m.Register(
        id=w[1],
        job=job,
        executor_id=eid,
        attempt=attempt,
        host=host or f"host{eid}",
        port=2000 + eid if port is None else port,
        gpus=tuple(gpus),
        task_id=task_id,
    )
    return s.RegisterNode(now=now, req=req, conn=conn, waiter=w)


def await_cluster(
    eid: int, job: str = "j", *, attempt: int = 0, timeout_s: float = 600.0, now: float = T0
) -> s.AwaitClusterEvent:
    conn = node_conn(eid, attempt)
    w = waiter(conn)
    req = m.AwaitCluster(id=w[1], job=job, executor_id=eid, attempt=attempt, timeout_s=timeout_s)
    return s.AwaitClusterEvent(now=now, req=req, conn=conn, waiter=w)


def report(
    eid: int,
    job: str = "j",
    state: NodeState = NodeState.RUNNING,
    *,
    attempt: int = 0,
    error: str = "",
    meta: dict[str, Any] | None = None,
    now: float = T0,
) -> s.ReportNode:
    conn = node_conn(eid, attempt)
    w = waiter(conn)
    req = m.Report(
        id=w[1], job=job, executor_id=eid, attempt=attempt, state=state, error=error, meta=meta or {}
    )
    return s.ReportNode(now=now, req=req, conn=conn, waiter=w)


def heartbeat(
    eid: int,
    job: str = "j",
    *,
    attempt: int = 0,
    meta: dict[str, Any] | None = None,
    credential: str = "",
    now: float = T0,
) -> s.HeartbeatNode:
    conn = node_conn(eid, attempt)
    w = waiter(conn)
    req = m.Heartbeat(
        id=w[1], job=job, executor_id=eid, attempt=attempt, meta=meta or {}, credential=credential
    )
    return s.HeartbeatNode(now=now, req=req, conn=conn, waiter=w)


def await_stop(
    eid: int, job: str = "j", *, attempt: int = 0, timeout_s: float = 3600.0, now: float = T0
) -> s.AwaitStopEvent:
    conn = node_conn(eid, attempt)
    w = waiter(conn)
    req = m.AwaitStop(id=w[1], job=job, executor_id=eid, attempt=attempt, timeout_s=timeout_s)
    return s.AwaitStopEvent(now=now, req=req, conn=conn, waiter=w)


def await_job(
    job: str = "j", *, timeout_s: float = 600.0, conn: int = DRIVER, now: float = T0
) -> s.AwaitJobEvent:
    w = waiter(conn)
    return s.AwaitJobEvent(now=now, req=m.AwaitJob(id=w[1], job=job, timeout_s=timeout_s), waiter=w)


def watch(
    version: int,
    job: str = "j",
    *,
    brief: bool = False,
    reports: int = -1,
    timeout_s: float = 600.0,
    conn: int = DRIVER,
    now: float = T0,
) -> s.AwaitJobEvent:
    w = waiter(conn)
    req = m.WatchJob(id=w[1], job=job, version=version, timeout_s=timeout_s, brief=brief, reports=reports)
    return s.AwaitJobEvent(now=now, req=req, waiter=w)


def stop(job: str = "j", reason: str = "enough", *, now: float = T0, dry_run: bool = False) -> s.StopJobEvent:
    return s.StopJobEvent(now=now, job=job, reason=reason, dry_run=dry_run, waiter=waiter(DRIVER))


def progress(
    eid: int,
    job: str = "j",
    *,
    figures: dict[str, int | float] | None = None,
    usage: dict[str, int | float] | None = None,
    attempt: int = 0,
    now: float = T0,
) -> s.ProgressNode:
    conn = node_conn(eid, attempt)
    w = waiter(conn)
    req = m.Progress(
        id=w[1], job=job, executor_id=eid, attempt=attempt, figures=figures or {}, usage=usage or {}
    )
    return s.ProgressNode(now=now, req=req, conn=conn, waiter=w)


def node_logs(
    eid: int, *lines: str, job: str = "j", stream: str = "stdout", attempt: int = 0, now: float = T0
) -> s.NodeLogsEvent:
    conn = node_conn(eid, attempt)
    w = waiter(conn)
    req = m.NodeLogs(id=w[1], job=job, executor_id=eid, attempt=attempt, stream=stream, lines=lines)
    return s.NodeLogsEvent(now=now, req=req, conn=conn, waiter=w)


def tick(now: float) -> s.Tick:
    return s.Tick(now=now)


# -- effects ------------------------------------------------------------------------------


def answer(ev: Any, effects: Iterable[s.Effect]) -> m.Message:
    """The one message ``effects`` send to ``ev``'s waiter."""
    sent = [
        e.msg for e in effects if isinstance(e, s.Send) and (e.conn, getattr(e.msg, "id", None)) == ev.waiter
    ]
    assert len(sent) == 1, sent
    return sent[0]


def result(ev: Any, effects: Iterable[s.Effect]) -> dict[str, Any]:
    """The result of the one Reply ``effects`` send to ``ev``'s waiter."""
    msg = answer(ev, effects)
    assert isinstance(msg, m.Reply), msg
    return dict(msg.result)


def refusal(ev: Any, effects: Iterable[s.Effect]) -> m.Error:
    msg = answer(ev, effects)
    assert isinstance(msg, m.Error), msg
    return msg


def reply(ev: Any, **result: Any) -> s.Send:
    """The Send effect answering ``ev`` with ``result``."""
    return s.Send(ev.waiter[0], m.Reply(id=ev.waiter[1], result=result))


def kinds(effects: Iterable[s.Effect]) -> list[str]:
    """Each effect's class name, in order: the shape of what an event did."""
    return [type(e).__name__ for e in effects]


def lines(effects: Iterable[s.Effect]) -> list[str]:
    """The timeline lines among ``effects``."""
    return [e.text for e in effects if isinstance(e, s.Log)]


def journaled(effects: Iterable[s.Effect]) -> list[s.Event]:
    return [e.event for e in effects if isinstance(e, s.Journal)]
