"""The coordinator's domain state: jobs, their slots and nodes, waits and deadlines.

Theory of operation (after dask's worker_state_machine and h11's _state): this
module is pure. ``CoordinatorState.handle(event)`` is the only thing that mutates
state; it returns a list of effects (:class:`Send` a message on a connection,
:class:`Journal` an event, :class:`Log` a state change) that the asyncio server
carries out. Time is an argument (``event.now``, wall-clock seconds, because
deadlines must survive a coordinator restart and monotonic clocks do not), so
every timeout is tested without sleeping.

A job's cluster completion (every node READY, every cluster wait answered) is O(nodes):
the registration that fills the last slot only encodes the spec and makes the job READY,
and asks with a :class:`Continue` effect for the rest, which the server hands in as
:class:`CompleteCluster` events of :data:`COMPLETE_PER_EVENT` nodes each on its next loop
turns (so at 10,000 nodes other jobs' heartbeats are answered in between). Each is
journaled with the slot it reached, so a replay goes through the same steps in the same
order.

Durability is event sourcing: every event that changes state is returned as a
:class:`Journal` effect, including the ones this module derives itself when a
deadline passes (:class:`NodeLost`, :class:`ReservationExpired`). Replaying the
journaled events through ``handle`` in order rebuilds the same state. Heartbeats
and disconnects are not journaled: they only feed the liveness deadlines, and
after a restart every node gets a fresh grace period (:class:`Recovered`).

Life cycles are the tables ``JOB_TRANSITIONS`` and ``NODE_TRANSITIONS``; an
illegal transition raises :class:`InvalidTransition` (a bug, never user input).
Bad requests are refused with a :class:`Send` of an ``Error`` carrying a stable
code and a message that says what to do.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tfcoord.client import messages as m
from tfcoord.client.protocol import encode_spec
from tfcoord.client.vocab import TERMINAL_JOB, TERMINAL_NODE, ErrorCode, FailureReason, JobState, NodeState

# -- life cycles --------------------------------------------------------------------------


J, N = JobState, NodeState

JOB_TRANSITIONS: dict[JobState, dict[str, JobState]] = {
    J.SUBMITTED: {"register": J.RESERVING, "fail": J.FAILED, "stop": J.STOPPED},
    J.RESERVING: {"complete": J.READY, "fail": J.FAILED, "stop": J.STOPPING},
    J.READY: {"run": J.RUNNING, "succeed": J.SUCCEEDED, "fail": J.FAILED, "stop": J.STOPPING},
    J.RUNNING: {"succeed": J.SUCCEEDED, "fail": J.FAILED, "stop": J.STOPPING},
    J.STOPPING: {"all_stopped": J.STOPPED, "fail": J.FAILED},
    J.SUCCEEDED: {},
    J.FAILED: {},
    J.STOPPED: {},
}

#: A node's events are named by the state they lead to (it reports RUNNING, it is found
#: LOST). Its states only move forward along this order, skipping some at will (a node
#: that fails while REGISTERED ends FAILED): each state's row is the states after it.
_NODE_ORDER = (N.REGISTERED, N.READY, N.RUNNING)
_NODE_ENDS = (N.SUCCEEDED, N.FAILED, N.LOST, N.STOPPED)
NODE_TRANSITIONS: dict[NodeState, dict[NodeState, NodeState]] = {
    **{st: {e: e for e in _NODE_ORDER[i + 1 :] + _NODE_ENDS} for i, st in enumerate(_NODE_ORDER)},
    **{st: {} for st in _NODE_ENDS},
}

#: Roles whose success is the job's success; ps and evaluator serve them and are then stopped.
FINISHING_ROLES = frozenset({"chief", "master", "worker"})
#: The longest error message an Error frame may carry (see ``messages.Error``): longer
#: texts (a job error quoting a node's 64 KiB traceback and its description) are clipped.
MAX_MESSAGE_LEN = m.MAX_ERROR_LEN + m.MAX_TEXT_LEN
#: A reservation timeout names every missing slot, but slots that never registered are
#: named as ranges (``worker:0-4999``), and at most this many lines are written out one
#: by one: a 100,000-slot job's message stays readable and inside one frame.
MAX_MISSING_LINES = 100
#: Missing slots a brief status names (progress lines show 8, then "and N more").
BRIEF_MISSING = 16
#: Finished jobs a long-running coordinator keeps (status, the HTTP API, the journal),
#: by count and by age; older ones are forgotten, journal records included, so memory
#: and restart time do not grow with every job ever run.
KEEP_FINISHED_JOBS = 1000
KEEP_FINISHED_S = 7 * 24 * 3600.0
#: A finished job is kept at least this long whatever the count, so its nodes and its
#: driver can still ask about it while they wind down.
FORGET_GRACE_S = 300.0
#: What a node shows about itself (TensorBoard URL, progress figures) is a few hundred
#: characters; its merged metadata is kept under this, oldest keys dropped first.
MAX_META_CHARS = 8 * 1024
#: Nodes made READY (their cluster waits answered) per event when a job's cluster forms;
#: the rest follow in :class:`CompleteCluster` events. 256 nodes are about 2 ms of work,
#: where a whole 10,000-node job in one event was a 60-90 ms turn every heartbeat waited behind.
COMPLETE_PER_EVENT = 256
#: Stale timer entries tolerated before the heap is compacted (see ``_compact_timers``).
STALE_TIMER_SLACK = 256
#: Earlier attempts a slot remembers (the newest ones): enough to tell a retry story, while
#: a token holder re-registering in a loop cannot grow a job's status past one frame.
MAX_HISTORY_PER_SLOT = 8
#: Attempts that may take one slot while its job reserves. Spark retries a task 4 times
#: and Mesos relaunches a few; far more is a loop (or an attacker), and each attempt is
#: a journal record and a timeline line.
MAX_ATTEMPTS_PER_SLOT = 32
#: Timeline lines a job keeps: a few per slot (registered, ready, running, its end) plus
#: room for the job's own; beyond it the oldest go (``Job.events_dropped`` counts them).
TIMELINE_BASE = 256
TIMELINE_PER_SLOT = 8
#: Progress points (``ctx.report``) kept per node while its job runs: at the node's default
#: pace of one every 2 s, the last 8 minutes; the oldest go first.
SERIES_POINTS_PER_NODE = 240
#: ... and per job, whatever its size: a 10,000-node job keeps 20 points a node, not 240.
SERIES_POINTS_PER_JOB = 200_000
#: Once a job ends its series are thinned to this many points in all (every k-th kept): a
#: finished job's charts stay readable, and a thousand finished jobs stay small.
SERIES_POINTS_FINISHED = 4_000
#: Output lines of its work kept per node (the newest; a marker says how many went) ...
LOG_LINES_PER_NODE = 2_000
#: ... and per job: a 1,000-node job keeps 100 lines a node.
LOG_LINES_PER_JOB = 100_000
#: Once a job ends each node keeps its last lines of these, shared (at least 50 a node).
LOG_LINES_FINISHED = 20_000


class InvalidTransition(RuntimeError):
    """A state change the life-cycle tables forbid: a bug in this module, never bad input."""


_S = TypeVar("_S", JobState, NodeState)


def _next(table: Mapping[_S, Mapping[Any, _S]], state: _S, event: str) -> _S:
    try:
        return table[state][event]
    except KeyError:
        raise InvalidTransition(f"'{event}' is not allowed in state {state}") from None


# -- events (inputs) ----------------------------------------------------------------------

#: (connection id, request id): where the answer to a request goes.
Waiter = tuple[int, int]


@dataclass(frozen=True)
class Event:
    now: float


#: Whose jobs a driver request may see: the driver's owner digest (``auth.owner_digest``),
#: or None for every job (admins; nodes, whose job the server already checked).
Viewer = bytes | None


@dataclass(frozen=True)
class SubmitJob(Event):
    job: str
    spec: m.JobSpec
    waiter: Waiter | None = None
    #: The submitting driver's owner digest: only it (and admins) may see or stop the job.
    owner: bytes = b""


@dataclass(frozen=True)
class RegisterNode(Event):
    req: m.Register
    conn: int | None = None
    waiter: Waiter | None = None


@dataclass(frozen=True)
class ReportNode(Event):
    req: m.Report
    conn: int | None = None
    waiter: Waiter | None = None


@dataclass(frozen=True)
class HeartbeatNode(Event):
    """Journaled only when it carries new metadata (a TensorBoard URL, progress)."""

    req: m.Heartbeat
    conn: int | None = None
    waiter: Waiter | None = None


@dataclass(frozen=True)
class ProgressNode(Event):
    """Never journaled: progress figures are for watching, and a restart shows the next ones."""

    req: m.Progress
    conn: int | None = None
    waiter: Waiter | None = None


@dataclass(frozen=True)
class NodeLogsEvent(Event):
    """Never journaled: a restarted coordinator shows the output that came after it."""

    req: m.NodeLogs
    conn: int | None = None
    waiter: Waiter | None = None


@dataclass(frozen=True)
class GetLogsEvent(Event):
    req: m.GetLogs
    waiter: Waiter
    viewer: Viewer = None


@dataclass(frozen=True)
class AwaitClusterEvent(Event):
    req: m.AwaitCluster
    conn: int
    waiter: Waiter


@dataclass(frozen=True)
class AwaitStopEvent(Event):
    req: m.AwaitStop
    conn: int
    waiter: Waiter


@dataclass(frozen=True)
class AwaitJobEvent(Event):
    req: m.AwaitJob | m.WatchJob
    waiter: Waiter
    viewer: Viewer = None


@dataclass(frozen=True)
class StopJobEvent(Event):
    job: str
    reason: str
    dry_run: bool = False
    waiter: Waiter | None = None
    #: The job's ``reason`` once it stops: requested, or forced by its engine giving up.
    cause: FailureReason = FailureReason.STOPPED
    viewer: Viewer = None


@dataclass(frozen=True)
class StatusEvent(Event):
    job: str | None
    waiter: Waiter
    viewer: Viewer = None


@dataclass(frozen=True)
class Disconnected(Event):
    conn: int


@dataclass(frozen=True)
class Tick(Event):
    """Time passed: resolve every deadline at or before ``now``."""


@dataclass(frozen=True)
class NodeLost(Event):
    """A node stopped answering (derived from deadlines, or told by an engine such as Mesos)."""

    job: str
    executor_id: int
    attempt: int
    reason: str


@dataclass(frozen=True)
class ReservationExpired(Event):
    job: str


@dataclass(frozen=True)
class FinishJobEvent(Event):
    """A driver's ``finish``: the serving nodes' grace once the deciding nodes succeeded."""

    job: str
    serving_grace_s: float
    waiter: Waiter | None = None
    viewer: Viewer = None


@dataclass(frozen=True)
class ServingGraceExpired(Event):
    """The ps/evaluator nodes' grace after the deciding nodes succeeded has passed."""

    job: str


@dataclass(frozen=True)
class CompleteCluster(Event):
    """Go on with a job's cluster completion (the answer to a :class:`Continue`): the nodes
    of the next slots become READY and their cluster waits are answered, up to slot
    ``upto`` (excluded); -1: the next ``complete_per_event``. Journaled with ``upto`` set."""

    job: str
    upto: int = -1


@dataclass(frozen=True)
class Recovered(Event):
    """The coordinator restarted: no connection survived, so every live node gets a fresh grace."""


@dataclass(frozen=True)
class EngineTaskUpdate(Event):
    """An engine (Mesos) says what became of the task it runs, or cannot place, for a slot.

    ``state`` is the engine's word (``TASK_RUNNING``; ``UNPLACED`` with an empty
    ``task_id`` when no offer fits); it is shown with the slot while the slot is missing, so
    a timeout names the task and its last state. With ``ended`` the task is gone for good:
    its node fails (or, if it never registered, the job fails at once) unless the job is
    already stopping, in which case the node just stopped.
    """

    job: str
    executor_id: int
    task_id: str
    state: str
    message: str = ""
    ended: bool = False


@dataclass(frozen=True)
class EngineJobFailed(Event):
    """The engine cannot run the job at all (bad resources, the master refused us)."""

    job: str
    reason: str


# -- effects (outputs) --------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    conn: int
    msg: m.Message


@dataclass(frozen=True)
class Journal:
    """Persist this event before sending anything that depends on it."""

    event: Event


@dataclass(frozen=True)
class Log:
    """One line of a job's timeline. State changes also say, as data, what changed, so
    observers (metrics, structured logs) never parse ``text``."""

    job: str
    text: str
    #: The node that changed ("worker:0"), or "" when the line is about the job itself.
    node: str = ""
    #: The new state's value (a JobState or, with ``node``, a NodeState), or "" when the
    #: line is not a state change.
    state: str = ""
    #: With a job's FAILED or STOPPED: why (the job's ``reason``).
    reason: FailureReason = FailureReason.NONE


@dataclass(frozen=True)
class Forget:
    """A finished job left the state (see ``KEEP_FINISHED_JOBS``): drop its journal records."""

    job: str


@dataclass(frozen=True)
class Continue:
    """The job's cluster completion is not finished: hand in a :class:`CompleteCluster` for
    it, on a later loop turn (at once when replaying). Until then some of its nodes are
    still REGISTERED and their cluster waits pending, though the job is READY and a new
    ``await_cluster`` is answered at once."""

    job: str


Effect = Send | Journal | Log | Forget | Continue


# -- domain objects -----------------------------------------------------------------------


@dataclass
class Node:
    executor_id: int
    attempt: int
    role: str
    index: int
    host: str
    port: int
    gpus: tuple[str, ...]
    task_id: str
    meta: dict[str, Any]
    registered_at: float
    state: NodeState = N.REGISTERED
    last_seen: float = 0.0
    conn: int | None = None
    disconnected_at: float | None = None
    ended_at: float | None = None
    error: str = ""
    #: The deadline of this node's one authoritative timer entry (lazy heap deletion).
    timer: float | None = None

    @property
    def live(self) -> bool:
        return self.state not in TERMINAL_NODE

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    def describe(self) -> str:
        where = f"executor {self.executor_id}, host {self.host}"
        if self.task_id:
            where += f", task {self.task_id}"
        if self.attempt:
            where += f", attempt {self.attempt}"
        return f"{self.name} ({where})"

    def snapshot(self) -> dict[str, Any]:
        return {
            "executor_id": self.executor_id,
            "attempt": self.attempt,
            "role": self.role,
            "index": self.index,
            "state": self.state.value,
            "host": self.host,
            "port": self.port,
            "gpus": list(self.gpus),
            "task_id": self.task_id,
            "meta": dict(self.meta),
            "registered_at": self.registered_at,
            "last_seen": self.last_seen,
            "ended_at": self.ended_at,
            "error": self.error,
            "connected": self.conn is not None,
        }


@dataclass(frozen=True)
class EngineTask:
    """The last thing an engine said about a slot's task (see :class:`EngineTaskUpdate`)."""

    task_id: str
    state: str
    message: str = ""

    def describe(self, engine: str) -> str:
        if not self.task_id:
            return f"{engine}: {self.message or self.state}"
        return f"{engine} task {self.task_id} {self.state}" + (f" ({self.message})" if self.message else "")


@dataclass
class Slot:
    role: str
    index: int
    node: Node | None = None
    #: Earlier attempts of this slot, oldest first (superseded or lost while reserving).
    history: list[Node] = field(default_factory=list)
    #: What the engine (Mesos) last said about this slot's task, if it runs one.
    task: EngineTask | None = None
    #: Attempts that took this slot (see ``MAX_ATTEMPTS_PER_SLOT``).
    attempts: int = 0


@dataclass
class Job:
    id: str
    spec: m.JobSpec
    submitted_at: float
    slots: list[Slot]
    state: JobState = J.SUBMITTED
    ended_at: float | None = None
    error: str = ""
    stop_reason: str = ""
    #: Why the job failed or stopped, as data (``error`` and ``stop_reason`` say it to people).
    reason: FailureReason = FailureReason.NONE
    #: Slots holding a node (kept, not counted, so a registration costs O(1)).
    filled: int = 0
    #: No slot before this one is empty (a hint for :meth:`CoordinatorState.brief`).
    first_missing: int = 0
    #: While the cluster completion goes on (see :class:`Continue`): the first slot whose
    #: node is not yet READY and whose cluster waits are not yet answered; None otherwise.
    completing: int | None = None
    #: Nodes now in a slot, by state (kept for the same reason: every "are all nodes ..."
    #: question of a report is O(1), not a scan of a 10,000-node job).
    in_state: dict[NodeState, int] = field(default_factory=dict)
    #: Nodes in a slot that decide the job's success (see :meth:`decides`) and succeeded.
    decided: int = 0
    #: After every deciding node succeeded, how long live ps/evaluator nodes may still run
    #: on their own (a driver's ``finish``), and since when they do.
    serving_grace_s: float = 0.0
    decided_at: float | None = None
    #: Bumped on every change a watcher could see.
    version: int = 1
    #: The cluster spec, msgpack-encoded once when the job becomes READY.
    spec_blob: bytes | None = None
    events: list[tuple[float, str]] = field(default_factory=list)
    #: Timeline lines dropped from the front of ``events`` (it is bounded): the sequence
    #: number of ``events[0]``.
    events_dropped: int = 0
    #: Who submitted the job (an opaque digest of the driver's owner key); only that driver
    #: (or an admin) may see or stop it, and the job's node token is bound to it.
    owner: bytes = b""
    #: Per executor id: the progress points its nodes reported, ``(time, figures)``, oldest
    #: first, bounded (see ``SERIES_POINTS_*``).
    series: dict[int, deque[tuple[float, dict[str, int | float]]]] = field(default_factory=dict)
    #: Per executor id: its latest figures (shown in status).
    figures: dict[int, dict[str, int | float]] = field(default_factory=dict)
    #: Per executor id: what its supervisor last measured of its work (CPU, memory), in status.
    usage: dict[int, dict[str, int | float]] = field(default_factory=dict)
    #: Progress reports taken: they change status without bumping ``version`` (which would
    #: wake every watcher once a second per node), so caches of status key on both.
    reports: int = 0
    #: Per executor id: its output lines ``(seq, time, stream, text)``, oldest first, bounded.
    logs: dict[int, deque[tuple[int, float, str, str]]] = field(default_factory=dict)
    #: Per executor id: lines dropped (by the bound here, or by the node before sending).
    logs_dropped: dict[int, int] = field(default_factory=dict)
    #: The number the next log line of this job gets (``get_logs``'s ``since``).
    log_seq: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_JOB

    def nodes(self) -> Iterable[Node]:
        return (s.node for s in self.slots if s.node is not None)

    def missing(self) -> list[Slot]:
        return [s for s in self.slots if s.node is None]

    def live_nodes(self) -> int:
        return sum(c for st, c in self.in_state.items() if st not in TERMINAL_NODE)

    def decides(self, role: str) -> bool:
        """Does the success of a node in ``role`` count toward the job's success?

        The chief/master/worker nodes decide (ps and evaluators serve them), or every role
        when the template has none of those; roles whose failure is tolerated never do.
        """
        if role in self.spec.tolerate_failure:
            return False
        return role in FINISHING_ROLES or not any(r in FINISHING_ROLES for r, c in self.spec.roles if c)

    def deciding(self) -> int:
        """How many slots decide the job's success."""
        return sum(c for r, c in self.spec.roles if self.decides(r))

    def stopping(self) -> bool:
        """Must every live node of this job stop now?"""
        return self.state in (J.STOPPING, J.SUCCEEDED, J.FAILED, J.STOPPED)


@dataclass
class _Wait:
    kind: str  # "cluster", "stop", "job", "watch"
    job: str
    deadline: float
    executor_id: int = -1
    attempt: int = -1
    version: int = 0
    brief: bool = False
    #: A watch that progress reports answer too: the job's ``reports`` it has seen; -1: none.
    reports: int = -1


def _same(a: Any, b: Any) -> bool:
    """Equal, counting NaN equal to NaN (a loss of NaN sent with every heartbeat is no change)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def _meta_chars(meta: Mapping[str, Any]) -> int:
    return sum(len(k) + (len(v) if isinstance(v, str) else 8) for k, v in meta.items())


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping its start and its end (where a
    traceback says what went wrong) and saying how much was left out."""
    if len(text) <= limit:
        return text
    budget = limit - 64  # the marker below is shorter than 64 characters
    head = budget // 3
    tail = budget - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters left out ...]\n{text[len(text) - tail :]}"


# -- the state machine --------------------------------------------------------------------


class CoordinatorState:
    """Every job the coordinator holds. Mutated only through :meth:`handle`."""

    def __init__(
        self,
        keep_finished: int = KEEP_FINISHED_JOBS,
        keep_finished_s: float = KEEP_FINISHED_S,
        complete_per_event: int = COMPLETE_PER_EVENT,
    ) -> None:
        self.keep_finished = keep_finished
        self.keep_finished_s = keep_finished_s
        self.complete_per_event = max(1, complete_per_event)
        self.jobs: dict[str, Job] = {}
        #: Finished jobs in the order they ended (oldest first): the ones to forget first.
        self._finished: deque[str] = deque()
        self._waits: dict[Waiter, _Wait] = {}
        # job -> wait kind -> waiters: waking one kind never scans the others (a 10,000-node
        # job has 10,000 cluster waits while its nodes register).
        self._waits_by_job: dict[str, dict[str, set[Waiter]]] = {}
        # (job, kind, executor id) -> waiters of one node: superseding or losing a node
        # answers its own waits without scanning the job's.
        self._waits_by_node: dict[tuple[str, str, int], set[Waiter]] = {}
        # Per connection, so a disconnect touches only what that connection held.
        self._waits_by_conn: dict[int, set[Waiter]] = {}
        self._nodes_by_conn: dict[int, set[tuple[str, int]]] = {}
        # (job, host, gpu id) -> executor id for live nodes: two nodes of one job on one host
        # must never drive the same GPU. Per job, because GPU ids are what nodes say of
        # themselves: a claim of one job must never refuse (or name) another job's nodes.
        self._gpu_owner: dict[tuple[str, str, str], int] = {}
        self._timers: list[tuple[float, int, tuple[Any, ...]]] = []
        #: Timer entries whose wait was removed before its deadline (disconnects): once
        #: they are as many as half the heap, the heap is rebuilt without them.
        self._stale_timers = 0
        self._seq = itertools.count()
        self._effects: list[Effect] = []
        self._dispatch = {
            SubmitJob: self._submit,
            RegisterNode: self._register,
            ReportNode: self._report,
            HeartbeatNode: self._heartbeat,
            ProgressNode: self._progress,
            NodeLogsEvent: self._node_logs,
            GetLogsEvent: self._get_logs,
            AwaitClusterEvent: self._await_cluster,
            AwaitStopEvent: self._await_stop,
            AwaitJobEvent: self._await_job,
            StopJobEvent: self._stop_job,
            FinishJobEvent: self._finish_job,
            ServingGraceExpired: self._serving_grace_expired,
            StatusEvent: self._status,
            Disconnected: self._disconnected,
            Tick: self._tick,
            NodeLost: self._node_lost,
            ReservationExpired: self._reservation_expired,
            Recovered: self._recovered,
            CompleteCluster: self._complete_cluster,
            EngineTaskUpdate: self._engine_task_update,
            EngineJobFailed: self._engine_job_failed,
        }

    # -- public -------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        """Apply one event; return the effects to carry out, in order."""
        self._effects = []
        self._dispatch[type(event)](event)  # type: ignore[operator]
        effects, self._effects = self._effects, []
        return effects

    def next_deadline(self) -> float | None:
        """The earliest time at which a :class:`Tick` may change something."""
        return self._timers[0][0] if self._timers else None

    def status(self, job_id: str) -> dict[str, Any]:
        """A JSON-able snapshot of one job (raises KeyError if unknown)."""
        job = self.jobs[job_id]
        return {
            "job": job.id,
            "name": job.spec.name,
            "engine": job.spec.engine,
            "state": job.state.value,
            "version": job.version,
            # Progress reports taken so far (a watch with ``reports`` waits for more).
            "reports": job.reports,
            "size": job.spec.size,
            "roles": [[r, c] for r, c in job.spec.roles],
            "labels": dict(job.spec.labels),
            "launch": job.spec.launch.to_wire() if job.spec.launch is not None else None,
            "submitted_at": job.submitted_at,
            "ended_at": job.ended_at,
            "error": job.error,
            "stop_reason": job.stop_reason,
            "reason": job.reason.value,
            "registered": job.filled,
            "missing": [self._describe_missing(job, s) for s in job.missing()],
            "nodes": [
                {
                    **n.snapshot(),
                    "figures": dict(job.figures.get(n.executor_id, {})),
                    "usage": dict(job.usage.get(n.executor_id, {})) if n.live else {},
                }
                for n in job.nodes()
            ],
            # Earlier attempts without their metadata: what they showed is of no use now,
            # and it is most of a node's size.
            "history": [{**n.snapshot(), "meta": {}} for s in job.slots for n in s.history],
            "events": [[t, text] for t, text in job.events],
            "events_dropped": job.events_dropped,
            "cluster": self.cluster_spec(job) if job.spec_blob is not None else None,
        }

    def brief(self, job_id: str) -> dict[str, Any]:
        """A job's status without its nodes, history and timeline: the same keys for the
        job itself, ``running`` and ``missing_count``, and only the first
        ``BRIEF_MISSING`` missing slots. Its size does not grow with the job."""
        job = self.jobs[job_id]
        # From the first slot that may be empty: slots fill mostly in order, and a scan from
        # slot 0 on every watcher's wake-up cost O(registered) per answer during a burst.
        slots = job.slots
        first = job.first_missing
        while first < len(slots) and slots[first].node is not None:
            first += 1
        job.first_missing = first
        shown = itertools.islice(
            (s for s in itertools.islice(slots, first, None) if s.node is None), BRIEF_MISSING
        )
        return {
            "job": job.id,
            "name": job.spec.name,
            "engine": job.spec.engine,
            "state": job.state.value,
            "version": job.version,
            "size": job.spec.size,
            "submitted_at": job.submitted_at,
            "ended_at": job.ended_at,
            "error": job.error,
            "stop_reason": job.stop_reason,
            "reason": job.reason.value,
            "registered": job.filled,
            "running": job.in_state.get(N.RUNNING, 0),
            "missing": [self._describe_missing(job, s) for s in shown],
            "missing_count": job.spec.size - job.filled,
            "brief": True,
        }

    def summary(self, viewer: Viewer = None) -> list[dict[str, Any]]:
        """One line per job ``viewer`` may see (every job for None)."""
        return [
            {
                "job": j.id,
                "name": j.spec.name,
                "engine": j.spec.engine,
                "state": j.state.value,
                "size": j.spec.size,
                "registered": j.filled,
                "submitted_at": j.submitted_at,
                "ended_at": j.ended_at,
                "error": j.error,
            }
            for j in self.jobs.values()
            if viewer is None or j.owner == viewer
        ]

    @staticmethod
    def cluster_spec(job: Job) -> dict[str, list[str]]:
        """Role → addresses ordered by task index, as TF_CONFIG's ``cluster`` wants."""
        spec: dict[str, list[str]] = {}
        for s in job.slots:
            assert s.node is not None
            host = f"[{s.node.host}]" if ":" in s.node.host else s.node.host  # IPv6, as TensorFlow wants it
            spec.setdefault(s.role, []).append(f"{host}:{s.node.port}")
        return spec

    def validate(self) -> None:
        """Check every invariant; raise AssertionError naming the broken one."""
        live_gpus: dict[tuple[str, str, str], int] = {}
        for job in self.jobs.values():
            assert [(s.role, s.index) for s in job.slots] == job.spec.slots(), job.id
            assert job.filled == sum(1 for s in job.slots if s.node is not None), job.id
            assert job.terminal == (job.ended_at is not None), (job.id, job.state)
            if job.state in (J.READY, J.RUNNING) or (job.spec_blob is not None):
                assert job.spec_blob is not None and not job.missing(), job.id
            if job.completing is not None:
                assert job.spec_blob is not None and 0 <= job.completing < len(job.slots), job.id
            if job.state == J.FAILED:
                assert job.error, job.id
            if job.state == J.SUCCEEDED:
                assert all(n.state == N.SUCCEEDED for n in job.nodes() if job.decides(n.role)), job.id
            counted: dict[NodeState, int] = {}
            for n in job.nodes():
                counted[n.state] = counted.get(n.state, 0) + 1
            assert {k: v for k, v in job.in_state.items() if v} == counted, (job.id, job.in_state)
            assert job.decided == sum(
                1 for n in job.nodes() if n.state == N.SUCCEEDED and job.decides(n.role)
            ), job.id
            if job.state == J.RUNNING:
                assert all(n.state != N.REGISTERED for n in job.nodes()), job.id
            for s in job.slots:
                if s.node is not None:
                    n = s.node
                    assert (n.role, n.index) == (s.role, s.index), (job.id, n.executor_id)
                    assert all(h.attempt <= n.attempt for h in s.history), (job.id, n.executor_id)
                    assert n.live == (n.ended_at is None), (job.id, n.executor_id, n.state)
                    if n.live:
                        for g in n.gpus:
                            assert (job.id, n.host, g) not in live_gpus, (job.id, n.host, g)
                            live_gpus[(job.id, n.host, g)] = n.executor_id
                    assert len(n.meta) <= m.MAX_META_ENTRIES, (job.id, n.executor_id)
                    assert len(n.meta) <= 1 or _meta_chars(n.meta) <= MAX_META_CHARS, (job.id, n.executor_id)
                assert len(s.history) <= MAX_HISTORY_PER_SLOT, (job.id, s.role, s.index)
                assert s.attempts <= MAX_ATTEMPTS_PER_SLOT + 1, (job.id, s.role, s.index)
                for h in s.history:
                    assert not h.live, (job.id, h.executor_id)
            assert len(job.events) <= self._timeline_cap(job), job.id
        assert live_gpus == self._gpu_owner, "GPU owner index out of step with live nodes"
        finished = [self.jobs[i] for i in self._finished]
        assert len(finished) == len(set(self._finished)) == sum(1 for j in self.jobs.values() if j.terminal)
        assert all(j.terminal for j in finished), "a job in the finished queue is not finished"
        for w, wait in self._waits.items():
            assert wait.job in self.jobs or wait.kind == "job", w
            if wait.kind == "cluster" and self.jobs[wait.job].spec_blob is not None:
                # A formed cluster's waits are answered slot by slot: only the ones its
                # completion (see ``Continue``) has not reached yet are left.
                going = self.jobs[wait.job].completing
                assert going is not None and wait.executor_id >= going, (w, going)
            assert w in self._waits_by_job.get(wait.job, {}).get(wait.kind, ()), w
            if wait.executor_id >= 0:
                assert w in self._waits_by_node[(wait.job, wait.kind, wait.executor_id)], w
        assert sum(len(ws) for ws in self._waits_by_node.values()) == sum(
            1 for wait in self._waits.values() if wait.executor_id >= 0
        ), "per-node wait index out of step"
        for job_id, kinds in self._waits_by_job.items():
            for kind, ws in kinds.items():
                assert ws and all(self._waits[w].kind == kind for w in ws), (job_id, kind)
        live_nodes = sum(1 for j in self.jobs.values() for n in j.nodes() if n.live)
        assert (
            len(self._timers)
            <= 2 * (len(self._waits) + live_nodes + 2 * len(self.jobs)) + 2 * STALE_TIMER_SLACK
        ), "timer heap holds far more entries than there are waits, nodes and jobs"

    # -- helpers ------------------------------------------------------------------------

    def _send(self, waiter: Waiter | None, msg: m.Message) -> None:
        if waiter is not None:
            self._effects.append(Send(waiter[0], msg))

    def _reply(self, waiter: Waiter | None, **result: Any) -> None:
        if waiter is not None:
            self._send(waiter, m.Reply(id=waiter[1], result=result))

    def _error(self, waiter: Waiter | None, code: ErrorCode, message: str) -> None:
        if waiter is not None:
            self._send(waiter, m.Error(id=waiter[1], code=code, message=clip(message, MAX_MESSAGE_LEN)))

    def _journal(self, event: Event) -> None:
        self._effects.append(Journal(event))

    @staticmethod
    def _timeline_cap(job: Job) -> int:
        return TIMELINE_BASE + TIMELINE_PER_SLOT * job.spec.size

    def _note(
        self,
        job: Job,
        now: float,
        text: str,
        node: str = "",
        state: str = "",
        reason: FailureReason = FailureReason.NONE,
    ) -> None:
        job.events.append((now, text))
        cap = self._timeline_cap(job)
        if len(job.events) > cap:
            # Drop a quarter at once, so trimming costs O(1) per line over time.
            cut = len(job.events) - cap + cap // 4
            del job.events[:cut]
            job.events_dropped += cut
        job.version += 1
        self._effects.append(Log(job.id, text, node, state, reason))

    def _timer(self, when: float, key: tuple[Any, ...]) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), key))

    def _arm_node(self, job: Job, node: Node) -> float:
        """(Re)arm the liveness deadline of a live node, keeping one authoritative entry.

        Lazily: a deadline that moves later (every heartbeat) leaves the earlier entry in
        place, and when that fires ``_tick`` re-arms from the node's real deadline. Pushing
        an entry per heartbeat instead kept heartbeat_timeout_s of them alive per node
        (150,000 at 10,000 nodes), and the collector's passes over them stalled the loop
        for 100-250 ms.
        """
        deadline = node.last_seen + job.spec.heartbeat_timeout_s
        if node.disconnected_at is not None:
            deadline = min(deadline, node.disconnected_at + job.spec.reconnect_grace_s)
        if node.timer is None or deadline < node.timer:
            node.timer = deadline
            self._timer(deadline, ("node", job.id, node.executor_id, node.attempt))
        return node.timer

    def _bind(self, job: Job, node: Node, conn: int | None) -> None:
        """Note that ``node`` now speaks through connection ``conn`` (it is connected)."""
        if conn is not None:
            node.conn, node.disconnected_at = conn, None
            self._nodes_by_conn.setdefault(conn, set()).add((job.id, node.executor_id))

    def _add_wait(self, waiter: Waiter, wait: _Wait) -> None:
        self._waits[waiter] = wait
        self._waits_by_job.setdefault(wait.job, {}).setdefault(wait.kind, set()).add(waiter)
        self._waits_by_conn.setdefault(waiter[0], set()).add(waiter)
        if wait.executor_id >= 0:
            self._waits_by_node.setdefault((wait.job, wait.kind, wait.executor_id), set()).add(waiter)
        self._timer(wait.deadline, ("wait", waiter))

    def _compact_timers(self) -> None:
        """Rebuild the heap without the entries of waits removed before their deadline.

        Waits that end early (their connection closed, their answer came) leave their heap
        entry behind until its deadline, up to 7 days for an await_stop: without this a
        client connecting, waiting and disconnecting in a loop grows the heap for ever. A
        rebuild costs O(heap) and happens only once half the heap is stale, so O(1) per wait.
        """

        def live(entry: tuple[float, int, tuple[Any, ...]]) -> bool:
            when, _, key = entry
            if key[0] == "wait":
                wait = self._waits.get(key[1])
                return wait is not None and wait.deadline == when
            if key[0] == "node":
                job = self.jobs.get(key[1])
                node = self._node(job, key[2]) if job is not None else None
                return node is not None and node.attempt == key[3] and node.timer == when
            return True

        self._timers = [e for e in self._timers if live(e)]
        heapq.heapify(self._timers)
        self._stale_timers = 0

    def _pop_wait(self, waiter: Waiter) -> _Wait | None:
        wait = self._waits.pop(waiter, None)
        if wait is not None:
            self._stale_timers += 1
            if self._stale_timers > max(STALE_TIMER_SLACK, len(self._timers) // 2):
                self._compact_timers()
            conn_waits = self._waits_by_conn.get(waiter[0])
            if conn_waits is not None:
                conn_waits.discard(waiter)
            if wait.executor_id >= 0:
                key = (wait.job, wait.kind, wait.executor_id)
                mine = self._waits_by_node[key]
                mine.discard(waiter)
                if not mine:
                    del self._waits_by_node[key]
            kinds = self._waits_by_job[wait.job]
            kinds[wait.kind].discard(waiter)
            if not kinds[wait.kind]:
                del kinds[wait.kind]
                if not kinds:
                    del self._waits_by_job[wait.job]
        return wait

    def _job_waits(self, job_id: str, kind: str) -> list[Waiter]:
        return list(self._waits_by_job.get(job_id, {}).get(kind, ()))

    def _node_waits(self, job_id: str, kind: str, executor_id: int) -> list[Waiter]:
        return list(self._waits_by_node.get((job_id, kind, executor_id), ()))

    def _job_or_error(self, job_id: str, waiter: Waiter | None, viewer: Viewer = None) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None and viewer is not None and job.owner != viewer:
            job = None  # another driver's job: as if it did not exist, so nothing leaks
        if job is None:
            self._error(
                waiter,
                ErrorCode.UNKNOWN_JOB,
                f"no job {job_id!r} on this coordinator; check the job id (tfcoord status lists them)",
            )
        return job

    def _set_job(self, job: Job, event: str, now: float) -> None:
        new = _next(JOB_TRANSITIONS, job.state, event)
        old, job.state = job.state, new
        self._note(job, now, f"job {old.value} -> {new.value}", state=new.value, reason=job.reason)
        if new in TERMINAL_JOB:
            job.ended_at = now
            self._finished.append(job.id)
            # Forgetting waits for a Tick: this job's own waiters are answered first.
            self._timer(now + self.keep_finished_s, ("forget",))
            if len(self._finished) > self.keep_finished:
                oldest = self.jobs[self._finished[0]]
                assert oldest.ended_at is not None
                self._timer(max(now, oldest.ended_at + FORGET_GRACE_S), ("forget",))

    def _forget_old(self, now: float) -> None:
        """Forget finished jobs past their age, or beyond the count once past the grace."""
        while self._finished:
            oldest = self.jobs[self._finished[0]]
            assert oldest.ended_at is not None
            if oldest.ended_at + self.keep_finished_s > now:  # not too old: too many?
                if len(self._finished) <= self.keep_finished:
                    return
                if oldest.ended_at + FORGET_GRACE_S > now:
                    self._timer(oldest.ended_at + FORGET_GRACE_S, ("forget",))
                    return
            self._finished.popleft()
            del self.jobs[oldest.id]
            for kind in list(self._waits_by_job.get(oldest.id, {})):  # none should be left; be sure
                for w in self._job_waits(oldest.id, kind):
                    self._pop_wait(w)
            self._effects.append(Forget(oldest.id))

    @staticmethod
    def _count(job: Job, node: Node, delta: int) -> None:
        """Count ``node`` (in its present state) into its slot (+1) or out of it (-1)."""
        job.in_state[node.state] = job.in_state.get(node.state, 0) + delta
        if node.state == N.SUCCEEDED and job.decides(node.role):
            job.decided += delta

    def _set_node(self, job: Job, node: Node, new: NodeState, now: float, detail: str = "") -> None:
        new = _next(NODE_TRANSITIONS, node.state, new)
        self._count(job, node, -1)
        node.state = new
        self._count(job, node, +1)
        if new in TERMINAL_NODE:
            node.ended_at = now
            node.timer = None
            for g in node.gpus:
                if self._gpu_owner.get((job.id, node.host, g)) == node.executor_id:
                    del self._gpu_owner[(job.id, node.host, g)]
        self._note(
            job,
            now,
            f"{node.name} {new.value}" + (f": {detail}" if detail else ""),
            node=node.name,
            state=new.value,
        )

    @staticmethod
    def _tolerated(job: Job, node: Node) -> bool:
        return node.role in job.spec.tolerate_failure

    @staticmethod
    def _executor_id(job: Job, slot: Slot) -> int:
        """The slot's executor id, from the template (``JobSpec.slots`` numbers slots in order).

        Not ``job.slots.index(slot)``: that compares dataclasses one by one, which made the
        status of a large reserving job quadratic (seconds at 2,000 slots, on the loop).
        """
        offset = 0
        for role, count in job.spec.roles:
            if role == slot.role:
                return offset + slot.index
            offset += count
        raise KeyError(f"role {slot.role!r} is not in job {job.id}'s template")

    def _missing_lines(self, job: Job) -> list[str]:
        """Every missing slot, for a message: slots that never registered (and of which the
        engine said nothing) as ranges per role, the others one by one, at most
        ``MAX_MISSING_LINES`` lines (then how many more, and where to see them)."""
        lines: list[str] = []
        run: list[Slot] = []  # consecutive never-registered slots of one role

        def close_run() -> None:
            if run:
                first, last = run[0], run[-1]
                e0, e1 = self._executor_id(job, first), self._executor_id(job, last)
                if first is last:
                    lines.append(f"{first.role}:{first.index} (executor {e0}): never registered")
                else:
                    lines.append(
                        f"{first.role}:{first.index}-{last.index} (executors {e0}-{e1}): never registered"
                    )
                run.clear()

        for slot in job.missing():
            plain = not slot.history and slot.task is None
            if plain and run and run[-1].role == slot.role and run[-1].index + 1 == slot.index:
                run.append(slot)
                continue
            close_run()
            if plain:
                run.append(slot)
            else:
                lines.append(self._describe_missing(job, slot))
        close_run()
        if len(lines) > MAX_MISSING_LINES:
            more = len(lines) - MAX_MISSING_LINES
            lines = [
                *lines[:MAX_MISSING_LINES],
                f"... and {more} more (tfcoord status {job.id} lists every slot)",
            ]
        return lines

    def _describe_missing(self, job: Job, slot: Slot) -> str:
        text = f"{slot.role}:{slot.index} (executor {self._executor_id(job, slot)})"
        engine = f"; {slot.task.describe(job.spec.engine)}" if slot.task is not None else ""
        if not slot.history:
            return text + ": never registered" + engine
        last = slot.history[-1]
        where = f"host {last.host}" + (f", task {last.task_id}" if last.task_id else "")
        return (
            f"{text}: attempt {last.attempt} registered from {where}, then {last.state.value}"
            + (f" ({last.error})" if last.error else "")
            + engine
        )

    # -- job level ----------------------------------------------------------------------

    def _submit(self, ev: SubmitJob) -> None:
        existing = self.jobs.get(ev.job)
        if existing is not None:
            if (
                existing.spec == ev.spec and existing.owner == ev.owner
            ):  # a driver resending after a reconnect
                self._reply(ev.waiter, job=ev.job, state=existing.state.value, created=False)
            else:
                self._error(
                    ev.waiter,
                    ErrorCode.JOB_EXISTS,
                    f"job {ev.job!r} already exists with a different spec; pick another job id",
                )
            return
        job = Job(
            id=ev.job,
            spec=ev.spec,
            submitted_at=ev.now,
            slots=[Slot(role, i) for role, i in ev.spec.slots()],
            owner=ev.owner,
        )
        self.jobs[ev.job] = job
        self._journal(SubmitJob(now=ev.now, job=ev.job, spec=ev.spec, owner=ev.owner))
        self._note(
            job,
            ev.now,
            f"submitted: {', '.join(f'{c} {r}' for r, c in ev.spec.roles)}",
            state=job.state.value,
        )
        self._timer(ev.now + ev.spec.reservation_timeout_s, ("reserve", job.id))
        self._reply(ev.waiter, job=ev.job, state=job.state.value, created=True)

    def _fail_job(self, job: Job, now: float, reason: FailureReason, error: str) -> None:
        if job.terminal:
            return
        job.error, job.reason = error, reason
        self._set_job(job, "fail", now)
        self._job_ended(job, now)

    def _job_ended(self, job: Job, now: float) -> None:
        """Tell everyone waiting on a job that just reached a terminal state."""
        self._thin_series(job)
        self._trim_logs(job)
        self._refuse_cluster_waits(job)
        self._wake_stops(job)
        self._wake_watchers(job)

    def _refuse_cluster_waits(self, job: Job) -> None:
        """A job that fails or stops before its cluster forms never will: say so to its waiters."""
        for w in self._job_waits(job.id, "cluster"):
            self._pop_wait(w)
            self._error(
                w,
                ErrorCode.job_is(job.state),
                f"job {job.id} is {job.state.value}: {job.error or job.stop_reason}",
            )

    def _refuse_node_waits(self, job: Job, node: Node, code: ErrorCode, message: str) -> None:
        for w in self._node_waits(job.id, "cluster", node.executor_id):
            wait = self._waits[w]
            if wait.attempt == node.attempt:
                self._pop_wait(w)
                self._error(w, code, message)

    def _wake_stops(self, job: Job, executor_id: int | None = None) -> None:
        """Answer the stop waits whose answer is now "stop": every one of a stopping job,
        else only those of ``executor_id`` (its node was superseded or its slot freed; no
        other node's answer changed)."""
        if executor_id is not None:
            waits = self._node_waits(job.id, "stop", executor_id)
        elif job.stopping():
            waits = self._job_waits(job.id, "stop")
        else:
            return
        for w in waits:
            wait = self._waits[w]
            node = self._node(job, wait.executor_id)
            if node is None or node.attempt != wait.attempt or self._must_stop(job, node):
                self._pop_wait(w)
                self._reply(w, **self._stop_answer(job, node, wait.attempt))

    def _wake_watchers(self, job: Job) -> None:
        wake = self._job_waits(job.id, "job") if job.terminal else []
        wake += [
            w
            for w in self._job_waits(job.id, "watch")
            if job.version > self._waits[w].version or 0 <= self._waits[w].reports < job.reports
        ]
        answers: dict[bool, dict[str, Any]] = {}  # each form built once, however many wait
        for w in wake:
            wait = self._pop_wait(w)
            assert wait is not None
            if wait.brief not in answers:
                answers[wait.brief] = self.brief(job.id) if wait.brief else self.status(job.id)
            self._reply(w, **answers[wait.brief])

    def _stop_job(self, ev: StopJobEvent) -> None:
        job = self._job_or_error(ev.job, ev.waiter, ev.viewer)
        if job is None:
            return
        live = [n for n in job.nodes() if n.live]
        result = {"job": job.id, "nodes": [n.describe() for n in live], "dry_run": ev.dry_run}
        if job.terminal or ev.dry_run or job.state == J.STOPPING:
            self._reply(ev.waiter, state=job.state.value, **result)
            return
        self._journal(StopJobEvent(now=ev.now, job=ev.job, reason=ev.reason, cause=ev.cause))
        if job.decided_at is not None:  # its work is done; only serving nodes were still given time
            self._succeed(job, ev.now)
            self._reply(ev.waiter, state=job.state.value, **result)
            return
        job.stop_reason = ev.reason or "stop requested"
        job.reason = ev.cause
        self._set_job(job, "stop", ev.now)
        self._refuse_cluster_waits(job)
        self._maybe_stopped(job, ev.now)
        self._wake_stops(job)
        self._wake_watchers(job)
        self._reply(ev.waiter, state=job.state.value, **result)

    def _maybe_stopped(self, job: Job, now: float) -> None:
        if job.state == J.STOPPING and job.live_nodes() == 0:
            self._set_job(job, "all_stopped", now)
            self._job_ended(job, now)

    def _maybe_succeeded(self, job: Job, now: float) -> None:
        if job.state not in (J.READY, J.RUNNING):
            return
        deciding = job.deciding()
        if not deciding or job.decided != deciding:
            return
        if job.serving_grace_s > 0 and job.live_nodes() > 0:
            # The work is done; the ps/evaluator nodes still running get their grace (a final
            # evaluation) before they are told to stop. They end it sooner by ending.
            if job.decided_at is None:
                job.decided_at = now
                self._timer(now + job.serving_grace_s, ("serving", job.id))
                self._note(job, now, f"its ps/evaluator nodes get {job.serving_grace_s:g} s to finish")
            return
        self._succeed(job, now)

    def _succeed(self, job: Job, now: float) -> None:
        self._set_job(job, "succeed", now)
        self._job_ended(job, now)

    def _finish_job(self, ev: FinishJobEvent) -> None:
        job = self._job_or_error(ev.job, ev.waiter, ev.viewer)
        if job is None:
            return
        if not job.terminal and job.decided_at is None and job.serving_grace_s != ev.serving_grace_s:
            self._journal(FinishJobEvent(now=ev.now, job=ev.job, serving_grace_s=ev.serving_grace_s))
            job.serving_grace_s = ev.serving_grace_s
        self._reply(ev.waiter, job=job.id, state=job.state.value, serving_grace_s=job.serving_grace_s)

    def _serving_grace_expired(self, ev: ServingGraceExpired) -> None:
        job = self.jobs.get(ev.job)
        if job is None or job.decided_at is None or job.state not in (J.READY, J.RUNNING):
            return
        self._journal(ev)
        self._succeed(job, ev.now)

    def _reservation_expired(self, ev: ReservationExpired) -> None:
        job = self.jobs.get(ev.job)
        if job is None or job.state not in (J.SUBMITTED, J.RESERVING):
            return
        self._journal(ev)
        lines = [f"  - {line}" for line in self._missing_lines(job)]
        self._fail_job(
            job,
            ev.now,
            FailureReason.RESERVATION_TIMEOUT,
            f"reservation timed out after {job.spec.reservation_timeout_s:g} s: "
            f"{job.spec.size - job.filled} of {job.spec.size} slots not filled:\n" + "\n".join(lines),
        )

    # -- node level ---------------------------------------------------------------------

    @staticmethod
    def _node(job: Job, executor_id: int) -> Node | None:
        if 0 <= executor_id < len(job.slots):
            return job.slots[executor_id].node
        return None

    def _node_or_error(
        self, job_id: str, executor_id: int, attempt: int, waiter: Waiter | None
    ) -> tuple[Job, Node] | None:
        job = self._job_or_error(job_id, waiter)
        if job is None:
            return None
        node = self._node(job, executor_id)
        if node is None:
            self._error(
                waiter,
                ErrorCode.NOT_REGISTERED,
                f"executor {executor_id} of job {job_id} is not registered; call register first",
            )
            return None
        if node.attempt != attempt:
            self._error(
                waiter,
                ErrorCode.STALE_ATTEMPT,
                f"executor {executor_id} of job {job_id} is now "
                f"attempt {node.attempt}; attempt {attempt} was superseded and must exit",
            )
            return None
        return job, node

    def _register(self, ev: RegisterNode) -> None:
        r = ev.req
        job = self._job_or_error(r.job, ev.waiter)
        if job is None:
            return
        if job.terminal or job.state == J.STOPPING:
            self._error(
                ev.waiter,
                ErrorCode.job_is(job.state),
                f"job {job.id} is {job.state.value} and takes no registrations: "
                f"{job.error or job.stop_reason}",
            )
            return
        if r.executor_id >= len(job.slots):
            self._error(
                ev.waiter,
                ErrorCode.BAD_SLOT,
                f"executor {r.executor_id} is out of range: job {job.id} "
                f"has {len(job.slots)} slots (executors 0..{len(job.slots) - 1})",
            )
            return
        slot = job.slots[r.executor_id]
        cur = slot.node
        if cur is not None:
            same = (cur.host, cur.port, cur.task_id, cur.gpus) == (r.host, r.port, r.task_id, r.gpus)
            if r.attempt == cur.attempt:
                if same:  # the same node again, after a reconnect: the same answer, nothing changes
                    if cur.live:
                        self._bind(job, cur, ev.conn)
                        cur.last_seen = ev.now
                        self._arm_node(job, cur)
                    self._reply(ev.waiter, **self._registration(job, cur))
                    return
                if cur.live:
                    self._error(
                        ev.waiter,
                        ErrorCode.DUPLICATE,
                        f"slot {cur.name} of job {job.id} is already held by {cur.describe()}; "
                        f"two live nodes claim executor {r.executor_id} (is the executor id unique? "
                        "check that no other driver or application submits under this job id)",
                    )
                    return
                self._error(
                    ev.waiter,
                    ErrorCode.ALREADY_TERMINAL,
                    f"{cur.describe()} already ended "
                    f"{cur.state.value}; a new attempt must use a higher attempt number",
                )
                return
            elif r.attempt < cur.attempt:
                self._error(
                    ev.waiter,
                    ErrorCode.STALE_ATTEMPT,
                    f"executor {r.executor_id} of job {job.id} is "
                    f"already at attempt {cur.attempt}; attempt {r.attempt} must exit",
                )
                return
            elif job.state in (J.SUBMITTED, J.RESERVING) and self._holds(job, cur, ev.now):
                # Only a holder that is gone (disconnected, lost, silent) may be replaced: a
                # token holder must not take over a slot a live node is serving from.
                self._error(
                    ev.waiter,
                    ErrorCode.SLOT_HELD,
                    f"slot {cur.name} of job {job.id} is held by {cur.describe()}, which is "
                    f"connected and heartbeating; attempt {r.attempt} may take it over only once "
                    "that node has exited (its connection closed) or stopped heartbeating",
                )
                return
            elif job.state not in (J.SUBMITTED, J.RESERVING):
                # A TensorFlow cluster cannot change membership once its spec is out.
                self._journal(RegisterNode(now=ev.now, req=r))
                self._fail_job(
                    job,
                    ev.now,
                    FailureReason.MEMBERSHIP_CHANGED,
                    f"{cur.describe()} was restarted as attempt {r.attempt} on host {r.host} "
                    "after the cluster was formed; a TensorFlow cluster cannot change "
                    "membership, so the job fails (resubmit it)",
                )
                self._error(ev.waiter, ErrorCode.JOB_FAILED, job.error)
                return
        newest = max((h.attempt for h in slot.history), default=-1) if slot.history else -1
        if cur is None and r.attempt < newest:
            self._error(
                ev.waiter,
                ErrorCode.STALE_ATTEMPT,
                f"executor {r.executor_id} of job {job.id} already "
                f"had attempt {newest}; attempt {r.attempt} must exit",
            )
            return
        if slot.attempts >= MAX_ATTEMPTS_PER_SLOT and (cur is None or r.attempt != cur.attempt):
            self._error(
                ev.waiter,
                ErrorCode.TOO_MANY_ATTEMPTS,
                f"slot {slot.role}:{slot.index} of job {job.id} was already taken by "
                f"{slot.attempts} attempts (at most {MAX_ATTEMPTS_PER_SLOT}); something restarts "
                "this task in a loop: look at its earlier errors (tfcoord status)",
            )
            return
        gpu_clash = [(g, self._gpu_owner.get((job.id, r.host, g))) for g in r.gpus] if r.gpus else []
        gpu_clash = [(g, o) for g, o in gpu_clash if o is not None and o != r.executor_id]
        if gpu_clash:
            g, oe = gpu_clash[0]
            self._error(
                ev.waiter,
                ErrorCode.GPU_CONFLICT,
                f"GPU {g} on host {r.host} is already claimed by executor {oe} of this job; "
                "give each node its own GPU (Spark: spark.task.resource.gpu.amount, "
                "or set CUDA_VISIBLE_DEVICES per executor)",
            )
            return
        self._journal(RegisterNode(now=ev.now, req=r))
        if cur is not None:  # a newer attempt, or a replacement for a lost node
            if cur.live:
                self._set_node(job, cur, N.STOPPED, ev.now, f"superseded by attempt {r.attempt}")
                cur.error = f"superseded by attempt {r.attempt}"
                self._refuse_node_waits(
                    job,
                    cur,
                    ErrorCode.STALE_ATTEMPT,
                    f"{cur.describe()} was superseded by attempt {r.attempt}",
                )
            self._remember(slot, cur)
            self._count(job, cur, -1)
        slot.attempts += 1
        role, index = slot.role, slot.index
        node = Node(
            executor_id=r.executor_id,
            attempt=r.attempt,
            role=role,
            index=index,
            host=r.host,
            port=r.port,
            gpus=r.gpus,
            task_id=r.task_id,
            meta=dict(r.meta),
            registered_at=ev.now,
            last_seen=ev.now,
        )
        self._bind(job, node, ev.conn)
        if slot.node is None:
            job.filled += 1
        slot.node = node
        self._count(job, node, +1)
        for g in node.gpus:
            self._gpu_owner[(job.id, node.host, g)] = node.executor_id
        if job.state == J.SUBMITTED:
            self._set_job(job, "register", ev.now)
        self._note(
            job,
            ev.now,
            f"{node.name} REGISTERED from {node.host}:{node.port}"
            + (f" (task {node.task_id})" if node.task_id else ""),
            node=node.name,
            state=node.state.value,
        )
        self._arm_node(job, node)
        self._wake_stops(job, r.executor_id)  # a superseded attempt waiting for stop learns it now
        if job.filled == len(job.slots):
            self._cluster_complete(job, ev.now)
        self._wake_watchers(job)
        self._reply(ev.waiter, **self._registration(job, node))

    @staticmethod
    def _holds(job: Job, node: Node, now: float) -> bool:
        """Is ``node`` a live holder that no newer attempt may displace: connected, and
        heard from within its heartbeat timeout?"""
        return node.live and node.conn is not None and now - node.last_seen < job.spec.heartbeat_timeout_s

    @staticmethod
    def _remember(slot: Slot, node: Node) -> None:
        slot.history.append(node)
        if len(slot.history) > MAX_HISTORY_PER_SLOT:
            del slot.history[0]

    @staticmethod
    def _registration(job: Job, node: Node) -> dict[str, Any]:
        return {
            "job": job.id,
            "role": node.role,
            "index": node.index,
            "size": job.spec.size,
            "heartbeat_timeout_s": job.spec.heartbeat_timeout_s,
            "state": job.state.value,
        }

    def _cluster_complete(self, job: Job, now: float) -> None:
        """Every slot is filled: the spec, encoded once (every node gets these bytes), and the
        job READY; every node READY and every cluster wait answered follow in
        :class:`CompleteCluster` events, a chunk of nodes each (see :class:`Continue`)."""
        job.spec_blob = encode_spec(self.cluster_spec(job))
        self._set_job(job, "complete", now)
        job.completing = 0
        self._effects.append(Continue(job.id))

    def _complete_cluster(self, ev: CompleteCluster) -> None:
        job = self.jobs.get(ev.job)
        if job is not None:
            upto = self._complete_some(job, ev.now, ev.upto)
            if upto is not None:
                self._journal(CompleteCluster(now=ev.now, job=job.id, upto=upto))

    def _complete_some(self, job: Job, now: float, upto: int = -1) -> int | None:
        """The next slots of a completing job, up to ``upto`` (-1: the next
        :attr:`complete_per_event`): each node READY (unless it reported meanwhile), each of
        its cluster waits answered; per node only what ``_set_node`` and ``_pop_wait`` would
        do (same effects, same order). Returns the slot it stopped before (None: nothing done)."""
        first = job.completing
        if first is None:
            return None
        if job.state not in (J.READY, J.RUNNING):
            # Failed or stopping meanwhile: the cluster waits left were refused with it,
            # and nodes not yet READY stay as they are (live, told to stop by their waits).
            job.completing = None
            return None
        spec = job.spec_blob
        assert spec is not None  # set with ``completing``
        slots = job.slots
        last = min(len(slots), first + self.complete_per_event if upto < 0 else max(upto, first + 1))
        ready = _next(NODE_TRANSITIONS, N.REGISTERED, N.READY)
        kinds = self._waits_by_job.get(job.id, {})
        cluster = kinds.get("cluster", set())
        by_node, by_conn, waits = self._waits_by_node, self._waits_by_conn, self._waits
        moved = 0
        for eid in range(first, last):
            node = slots[eid].node
            assert node is not None  # every slot is filled once a job completes
            if node.state == N.REGISTERED:
                node.state = ready
                moved += 1
                name = node.name
                self._note(job, now, f"{name} {ready.value}", node=name, state=ready.value)
            mine = by_node.pop((job.id, "cluster", eid), None)
            if not mine:
                continue
            self._stale_timers += len(mine)
            for w in mine:
                wait = waits.pop(w)
                cluster.discard(w)
                conn_waits = by_conn.get(w[0])
                if conn_waits is not None:
                    conn_waits.discard(w)
                if node.attempt == wait.attempt:
                    self._send(w, m.ClusterReply(id=w[1], role=node.role, index=node.index, spec=spec))
                else:
                    self._error(
                        w,
                        ErrorCode.STALE_ATTEMPT,
                        f"executor {wait.executor_id} attempt {wait.attempt} was replaced before the cluster formed",
                    )
        if moved:
            job.in_state[N.REGISTERED] -= moved
            job.in_state[ready] = job.in_state.get(ready, 0) + moved
        if "cluster" in kinds and not cluster:
            del kinds["cluster"]
            if not kinds:
                del self._waits_by_job[job.id]
        if self._stale_timers > max(STALE_TIMER_SLACK, len(self._timers) // 2):
            self._compact_timers()
        if last < len(slots):
            job.completing = last
            self._effects.append(Continue(job.id))
        else:
            job.completing = None
            self._wake_watchers(job)  # they heard of READY already; now of every node's too
        return last

    def _await_cluster(self, ev: AwaitClusterEvent) -> None:
        r = ev.req
        found = self._node_or_error(r.job, r.executor_id, r.attempt, ev.waiter)
        if found is None:
            return
        job, node = found
        self._bind(job, node, ev.conn)
        if job.spec_blob is not None and not (job.terminal and job.state != J.SUCCEEDED):
            self._send(
                ev.waiter,
                m.ClusterReply(id=ev.waiter[1], role=node.role, index=node.index, spec=job.spec_blob),
            )
        elif job.terminal or job.state == J.STOPPING:
            self._error(
                ev.waiter,
                ErrorCode.job_is(job.state),
                f"job {job.id} is {job.state.value}: {job.error or job.stop_reason}",
            )
        elif not node.live:
            self._error(ev.waiter, ErrorCode.node_is(node.state), f"{node.describe()} is {node.state.value}")
        else:
            self._add_wait(
                ev.waiter, _Wait("cluster", job.id, ev.now + r.timeout_s, r.executor_id, r.attempt)
            )

    def _report(self, ev: ReportNode) -> None:
        r = ev.req
        found = self._node_or_error(r.job, r.executor_id, r.attempt, ev.waiter)
        if found is None:
            return
        job, node = found
        if ev.conn is not None:
            self._bind(job, node, ev.conn)
            node.last_seen = ev.now
        if not node.live:
            if node.state == r.state:  # the same report resent: same answer
                self._reply(ev.waiter, state=node.state.value, job_state=job.state.value)
            else:
                self._error(
                    ev.waiter,
                    ErrorCode.ALREADY_TERMINAL,
                    f"{node.describe()} is already {node.state.value}; it cannot become {r.state.value}",
                )
            return
        if r.state == N.RUNNING and job.spec_blob is None:
            self._error(
                ev.waiter,
                ErrorCode.NOT_READY,
                f"{node.describe()} cannot run before the cluster is complete; call await_cluster first",
            )
            return
        if r.state == N.RUNNING and node.state == N.RUNNING:
            if self._update_meta(job, node, r.meta):
                self._journal(ReportNode(now=ev.now, req=r))
            self._reply(ev.waiter, state=node.state.value, job_state=job.state.value)
            return
        self._journal(ReportNode(now=ev.now, req=r))
        self._update_meta(job, node, r.meta)
        if r.state == N.RUNNING:
            self._set_node(job, node, N.RUNNING, ev.now)
            if job.state == J.READY and not job.in_state.get(N.REGISTERED) and not job.in_state.get(N.READY):
                self._set_job(job, "run", ev.now)
        elif r.state == N.SUCCEEDED:
            self._set_node(job, node, N.SUCCEEDED, ev.now)
            self._maybe_succeeded(job, ev.now)
            self._maybe_stopped(job, ev.now)
        elif r.state == N.FAILED:
            node.error = r.error if r.error.strip() else "failed without an error message"
            self._set_node(job, node, N.FAILED, ev.now, node.error.strip().splitlines()[-1][:200])
            self._node_down(job, node, ev.now, f"{node.describe()} failed:\n{node.error}")
        else:  # stopped
            if job.stopping() or self._must_stop(job, node):
                self._set_node(job, node, N.STOPPED, ev.now)
                self._maybe_stopped(job, ev.now)
            else:
                node.error = r.error if r.error.strip() else "stopped although no stop was requested"
                self._set_node(job, node, N.FAILED, ev.now, node.error)
                self._node_down(job, node, ev.now, f"{node.describe()} stopped unasked: {node.error}")
        self._wake_stops(job)
        self._wake_watchers(job)
        self._reply(ev.waiter, state=node.state.value, job_state=job.state.value)

    def _node_down(self, job: Job, node: Node, now: float, error: str) -> None:
        """A node failed or was lost: the job fails unless its role is tolerated."""
        if job.terminal:
            return
        if job.state in (J.SUBMITTED, J.RESERVING) and node.state == N.LOST:
            # Still reserving: free the slot so a retry (Spark task retry, Mesos relaunch) can
            # take it; the reservation deadline names it if nothing comes.
            slot = job.slots[node.executor_id]
            self._remember(slot, node)
            slot.node = None
            job.filled -= 1
            job.first_missing = min(job.first_missing, node.executor_id)
            self._count(job, node, -1)
            self._refuse_node_waits(
                job, node, ErrorCode.NODE_LOST, f"{node.describe()} was LOST: {node.error}"
            )
            return
        if self._tolerated(job, node):
            self._maybe_succeeded(job, now)
            return
        if job.state == J.STOPPING and node.state == N.LOST:
            self._maybe_stopped(job, now)
            return
        why = FailureReason.NODE_LOST if node.state == N.LOST else FailureReason.NODE_FAILED
        self._fail_job(job, now, why, error)

    def _must_stop(self, job: Job, node: Node) -> bool:
        if job.stopping():
            return True
        cur = self._node(job, node.executor_id)
        return cur is not node

    def _stop_answer(self, job: Job, node: Node | None, attempt: int) -> dict[str, Any]:
        if node is None or node.attempt != attempt:
            return {"stop": True, "reason": f"attempt {attempt} was superseded", "job_state": job.state.value}
        if job.stopping():
            reason = job.error or job.stop_reason or f"job {job.state.value}"
            if job.state == J.SUCCEEDED:
                reason = "the job succeeded; its remaining nodes stop"
            return {"stop": True, "reason": reason, "job_state": job.state.value}
        return {"stop": False, "reason": "", "job_state": job.state.value}

    def _heartbeat(self, ev: HeartbeatNode) -> None:
        r = ev.req
        job = self._job_or_error(r.job, ev.waiter)
        if job is None:
            return
        node = self._node(job, r.executor_id)
        if node is not None and node.attempt == r.attempt:
            self._bind(job, node, ev.conn)
            node.last_seen = ev.now
            if node.live:
                self._arm_node(job, node)
            if self._update_meta(job, node, r.meta):
                self._journal(HeartbeatNode(now=ev.now, req=r))
        elif node is None or node.attempt < r.attempt:
            self._error(
                ev.waiter,
                ErrorCode.NOT_REGISTERED,
                f"executor {r.executor_id} attempt {r.attempt} "
                f"of job {job.id} is not registered; register first",
            )
            return
        self._reply(ev.waiter, **self._stop_answer(job, node, r.attempt))

    def _progress(self, ev: ProgressNode) -> None:
        r = ev.req
        job = self._job_or_error(r.job, ev.waiter)
        if job is None:
            return
        node = self._node(job, r.executor_id)
        if node is None or node.attempt != r.attempt:
            self._error(
                ev.waiter,
                ErrorCode.NOT_REGISTERED,
                f"executor {r.executor_id} attempt {r.attempt} of job {job.id} is not the registered "
                "node of its slot; only that node may report progress",
            )
            return
        # A finished job's series are thinned and final: late figures are answered, not kept.
        if not job.terminal and r.usage:
            job.usage[r.executor_id] = dict(r.usage)
            job.reports += 1
        if not job.terminal and r.figures:
            figures = dict(r.figures)
            job.figures[r.executor_id] = figures
            job.reports += 1
            points = job.series.get(r.executor_id)
            if points is None:
                cap = max(8, min(SERIES_POINTS_PER_NODE, SERIES_POINTS_PER_JOB // job.spec.size))
                points = job.series[r.executor_id] = deque(maxlen=cap)
            points.append((ev.now, figures))
        if not job.terminal and (r.usage or r.figures):
            self._wake_watchers(job)
        self._reply(ev.waiter)

    def series(self, job_id: str, executor_id: int | None = None, since: float = 0.0) -> dict[str, Any]:
        """A job's progress points per node (raises KeyError if the job is unknown).

        ``since`` keeps only later points (a dashboard polling for what is new).
        """
        job = self.jobs[job_id]
        nodes = []
        for eid, points in sorted(job.series.items()):
            if executor_id is not None and eid != executor_id:
                continue
            slot = job.slots[eid]
            nodes.append(
                {
                    "executor_id": eid,
                    "role": slot.role,
                    "index": slot.index,
                    "points": [[t, dict(f)] for t, f in points if t > since],
                }
            )
        return {"job": job.id, "state": job.state.value, "nodes": nodes}

    def _node_logs(self, ev: NodeLogsEvent) -> None:
        r = ev.req
        job = self._job_or_error(r.job, ev.waiter)
        if job is None:
            return
        node = self._node(job, r.executor_id)
        if node is None or node.attempt != r.attempt:
            self._error(
                ev.waiter,
                ErrorCode.NOT_REGISTERED,
                f"executor {r.executor_id} attempt {r.attempt} of job {job.id} is not the registered "
                "node of its slot; only that node may send its output",
            )
            return
        # Kept after the job ended too (its last words often come then), within the bound.
        lines = job.logs.get(r.executor_id)
        if lines is None:
            cap = max(50, min(LOG_LINES_PER_NODE, LOG_LINES_PER_JOB // job.spec.size))
            lines = job.logs[r.executor_id] = deque(maxlen=cap)
        dropped = r.dropped + max(0, len(lines) + len(r.lines) - (lines.maxlen or 0))
        if dropped:
            job.logs_dropped[r.executor_id] = job.logs_dropped.get(r.executor_id, 0) + dropped
        for text in r.lines:
            lines.append((job.log_seq, ev.now, r.stream, text))
            job.log_seq += 1
        self._reply(ev.waiter)

    def logs(
        self, job_id: str, executor_id: int = -1, since: int = 0, limit: int = m.MAX_LOGS_REPLY
    ) -> dict[str, Any]:
        """A job's node output from line ``since`` on, oldest first, at most ``limit`` lines
        (raises KeyError if the job is unknown)."""
        job = self.jobs[job_id]
        picked: list[tuple[int, float, int, str, str]] = []
        nodes = []
        for eid, lines in sorted(job.logs.items()):
            if executor_id >= 0 and eid != executor_id:
                continue
            slot = job.slots[eid]
            nodes.append(
                {
                    "executor_id": eid,
                    "role": slot.role,
                    "index": slot.index,
                    "dropped": job.logs_dropped.get(eid, 0),
                }
            )
            for seq, t, stream, text in reversed(lines):
                if seq < since:
                    break
                picked.append((seq, t, eid, stream, text))
        picked.sort()
        more = len(picked) > limit
        picked = picked[:limit]
        return {
            "job": job.id,
            "state": job.state.value,
            "nodes": nodes,
            "lines": [list(x) for x in picked],
            "next": picked[-1][0] + 1 if more else max(since, job.log_seq),
        }

    def _get_logs(self, ev: GetLogsEvent) -> None:
        r = ev.req
        if self._job_or_error(r.job, ev.waiter, ev.viewer) is not None:
            self._reply(ev.waiter, **self.logs(r.job, r.executor_id, r.since, r.limit))

    @staticmethod
    def _trim_logs(job: Job) -> None:
        if not job.logs:
            return
        keep = max(50, LOG_LINES_FINISHED // len(job.logs))
        for eid, lines in job.logs.items():
            if (lines.maxlen or 0) > keep:
                gone = max(0, len(lines) - keep)
                if gone:
                    job.logs_dropped[eid] = job.logs_dropped.get(eid, 0) + gone
                job.logs[eid] = deque(list(lines)[-keep:], maxlen=keep)

    @staticmethod
    def _thin_series(job: Job) -> None:
        """Keep evenly spaced points, the first and last of each node among them."""
        if sum(len(p) for p in job.series.values()) <= SERIES_POINTS_FINISHED:
            return
        keep = max(2, SERIES_POINTS_FINISHED // len(job.series))
        for eid, points in job.series.items():
            n = len(points)
            if n > keep:
                picked = [points[round(i * (n - 1) / (keep - 1))] for i in range(keep)]
                job.series[eid] = deque(picked, maxlen=keep)

    def _update_meta(self, job: Job, node: Node, meta: Mapping[str, Any]) -> bool:
        """Merge what a node says about itself; True (and watchers woken) if anything changed."""
        if all(_same(node.meta.get(k), v) for k, v in meta.items()):
            return False
        node.meta.update(meta)
        # Each update is bounded by the wire (MAX_META_ENTRIES); their union must be too, or
        # heartbeats naming new keys would grow a node without end: the oldest keys go.
        while len(node.meta) > m.MAX_META_ENTRIES or (
            len(node.meta) > 1 and _meta_chars(node.meta) > MAX_META_CHARS
        ):
            del node.meta[next(iter(node.meta))]
        job.version += 1
        self._wake_watchers(job)
        return True

    def _await_stop(self, ev: AwaitStopEvent) -> None:
        r = ev.req
        job = self._job_or_error(r.job, ev.waiter)
        if job is None:
            return
        node = self._node(job, r.executor_id)
        answer = self._stop_answer(job, node, r.attempt)
        if answer["stop"] or (node is not None and not node.live):
            self._reply(ev.waiter, **answer)
        else:
            self._add_wait(ev.waiter, _Wait("stop", job.id, ev.now + r.timeout_s, r.executor_id, r.attempt))

    def _await_job(self, ev: AwaitJobEvent) -> None:
        r = ev.req
        job = self._job_or_error(r.job, ev.waiter, ev.viewer)
        if job is None:
            return
        if isinstance(r, m.WatchJob):
            if job.version > r.version or job.terminal or 0 <= r.reports < job.reports:
                self._reply(ev.waiter, **(self.brief(job.id) if r.brief else self.status(job.id)))
            else:
                self._add_wait(
                    ev.waiter,
                    _Wait(
                        "watch",
                        job.id,
                        ev.now + r.timeout_s,
                        version=r.version,
                        brief=r.brief,
                        reports=r.reports,
                    ),
                )
        elif job.terminal:
            self._reply(ev.waiter, **self.status(job.id))
        else:
            self._add_wait(ev.waiter, _Wait("job", job.id, ev.now + r.timeout_s))

    def _status(self, ev: StatusEvent) -> None:
        if ev.job is None:
            self._reply(ev.waiter, jobs=self.summary(ev.viewer))
        elif self._job_or_error(ev.job, ev.waiter, ev.viewer) is not None:
            self._reply(ev.waiter, **self.status(ev.job))

    # -- engines ------------------------------------------------------------------------

    def _engine_task_update(self, ev: EngineTaskUpdate) -> None:
        job = self.jobs.get(ev.job)
        if job is None or job.terminal or not 0 <= ev.executor_id < len(job.slots):
            return  # the job's story is over (or never began): nothing to record
        slot = job.slots[ev.executor_id]
        node = slot.node
        if node is not None and node.task_id != ev.task_id:
            return  # about a task this slot no longer runs
        self._journal(ev)
        slot.task = EngineTask(ev.task_id, ev.state, ev.message)
        name = f"{slot.role}:{slot.index}"
        self._note(job, ev.now, f"{name} {slot.task.describe(job.spec.engine)}")
        if ev.ended:
            what = f"{job.spec.engine} task {ev.task_id} ended {ev.state}" + (
                f": {ev.message}" if ev.message else ""
            )
            if node is None:
                if not job.stopping():
                    self._fail_job(
                        job,
                        ev.now,
                        FailureReason.NODE_FAILED,
                        f"{name} (executor {ev.executor_id}) never registered: {what}",
                    )
            elif node.live:
                node.error = what
                if job.stopping():  # it was told to stop; the engine ending its task is how it did
                    self._set_node(job, node, N.STOPPED, ev.now, what)
                    self._maybe_stopped(job, ev.now)
                else:
                    self._set_node(job, node, N.FAILED, ev.now, what)
                    self._node_down(job, node, ev.now, f"{node.describe()} failed: {what}")
                self._wake_stops(job)
        self._wake_watchers(job)

    def _engine_job_failed(self, ev: EngineJobFailed) -> None:
        job = self.jobs.get(ev.job)
        if job is None or job.terminal:
            return
        self._journal(ev)
        self._fail_job(job, ev.now, FailureReason.ENGINE_FAILED, ev.reason)

    # -- time and connections ------------------------------------------------------------

    def _disconnected(self, ev: Disconnected) -> None:
        for w in self._waits_by_conn.pop(ev.conn, ()):
            self._pop_wait(w)
        for job_id, executor_id in self._nodes_by_conn.pop(ev.conn, ()):
            job = self.jobs.get(job_id)
            if job is None:  # forgotten since
                continue
            node = self._node(job, executor_id)
            if node is not None and node.conn == ev.conn and node.live and not job.terminal:
                node.conn, node.disconnected_at = None, ev.now
                self._arm_node(job, node)

    def _recovered(self, ev: Recovered) -> None:
        self._timer(ev.now, ("forget",))  # what aged while the coordinator was down
        for job in self.jobs.values():
            while job.completing is not None:  # stopped (killed) before it was done
                self._complete_some(job, ev.now, len(job.slots))
            if not job.terminal:
                self._timer(job.submitted_at + job.spec.reservation_timeout_s, ("reserve", job.id))
            for node in job.nodes():
                if node.live:
                    # The restart cost every node its connection; give each the full heartbeat
                    # timeout to come back rather than the short reconnect grace.
                    node.conn, node.disconnected_at, node.last_seen = None, None, ev.now
                    node.timer = None
                    self._arm_node(job, node)

    def _tick(self, ev: Tick) -> None:
        while self._timers and self._timers[0][0] <= ev.now:
            when, _, key = heapq.heappop(self._timers)
            kind = key[0]
            if kind == "wait":
                self._wait_expired(key[1], ev.now)
            elif kind == "reserve":
                job = self.jobs.get(key[1])
                if job is not None and job.state in (J.SUBMITTED, J.RESERVING):
                    self._reservation_expired(ReservationExpired(now=ev.now, job=job.id))
            elif kind == "forget":
                self._forget_old(ev.now)
            elif kind == "serving":
                self._serving_grace_expired(ServingGraceExpired(now=ev.now, job=key[1]))
            else:
                _, job_id, executor_id, attempt = key
                job = self.jobs.get(job_id)
                if job is None:  # forgotten since
                    continue
                node = self._node(job, executor_id)
                if node is None or node.attempt != attempt or not node.live or node.timer != when:
                    continue  # superseded entry (lazy deletion)
                node.timer = None
                deadline = self._arm_node(job, node)
                if deadline <= ev.now:
                    if (
                        node.disconnected_at is not None
                        and ev.now >= node.disconnected_at + job.spec.reconnect_grace_s
                    ):
                        reason = (
                            f"connection lost and not re-established within "
                            f"{job.spec.reconnect_grace_s:g} s (process or host died?)"
                        )
                    else:
                        reason = f"no heartbeat for {job.spec.heartbeat_timeout_s:g} s (process hung or host unreachable?)"
                    self._node_lost(
                        NodeLost(
                            now=ev.now, job=job_id, executor_id=executor_id, attempt=attempt, reason=reason
                        )
                    )

    def _wait_expired(self, waiter: Waiter, now: float) -> None:
        wait = self._waits.get(waiter)
        if wait is None or wait.deadline > now:
            return
        self._pop_wait(waiter)
        job = self.jobs.get(wait.job)
        if wait.kind == "cluster" and job is not None:
            missing = "; ".join(self._missing_lines(job))
            self._error(
                waiter,
                ErrorCode.TIMEOUT,
                f"cluster of job {job.id} not complete before the deadline; still missing: {missing}",
            )
        elif wait.kind == "stop" and job is not None:
            self._reply(waiter, stop=False, reason="", job_state=job.state.value)
        elif wait.kind == "watch" and job is not None:
            self._reply(waiter, **(self.brief(job.id) if wait.brief else self.status(job.id)))
        elif job is not None:
            self._error(waiter, ErrorCode.TIMEOUT, f"job {job.id} is still {job.state.value} at the deadline")

    def _node_lost(self, ev: NodeLost) -> None:
        job = self.jobs.get(ev.job)
        node = self._node(job, ev.executor_id) if job else None
        if job is None or node is None or node.attempt != ev.attempt or not node.live:
            return
        self._journal(
            NodeLost(now=ev.now, job=ev.job, executor_id=ev.executor_id, attempt=ev.attempt, reason=ev.reason)
        )
        node.error = ev.reason
        self._set_node(job, node, N.LOST, ev.now, ev.reason)
        self._node_down(job, node, ev.now, f"{node.describe()} was lost: {ev.reason}")
        self._wake_stops(job, ev.executor_id)  # its slot may have been freed
        self._wake_stops(job)
        self._wake_watchers(job)
