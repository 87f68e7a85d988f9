"""The coordinator's answers, typed: decoded once, in the blocking client, from a reply's map.

A :class:`~tfcoord.client.messages.Reply` carries its result as a plain map (the wire
stays one msgpack map per frame). :class:`~tfcoord.client.client.DriverClient` and
:class:`~tfcoord.client.client.NodeClient` turn each result into one of the frozen
classes here, so callers read ``status.state`` (a :class:`~tfcoord.client.vocab.JobState`)
instead of ``result["state"]`` (a string). A result that lacks a field or holds one of
the wrong type is a :class:`~tfcoord.client.errors.RemoteProtocolError`, raised where
it arrived rather than as a ``KeyError`` somewhere downstream.

Each class is also a read-only mapping over the map it was decoded from (``wire``), the
form ``tfcoord status --json`` prints and that programs written against tfcoord 0.1's
dictionaries read; code in tfcoord itself reads the attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import RemoteProtocolError
from .vocab import FailureReason, JobState, NodeState

_R = TypeVar("_R", bound="_Decoded")

#: Node metadata written by the node runtime: the TensorBoard URL (pushed once TensorBoard
#: answers) and what map_fun returned (``result.NAME`` per entry of the dict it returned).
TENSORBOARD_META = "tensorboard_url"
#: ... and TensorBoard's process id, from registration on.
TENSORBOARD_PID_META = "tensorboard_pid"
RESULT_META = "result."


@dataclass(frozen=True, eq=False)
class _Decoded(Mapping[str, Any]):
    """A typed answer that also reads as the map it came from (equal to it, too)."""

    wire: Mapping[str, Any] = field(repr=False)

    def __getitem__(self, key: str) -> Any:
        return self.wire[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.wire)

    def __len__(self) -> int:
        return len(self.wire)

    @classmethod
    def decode(cls: type[_R], wire: Any) -> _R:
        """Build from a reply's result map.

        Raises:
            RemoteProtocolError: a field is missing or holds a value of the wrong kind.
        """
        if not isinstance(wire, Mapping):
            raise RemoteProtocolError(f"a {cls.__name__} must be a map, not {type(wire).__name__}")
        try:
            return cls._from(wire)
        except (KeyError, TypeError, ValueError) as e:
            raise RemoteProtocolError(f"the coordinator sent a malformed {cls.__name__}: {e!r}") from None

    @classmethod
    def _from(cls: type[_R], w: Mapping[str, Any]) -> _R:
        raise NotImplementedError


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True, eq=False, kw_only=True)
class NodeStatus(_Decoded):
    """One node of a job as the coordinator sees it."""

    executor_id: int
    attempt: int
    role: str
    index: int
    state: NodeState
    host: str
    port: int
    gpus: tuple[str, ...]
    task_id: str
    #: What the node says about itself: TensorBoard URL, child pid, feed address, results.
    meta: Mapping[str, Any]
    registered_at: float
    last_seen: float
    ended_at: float | None
    #: Its error text (a traceback), or why it was lost or stopped.
    error: str
    connected: bool

    @property
    def name(self) -> str:
        """``role:index``, the slot's name in the cluster spec."""
        return f"{self.role}:{self.index}"

    @property
    def live(self) -> bool:
        return not self.state.terminal

    @property
    def results(self) -> dict[str, Any]:
        """What the node's function returned (its ``result.*`` metadata), by name."""
        return {k.removeprefix(RESULT_META): v for k, v in self.meta.items() if k.startswith(RESULT_META)}

    @property
    def figures(self) -> dict[str, int | float]:
        """The latest progress figures its work reported (``ctx.report``); empty before the
        first, and from a coordinator that does not keep them."""
        f = self.wire.get("figures")
        return dict(f) if isinstance(f, Mapping) else {}

    @property
    def usage(self) -> dict[str, int | float]:
        """What its supervisor last measured of its work while it ran: ``cpu_percent``
        (100 is one core), ``rss_bytes``, ``processes``; empty before the first and once it ended."""
        u = self.wire.get("usage")
        return dict(u) if isinstance(u, Mapping) else {}

    @property
    def tensorboard_url(self) -> str | None:
        url = self.meta.get(TENSORBOARD_META)
        return str(url) if url else None

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> NodeStatus:
        return cls(
            wire=w,
            executor_id=int(w["executor_id"]),
            attempt=int(w["attempt"]),
            role=str(w["role"]),
            index=int(w["index"]),
            state=NodeState(w["state"]),
            host=str(w["host"]),
            port=int(w["port"]),
            gpus=tuple(str(g) for g in w["gpus"]),
            task_id=str(w["task_id"]),
            meta=dict(w["meta"]),
            registered_at=float(w["registered_at"]),
            last_seen=float(w["last_seen"]),
            ended_at=_opt_float(w["ended_at"]),
            error=str(w["error"]),
            connected=bool(w["connected"]),
        )


@dataclass(frozen=True, eq=False, kw_only=True)
class JobStatus(_Decoded):
    """A job's status: full (``status``, ``await_job``, a full ``watch``) or ``brief``.

    A brief status has no nodes, history, timeline or cluster, and names only the first
    missing slots; ``running`` and ``missing_count`` count for both forms.
    """

    job: str
    name: str
    engine: str
    state: JobState
    #: Bumped on every change a watcher could see.
    version: int
    #: Progress reports (figures, usage) taken so far: they change status, not ``version``.
    reports: int
    size: int
    submitted_at: float
    ended_at: float | None
    #: Why it failed, for people (names the node and carries its traceback).
    error: str
    #: Why it was stopped, for people.
    stop_reason: str
    #: Why it failed or stopped, for programs.
    reason: FailureReason
    registered: int
    #: Nodes now RUNNING.
    running: int
    #: Missing slots, each with the last thing seen of it (brief: the first few).
    missing: tuple[str, ...]
    missing_count: int
    brief: bool
    roles: tuple[tuple[str, int], ...]
    labels: Mapping[str, Any]
    nodes: tuple[NodeStatus, ...]
    #: Earlier attempts of slots (superseded, or lost while reserving).
    history: tuple[NodeStatus, ...]
    #: The timeline: (unix time, text), oldest first.
    events: tuple[tuple[float, str], ...]
    #: Role → addresses once the cluster formed, else None.
    cluster: Mapping[str, list[str]] | None

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def why(self) -> str:
        """What ended it, for people: the error, else the stop reason."""
        return self.error or self.stop_reason

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> JobStatus:
        brief = bool(w.get("brief", False))
        nodes = tuple(NodeStatus.decode(n) for n in w.get("nodes", ()))
        missing = tuple(str(x) for x in w["missing"])
        running = w["running"] if brief else sum(1 for n in nodes if n.state == NodeState.RUNNING)
        cluster = w.get("cluster")
        return cls(
            wire=w,
            job=str(w["job"]),
            name=str(w["name"]),
            engine=str(w["engine"]),
            state=JobState(w["state"]),
            version=int(w["version"]),
            reports=int(w.get("reports", 0)),
            size=int(w["size"]),
            submitted_at=float(w["submitted_at"]),
            ended_at=_opt_float(w["ended_at"]),
            error=str(w["error"]),
            stop_reason=str(w["stop_reason"]),
            # Coordinators before failure reasons sent none.
            reason=FailureReason(w.get("reason", FailureReason.NONE)),
            registered=int(w["registered"]),
            running=int(running),
            missing=missing,
            missing_count=int(w["missing_count"]) if brief else len(missing),
            brief=brief,
            roles=tuple((str(r), int(c)) for r, c in w.get("roles", ())),
            labels=dict(w.get("labels", {})),
            nodes=nodes,
            history=tuple(NodeStatus.decode(n) for n in w.get("history", ())),
            events=tuple((float(t), str(text)) for t, text in w.get("events", ())),
            cluster=None if cluster is None else {str(r): list(a) for r, a in cluster.items()},
        )


@dataclass(frozen=True, eq=False, kw_only=True)
class JobSummary(_Decoded):
    """One line of ``status`` without a job: every job the caller may see."""

    job: str
    name: str
    engine: str
    state: JobState
    size: int
    registered: int
    submitted_at: float
    ended_at: float | None
    error: str

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> JobSummary:
        return cls(
            wire=w,
            job=str(w["job"]),
            name=str(w["name"]),
            engine=str(w["engine"]),
            state=JobState(w["state"]),
            size=int(w["size"]),
            registered=int(w["registered"]),
            submitted_at=float(w["submitted_at"]),
            ended_at=_opt_float(w["ended_at"]),
            error=str(w["error"]),
        )


@dataclass(frozen=True, eq=False, kw_only=True)
class JobList(_Decoded):
    """``status`` without a job."""

    jobs: tuple[JobSummary, ...]

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> JobList:
        return cls(wire=w, jobs=tuple(JobSummary.decode(j) for j in w["jobs"]))


@dataclass(frozen=True, eq=False, kw_only=True)
class Submitted(_Decoded):
    """The answer to ``submit``: ``created`` is False when the same job was submitted before."""

    job: str
    state: JobState
    created: bool

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> Submitted:
        return cls(wire=w, job=str(w["job"]), state=JobState(w["state"]), created=bool(w["created"]))


@dataclass(frozen=True, eq=False, kw_only=True)
class StopResult(_Decoded):
    """The answer to a driver's ``stop``: the job's state after it, and its live nodes."""

    job: str
    state: JobState
    #: The nodes told to stop (or that would be, with ``dry_run``), described for people.
    nodes: tuple[str, ...]
    dry_run: bool

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> StopResult:
        return cls(
            wire=w,
            job=str(w["job"]),
            state=JobState(w["state"]),
            nodes=tuple(str(n) for n in w["nodes"]),
            dry_run=bool(w["dry_run"]),
        )


@dataclass(frozen=True, eq=False, kw_only=True)
class Registration(_Decoded):
    """The answer to ``register``: the slot this node holds."""

    job: str
    role: str
    index: int
    size: int
    heartbeat_timeout_s: float
    #: The job's state.
    state: JobState

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> Registration:
        return cls(
            wire=w,
            job=str(w["job"]),
            role=str(w["role"]),
            index=int(w["index"]),
            size=int(w["size"]),
            heartbeat_timeout_s=float(w["heartbeat_timeout_s"]),
            state=JobState(w["state"]),
        )


@dataclass(frozen=True, eq=False, kw_only=True)
class Reported(_Decoded):
    """The answer to ``report``: the node's state and its job's after it."""

    state: NodeState
    job_state: JobState

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> Reported:
        return cls(wire=w, state=NodeState(w["state"]), job_state=JobState(w["job_state"]))


@dataclass(frozen=True, eq=False, kw_only=True)
class StopAnswer(_Decoded):
    """The answer to ``heartbeat`` and ``await_stop``: must this node stop, and why."""

    stop: bool
    reason: str
    job_state: JobState

    @classmethod
    def _from(cls, w: Mapping[str, Any]) -> StopAnswer:
        return cls(wire=w, stop=bool(w["stop"]), reason=str(w["reason"]), job_state=JobState(w["job_state"]))
