"""The answers about jobs: what drivers and admins ask for (``submit``, ``status``,
``watch_job``, ``await_job``, ``stop_job``, ``finish``, ``get_logs``) and the HTTP API's
progress series, typed once for every side as :mod:`tfcoord.client.replies` explains.

Apart from the node's answers (in :mod:`~tfcoord.client.replies`) so that a node, which
never asks for a job's status, does not build these classes when it starts: each frozen
dataclass costs its creation at import, and a Mesos task's readiness waits on every import
of the node before it registers. :data:`ANSWERS` says which class answers which request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import RemoteProtocolError
from .replies import (
    RESULT_META,
    TENSORBOARD_META,
    Ack,
    Answer,
    Registration,
    Reported,
    StopAnswer,
    wire_meta,
)
from .vocab import FailureReason, JobState, NodeState

#: A job status's two forms (see :class:`JobStatus`): the fields a field's ``form`` names
#: are on the wire only in that form.
FULL, BRIEF = "full", "brief"


@dataclass(frozen=True, eq=False, kw_only=True)
class Submitted(Answer):
    """The answer to ``submit``: ``created`` is False when the same job was submitted before."""

    job: str
    state: JobState
    created: bool


@dataclass(frozen=True, eq=False, kw_only=True)
class NodeStatus(Answer):
    """One node of a job as the coordinator sees it (a job status's ``nodes`` and ``history``)."""

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
    #: The cluster generation it belongs to (one more each time the job restarted).
    generation: int = 0
    #: How its work ended, as it reported (negative: the signal that ended it).
    exit_code: int = 0
    #: The latest progress figures its work reported (``ctx.report``); None for an earlier
    #: attempt of its slot (``history``), and from a coordinator that does not keep them.
    figures: Mapping[str, int | float] | None = field(default=None, metadata=wire_meta(omit_none=True))
    #: What its supervisor last measured of its work while it ran: ``cpu_percent`` (100 is
    #: one core), ``rss_bytes``, ``processes``; empty before the first and once it ended.
    usage: Mapping[str, int | float] | None = field(default=None, metadata=wire_meta(omit_none=True))

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
    def tensorboard_url(self) -> str | None:
        url = self.meta.get(TENSORBOARD_META)
        return str(url) if url else None


@dataclass(frozen=True, eq=False, kw_only=True)
class Restart(Answer):
    """One restart of a job's cluster (``JobSpec.max_restarts``): what failed, and how."""

    #: The generation the restart started.
    generation: int
    #: When (unix time).
    at: float
    #: The node whose failure restarted it: ``role:index (executor N, host H, ...)``.
    node: str
    executor_id: int
    #: What happened to it, for people: "was killed by SIGKILL", "was lost (...)".
    cause: str
    #: Its work's exit status (negative: the signal that ended it); 0 when it was lost.
    exit_code: int
    #: Whether it was lost (heartbeats or connection gone) rather than reporting a failure.
    lost: bool


def _full(**kw: Any) -> Any:
    return field(**kw, metadata=wire_meta(form=FULL))


def _brief(**kw: Any) -> Any:
    return field(**kw, metadata=wire_meta(form=BRIEF))


@dataclass(frozen=True, eq=False, kw_only=True)
class JobStatus(Answer):
    """A job's status: full (``status``, ``await_job``, a full ``watch``) or ``brief``.

    A brief status has no nodes, history, timeline or cluster, and names only the first
    missing slots; its size does not grow with the job. ``running`` and ``missing_count``
    count for both forms (on the wire only in the brief one; worked out from the full one).
    """

    job: str
    name: str
    engine: str
    state: JobState
    #: Bumped on every change a watcher could see.
    version: int
    #: Progress reports (figures, usage) taken so far: they change status, not ``version``.
    reports: int = _full(default=0)
    size: int
    #: [role, count] pairs in assignment order.
    roles: tuple[tuple[str, int], ...] = _full(default=())
    labels: Mapping[str, Any] = _full(default_factory=dict)
    #: How the coordinator's engine launches each node (``messages.LaunchSpec``'s wire form),
    #: or None for engines that launch their own.
    launch: Mapping[str, Any] | None = _full(default=None)
    submitted_at: float
    ended_at: float | None
    #: Why it failed, for people (names the node and carries its traceback).
    error: str
    #: Why it was stopped, for people.
    stop_reason: str
    #: Why it failed or stopped, for programs (coordinators before failure reasons sent none).
    reason: FailureReason = FailureReason.NONE
    registered: int
    #: Nodes now RUNNING.
    running: int = _brief(default=0)
    #: Missing slots, each with the last thing seen of it (brief: the first few).
    missing: tuple[str, ...]
    missing_count: int = _brief(default=0)
    nodes: tuple[NodeStatus, ...] = _full(default=())
    #: Earlier attempts of slots (superseded, or lost while reserving).
    history: tuple[NodeStatus, ...] = _full(default=())
    #: The timeline: (unix time, text), oldest first.
    events: tuple[tuple[float, str], ...] = _full(default=())
    #: Timeline lines dropped from its front (it is bounded).
    events_dropped: int = _full(default=0)
    #: Role → addresses once the cluster formed, else None.
    cluster: Mapping[str, list[str]] | None = _full(default=None)
    brief: bool = _brief(default=False)
    #: The cluster's generation: 0, one more each restart.
    generation: int = 0
    #: The restarts the job may make (``JobSpec.max_restarts``).
    max_restarts: int = 0
    #: Each restart, oldest first (brief: only the newest).
    restarts: tuple[Restart, ...] = ()
    #: How many restarts there were (on the wire only in the brief form).
    restart_count: int = _brief(default=0)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def why(self) -> str:
        """What ended it, for people: the error, else the stop reason."""
        return self.error or self.stop_reason

    def form(self) -> str:
        return BRIEF if self.brief else FULL

    @classmethod
    def _derived(cls, wire: Mapping[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
        if not kw.get("brief", False):
            kw["running"] = sum(1 for n in kw.get("nodes", ()) if n.state == NodeState.RUNNING)
            kw["missing_count"] = len(kw["missing"])
            kw["restart_count"] = len(kw.get("restarts", ()))
        elif kw.get("running") is None or kw.get("missing_count") is None:
            raise RemoteProtocolError(
                "the coordinator sent a malformed JobStatus: a brief one without its counts"
            )
        return kw


@dataclass(frozen=True, eq=False, kw_only=True)
class JobSummary(Answer):
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


@dataclass(frozen=True, eq=False, kw_only=True)
class JobList(Answer):
    """``status`` without a job."""

    jobs: tuple[JobSummary, ...]


@dataclass(frozen=True, eq=False, kw_only=True)
class StopResult(Answer):
    """The answer to a driver's ``stop``: the job's state after it, and its live nodes."""

    state: JobState
    job: str
    #: The nodes told to stop (or that would be, with ``dry_run``), described for people.
    nodes: tuple[str, ...]
    dry_run: bool


@dataclass(frozen=True, eq=False, kw_only=True)
class Finished(Answer):
    """The answer to a driver's ``finish``: the job's state and its serving nodes' grace."""

    job: str
    state: JobState
    serving_grace_s: float


@dataclass(frozen=True, eq=False, kw_only=True)
class LogSource(Answer):
    """A node whose output a :class:`Logs` answer holds lines of."""

    executor_id: int
    role: str
    index: int
    #: Its lines no longer kept (the oldest go first), or dropped by the node itself.
    dropped: int


@dataclass(frozen=True, eq=False, kw_only=True)
class Logs(Answer):
    """The answer to ``get_logs`` (and the HTTP API's ``/logs``): lines from ``since`` on."""

    job: str
    state: JobState
    nodes: tuple[LogSource, ...]
    #: (line number, unix time, executor id, stream, text), oldest first.
    lines: tuple[tuple[int, float, int, str, str], ...]
    #: The ``since`` of the next call.
    next: int


@dataclass(frozen=True, eq=False, kw_only=True)
class NodeSeries(Answer):
    """One node's progress points in a :class:`Series`."""

    executor_id: int
    role: str
    index: int
    #: (unix time, figures), oldest first.
    points: tuple[tuple[float, Mapping[str, int | float]], ...]


@dataclass(frozen=True, eq=False, kw_only=True)
class Series(Answer):
    """A job's progress points per node (the HTTP API's ``/progress``)."""

    job: str
    state: JobState
    nodes: tuple[NodeSeries, ...]


#: Which answer each request op gets (``status`` without a job: a :class:`JobList`;
#: ``await_cluster``: a ``ClusterReply`` message of its own, not a map).
ANSWERS: Mapping[str, type[Answer]] = {
    "submit": Submitted,
    "status": JobStatus,
    "await_job": JobStatus,
    "watch_job": JobStatus,
    "stop_job": StopResult,
    "finish": Finished,
    "register": Registration,
    "report": Reported,
    "heartbeat": StopAnswer,
    "await_stop": StopAnswer,
    "progress": Ack,
    "node_logs": Ack,
    "get_logs": Logs,
}
