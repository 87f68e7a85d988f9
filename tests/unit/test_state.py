"""The coordinator's pure state machine, and the journal that makes it durable.

Every test drives a :class:`CoordinatorState` through a :class:`Harness`: each request
gets a unique waiter (connection id, request id), every reply the state produces is
recorded against its waiter (answering one twice fails the test), journaled events are
kept for replay, and ``state.validate()`` runs after every event and again at teardown.
No sockets, no sleeps: ``now`` is an argument, deadlines pass by handing in a ``Tick``.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tfcoord.client import messages as m
from tfcoord.client import protocol
from tfcoord.client.messages import JobSpec
from tfcoord.client.protocol import decode_spec, pack
from tfcoord.client.vocab import FailureReason, WaitKind
from tfcoord.coordinator import state as s
from tfcoord.coordinator.journal import (
    FILENAME,
    SqliteJournal,
    StateDirError,
    decode_event,
    encode_event,
    event_job,
)
from tfcoord.coordinator.state import (
    JOB_TRANSITIONS,
    NODE_TRANSITIONS,
    CoordinatorState,
    InvalidTransition,
    JobState,
    NodeState,
    Waiter,
    telemetry,
)

J, N = JobState, NodeState
T0 = 1_000.0
DRIVER = 1


def spec(*roles: tuple[str, int], **kw: Any) -> JobSpec:
    return JobSpec(roles=tuple(roles), **kw)


TWO_WORKERS = spec(("worker", 2))
PS_WORKERS = spec(("ps", 1), ("worker", 2))
TRACEBACK = (
    'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nValueError: loss is NaN'
)


def node_conn(executor_id: int, attempt: int = 0) -> int:
    """The connection a node uses by default: one per executor and attempt."""
    return 100 + executor_id + 1000 * attempt


@dataclass
class Call:
    """A request handed to the state: its waiter, and the answer once there is one."""

    h: Harness
    waiter: Waiter

    @property
    def msg(self) -> m.Message | None:
        return self.h.answers.get(self.waiter)

    @property
    def pending(self) -> bool:
        return self.msg is None

    @property
    def result(self) -> dict[str, Any]:
        assert isinstance(self.msg, m.Reply), self.msg
        return dict(self.msg.result)

    @property
    def error(self) -> m.Error:
        assert isinstance(self.msg, m.Error), self.msg
        return self.msg

    @property
    def cluster(self) -> m.ClusterReply:
        assert isinstance(self.msg, m.ClusterReply), self.msg
        return self.msg


class Harness:
    """A CoordinatorState, the answers it gave and the events it journaled.

    A cluster completion that goes on (``Continue``) is finished at once, as the server
    does on its next loop turns, unless ``continue_at_once`` is False: then ``continuing``
    lists the jobs, and the test hands in each ``CompleteCluster`` itself."""

    def __init__(self, state: CoordinatorState | None = None, *, continue_at_once: bool = True) -> None:
        self.state = state or CoordinatorState()
        self.continue_at_once = continue_at_once
        self.continuing: list[str] = []
        self.now = T0
        self.answers: dict[Waiter, m.Message] = {}
        self.journal: list[s.Event] = []
        self.effects: list[s.Effect] = []  # of the last event, and of the completion it went on with
        self._ids = itertools.count(1)

    def handle(self, event: s.Event) -> list[s.Effect]:
        self.effects = effects = self.state.handle(event)
        self.state.validate()
        while effects:
            going = []
            for eff in effects:
                if isinstance(eff, s.Send):
                    waiter = (eff.conn, eff.msg.id)  # type: ignore[attr-defined]
                    assert waiter not in self.answers, f"{waiter} answered twice"
                    self.answers[waiter] = eff.msg
                elif isinstance(eff, s.Journal):
                    self.journal.append(eff.event)
                elif isinstance(eff, s.Continue):
                    going.append(eff.job)
            effects = []
            for job in going:
                if not self.continue_at_once:
                    self.continuing.append(job)
                    continue
                more = self.state.handle(s.CompleteCluster(now=event.now, job=job))
                self.state.validate()
                self.effects += more
                effects += more
        return self.effects

    def go_on(self, job: str = "j", *, now: float | None = None) -> list[s.Effect]:
        """Hand in the ``CompleteCluster`` a ``Continue`` asked for (``continue_at_once`` False)."""
        self.continuing.remove(job)
        return self.handle(s.CompleteCluster(now=self._at(now), job=job))

    def _at(self, now: float | None) -> float:
        return self.now if now is None else now

    def _call(self, conn: int, build: Callable[[Waiter], s.Event]) -> Call:
        waiter = (conn, next(self._ids))
        self.handle(build(waiter))
        return Call(self, waiter)

    # -- drivers --

    def submit(self, sp: JobSpec = TWO_WORKERS, job: str = "j", *, now: float | None = None) -> Call:
        return self._call(DRIVER, lambda w: s.SubmitJob(now=self._at(now), job=job, spec=sp, waiter=w))

    def stop(
        self, job: str = "j", reason: str = "enough", *, dry_run: bool = False, now: float | None = None
    ) -> Call:
        return self._call(
            DRIVER,
            lambda w: s.StopJobEvent(now=self._at(now), job=job, reason=reason, dry_run=dry_run, waiter=w),
        )

    def await_job(self, job: str = "j", timeout_s: float = 600.0, *, now: float | None = None) -> Call:
        return self._call(
            DRIVER,
            lambda w: s.AwaitJobEvent(
                now=self._at(now), req=m.AwaitJob(id=w[1], job=job, timeout_s=timeout_s), waiter=w
            ),
        )

    def watch(
        self,
        version: int,
        job: str = "j",
        timeout_s: float = 600.0,
        *,
        brief: bool = False,
        reports: int = -1,
        now: float | None = None,
    ) -> Call:
        return self._call(
            DRIVER,
            lambda w: s.AwaitJobEvent(
                now=self._at(now),
                req=m.WatchJob(
                    id=w[1], job=job, version=version, timeout_s=timeout_s, brief=brief, reports=reports
                ),
                waiter=w,
            ),
        )

    def status_call(self, job: str | None) -> Call:
        return self._call(DRIVER, lambda w: s.StatusEvent(now=self.now, job=job, waiter=w))

    # -- nodes --

    def register(
        self,
        eid: int,
        job: str = "j",
        *,
        attempt: int = 0,
        host: str | None = None,
        port: int | None = None,
        gpus: Iterable[str] = (),
        task_id: str = "",
        conn: int | None = None,
        now: float | None = None,
    ) -> Call:
        conn = node_conn(eid, attempt) if conn is None else conn
        return self._call(
            conn,
            lambda w: s.RegisterNode(
                now=self._at(now),
                conn=conn,
                waiter=w,
                req=m.Register(
                    id=w[1],
                    job=job,
                    executor_id=eid,
                    attempt=attempt,
                    host=host or f"host{eid}",
                    port=2000 + eid if port is None else port,
                    gpus=tuple(gpus),
                    task_id=task_id,
                ),
            ),
        )

    def _node_call(
        self,
        event: type,
        req: type,
        eid: int,
        job: str,
        *,
        attempt: int = 0,
        conn: int | None = None,
        now: float | None = None,
        **fields: Any,
    ) -> Call:
        conn = node_conn(eid, attempt) if conn is None else conn
        # As a NodeClient does: every request carries the credential its registration returned.
        held = self.state.jobs[job].node(eid) if job in self.state.jobs else None
        if held is not None and held.attempt == attempt:
            fields.setdefault("credential", self.state.ledger.credential_of(self.state.jobs[job], held))
        return self._call(
            conn,
            lambda w: event(
                now=self._at(now),
                conn=conn,
                waiter=w,
                req=req(id=w[1], job=job, executor_id=eid, attempt=attempt, **fields),
            ),
        )

    # Node requests take attempt=, conn= and now= as keywords, like register.

    def await_cluster(self, eid: int, job: str = "j", *, timeout_s: float = 600.0, **kw: Any) -> Call:
        return self._node_call(s.AwaitClusterEvent, m.AwaitCluster, eid, job, timeout_s=timeout_s, **kw)

    def report(
        self,
        eid: int,
        state: str = "running",
        job: str = "j",
        *,
        error: str = "",
        meta: Any = None,
        **kw: Any,
    ) -> Call:
        return self._node_call(
            s.ReportNode, m.Report, eid, job, state=state, error=error, meta=meta or {}, **kw
        )

    def heartbeat(self, eid: int, job: str = "j", **kw: Any) -> Call:
        return self._node_call(s.HeartbeatNode, m.Heartbeat, eid, job, **kw)

    def node_logs(self, eid: int, *lines: str, job: str = "j", stream: str = "stdout", **kw: Any) -> Call:
        return self._node_call(s.NodeLogsEvent, m.NodeLogs, eid, job, stream=stream, lines=lines, **kw)

    def progress(self, eid: int, job: str = "j", **kw: Any) -> Call:
        return self._node_call(s.ProgressNode, m.Progress, eid, job, **kw)

    def await_stop(self, eid: int, job: str = "j", *, timeout_s: float = 3600.0, **kw: Any) -> Call:
        return self._node_call(s.AwaitStopEvent, m.AwaitStop, eid, job, timeout_s=timeout_s, **kw)

    # -- time and connections --

    def tick(self, now: float | None = None) -> list[s.Effect]:
        return self.handle(s.Tick(now=self._at(now)))

    def disconnect(self, conn: int, *, now: float | None = None) -> list[s.Effect]:
        return self.handle(s.Disconnected(now=self._at(now), conn=conn))

    # -- shortcuts --

    def form(self, sp: JobSpec = TWO_WORKERS, job: str = "j") -> None:
        """Submit and register every slot: the job is READY."""
        self.submit(sp, job)
        for eid in range(sp.size):
            self.register(eid, job)
        assert self.job(job).state is J.READY

    def run(self, sp: JobSpec = TWO_WORKERS, job: str = "j") -> None:
        """Form the job and report every node running: the job is RUNNING."""
        self.form(sp, job)
        for eid in range(sp.size):
            self.report(eid, job=job)
        assert self.job(job).state is J.RUNNING

    def job(self, job: str = "j") -> s.Job:
        return self.state.jobs[job]

    def node(self, eid: int, job: str = "j") -> s.Node:
        node = self.job(job).slots[eid].node
        assert node is not None
        return node

    def status(self, job: str = "j") -> dict[str, Any]:
        return self.state.status(job)


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.state.validate()


def replay(events: Iterable[s.Event], now: float) -> CoordinatorState:
    """A coordinator restarted from a journal: every event again, then Recovered."""
    state = CoordinatorState()
    for ev in events:
        state.handle(ev)
    state.handle(s.Recovered(now=now))
    state.validate()
    return state


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    """A job status without what a restart legitimately changes: connections and last contact."""

    def strip(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in n.items() if k not in ("connected", "last_seen")} for n in nodes]

    return {**status, "nodes": strip(status["nodes"]), "history": strip(status["history"])}


# -- submit -------------------------------------------------------------------------------


def test_submit_creates_a_journaled_job_with_a_reservation_deadline(h: Harness) -> None:
    assert h.submit().result == {"job": "j", "state": "SUBMITTED", "created": True}
    assert h.journal == [s.SubmitJob(now=T0, job="j", spec=TWO_WORKERS)]
    assert h.status()["state"] == "SUBMITTED"
    assert h.state.next_deadline() == T0 + TWO_WORKERS.reservation_timeout_s


def test_resubmitting_the_same_spec_is_idempotent(h: Harness) -> None:
    h.submit()
    h.register(0)
    again = h.submit(spec(("worker", 2)), now=T0 + 5)  # an equal spec, built anew by a reconnected driver
    assert again.result == {"job": "j", "state": "RESERVING", "created": False}
    assert [type(e) for e in h.journal] == [s.SubmitJob, s.RegisterNode]
    assert h.job().submitted_at == T0


def test_resubmitting_a_different_spec_is_refused(h: Harness) -> None:
    h.submit()
    err = h.submit(spec(("worker", 3))).error
    assert err.code == "job_exists"
    assert "pick another job id" in err.message
    assert h.job().spec == TWO_WORKERS
    assert len(h.journal) == 1


# -- registration -------------------------------------------------------------------------


def test_registration_assigns_role_and_index_by_executor_id_in_tfos_order(h: Harness) -> None:
    h.submit(spec(("ps", 2), ("chief", 1), ("evaluator", 1), ("worker", 2)))
    expected = {
        0: ("ps", 0),
        1: ("ps", 1),
        2: ("chief", 0),
        3: ("evaluator", 0),
        4: ("worker", 0),
        5: ("worker", 1),
    }
    for eid in (5, 2, 0, 4, 3, 1):
        r = h.register(eid).result
        assert (r["role"], r["index"], r["size"], r["job"]) == (*expected[eid], 6, "j")
        assert r["state"] == ("READY" if eid == 1 else "RESERVING")
        assert r["heartbeat_timeout_s"] == 30.0


def test_cluster_spec_lists_each_role_by_task_index(h: Harness) -> None:
    h.submit(spec(("ps", 1), ("worker", 3)))
    for eid in (3, 1, 0, 2):
        h.register(eid, host=f"10.0.0.{eid}", port=7000 + eid)
    reply = h.await_cluster(2).cluster
    expected = {"ps": ["10.0.0.0:7000"], "worker": ["10.0.0.1:7001", "10.0.0.2:7002", "10.0.0.3:7003"]}
    assert decode_spec(reply.spec) == expected
    assert list(decode_spec(reply.spec)) == ["ps", "worker"]
    assert (reply.role, reply.index) == ("worker", 1)
    assert h.status()["cluster"] == expected


def test_the_last_registration_answers_every_cluster_waiter_with_the_same_bytes(h: Harness) -> None:
    h.submit(PS_WORKERS)
    waits = []
    for eid in (0, 1):
        h.register(eid)
        waits.append(h.await_cluster(eid))
    assert all(w.pending for w in waits)
    assert h.job().state is J.RESERVING and h.job().spec_blob is None

    assert h.register(2).result["state"] == "READY"
    first, second = (w.cluster for w in waits)
    assert first.spec is second.spec is h.job().spec_blob  # encoded once, the very same bytes
    assert [(c.role, c.index) for c in (first, second)] == [("ps", 0), ("worker", 0)]
    assert h.job().state is J.READY
    assert {n["state"] for n in h.status()["nodes"]} == {"READY"}

    late = h.await_cluster(2).cluster  # after READY: answered at once
    assert late.spec is first.spec
    assert (late.role, late.index) == ("worker", 1)


UNKNOWN_JOB: dict[str, Callable[[Harness], Call]] = {
    "register": lambda h: h.register(0, job="nope"),
    "await_cluster": lambda h: h.await_cluster(0, job="nope"),
    "report": lambda h: h.report(0, job="nope"),
    "heartbeat": lambda h: h.heartbeat(0, job="nope"),
    "await_stop": lambda h: h.await_stop(0, job="nope"),
    "await_job": lambda h: h.await_job(job="nope"),
    "watch_job": lambda h: h.watch(0, job="nope"),
    "stop_job": lambda h: h.stop(job="nope"),
    "finish": lambda h: finish_job(h, 1.0, job="nope"),
    "status": lambda h: h.status_call("nope"),
}


@pytest.mark.parametrize("request_for", UNKNOWN_JOB.values(), ids=UNKNOWN_JOB.keys())
def test_requests_for_an_unknown_job_are_refused(h: Harness, request_for: Callable[[Harness], Call]) -> None:
    h.submit()
    err = request_for(h).error
    assert err.code == "unknown_job"
    assert "no job 'nope'" in err.message and "tfcoord status" in err.message
    assert len(h.journal) == 1


@pytest.mark.parametrize(
    "request_for",
    [lambda h: h.await_cluster(1), lambda h: h.report(1), lambda h: h.heartbeat(1)],
    ids=["await_cluster", "report", "heartbeat"],
)
def test_node_requests_before_registering_are_refused(
    h: Harness, request_for: Callable[[Harness], Call]
) -> None:
    h.submit()
    h.register(0)
    err = request_for(h).error
    assert err.code == "not_registered"
    assert "executor 1" in err.message and "register first" in err.message


def test_an_executor_id_beyond_the_template_is_a_bad_slot(h: Harness) -> None:
    h.submit()
    err = h.register(2).error
    assert err.code == "bad_slot"
    assert "job j has 2 slots (executors 0..1)" in err.message
    assert h.job().state is J.SUBMITTED and len(h.journal) == 1


@pytest.mark.parametrize("other", [{"host": "b"}, {"port": 9}, {"gpus": ("GPU-1",)}, {"task_id": "other"}])
def test_a_second_live_registration_of_a_slot_is_a_duplicate(h: Harness, other: dict[str, Any]) -> None:
    h.submit()
    h.register(0, host="a", port=1, task_id="t0")
    before, journaled = h.status(), len(h.journal)
    err = h.register(0, **{"host": "a", "port": 1, "task_id": "t0", **other}).error
    assert err.code == "duplicate"
    assert "slot worker:0 of job j is already held by worker:0 (executor 0, host a, task t0)" in err.message
    assert h.status() == before
    assert len(h.journal) == journaled


def test_the_same_registration_again_gets_the_same_answer(h: Harness) -> None:
    h.submit()
    first = h.register(0, gpus=("GPU-0",), task_id="t0").result
    journaled = len(h.journal)
    h.disconnect(node_conn(0))  # the node lost its connection, and registers again on a new one
    again = h.register(0, gpus=("GPU-0",), task_id="t0", conn=999, now=T0 + 5)
    assert again.result == first
    assert len(h.journal) == journaled  # nothing changed worth journaling
    assert (h.node(0).conn, h.node(0).last_seen) == (999, T0 + 5)


def test_a_newer_attempt_supersedes_the_old_one_while_reserving(h: Harness) -> None:
    h.submit()
    h.register(0, host="old", task_id="1.0.0")
    old_cluster, old_stop = h.await_cluster(0), h.await_stop(0)

    # The old attempt hung: still connected, but silent for its whole heartbeat timeout.
    new = h.register(0, attempt=1, host="new", task_id="1.0.1", now=T0 + 30)
    assert (new.result["role"], new.result["index"]) == ("worker", 0)
    assert old_cluster.error.code == "stale_attempt"
    assert (
        old_cluster.error.message == "worker:0 (executor 0, host old, task 1.0.0) was superseded by attempt 1"
    )
    assert old_stop.result == {"stop": True, "reason": "attempt 0 was superseded", "job_state": "RESERVING"}
    [old] = h.status()["history"]
    assert (old["attempt"], old["state"], old["host"], old["error"]) == (
        0,
        "STOPPED",
        "old",
        "superseded by attempt 1",
    )
    assert (h.node(0).attempt, h.job().state) == (1, J.RESERVING)

    # The old attempt is refused from now on, and told to stop.
    for err in (h.report(0, "failed", error="x").error, h.await_cluster(0).error):
        assert err.code == "stale_attempt"
        assert "attempt 0 was superseded and must exit" in err.message
    assert h.heartbeat(0).result["stop"] is True

    h.register(1)
    assert decode_spec(h.await_cluster(0, attempt=1).cluster.spec) == {"worker": ["new:2000", "host1:2001"]}


def test_a_newer_attempt_after_ready_fails_the_job(h: Harness) -> None:
    h.form()
    stop = h.await_stop(0)
    err = h.register(1, attempt=1, host="elsewhere").error
    job = h.job()
    assert job.state is J.FAILED
    assert "worker:1 (executor 1, host host1) was restarted as attempt 1 on host elsewhere" in job.error
    assert "cannot change membership" in job.error
    assert (err.code, err.message) == ("job_failed", job.error)
    assert stop.result["stop"] is True
    assert isinstance(h.journal[-1], s.RegisterNode)


# -- a cluster completion in chunks (``Continue`` / ``CompleteCluster``) ---------------------


def _chunked(per_event: int = 2) -> Harness:
    """A harness whose state completes a cluster ``per_event`` nodes per event, and which
    leaves handing in each ``CompleteCluster`` to the test, as the server's later turns do."""
    return Harness(CoordinatorState(complete_per_event=per_event), continue_at_once=False)


def _waiting_five(h: Harness) -> list[Call]:
    """A five-worker job, four nodes registered and waiting for the cluster."""
    h.submit(spec(("worker", 5)))
    waits = []
    for eid in range(4):
        h.register(eid)
        waits.append(h.await_cluster(eid))
    return waits


def test_a_cluster_completion_goes_on_a_chunk_of_nodes_per_event() -> None:
    h = _chunked()
    waits = _waiting_five(h)
    watch = h.watch(h.job().version + 1)
    assert h.register(4).result["state"] == "READY"
    # The job is READY at once, with its spec; its nodes follow, a chunk per event.
    assert h.job().state is J.READY and h.job().spec_blob is not None and h.continuing == ["j"]
    assert {n["state"] for n in h.status()["nodes"]} == {"REGISTERED"}
    assert all(w.pending for w in waits)
    assert watch.result["state"] == "READY"  # the completing event wakes watchers
    watch = h.watch(h.job().version)
    effects = h.go_on()
    assert [n["state"] for n in h.status()["nodes"]] == ["READY", "READY"] + ["REGISTERED"] * 3
    assert h.job().in_state == {N.READY: 2, N.REGISTERED: 3}
    assert [w.pending for w in waits] == [False, False, True, True]
    assert [type(e) for e in effects].count(s.Send) == 2
    assert h.continuing == ["j"] and s.Continue("j") in effects
    # A node not reached yet that asks again is answered at once, with the same bytes.
    assert h.await_cluster(4).cluster.spec is h.job().spec_blob
    h.go_on()
    assert [w.pending for w in waits] == [False] * 4
    assert watch.pending  # watchers hear once the completion is over
    h.go_on()
    assert h.continuing == [] and h.job().completing is None
    assert watch.result["state"] == "READY"
    assert {n["state"] for n in h.status()["nodes"]} == {"READY"}
    assert [(w.cluster.role, w.cluster.index) for w in waits] == [("worker", i) for i in range(4)]
    assert all(w.cluster.spec is h.job().spec_blob for w in waits)


def test_a_chunked_completion_ends_as_the_whole_one_in_one_event() -> None:
    whole, chunked = Harness(), _chunked()
    for h in (whole, chunked):
        _waiting_five(h)
        h.register(4)
        h.await_stop(0)
        while h.continuing:
            h.go_on()
    assert whole.answers == chunked.answers
    assert whole.status() == chunked.status()  # the timeline too, line by line


def test_a_node_that_reports_before_its_chunk_keeps_its_state() -> None:
    h = _chunked()
    waits = _waiting_five(h)
    h.register(4)
    h.report(3)  # it had its spec from elsewhere (a second connection's wait)
    assert h.node(3).state is N.RUNNING
    while h.continuing:
        h.go_on()
    assert h.node(3).state is N.RUNNING and waits[3].cluster.index == 3
    assert {k: v for k, v in h.job().in_state.items() if v} == {N.READY: 4, N.RUNNING: 1}


def test_a_job_that_fails_during_its_completion_refuses_the_waits_left() -> None:
    h = _chunked()
    waits = _waiting_five(h)
    h.register(4)
    h.go_on()
    h.report(0, "failed", error=TRACEBACK)
    assert h.job().state is J.FAILED
    assert [w.msg.code for w in waits[2:]] == ["job_failed", "job_failed"]  # type: ignore[union-attr]
    effects = h.go_on()
    assert not any(isinstance(e, (s.Send, s.Continue)) for e in effects)
    assert h.job().completing is None
    # The nodes it had not reached stay REGISTERED (live; their stop waits tell them).
    assert [h.node(i).state for i in range(5)] == [
        N.FAILED,
        N.READY,
        N.REGISTERED,
        N.REGISTERED,
        N.REGISTERED,
    ]


def test_a_node_that_disconnects_before_its_chunk_gets_no_answer_but_turns_ready() -> None:
    h = _chunked()
    waits = _waiting_five(h)
    h.register(4)
    h.disconnect(node_conn(3))
    while h.continuing:
        h.go_on()
    assert waits[3].pending and h.node(3).state is N.READY
    assert h.state.waits.pending == {} or all(
        w.kind != WaitKind.CLUSTER for w in h.state.waits.pending.values()
    )


def test_a_completion_is_journaled_step_by_step_and_replays_the_same() -> None:
    h = _chunked()
    _waiting_five(h)
    h.register(4)
    h.report(2)  # before its chunk reached it: RUNNING, and never READY
    while h.continuing:
        h.go_on()
    steps = [ev for ev in h.journal if isinstance(ev, s.CompleteCluster)]
    assert [ev.upto for ev in steps] == [2, 4, 5]
    assert [decode_event(*encode_event(ev)) for ev in steps] == steps
    # A replay goes through the same steps (whatever its own chunk size): the same timeline.
    again = replay(h.journal, T0)
    assert comparable(again.status("j")) == comparable(h.status())
    assert "worker:2 READY" not in [text for _, text in h.status()["events"]]


def test_a_completion_cut_short_by_a_restart_is_finished_by_recovered() -> None:
    h = _chunked()
    _waiting_five(h)
    h.register(4)  # killed here: the steps after the first were never journaled
    again = replay(h.journal, T0 + 1)
    assert [n["state"] for n in again.status("j")["nodes"]] == ["READY"] * 5
    assert again.jobs["j"].completing is None and again.jobs["j"].state is J.READY


def test_a_lower_attempt_is_stale(h: Harness) -> None:
    h.submit()
    h.register(0, attempt=2)
    err = h.register(0, attempt=1).error
    assert err.code == "stale_attempt"
    assert "already at attempt 2; attempt 1 must exit" in err.message
    assert h.node(0).attempt == 2


def test_an_attempt_older_than_a_lost_one_is_stale(h: Harness) -> None:
    h.submit(spec(("worker", 2), reconnect_grace_s=1.0))
    h.register(0, attempt=2)
    h.disconnect(node_conn(0, 2))
    h.tick(T0 + 1)
    assert h.job().slots[0].node is None
    assert h.register(0, attempt=1).error.code == "stale_attempt"


def test_re_registering_a_finished_node_after_ready_is_answered_without_changing_the_job(h: Harness) -> None:
    h.run()
    h.report(0, "succeeded")
    call = h.register(0)  # the same attempt, host and port: a register resent after a reconnect
    assert call.msg is not None
    assert h.job().state is J.RUNNING
    assert h.node(0).state is N.SUCCEEDED


def test_two_nodes_on_one_host_cannot_claim_the_same_gpu(h: Harness) -> None:
    h.submit(job="a")
    h.submit(job="b")
    h.register(0, job="a", host="gpuhost", gpus=("GPU-0", "GPU-1"))
    err = h.register(1, job="a", host="gpuhost", gpus=("GPU-1",)).error
    assert err.code == "gpu_conflict"
    assert "GPU GPU-1 on host gpuhost is already claimed by executor 0 of this job" in err.message
    assert h.register(0, job="b", host="otherhost", gpus=("GPU-1",)).result  # another host: fine
    assert h.register(1, job="a", host="gpuhost", gpus=("GPU-2",)).result  # another GPU: fine
    h.submit(job="c")  # a newer attempt of the same slot takes over its own GPUs
    assert h.register(0, job="c", attempt=1, host="x", gpus=("GPU-7",)).result
    h.disconnect(node_conn(0, 1))
    assert h.register(0, job="c", attempt=2, host="x", gpus=("GPU-7",)).result


def test_a_gpu_is_free_again_once_its_node_is_terminal(h: Harness) -> None:
    h.submit(spec(("ps", 1), ("worker", 1), reservation_timeout_s=60.0, reconnect_grace_s=1.0))
    h.register(0, host="g", gpus=("GPU-0",))
    assert h.register(1, host="g", gpus=("GPU-0",)).error.code == "gpu_conflict"
    h.disconnect(node_conn(0))
    h.now += 2
    h.tick()  # lost while reserving: its slot and its GPU are free again
    assert h.job().slots[0].node is None
    assert h.register(1, host="g", gpus=("GPU-0",)).result["role"] == "worker"


def test_gpu_claims_of_one_job_never_refuse_or_name_another_job(h: Harness) -> None:
    """Attack 3: GPU ids are self-reported, so a node of job a claiming every GPU of a host
    must not fail job b's nodes on that host, nor tell them about job a."""
    h.submit(job="a")
    h.submit(job="b")
    h.register(0, job="a", host="gpuhost", gpus=tuple(f"GPU-{i}" for i in range(8)))
    ok = h.register(0, job="b", host="gpuhost", gpus=("GPU-1",))
    assert ok.result["job"] == "b"
    h.state.validate()


# -- reports ------------------------------------------------------------------------------


def test_the_job_runs_once_every_node_runs(h: Harness) -> None:
    h.form()
    assert h.report(0).result == {"state": "RUNNING", "job_state": "READY"}
    assert h.report(1).result == {"state": "RUNNING", "job_state": "RUNNING"}
    journaled = len(h.journal)
    assert h.report(1).result == {"state": "RUNNING", "job_state": "RUNNING"}  # resent: same answer
    assert len(h.journal) == journaled


def test_running_before_the_cluster_is_complete_is_refused(h: Harness) -> None:
    h.submit()
    h.register(0)
    err = h.report(0).error
    assert err.code == "not_ready" and "call await_cluster first" in err.message
    assert h.node(0).state is N.REGISTERED


def test_a_failed_node_fails_the_job_at_once_and_every_other_node_is_told(h: Harness) -> None:
    h.submit(PS_WORKERS)
    for eid in range(3):
        h.register(eid, host=f"10.0.0.{eid}", task_id=f"3.{eid}.0")
    for eid in range(3):
        h.report(eid)
    stops = [h.await_stop(eid) for eid in range(3)]
    done = h.await_job()
    assert all(c.pending for c in (*stops, done))

    assert h.report(2, "failed", error=TRACEBACK, now=T0 + 7).result == {
        "state": "FAILED",
        "job_state": "FAILED",
    }
    job = h.job()
    assert (job.state, job.ended_at) == (J.FAILED, T0 + 7)
    assert job.error == f"worker:1 (executor 2, host 10.0.0.2, task 3.2.0) failed:\n{TRACEBACK}"
    for c in stops:
        assert c.result == {"stop": True, "reason": job.error, "job_state": "FAILED"}
    assert (done.result["state"], done.result["error"]) == ("FAILED", job.error)
    assert h.heartbeat(0).result["stop"] is True
    assert h.status()["events"][-2][1] == "worker:1 FAILED: ValueError: loss is NaN"


def test_a_resent_terminal_report_gets_the_same_answer(h: Harness) -> None:
    h.run()
    first = h.report(0, "failed", error="boom").result
    assert h.report(0, "failed", error="boom").result == first
    err = h.report(0, "succeeded").error
    assert err.code == "already_terminal"
    assert "is already FAILED; it cannot become SUCCEEDED" in err.message


def test_a_failure_without_text_still_says_so(h: Harness) -> None:
    h.run()
    h.report(1, "failed")
    assert h.job().error.endswith("failed:\nfailed without an error message")


def test_a_failure_with_blank_error_text_fails_the_job(h: Harness) -> None:
    h.run()
    h.report(0, "failed", error=" \n ")
    assert h.job().state is J.FAILED


def test_heartbeat_answers_whether_to_stop(h: Harness) -> None:
    h.form()
    assert h.heartbeat(0).result == {"stop": False, "reason": "", "job_state": "READY"}
    h.stop(reason="streaming ended")
    assert h.heartbeat(0).result == {"stop": True, "reason": "streaming ended", "job_state": "STOPPING"}


def test_the_job_succeeds_when_every_worker_does_and_the_ps_is_then_stopped(h: Harness) -> None:
    h.run(PS_WORKERS)
    ps_stop, done = h.await_stop(0), h.await_job()
    h.report(1, "succeeded")
    assert h.job().state is J.RUNNING and ps_stop.pending and done.pending

    h.report(2, "succeeded", now=T0 + 9)
    assert (h.job().state, h.job().ended_at, h.job().error) == (J.SUCCEEDED, T0 + 9, "")
    expected = {
        "stop": True,
        "reason": "the job succeeded; its remaining nodes stop",
        "job_state": "SUCCEEDED",
    }
    assert ps_stop.result == expected
    assert h.heartbeat(0).result == expected
    assert done.result["state"] == "SUCCEEDED"
    assert h.report(0, "stopped").result == {"state": "STOPPED", "job_state": "SUCCEEDED"}


@pytest.mark.parametrize("tolerated", [True, False])
def test_an_evaluator_failure_is_tolerated_only_when_asked(h: Harness, tolerated: bool) -> None:
    h.run(spec(("evaluator", 1), ("worker", 1), tolerate_failure=("evaluator",) if tolerated else ()))
    h.report(0, "failed", error="evaluation crashed")
    if tolerated:
        assert h.job().state is J.RUNNING
        assert h.heartbeat(1).result["stop"] is False
        h.report(1, "succeeded")
        assert h.job().state is J.SUCCEEDED
    else:
        assert h.job().state is J.FAILED
        assert h.job().error.startswith("evaluator:0 (executor 0, host host0) failed:")


def test_a_node_that_stops_unasked_fails_the_job(h: Harness) -> None:
    h.run()
    h.report(0, "stopped")
    assert h.job().state is J.FAILED
    assert "worker:0 (executor 0, host host0) stopped unasked" in h.job().error


ALL_ROLES = spec(("ps", 1), ("chief", 1), ("evaluator", 1), ("worker", 2))


def test_the_job_succeeds_when_chief_and_workers_do_and_ps_and_evaluator_are_told_to_stop(h: Harness) -> None:
    """TFJob's complaints: "chief done, evaluator killed" and "ps never stops"."""
    h.run(ALL_ROLES)
    ps_stop, eval_stop = h.await_stop(0), h.await_stop(2)
    for eid in (1, 3):  # chief and worker:0
        h.report(eid, "succeeded")
    assert h.job().state is J.RUNNING and ps_stop.pending and eval_stop.pending
    h.report(4, "succeeded")  # the last worker
    assert h.job().state is J.SUCCEEDED
    for told in (ps_stop, eval_stop):
        assert told.result == {
            "stop": True,
            "reason": "the job succeeded; its remaining nodes stop",
            "job_state": "SUCCEEDED",
        }
    for eid in (0, 2):
        assert h.report(eid, "stopped").result == {"state": "STOPPED", "job_state": "SUCCEEDED"}
    states = {n["role"]: n["state"] for n in h.status()["nodes"]}
    assert states == {"ps": "STOPPED", "chief": "SUCCEEDED", "evaluator": "STOPPED", "worker": "SUCCEEDED"}


def finish_job(h: Harness, grace_s: float, job: str = "j") -> Call:
    return h._call(DRIVER, lambda w: s.FinishJobEvent(now=h.now, job=job, serving_grace_s=grace_s, waiter=w))


def test_finish_gives_ps_and_evaluator_their_grace_after_the_work_is_done(h: Harness) -> None:
    """shutdown(grace_secs=...): a final evaluation is not cut off when the chief and workers end."""
    h.run(ALL_ROLES)
    assert finish_job(h, 30.0).result == {"job": "j", "state": "RUNNING", "serving_grace_s": 30.0}
    ps_stop, eval_stop, done = h.await_stop(0), h.await_stop(2), h.await_job()
    for eid in (1, 3, 4):  # chief and both workers
        h.report(eid, "succeeded", now=T0 + 10)
    assert h.job().state is J.RUNNING and ps_stop.pending and eval_stop.pending and done.pending
    assert h.heartbeat(2).result["stop"] is False
    h.report(2, "succeeded", now=T0 + 20)  # the evaluator ends on its own within the grace
    assert h.job().state is J.RUNNING  # the ps still serves (until its grace ends)
    h.heartbeat(0, now=T0 + 20)
    h.tick(T0 + 39.9)
    assert h.job().state is J.RUNNING and ps_stop.pending
    h.tick(T0 + 40)
    assert (h.job().state, h.job().ended_at) == (J.SUCCEEDED, T0 + 40)
    assert ps_stop.result["stop"] is True and done.result["state"] == "SUCCEEDED"
    assert "its ps/evaluator nodes get 30 s to finish" in [e[1] for e in h.job().events][-3]
    restored = replay(h.journal, now=h.now + 500)
    assert_same_jobs(restored, h.state)


def test_within_the_serving_grace_the_last_serving_node_ending_or_a_stop_ends_the_job_succeeded(
    h: Harness,
) -> None:
    h.run(spec(("ps", 1), ("evaluator", 1), ("worker", 1)))
    finish_job(h, 600.0)
    h.report(2, "succeeded")
    h.report(1, "succeeded")  # the evaluator returned; the ps is the last one
    assert h.job().state is J.RUNNING
    h.stop(reason="shutdown: grace_secs passed")  # the driver's word: the work succeeded
    assert h.job().state is J.SUCCEEDED and h.job().reason.value == ""
    assert h.report(0, "stopped").result == {"state": "STOPPED", "job_state": "SUCCEEDED"}
    assert_same_jobs(replay(h.journal, now=h.now + 500), h.state)


def test_a_serving_node_failing_within_its_grace_fails_the_job(h: Harness) -> None:
    h.run(spec(("evaluator", 1), ("worker", 1)))
    finish_job(h, 60.0)
    h.report(1, "succeeded")
    h.report(0, "failed", error="final evaluation crashed")
    assert h.job().state is J.FAILED and "final evaluation crashed" in h.job().error


def test_finish_after_the_work_is_done_changes_nothing(h: Harness) -> None:
    h.run(PS_WORKERS)
    for eid in (1, 2):
        h.report(eid, "succeeded")
    assert finish_job(h, 60.0).result["state"] == "SUCCEEDED" and h.job().serving_grace_s == 0
    assert finish_job(h, 60.0, job="nope").error.code == "unknown_job"


@pytest.mark.parametrize("tolerated", [True, False])
def test_a_lost_evaluator_is_tolerated_only_when_asked(h: Harness, tolerated: bool) -> None:
    h.run(
        spec(
            ("chief", 1),
            ("evaluator", 1),
            ("worker", 1),
            heartbeat_timeout_s=10.0,
            tolerate_failure=("evaluator",) if tolerated else (),
        )
    )
    for eid in (0, 2):
        h.heartbeat(eid, now=T0 + 8)
    h.tick(T0 + 10)  # the evaluator (executor 1) fell silent
    assert h.node(1).state is N.LOST
    if tolerated:
        assert h.job().state is J.RUNNING and h.heartbeat(0, now=T0 + 11).result["stop"] is False
        h.report(0, "succeeded", now=T0 + 12)
        h.report(2, "succeeded", now=T0 + 12)
        assert h.job().state is J.SUCCEEDED
    else:
        assert h.job().state is J.FAILED
        assert h.job().error.startswith("evaluator:0 (executor 1, host host1) was lost: no heartbeat")


@pytest.mark.parametrize("role", ["ps", "chief", "worker"])
def test_tolerating_the_evaluator_does_not_tolerate_other_roles(h: Harness, role: str) -> None:
    h.run(spec(("ps", 1), ("chief", 1), ("evaluator", 1), ("worker", 1), tolerate_failure=("evaluator",)))
    eid = {"ps": 0, "chief": 1, "worker": 3}[role]
    h.report(eid, "failed", error="OOM")
    assert h.job().state is J.FAILED and h.job().error.startswith(f"{role}:0 (executor {eid}")


# -- stop ---------------------------------------------------------------------------------


def test_stop_tells_every_node_and_ends_stopped_once_all_acknowledge(h: Harness) -> None:
    h.run(PS_WORKERS)
    stops, done = [h.await_stop(eid) for eid in range(3)], h.await_job()
    r = h.stop(reason="streaming ended", now=T0 + 3).result
    assert (r["state"], r["job"], r["dry_run"]) == ("STOPPING", "j", False)
    assert r["nodes"] == [h.node(e).describe() for e in range(3)]
    for c in stops:
        assert c.result == {"stop": True, "reason": "streaming ended", "job_state": "STOPPING"}
    assert h.journal[-1] == s.StopJobEvent(now=T0 + 3, job="j", reason="streaming ended")

    h.report(0, "stopped")
    h.report(1, "stopped")
    assert h.job().state is J.STOPPING and done.pending
    h.report(2, "stopped", now=T0 + 4)
    job = h.job()
    assert (job.state, job.ended_at, job.stop_reason, job.error) == (J.STOPPED, T0 + 4, "streaming ended", "")
    assert (done.result["state"], done.result["stop_reason"]) == ("STOPPED", "streaming ended")


def test_stop_while_reserving_waits_for_registered_nodes(h: Harness) -> None:
    h.submit()
    h.register(0)
    assert h.stop().result["state"] == "STOPPING"
    assert h.register(1).error.code == "job_stopping"
    assert h.await_cluster(0).error.code == "job_stopping"
    h.report(0, "stopped")
    assert h.job().state is J.STOPPED


def test_stop_while_reserving_releases_pending_cluster_waits(h: Harness) -> None:
    h.submit()
    h.register(0)
    wait = h.await_cluster(0)
    h.stop(reason="cancelled")
    assert wait.error.code == "job_stopping"


def test_stop_of_a_job_without_nodes_is_immediate(h: Harness) -> None:
    h.submit()
    done = h.await_job()
    r = h.stop(now=T0 + 2).result
    assert (r["state"], r["nodes"]) == ("STOPPED", [])
    assert h.job().ended_at == T0 + 2
    assert done.result["state"] == "STOPPED"
    assert h.register(0).error.code == "job_stopped"


def test_a_dry_run_stop_changes_nothing(h: Harness) -> None:
    h.run()
    before, journaled = h.status(), len(h.journal)
    r = h.stop(dry_run=True).result
    assert r == {
        "state": "RUNNING",
        "job": "j",
        "nodes": [h.node(0).describe(), h.node(1).describe()],
        "dry_run": True,
    }
    assert h.status() == before and len(h.journal) == journaled
    assert h.heartbeat(0).result["stop"] is False


def _finish(h: Harness, how: str) -> None:
    h.run()
    if how == "stopping":
        h.stop()
        return
    if how == "stopped":
        h.stop()
    for eid in range(2):
        h.report(eid, how)


@pytest.mark.parametrize("how", ["succeeded", "failed", "stopped", "stopping"])
def test_stopping_a_stopping_or_finished_job_again_changes_nothing(h: Harness, how: str) -> None:
    _finish(h, how)
    before, journaled = h.status(), len(h.journal)
    assert h.stop(reason="again").result["state"] == before["state"]
    assert h.status() == before and len(h.journal) == journaled


# -- deadlines ----------------------------------------------------------------------------


def test_reservation_timeout_names_every_missing_slot(h: Harness) -> None:
    sp = spec(
        ("ps", 1),
        ("chief", 1),
        ("worker", 2),
        reservation_timeout_s=60.0,
        heartbeat_timeout_s=1000.0,
        reconnect_grace_s=2.0,
    )
    h.submit(sp)
    h.register(1, host="chiefhost")
    chief_wait = h.await_cluster(1)
    h.register(2, host="w0host", task_id="5.2.0", now=T0 + 1)
    h.disconnect(node_conn(2), now=T0 + 10)
    h.tick(T0 + 12)  # lost while reserving: its slot is open again
    assert h.job().state is J.RESERVING

    assert h.tick(T0 + 59.999) == []
    h.tick(T0 + 60)
    job = h.job()
    assert job.state is J.FAILED
    assert job.error.splitlines() == [
        "reservation timed out after 60 s: 3 of 4 slots not filled:",
        "  - ps:0 (executor 0): never registered",
        "  - worker:0 (executor 2): attempt 0 registered from host w0host, task 5.2.0, then LOST "
        "(connection lost and not re-established within 2 s (process or host died?))",
        "  - worker:1 (executor 3): never registered",
    ]
    assert chief_wait.error.code == "job_failed" and job.error in chief_wait.error.message
    assert h.journal[-1] == s.ReservationExpired(now=T0 + 60, job="j")


def test_a_huge_reservation_timeout_names_never_registered_slots_as_ranges(h: Harness) -> None:
    """5,000 missing slots would be a 300 KB message; ranges keep every slot named in a few lines."""
    h.submit(spec(("ps", 2), ("worker", 6000), reservation_timeout_s=60.0, heartbeat_timeout_s=1000.0))
    for eid in [0, *range(2, 1002)]:  # ps:0 and worker:0-999 register; ps:1, worker:1000- do not
        h.state.handle(
            s.RegisterNode(
                now=T0,
                req=m.Register(id=1, job="j", executor_id=eid, attempt=0, host=f"host{eid}", port=2000),
            )
        )
    waiting = h.await_cluster(0)
    h.tick(T0 + 60)
    assert h.job().error.splitlines() == [
        "reservation timed out after 60 s: 5001 of 6002 slots not filled:",
        "  - ps:1 (executor 1): never registered",
        "  - worker:1000-5999 (executors 1002-6001): never registered",
    ]
    assert waiting.error.code == "job_failed" and h.job().error in waiting.error.message


def test_missing_slots_beyond_the_line_limit_are_counted_not_dropped_silently(h: Harness) -> None:
    h.submit(
        spec(("worker", 2 * s.MAX_MISSING_LINES + 10), reservation_timeout_s=60.0, heartbeat_timeout_s=1000.0)
    )
    for eid in range(0, 2 * s.MAX_MISSING_LINES + 10, 2):  # every other slot: no two gaps touch
        h.state.handle(
            s.RegisterNode(
                now=T0, req=m.Register(id=1, job="j", executor_id=eid, attempt=0, host="h", port=2000 + eid)
            )
        )
    h.tick(T0 + 60)
    lines = h.job().error.splitlines()
    assert len(lines) == 1 + s.MAX_MISSING_LINES + 1
    assert lines[1] == "  - worker:1 (executor 1): never registered"
    assert lines[-1] == "  - ... and 5 more (tfcoord status j lists every slot)"


def test_an_error_longer_than_a_frame_allows_is_clipped_keeping_its_end(h: Harness) -> None:
    h.submit(spec(("worker", 2)))
    h.register(0)
    h.register(1, host="h" * m.MAX_HOST_LEN, task_id="t" * m.MAX_TEXT_LEN)  # a long description
    wait = h.await_job()
    huge = "x" * m.MAX_ERROR_LEN
    h.report(1, "failed", error=huge[:-40] + "\nValueError: the real reason")
    assert h.job().state is J.FAILED and len(h.job().error) > s.MAX_MESSAGE_LEN  # the job keeps it all
    waiter = h.register(1, attempt=1)  # a late retry is refused with the (clipped) job error
    message = waiter.error.message
    assert len(message) <= s.MAX_MESSAGE_LEN
    assert message.endswith("ValueError: the real reason") and "characters left out" in message
    assert wait.result["state"] == "FAILED"


def test_clip_keeps_short_texts_and_cuts_long_ones_to_the_limit() -> None:
    assert s.clip("short", 100) == "short"
    cut = s.clip("a" * 500 + "b" * 500, 200)
    assert len(cut) <= 200 and cut.startswith("a") and cut.endswith("b" * 50)
    assert "characters left out" in cut


def test_a_tick_before_any_deadline_does_nothing(h: Harness) -> None:
    h.run(spec(("worker", 2), heartbeat_timeout_s=10.0))
    before = h.status()
    assert h.tick(T0 + 9.999) == []
    assert h.status() == before


def test_next_deadline_is_the_earliest_timer(h: Harness) -> None:
    assert h.state.next_deadline() is None
    h.submit(spec(("worker", 2), reservation_timeout_s=100.0, heartbeat_timeout_s=30.0))
    assert h.state.next_deadline() == T0 + 100
    h.register(0, now=T0 + 1)
    assert h.state.next_deadline() == T0 + 31
    h.await_cluster(0, timeout_s=5, now=T0 + 2)
    assert h.state.next_deadline() == T0 + 7
    h.tick(T0 + 7)
    assert h.state.next_deadline() == T0 + 31


def test_a_node_silent_past_the_heartbeat_timeout_is_lost_and_fails_the_job(h: Harness) -> None:
    h.run(spec(("worker", 2), heartbeat_timeout_s=10.0))
    stop = h.await_stop(0)
    h.heartbeat(0, now=T0 + 8)
    assert h.tick(T0 + 9.9) == []
    h.tick(T0 + 10)
    reason = "no heartbeat for 10 s (process hung or host unreachable?)"
    assert (h.node(0).state, h.node(1).state) == (N.RUNNING, N.LOST)
    assert h.job().state is J.FAILED
    assert h.job().error == f"worker:1 (executor 1, host host1) was lost: {reason}"
    assert h.journal[-1] == s.NodeLost(now=T0 + 10, job="j", executor_id=1, attempt=0, reason=reason)
    assert stop.result["stop"] is True


def test_heartbeats_move_a_nodes_deadline_without_piling_up_timer_entries(h: Harness) -> None:
    """A heartbeat only moves the deadline later; the one timer entry catches up when it fires
    (at 10,000 nodes one entry per heartbeat kept 150,000 alive, and GC passes stalled the loop)."""
    h.run(spec(("worker", 2), heartbeat_timeout_s=30.0))
    entries = len(h.state.timers.heap)
    for k in range(1, 200):
        for eid in (0, 1):
            h.heartbeat(eid, now=T0 + k * 0.1)
    assert len(h.state.timers.heap) == entries
    assert h.tick(T0 + 30) == []  # the first entry fires: both nodes were heard from since
    assert h.state.next_deadline() == pytest.approx(T0 + 19.9 + 30)
    h.tick(T0 + 19.9 + 30)
    assert h.job().state is J.FAILED and "no heartbeat for 30 s" in h.job().error


def test_a_connection_not_reestablished_within_the_grace_is_lost(h: Harness) -> None:
    h.run(spec(("worker", 2), reconnect_grace_s=3.0))
    h.disconnect(node_conn(1), now=T0 + 5)
    assert h.tick(T0 + 7.9) == []
    h.tick(T0 + 8)
    assert h.node(1).state is N.LOST
    assert h.job().error == (
        "worker:1 (executor 1, host host1) was lost: connection lost and not "
        "re-established within 3 s (process or host died?)"
    )


@pytest.mark.parametrize("how", ["register", "heartbeat"])
def test_reconnecting_within_the_grace_keeps_the_node(h: Harness, how: str) -> None:
    h.run(spec(("worker", 2), reconnect_grace_s=3.0, heartbeat_timeout_s=30.0))
    h.disconnect(node_conn(1), now=T0 + 5)
    getattr(h, how)(1, conn=77, now=T0 + 7)
    h.tick(T0 + 20)
    assert (h.node(1).state, h.job().state) == (N.RUNNING, J.RUNNING)
    assert h.status()["nodes"][1]["connected"] is True
    h.heartbeat(0, now=T0 + 36)
    h.tick(T0 + 37)  # the ordinary heartbeat deadline still applies
    assert h.node(1).state is N.LOST


def test_a_disconnect_drops_the_pending_waits_of_that_connection(h: Harness) -> None:
    h.submit()
    h.register(0)
    wait = h.await_cluster(0)
    h.disconnect(node_conn(0))
    h.register(0, conn=55)
    h.register(1)
    assert wait.pending  # nobody is left on that connection to answer


def test_a_node_lost_while_reserving_frees_its_slot_for_a_retry(h: Harness) -> None:
    h.submit(spec(("worker", 2), reconnect_grace_s=1.0))
    h.register(0, host="flaky", task_id="2.0.0")
    h.disconnect(node_conn(0), now=T0 + 1)
    h.tick(T0 + 2)
    status = h.status()
    assert (status["state"], status["registered"]) == ("RESERVING", 0)
    assert status["missing"][0] == (
        "worker:0 (executor 0): attempt 0 registered from host flaky, task 2.0.0, "
        "then LOST (connection lost and not re-established within 1 s "
        "(process or host died?))"
    )
    assert [(n["attempt"], n["state"]) for n in status["history"]] == [(0, "LOST")]

    h.register(0, attempt=1, host="steady")
    h.register(1)
    assert h.job().state is J.READY
    assert h.status()["cluster"] == {"worker": ["steady:2000", "host1:2001"]}


def test_a_lost_nodes_pending_cluster_wait_is_answered(h: Harness) -> None:
    h.submit(spec(("worker", 2), heartbeat_timeout_s=10.0))
    h.register(0)
    hung = h.await_cluster(0, timeout_s=60)  # connected, but no more heartbeats
    h.tick(T0 + 10)
    assert h.job().slots[0].node is None
    h.register(0, attempt=1, now=T0 + 11)
    h.register(1, now=T0 + 11)
    h.tick(T0 + 60)
    assert not hung.pending


def test_await_cluster_times_out_listing_what_is_missing(h: Harness) -> None:
    h.submit(PS_WORKERS)
    h.register(1)
    wait = h.await_cluster(1, timeout_s=5)
    h.tick(T0 + 4.9)
    assert wait.pending
    h.tick(T0 + 5)
    assert wait.error.code == "timeout"
    assert wait.error.message == (
        "cluster of job j not complete before the deadline; still missing: "
        "ps:0 (executor 0): never registered; worker:1 (executor 2): never registered"
    )
    assert h.job().state is J.RESERVING


def test_watch_answers_when_the_version_moves_or_at_its_deadline(h: Harness) -> None:
    h.submit()
    v = h.status()["version"]
    watch = h.watch(v, timeout_s=10)
    assert watch.pending
    h.register(0, now=T0 + 1)
    assert watch.result["version"] > v and watch.result["registered"] == 1
    assert h.watch(v).result["version"] > v  # already past: at once

    current = h.status()["version"]
    idle = h.watch(current, timeout_s=10, now=T0 + 2)
    h.tick(T0 + 11.9)
    assert idle.pending
    h.tick(T0 + 12)
    assert idle.result == h.status()


def test_a_brief_watch_answers_with_a_summary_whose_size_does_not_grow(h: Harness) -> None:
    h.submit(spec(("ps", 1), ("worker", 40)))
    full, brief = h.watch(h.job().version), h.watch(h.job().version, brief=True)
    h.register(0)
    got = brief.result
    assert full.result == h.status()  # the two forms wake together, each in its own shape
    assert (got["state"], got["registered"], got["running"], got["missing_count"]) == ("RESERVING", 1, 0, 40)
    assert got["missing"] == [
        f"worker:{i} (executor {i + 1}): never registered" for i in range(s.BRIEF_MISSING)
    ]
    assert "nodes" not in got and "events" not in got and got["brief"] is True
    assert {k: got[k] for k in ("job", "version", "size", "error", "stop_reason")} == {
        k: full.result[k] for k in ("job", "version", "size", "error", "stop_reason")
    }
    for eid in range(1, 41):
        h.register(eid)
    for eid in range(41):
        h.report(eid)
    late = h.watch(0, brief=True).result  # already past: at once
    assert (late["state"], late["running"], late["missing_count"], late["missing"]) == ("RUNNING", 41, 0, [])


def test_await_job_answers_at_the_end_or_times_out(h: Harness) -> None:
    h.run()
    early = h.await_job(timeout_s=10)
    h.tick(T0 + 10)
    assert (early.error.code, early.error.message) == ("timeout", "job j is still RUNNING at the deadline")
    late = h.await_job(timeout_s=100)
    h.report(0, "succeeded")
    assert late.pending
    h.report(1, "succeeded")
    assert late.result == h.status()
    assert h.await_job().result == h.status()  # terminal: at once
    assert h.watch(h.status()["version"]).result == h.status()


def test_await_stop_says_no_stop_at_its_deadline(h: Harness) -> None:
    h.run()
    wait = h.await_stop(0, timeout_s=5)
    h.tick(T0 + 5)
    assert wait.result == {"stop": False, "reason": "", "job_state": "RUNNING"}


def test_jobs_are_isolated(h: Harness) -> None:
    h.run(job="a")
    h.run(job="b")
    b_before = h.status("b")
    b_stop = h.await_stop(0, job="b")
    h.report(0, "failed", job="a", error="boom")
    assert h.job("a").state is J.FAILED
    assert h.status("b") == b_before
    assert b_stop.pending
    assert h.heartbeat(1, job="b").result["stop"] is False


def test_meta_from_a_repeated_running_report_survives_a_restart(h: Harness) -> None:
    h.run()
    h.report(0, meta={"tensorboard": "http://host0:6006"})
    restored = replay(h.journal, now=T0 + 1)
    assert restored.status("j")["nodes"][0]["meta"] == {"tensorboard": "http://host0:6006"}


def test_an_ipv6_node_is_bracketed_in_the_cluster_spec(h: Harness) -> None:
    h.submit()
    h.register(0, host="fd00::7", port=2222)
    h.register(1, host="10.0.0.2", port=2223)
    assert decode_spec(h.await_cluster(0).cluster.spec) == {"worker": ["[fd00::7]:2222", "10.0.0.2:2223"]}


def test_a_nan_in_meta_sent_again_is_no_change(h: Harness) -> None:
    h.run()
    h.heartbeat(0, meta={"loss": float("nan")})
    n, v = len(h.journal), h.job().version
    h.heartbeat(0, meta={"loss": float("nan")})
    assert (len(h.journal), h.job().version) == (n, v)  # not journaled, no watcher woken


def test_a_meta_update_wakes_watchers(h: Harness) -> None:
    h.run()
    v = h.status()["version"]
    watch = h.watch(v)
    h.report(0, meta={"tensorboard": "http://host0:6006"})
    assert h.status()["version"] > v
    assert not watch.pending


# -- status -------------------------------------------------------------------------------

STATUS_KEYS = {
    "job",
    "name",
    "engine",
    "state",
    "version",
    "size",
    "roles",
    "labels",
    "launch",
    "submitted_at",
    "ended_at",
    "error",
    "stop_reason",
    "reason",
    "registered",
    "missing",
    "nodes",
    "history",
    "events",
    "events_dropped",
    "cluster",
    "reports",
    "generation",
    "max_restarts",
    "restarts",
}
NODE_KEYS = {
    "executor_id",
    "attempt",
    "role",
    "index",
    "state",
    "host",
    "port",
    "gpus",
    "task_id",
    "meta",
    "registered_at",
    "last_seen",
    "ended_at",
    "error",
    "connected",
    "figures",
    "usage",
    "generation",
    "exit_code",
}
SUMMARY_KEYS = {"job", "name", "engine", "state", "size", "registered", "submitted_at", "ended_at", "error"}


def test_status_and_summary_shapes(h: Harness) -> None:
    h.submit(spec(("worker", 2), name="demo", engine="spark", labels={"app": "app-1"}))
    h.register(0, gpus=("GPU-0",), task_id="1.0.0", now=T0 + 1)
    st = h.status()
    assert set(st) == STATUS_KEYS
    assert {
        k: st[k] for k in ("job", "name", "engine", "state", "size", "roles", "labels", "registered")
    } == {
        "job": "j",
        "name": "demo",
        "engine": "spark",
        "state": "RESERVING",
        "size": 2,
        "roles": [["worker", 2]],
        "labels": {"app": "app-1"},
        "registered": 1,
    }
    assert (st["submitted_at"], st["ended_at"], st["error"], st["cluster"], st["history"]) == (
        T0,
        None,
        "",
        None,
        [],
    )
    assert st["missing"] == ["worker:1 (executor 1): never registered"]
    assert [text for _, text in st["events"]] == [
        "submitted: 2 worker",
        "job SUBMITTED -> RESERVING",
        "worker:0 REGISTERED from host0:2000 (task 1.0.0)",
    ]
    [node] = st["nodes"]
    assert set(node) == NODE_KEYS
    assert node == {
        "executor_id": 0,
        "attempt": 0,
        "role": "worker",
        "index": 0,
        "state": "REGISTERED",
        "host": "host0",
        "port": 2000,
        "gpus": ["GPU-0"],
        "task_id": "1.0.0",
        "meta": {},
        "registered_at": T0 + 1,
        "last_seen": T0 + 1,
        "ended_at": None,
        "error": "",
        "connected": True,
        "figures": {},
        "usage": {},
        "generation": 0,
        "exit_code": 0,
    }
    assert json.loads(json.dumps(st)) == st  # JSON-able as it is
    assert h.status_call("j").result == st

    [summary] = h.state.summary()
    assert set(summary) == SUMMARY_KEYS
    assert (summary["job"], summary["state"], summary["registered"]) == ("j", "RESERVING", 1)
    assert h.status_call(None).result == {"jobs": h.state.summary()}


def test_status_of_an_unknown_job_is_a_key_error(h: Harness) -> None:
    with pytest.raises(KeyError):
        h.state.status("nope")


# -- life-cycle tables --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "states", "terminal"),
    [(JOB_TRANSITIONS, JobState, s.TERMINAL_JOB), (NODE_TRANSITIONS, NodeState, s.TERMINAL_NODE)],
    ids=["job", "node"],
)
def test_every_transition_outside_the_table_raises(
    table: dict[Any, dict[str, Any]], states: Any, terminal: Any
) -> None:
    assert set(table) == set(states)
    events = sorted({e for row in table.values() for e in row} | {"bogus"})
    for state in states:
        assert (not table[state]) == (state in terminal), state
        for event in events:
            if event in table[state]:
                assert s.next_state(table, state, event) is table[state][event]
            else:
                with pytest.raises(
                    InvalidTransition, match=f"'{event}' is not allowed in state {state.name}"
                ):
                    s.next_state(table, state, event)


def test_the_job_table_matches_the_design() -> None:
    reachable = {(a.name, b.name) for a, row in JOB_TRANSITIONS.items() for b in row.values()}
    assert reachable == {
        ("SUBMITTED", "RESERVING"),
        ("SUBMITTED", "FAILED"),
        ("SUBMITTED", "STOPPED"),
        ("RESERVING", "READY"),
        ("RESERVING", "FAILED"),
        ("RESERVING", "STOPPING"),
        ("READY", "RUNNING"),
        ("READY", "SUCCEEDED"),
        ("READY", "FAILED"),
        ("READY", "STOPPING"),
        ("READY", "RESERVING"),  # a restart: the next generation reserves its slots again
        ("RUNNING", "SUCCEEDED"),
        ("RUNNING", "FAILED"),
        ("RUNNING", "STOPPING"),
        ("RUNNING", "RESERVING"),
        ("STOPPING", "STOPPED"),
        ("STOPPING", "FAILED"),
    }


# -- journal and replay -------------------------------------------------------------------


def scenario_succeeded(h: Harness, job: str = "j") -> None:
    h.run(PS_WORKERS, job)
    h.report(1, "succeeded", job, meta={"steps": 100})
    h.report(2, "succeeded", job)
    h.report(0, "stopped", job)


def scenario_failed(h: Harness, job: str = "j") -> None:
    h.run(PS_WORKERS, job)
    h.report(2, "failed", job, error=TRACEBACK)
    h.report(0, "stopped", job)  # worker 1 stays RUNNING: told to stop, never answered


def scenario_superseded(h: Harness, job: str = "j") -> None:
    h.submit(TWO_WORKERS, job)
    h.register(0, job, host="first", task_id="0.0.0")
    h.disconnect(node_conn(0))  # the first attempt's process died
    h.register(0, job, attempt=1, host="retry", task_id="0.0.1")
    h.register(1, job)
    h.report(0, job=job, attempt=1)
    h.report(1, job=job)  # left RUNNING: recovery must re-arm its liveness deadline


def scenario_reservation_timeout(h: Harness, job: str = "j") -> None:
    h.submit(spec(("ps", 1), ("worker", 2), reservation_timeout_s=60.0, reconnect_grace_s=1.0), job)
    h.register(1, job, host="lost", task_id="7.1.0")
    h.register(2, job)
    h.disconnect(node_conn(1))
    h.now += 2
    h.tick()
    h.now += 60
    h.heartbeat(2, job)  # executor 2 stays alive: only the reservation deadline fires
    h.tick()


def scenario_engine(h: Harness, job: str = "j") -> None:
    """A Mesos job: tasks staged and running, one dies after registering."""
    h.submit(spec(("ps", 1), ("worker", 2), engine="mesos"), job)
    for eid in range(3):
        engine_update(h, eid, "TASK_STAGING", job=job)
        engine_update(h, eid, "TASK_RUNNING", job=job)
    h.register(0, job, task_id=mesos_task(0, job))
    h.register(1, job, task_id=mesos_task(1, job))
    engine_update(h, 2, "TASK_FAILED", "Command exited with status 1", ended=True, job=job)


def scenario_engine_refused(h: Harness, job: str = "j") -> None:
    h.submit(spec(("worker", 1), engine="mesos"), job)
    h.handle(s.EngineJobFailed(now=h.now, job=job, reason="cannot run on Mesos: bad labels"))


SCENARIOS: dict[str, Callable[[Harness, str], None]] = {
    "succeeded": scenario_succeeded,
    "failed": scenario_failed,
    "superseded": scenario_superseded,
    "reservation_timeout": scenario_reservation_timeout,
    "engine": scenario_engine,
    "engine_refused": scenario_engine_refused,
}
JOURNALED_KINDS = {
    s.SubmitJob,
    s.RegisterNode,
    s.ReportNode,
    s.StopJobEvent,
    s.NodeLost,
    s.ReservationExpired,
    s.EngineTaskUpdate,
    s.EngineJobFailed,
    s.CompleteCluster,
}
EXPECTED_STATE = {
    "succeeded": J.SUCCEEDED,
    "failed": J.FAILED,
    "superseded": J.RUNNING,
    "reservation_timeout": J.FAILED,
    "engine": J.FAILED,
    "engine_refused": J.FAILED,
}


def assert_same_jobs(restored: CoordinatorState, original: CoordinatorState) -> None:
    assert restored.jobs.keys() == original.jobs.keys()
    for job_id in original.jobs:
        assert comparable(restored.status(job_id)) == comparable(original.status(job_id))
    assert restored.summary() == original.summary()


@pytest.mark.parametrize("name", SCENARIOS)
def test_replaying_the_journal_rebuilds_every_job(h: Harness, name: str) -> None:
    SCENARIOS[name](h, "j")
    assert h.job().state is EXPECTED_STATE[name]
    assert all(isinstance(e, s.Event) and getattr(e, "waiter", None) is None for e in h.journal)
    assert_same_jobs(replay(h.journal, now=h.now + 500), h.state)


def test_after_a_restart_every_live_node_gets_a_fresh_heartbeat_period(h: Harness) -> None:
    scenario_superseded(h)
    restart = h.now + 500  # far past every deadline the old process had armed
    restored = Harness()
    for ev in h.journal:
        restored.handle(ev)
    restored.handle(s.Recovered(now=restart))
    assert restored.tick(restart + 29.9) == []
    assert restored.job().state is J.RUNNING
    restored.tick(restart + 30)
    assert restored.job().state is J.FAILED
    assert "no heartbeat for 30 s" in restored.job().error


def test_after_a_restart_the_reservation_deadline_still_holds(h: Harness) -> None:
    h.submit(spec(("worker", 2), reservation_timeout_s=60.0, heartbeat_timeout_s=1000.0))
    h.register(0)
    restored = Harness()
    for ev in h.journal:
        restored.handle(ev)
    restored.handle(s.Recovered(now=T0 + 30))
    assert restored.tick(T0 + 59) == []
    restored.tick(T0 + 60)
    assert restored.job().state is J.FAILED
    assert "worker:1 (executor 1): never registered" in restored.job().error


def test_sqlite_journal_round_trip(h: Harness, tmp_path: Path) -> None:
    h.run(job="job-stopping")
    h.stop("job-stopping")
    for name, scenario in SCENARIOS.items():  # one coordinator, every scenario, every kind of event
        scenario(h, f"job-{name}")
    assert {type(e) for e in h.journal} == JOURNALED_KINDS
    half = len(h.journal) // 2

    journal = SqliteJournal(tmp_path / "state")
    for ev in h.journal[:half]:
        journal.append(ev)
    assert journal.commit() >= 0.0
    for ev in h.journal[half:]:
        journal.append(ev)
    journal.set_meta("owner", "unit-test")
    journal.close()  # commits what is pending

    reopened = SqliteJournal(tmp_path / "state")
    try:
        events = list(reopened.replay())
        assert (reopened.get_meta("format"), reopened.get_meta("owner")) == ("tfcoord-journal", "unit-test")
        assert reopened.get_meta("missing") is None
    finally:
        reopened.close()
    assert events == h.journal
    assert_same_jobs(replay(events, now=h.now + 1), h.state)


def test_a_non_empty_foreign_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    with pytest.raises(
        StateDirError,
        match=r"is not empty and holds no tfcoord journal \(found data, notes.txt\); "
        "point --state-dir at an empty or tfcoord directory",
    ):
        SqliteJournal(tmp_path)
    assert not (tmp_path / FILENAME).exists()


def _foreign_database(path: Path, *statements: str) -> None:
    with closing(sqlite3.connect(path)) as db:
        for sql in statements:
            db.execute(sql)
        db.commit()


def test_a_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    _foreign_database(tmp_path / FILENAME, "CREATE TABLE accounts (id INTEGER)")
    with pytest.raises(
        StateDirError, match=r"is an SQLite database but not a tfcoord journal \(no such table: meta\)"
    ):
        SqliteJournal(tmp_path)


def test_a_sqlite_database_with_someone_elses_meta_table_is_refused(tmp_path: Path) -> None:
    _foreign_database(
        tmp_path / FILENAME,
        "CREATE TABLE meta (key TEXT, value TEXT)",
        "INSERT INTO meta VALUES ('format', 'other-tool')",
    )
    with pytest.raises(StateDirError, match="is an SQLite database but not a tfcoord journal"):
        SqliteJournal(tmp_path)


def test_a_foreign_database_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    _foreign_database(path, "CREATE TABLE accounts (id INTEGER)")
    content = path.read_bytes()
    with pytest.raises(StateDirError):
        SqliteJournal(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILENAME]
    assert path.read_bytes() == content


def test_a_garbage_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / FILENAME).write_bytes(b"this is not an SQLite database\n" * 64)
    with pytest.raises(
        StateDirError,
        match=r"is not a readable tfcoord journal \(file is not a database\); "
        "it may be corrupt. Move it aside",
    ):
        SqliteJournal(tmp_path)


def finish(h: Harness, job: str, now: float) -> None:
    """Submit a one-worker job and run it to SUCCEEDED at ``now``."""
    h.submit(spec(("worker", 1)), job, now=now)
    h.register(0, job, now=now)
    h.report(0, "succeeded", job, now=now)
    assert h.state.jobs[job].state is J.SUCCEEDED


def test_finished_jobs_beyond_the_count_are_forgotten_after_the_grace() -> None:
    h = Harness()
    h.state = CoordinatorState(keep_finished=2, keep_finished_s=10 * s.FORGET_GRACE_S)
    for i, job in enumerate(("a", "b", "c")):
        finish(h, job, T0 + i)
    assert set(h.state.jobs) == {"a", "b", "c"}  # three kept: "a" ended less than the grace ago
    assert h.tick(T0 + s.FORGET_GRACE_S - 0.1) == []
    assert s.Forget("a") in h.tick(T0 + s.FORGET_GRACE_S)
    assert set(h.state.jobs) == {"b", "c"}
    assert h.status_call("a").error.code == "unknown_job"
    assert [j["job"] for j in h.status_call(None).result["jobs"]] == ["b", "c"]


def test_finished_jobs_are_forgotten_at_their_age_running_ones_never() -> None:
    h = Harness()
    h.state = CoordinatorState(keep_finished=100, keep_finished_s=60.0)
    finish(h, "old", T0)
    h.submit(spec(("worker", 1)), "live", now=T0)
    h.register(0, "live", now=T0)
    h.report(0, "running", "live", now=T0)
    h.heartbeat(0, "live", now=T0 + 50)
    effects = h.tick(T0 + 60)
    assert s.Forget("old") in effects and set(h.state.jobs) == {"live"}
    h.heartbeat(0, "live", now=T0 + 100)
    h.tick(T0 + 120)
    assert set(h.state.jobs) == {"live"}


def test_a_forgotten_job_leaves_the_journal_and_a_replay(tmp_path: Path) -> None:
    h = Harness()
    h.state = CoordinatorState(keep_finished=1, keep_finished_s=1000.0)
    journal = SqliteJournal(tmp_path)
    try:
        for i, job in enumerate(("a", "b")):
            finish(h, job, T0 + i)
        for event in h.journal:
            journal.append(event)
        journal.commit()
        for eff in h.tick(T0 + s.FORGET_GRACE_S):
            if isinstance(eff, s.Forget):
                journal.forget(eff.job)
        journal.commit()
        events = list(journal.replay())
    finally:
        journal.close()
    assert events and {event_job(e) for e in events} == {"b"}
    assert set(replay(events, now=T0 + s.FORGET_GRACE_S).jobs) == {"b"}


async def test_a_restart_with_a_lower_keep_forgets_the_excess_and_their_records(tmp_path: Path) -> None:
    import asyncio

    from tfcoord.coordinator.server import CoordinatorServer, ServerConfig

    h = Harness()
    for i, job in enumerate(("a", "b", "c")):
        finish(h, job, T0 + i)  # long ago: T0 is in 1970
    journal = SqliteJournal(tmp_path)
    for event in h.journal:
        journal.append(event)
    journal.commit()
    config = ServerConfig(secret=b"s" * 32, keep_finished_jobs=1, keep_finished_s=1e12)  # by count only
    server = CoordinatorServer(config, journal=journal)
    forgotten = asyncio.Event()

    class Watch:
        def on_effects(self, event: s.Event, effects: Any) -> None:
            if any(isinstance(e, s.Forget) for e in effects):
                forgotten.set()

        def on_commit(self, seconds: float) -> None:
            pass

    server.observers.append(Watch())
    server.recover()
    assert set(server.state.jobs) == {"a", "b", "c"}
    await server.start()  # its first Tick carries out what came due while it was down
    try:
        async with asyncio.timeout(10):
            await forgotten.wait()
        assert set(server.state.jobs) == {"c"}
    finally:
        await server.close()  # commits, closes the journal
    reopened = SqliteJournal(tmp_path)
    try:
        assert {e.job for e in reopened.replay() if isinstance(e, s.SubmitJob)} == {"c"}
    finally:
        reopened.close()


def test_a_first_start_killed_before_it_made_its_tables_starts_afresh(h: Harness, tmp_path: Path) -> None:
    # What a kill -9 during the very first start leaves: the file, in WAL mode, with no tables
    # (the tables and the format rows are made in one transaction).
    _foreign_database(tmp_path / FILENAME, "PRAGMA journal_mode=WAL")
    journal = SqliteJournal(tmp_path)
    try:
        h.submit()
        for event in h.journal:
            journal.append(event)
        journal.commit()
    finally:
        journal.close()
    reopened = SqliteJournal(tmp_path)
    try:
        assert list(reopened.replay()) == h.journal
    finally:
        reopened.close()


def test_a_write_ahead_log_without_its_journal_is_refused(tmp_path: Path) -> None:
    (tmp_path / f"{FILENAME}-wal").write_bytes(b"\x37\x7f\x06\x82" + bytes(60))
    with pytest.raises(StateDirError, match=rf"{FILENAME} is missing but {FILENAME}-wal is there.*Put "):
        SqliteJournal(tmp_path)
    assert not (tmp_path / FILENAME).exists()


def test_a_journal_of_another_format_version_is_refused(tmp_path: Path) -> None:
    SqliteJournal(tmp_path).close()
    _foreign_database(tmp_path / FILENAME, "UPDATE meta SET value = '1' WHERE key = 'format_version'")
    with pytest.raises(StateDirError, match="has journal format 1, this tfcoord reads 2"):
        SqliteJournal(tmp_path)


def test_an_unreadable_record_is_reported_by_number(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    journal.append(s.SubmitJob(now=T0, job="j", spec=TWO_WORKERS))
    journal.close()
    _foreign_database(
        tmp_path / FILENAME, "INSERT INTO events (job, kind, body) VALUES ('j', 'SubmitJob', X'C1')"
    )
    reopened = SqliteJournal(tmp_path)
    try:
        replayed = reopened.replay()
        assert next(replayed) == s.SubmitJob(now=T0, job="j", spec=TWO_WORKERS)
        with pytest.raises(StateDirError, match=r"journal record 2 in .* is unreadable"):
            next(replayed)
    finally:
        reopened.close()


# -- engines (Mesos) ----------------------------------------------------------------------

MESOS_PS_WORKERS = spec(("ps", 1), ("worker", 2), engine="mesos")


def mesos_task(eid: int, job: str = "j", attempt: int = 0) -> str:
    return f"tfcoord.{job}.{eid}.{attempt}"


def engine_update(
    h: Harness,
    eid: int,
    state: str,
    message: str = "",
    *,
    ended: bool = False,
    job: str = "j",
    task_id: str | None = None,
    now: float | None = None,
) -> list[s.Effect]:
    return h.handle(
        s.EngineTaskUpdate(
            now=h.now if now is None else now,
            job=job,
            executor_id=eid,
            task_id=mesos_task(eid, job) if task_id is None else task_id,
            state=state,
            message=message,
            ended=ended,
        )
    )


def test_engine_updates_are_journaled_and_shown_with_a_missing_slot(h: Harness) -> None:
    h.submit(MESOS_PS_WORKERS)
    engine_update(h, 0, "TASK_STAGING", "launching on agent-1:31000")
    engine_update(h, 1, "TASK_RUNNING")
    assert [type(e) for e in h.journal] == [s.SubmitJob, s.EngineTaskUpdate, s.EngineTaskUpdate]
    assert h.status()["missing"] == [
        "ps:0 (executor 0): never registered; mesos task tfcoord.j.0.0 TASK_STAGING (launching on agent-1:31000)",
        "worker:0 (executor 1): never registered; mesos task tfcoord.j.1.0 TASK_RUNNING",
        "worker:1 (executor 2): never registered",
    ]
    assert h.status()["events"][-1][1] == "worker:0 mesos task tfcoord.j.1.0 TASK_RUNNING"
    assert h.job().state is J.SUBMITTED


def test_an_unplaceable_slot_says_why_in_the_status(h: Harness) -> None:
    h.submit(MESOS_PS_WORKERS)
    watch = h.watch(h.job().version)
    engine_update(
        h, 2, "UNPLACED", "no offer can ever fit it: needs 8 GPUs, the largest offer had 2", task_id=""
    )
    assert not watch.pending  # the driver hears of it at once
    assert h.status()["missing"][2] == (
        "worker:1 (executor 2): never registered; mesos: no offer can ever fit it: needs 8 GPUs, the largest offer had 2"
    )


def test_the_reservation_timeout_names_the_mesos_tasks_and_their_last_state(h: Harness) -> None:
    h.submit(spec(("ps", 1), ("worker", 1), engine="mesos", reservation_timeout_s=60.0))
    engine_update(h, 0, "TASK_STAGING")
    engine_update(h, 0, "TASK_STARTING")
    h.register(1, task_id=mesos_task(1))
    h.tick(T0 + 60)
    assert h.job().state is J.FAILED
    assert "ps:0 (executor 0): never registered; mesos task tfcoord.j.0.0 TASK_STARTING" in h.job().error


def test_a_task_that_dies_before_registering_fails_the_job_at_once(h: Harness) -> None:
    h.submit(MESOS_PS_WORKERS)
    h.register(0, task_id=mesos_task(0))
    cluster = h.await_cluster(0)
    engine_update(h, 1, "TASK_FAILED", "Command exited with status 127", ended=True)
    assert h.job().state is J.FAILED
    assert h.job().error == (
        "worker:0 (executor 1) never registered: mesos task tfcoord.j.1.0 ended TASK_FAILED: Command exited with status 127"
    )
    assert cluster.error.code == "job_failed"  # the waiting node learns at once


@pytest.mark.parametrize(
    "state", ["TASK_FAILED", "TASK_LOST", "TASK_ERROR", "TASK_DROPPED", "TASK_GONE", "TASK_KILLED"]
)
def test_a_task_that_dies_after_registering_fails_its_node_and_the_job(h: Harness, state: str) -> None:
    h.submit(MESOS_PS_WORKERS)
    for eid in range(3):
        h.register(eid, task_id=mesos_task(eid))
    stop = h.await_stop(0)
    engine_update(h, 2, state, "agent lost", ended=True)
    assert (
        h.node(2).state is N.FAILED
        and h.node(2).error == f"mesos task tfcoord.j.2.0 ended {state}: agent lost"
    )
    assert h.job().state is J.FAILED
    assert h.job().error.startswith(
        "worker:1 (executor 2, host host2, task tfcoord.j.2.0) failed: mesos task"
    )
    assert stop.result["stop"] is True


def test_a_tolerated_roles_task_death_leaves_the_job_running(h: Harness) -> None:
    h.submit(spec(("evaluator", 1), ("worker", 1), engine="mesos", tolerate_failure=("evaluator",)))
    for eid in range(2):
        h.register(eid, task_id=mesos_task(eid))
    for eid in range(2):
        h.report(eid)
    engine_update(h, 0, "TASK_LOST", ended=True)
    assert h.node(0).state is N.FAILED
    assert h.job().state is J.RUNNING


def test_a_task_killed_while_the_job_stops_is_a_stopped_node(h: Harness) -> None:
    h.submit(MESOS_PS_WORKERS)
    for eid in range(3):
        h.register(eid, task_id=mesos_task(eid))
    for eid in range(3):
        h.report(eid)
    h.stop()
    h.report(0, "stopped")
    h.report(1, "stopped")
    engine_update(h, 2, "TASK_KILLED", "killed", ended=True)
    assert h.node(2).state is N.STOPPED
    assert h.job().state is J.STOPPED


def test_an_unregistered_slot_ending_while_the_job_stops_changes_nothing_more(h: Harness) -> None:
    h.submit(MESOS_PS_WORKERS)
    h.register(0, task_id=mesos_task(0))
    h.stop()
    engine_update(h, 1, "TASK_KILLED", ended=True)
    assert h.job().state is J.STOPPING and not h.job().error


def test_updates_about_another_task_or_an_ended_job_are_ignored(h: Harness) -> None:
    h.submit(MESOS_PS_WORKERS)
    h.register(0, task_id=mesos_task(0, attempt=1))
    n = len(h.journal)
    assert engine_update(h, 0, "TASK_FAILED", ended=True) == []  # attempt 0: not the registered task
    assert h.node(0).state is N.REGISTERED
    h.handle(s.EngineJobFailed(now=h.now, job="j", reason="the Mesos framework has stopped"))
    assert engine_update(h, 1, "TASK_KILLED", ended=True) == []
    assert engine_update(h, 1, "TASK_RUNNING", job="nope") == []
    assert engine_update(h, 7, "TASK_RUNNING") == []
    assert [type(e) for e in h.journal[n:]] == [s.EngineJobFailed]


def test_a_finished_task_of_a_node_that_already_reported_changes_nothing(h: Harness) -> None:
    h.submit(spec(("worker", 1), engine="mesos"))
    h.register(0, task_id=mesos_task(0))
    h.report(0)
    h.report(0, "succeeded")
    assert h.job().state is J.SUCCEEDED
    assert engine_update(h, 0, "TASK_FINISHED", ended=True) == []


def test_an_engine_failure_fails_the_job_once(h: Harness) -> None:
    h.submit(MESOS_PS_WORKERS)
    waiter = h.await_job()
    h.handle(s.EngineJobFailed(now=h.now, job="j", reason="the Mesos master refused our credentials"))
    assert h.job().state is J.FAILED and h.job().error == "the Mesos master refused our credentials"
    assert waiter.result["state"] == "FAILED"
    assert h.handle(s.EngineJobFailed(now=h.now, job="j", reason="again")) == []
    assert h.job().error == "the Mesos master refused our credentials"


# -- bounds and authority (issue 16) --------------------------------------------------------


def test_a_live_heartbeating_holder_cannot_be_displaced(h: Harness) -> None:
    """Attack 8: a second holder of the job token registering a higher attempt over a
    connected, heartbeating node would rewrite the cluster spec every worker receives."""
    h.submit()
    h.register(0, host="10.0.0.1")
    h.now += 5
    h.heartbeat(0)
    err = h.register(0, attempt=7, host="203.0.113.66", conn=4242).error
    assert err.code == "slot_held" and "connected and heartbeating" in err.message
    h.register(1)
    spec_ = decode_spec(h.await_cluster(0).cluster.spec)
    assert spec_ == {"worker": ["10.0.0.1:2000", "host1:2001"]}
    # Once the holder's connection is gone, a retry may take the slot (a Spark task retry).
    h2 = Harness()
    h2.submit()
    h2.register(0, host="10.0.0.1")
    h2.disconnect(node_conn(0))
    assert h2.register(0, attempt=1, host="10.0.0.9").result["index"] == 0


def test_attempts_history_and_timeline_of_a_slot_are_bounded(h: Harness) -> None:
    """Attack 2: re-registering a slot in a loop with full-size fields grew the job's
    history, timeline and journal without bound, until its status no longer fit a frame."""
    h.submit()
    big = "x" * m.MAX_TEXT_LEN
    refused = 0
    for attempt in range(300):
        call = h.register(0, attempt=attempt, host=f"h{attempt}", task_id=big)
        if isinstance(call.msg, m.Error):
            assert call.msg.code == "too_many_attempts", call.msg
            refused += 1
        else:
            h.disconnect(node_conn(0, attempt))
    assert refused == 300 - s.MAX_ATTEMPTS_PER_SLOT
    slot = h.job().slots[0]
    assert len(slot.history) == s.MAX_HISTORY_PER_SLOT
    assert slot.node is not None and slot.node.attempt == s.MAX_ATTEMPTS_PER_SLOT - 1
    assert len(h.job().events) <= s.TIMELINE_BASE + s.TIMELINE_PER_SLOT * 2
    assert len(protocol.pack(h.status())) < 128 * 1024
    journaled = sum(1 for ev in h.journal if isinstance(ev, s.RegisterNode))
    assert journaled == s.MAX_ATTEMPTS_PER_SLOT
    h.state.validate()


def test_the_timeline_drops_its_oldest_lines_and_counts_them(h: Harness) -> None:
    h.submit(spec(("worker", 1), reservation_timeout_s=60.0, heartbeat_timeout_s=5.0))
    for i in range(2000):
        h.handle(s.EngineTaskUpdate(now=h.now, job="j", executor_id=0, task_id="t", state=f"S{i}"))
    job = h.job()
    assert len(job.events) <= s.TIMELINE_BASE + s.TIMELINE_PER_SLOT
    assert job.events_dropped + len(job.events) == 2001
    assert job.events[-1][1].endswith("S1999")


def test_merged_node_metadata_is_bounded(h: Harness) -> None:
    h.form()
    for i in range(100):
        meta = {f"k{i}-{j}": "v" * 1000 for j in range(m.MAX_META_ENTRIES)}
        h.heartbeat(0, meta=meta)
    meta = h.node(0).meta
    assert len(meta) <= m.MAX_META_ENTRIES and s.meta_chars(meta) <= s.MAX_META_CHARS
    assert "k99-31" in meta  # the newest keys stay
    h.state.validate()


def test_removed_waits_leave_the_timer_heap(h: Harness) -> None:
    """Attack 4: waits removed on disconnect kept their heap entries until their deadline
    (7 days for await_stop): 200 rounds of connect, wait, disconnect left 12,600 entries."""
    h.form()
    for round_ in range(200):
        conn = 50_000 + round_
        for i in range(63):
            h.handle(
                s.AwaitJobEvent(
                    now=h.now, req=m.AwaitJob(id=i + 1, job="j", timeout_s=7 * 86400.0), waiter=(conn, i + 1)
                )
            )
        h.disconnect(conn)
    assert len(h.state.waits.pending) == 0
    assert len(h.state.timers.heap) <= 2 * s.STALE_TIMER_SLACK + 16
    h.state.validate()


# -- failure reasons ----------------------------------------------------------------------
# Why a job did not succeed is data (``reason``), so no caller searches its error text.


def _reason(h: Harness) -> str:
    status = h.status()
    assert status["reason"] == h.state.brief("j")["reason"] == h.job().reason
    return status["reason"]


def test_a_running_job_has_no_failure_reason(h: Harness) -> None:
    h.run()
    assert _reason(h) == FailureReason.NONE == ""


def test_a_node_failure_is_the_reason(h: Harness) -> None:
    h.run()
    h.report(1, "failed", error="Traceback ...\nValueError: boom")
    assert _reason(h) == FailureReason.NODE_FAILED


def test_a_node_that_stops_unasked_is_a_node_failure(h: Harness) -> None:
    h.run()
    h.report(0, "stopped")
    assert _reason(h) == FailureReason.NODE_FAILED


def test_a_lost_node_is_the_reason(h: Harness) -> None:
    h.run()
    h.tick(T0 + 1000)
    assert _reason(h) == FailureReason.NODE_LOST


def test_a_reservation_timeout_is_the_reason_and_is_logged_as_data(h: Harness) -> None:
    h.submit(spec(("worker", 2), reservation_timeout_s=60.0))
    effects = h.tick(T0 + 60)
    assert _reason(h) == FailureReason.RESERVATION_TIMEOUT
    [failed] = [e for e in effects if isinstance(e, s.Log) and e.state == J.FAILED and not e.node]
    assert failed.reason == FailureReason.RESERVATION_TIMEOUT


def test_a_restart_after_the_cluster_formed_is_the_reason(h: Harness) -> None:
    h.run()
    h.register(0, attempt=1)
    assert _reason(h) == FailureReason.MEMBERSHIP_CHANGED


def test_an_engine_giving_up_is_the_reason(h: Harness) -> None:
    h.submit()
    h.handle(s.EngineJobFailed(now=T0 + 1, job="j", reason="no offer can ever fit"))
    assert _reason(h) == FailureReason.ENGINE_FAILED


def test_a_stop_carries_its_cause_through_the_journal(h: Harness) -> None:
    h.run()
    h._call(
        DRIVER,
        lambda w: s.StopJobEvent(
            now=T0 + 1, job="j", reason="the Spark job failed", cause=FailureReason.ENGINE_FAILED, waiter=w
        ),
    )
    assert _reason(h) == FailureReason.ENGINE_FAILED
    [stop] = [e for e in h.journal if isinstance(e, s.StopJobEvent)]
    assert decode_event(*encode_event(stop)) == stop
    # A journal written before stops had a cause replays as a requested stop.
    legacy = pack({"job": "j", "reason": "enough", "now": T0})
    assert decode_event("StopJobEvent", legacy).cause is FailureReason.STOPPED
    assert replay(h.journal, now=T0 + 2).jobs["j"].reason == FailureReason.ENGINE_FAILED


def test_a_plain_stop_is_the_reason(h: Harness) -> None:
    h.run()
    h.stop()
    assert _reason(h) == FailureReason.STOPPED


# -- progress figures (ctx.report) ---------------------------------------------------------


def test_progress_shows_in_status_and_series_and_is_not_journaled(h: Harness) -> None:
    h.run()
    before = len(h.journal)
    assert h.progress(0, figures={"step": 1, "loss": 0.5}).result == {}
    h.progress(0, figures={"step": 2, "loss": 0.25}, now=T0 + 1)
    assert len(h.journal) == before  # figures are for watching: a restart shows the next ones
    nodes = h.state.status("j")["nodes"]
    assert nodes[0]["figures"] == {"step": 2, "loss": 0.25} and nodes[1]["figures"] == {}
    series = h.state.series("j")
    assert series["nodes"] == [
        {
            "executor_id": 0,
            "role": "worker",
            "index": 0,
            "points": [[T0, {"step": 1, "loss": 0.5}], [T0 + 1, {"step": 2, "loss": 0.25}]],
        }
    ]
    assert h.state.series("j", since=T0)["nodes"][0]["points"] == [[T0 + 1, {"step": 2, "loss": 0.25}]]


def test_usage_shows_apart_from_the_figures_while_the_node_runs(h: Harness) -> None:
    h.run()
    before = len(h.journal)
    h.progress(0, figures={"step": 3})
    h.progress(0, figures={}, usage={"cpu_percent": 87.5, "rss_bytes": 2**30}, now=T0 + 1)
    assert len(h.journal) == before
    node = h.state.status("j")["nodes"][0]
    assert node["figures"] == {"step": 3}  # usage neither replaces nor joins the work's figures
    assert node["usage"] == {"cpu_percent": 87.5, "rss_bytes": 2**30}
    assert [f for _, f in h.state.series("j")["nodes"][0]["points"]] == [{"step": 3}]
    h.report(0, "succeeded")
    assert h.state.status("j")["nodes"][0]["usage"] == {}  # an ended node uses nothing


def test_a_watch_with_reports_is_answered_by_progress(h: Harness) -> None:
    h.run()
    st = h.state.status("j")
    plain = h.watch(st["version"])
    counted = h.watch(st["version"], reports=st["reports"])
    assert plain.pending and counted.pending
    h.progress(1, figures={"loss": 0.5})
    assert plain.pending  # a watch for changes only is not woken by figures
    assert counted.result["nodes"][1]["figures"] == {"loss": 0.5}
    assert counted.result["reports"] == st["reports"] + 1
    # Reports already past the count answer at once.
    assert h.watch(st["version"], reports=st["reports"]).result["reports"] == st["reports"] + 1
    assert h.watch(st["version"], reports=st["reports"] + 1).pending


def test_progress_from_a_superseded_attempt_is_refused(h: Harness) -> None:
    h.run()
    assert h.progress(0, attempt=3, figures={"step": 1}).error.code == "not_registered"
    assert h.state.series("j")["nodes"] == []


def test_progress_series_are_bounded_and_thinned_when_the_job_ends(h: Harness, monkeypatch) -> None:
    h.run()
    for i in range(s.SERIES_POINTS_PER_NODE + 50):
        h.progress(0, figures={"step": i}, now=T0 + i)
    points = h.state.series("j")["nodes"][0]["points"]
    assert len(points) == s.SERIES_POINTS_PER_NODE and points[-1][1] == {
        "step": s.SERIES_POINTS_PER_NODE + 49
    }
    # The same bounds at a smaller scale: a job's points are shared by its nodes.
    monkeypatch.setattr(telemetry, "SERIES_POINTS_PER_JOB", 400)
    monkeypatch.setattr(telemetry, "SERIES_POINTS_FINISHED", 100)
    h.run(spec(("worker", 40)), job="big")
    for t in range(30):
        for eid in range(40):
            h.progress(eid, job="big", figures={"step": t}, now=T0 + t)
    assert [len(n["points"]) for n in h.state.series("big")["nodes"]] == [10] * 40
    for eid in range(40):
        h.report(eid, "succeeded", job="big")
    assert h.job("big").terminal
    kept = h.state.series("big")["nodes"]
    assert [len(n["points"]) for n in kept] == [2] * 40  # 100 points in all, at least first and last
    assert all(n["points"][-1][1] == {"step": 29} for n in kept)  # the final figures stay
    h.progress(0, job="big", figures={"step": 99})  # answered, not kept: the series are final
    assert h.state.series("big")["nodes"][0]["points"][-1][1] == {"step": 29}


def test_progress_figures_are_checked_on_the_wire() -> None:
    ids = {"id": 1, "job": "j", "executor_id": 0, "attempt": 0}
    for bad in (
        {},
        {"x" * 40: 1},
        {"loss": float("nan")},
        {"ok": True},
        {"a": "1"},
        {f"f{i}": i for i in range(17)},
    ):
        with pytest.raises(m.RemoteProtocolError):
            m.decode({"op": "progress", **ids, "figures": bad})
    with pytest.raises(m.RemoteProtocolError, match="no figures and no usage"):
        m.decode({"op": "progress", **ids, "figures": {}, "usage": {}})
    with pytest.raises(m.RemoteProtocolError):
        m.decode({"op": "progress", **ids, "figures": {}, "usage": {f"u{i}": i for i in range(9)}})
    assert m.decode({"op": "progress", **ids, "figures": {}, "usage": {"rss_bytes": 5}}).usage == {
        "rss_bytes": 5
    }
    assert m.decode({"op": "progress", **ids, "figures": {"loss": 0.5, "step": 3}}).figures == {
        "loss": 0.5,
        "step": 3,
    }


# -- node output (tfcoord logs) -------------------------------------------------------------


def test_node_output_is_kept_numbered_and_read_from_a_line_on(h: Harness) -> None:
    h.run()
    before = len(h.journal)
    assert h.node_logs(0, "hello", "world").result == {}
    h.node_logs(1, "oops", stream="stderr", now=T0 + 1)
    h.node_logs(0, "again", now=T0 + 2)
    assert len(h.journal) == before  # output is not journaled
    got = h.state.logs("j")
    assert got["lines"] == [
        [0, T0, 0, "stdout", "hello"],
        [1, T0, 0, "stdout", "world"],
        [2, T0 + 1, 1, "stderr", "oops"],
        [3, T0 + 2, 0, "stdout", "again"],
    ]
    assert got["next"] == 4 and [n["dropped"] for n in got["nodes"]] == [0, 0]
    assert [x[4] for x in h.state.logs("j", executor_id=0, since=1)["lines"]] == ["world", "again"]
    page = h.state.logs("j", limit=3)
    assert len(page["lines"]) == 3 and page["next"] == 3
    assert h.state.logs("j", since=4)["lines"] == [] and h.state.logs("j", since=4)["next"] == 4
    answer = h.handle(s.GetLogsEvent(now=h.now, req=m.GetLogs(id=1, job="j", since=3), waiter=(900, 1)))
    assert [e.msg.result["lines"] for e in answer if isinstance(e, s.Send)] == [
        [[3, T0 + 2, 0, "stdout", "again"]]
    ]


def test_node_output_is_bounded_with_the_drops_counted(h: Harness, monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "LOG_LINES_PER_NODE", 100)
    monkeypatch.setattr(telemetry, "LOG_LINES_FINISHED", 100)
    h.run()
    for i in range(5):
        h.node_logs(0, *(f"line {i * 50 + j}" for j in range(50)), dropped=2 if i == 4 else 0)
    got = h.state.logs("j", executor_id=0)
    assert len(got["lines"]) == 100 and got["lines"][-1][4] == "line 249" and got["lines"][0][4] == "line 150"
    assert got["nodes"][0]["dropped"] == 150 + 2  # by the bound here, and by the node itself
    assert h.progress(0, attempt=5, figures={"x": 1}).error.code == "not_registered"
    assert h.node_logs(0, "forged", attempt=5).error.code == "not_registered"
    h.node_logs(1, "one line")  # two nodes share what a finished job keeps
    h.report(0, "succeeded")
    h.report(1, "succeeded")
    assert h.job().terminal
    kept = h.state.logs("j", executor_id=0)
    assert (
        len(kept["lines"]) == 50 and kept["nodes"][0]["dropped"] == 152 + 50
    )  # 100 shared by 2 nodes... at least 50 each
    h.node_logs(0, "late words")  # kept after the end too, within the bound
    assert h.state.logs("j", executor_id=0)["lines"][-1][4] == "late words"


def test_log_lines_with_control_characters_or_too_long_are_refused_on_the_wire() -> None:
    ids = {"id": 1, "job": "j", "executor_id": 0, "attempt": 0, "stream": "stdout"}
    for bad in ([], ["two\nlines"], ["\x1b[31mred"], ["cr\r"], ["x" * (m.MAX_LOG_LINE + 1)], ["l"] * 257):
        with pytest.raises(m.RemoteProtocolError):
            m.decode({"op": "node_logs", **ids, "lines": bad})
    with pytest.raises(m.RemoteProtocolError):
        m.decode({"op": "node_logs", **{**ids, "stream": "stdin"}, "lines": ["a"]})
    assert m.decode({"op": "node_logs", **ids, "lines": ["tab\tok"]}).lines == ("tab\tok",)
