"""What the coordinator holds of a job: its slots, the node in each, and their history.

Plain data and the rules that read only it (who decides a job's success, must a node
stop now, what a node is told about stopping); every change to it goes through the
parts of the state machine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tfcoord.client import messages as m
from tfcoord.client.jobreplies import NodeStatus
from tfcoord.client.replies import StopAnswer
from tfcoord.client.vocab import TERMINAL_JOB, TERMINAL_NODE, FailureReason, JobState, NodeState

J, N = JobState, NodeState

#: Roles whose success is the job's success; ps and evaluator serve them and are then stopped.
FINISHING_ROLES = frozenset({"chief", "master", "worker"})
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


@dataclass(slots=True)  # a 10,000-node job holds 10,000 of these: no dict per node
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
    #: The cluster generation this node belongs to (see ``Job.generation``).
    generation: int = 0
    #: How its work ended, as it reported (negative: the signal that ended it). What the
    #: node proves itself with from another connection is not kept: it is derived from
    #: the node's identity (see ``Ledger.credential_of``), 113 bytes a node saved.
    exit_code: int = 0

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
        if self.generation:
            where += f", generation {self.generation}"
        return f"{self.name} ({where})"

    def status(
        self,
        figures: dict[str, int | float] | None = None,
        usage: dict[str, int | float] | None = None,
        *,
        meta: bool = True,
    ) -> NodeStatus:
        """What status shows of this node: with its latest ``figures`` and ``usage`` while it
        holds its slot; an earlier attempt without them, and without its metadata."""
        return NodeStatus.of(  # every field given: a status builds one per node
            executor_id=self.executor_id,
            attempt=self.attempt,
            role=self.role,
            index=self.index,
            state=self.state,
            host=self.host,
            port=self.port,
            gpus=self.gpus,
            task_id=self.task_id,
            meta=dict(self.meta) if meta else {},
            registered_at=self.registered_at,
            last_seen=self.last_seen,
            ended_at=self.ended_at,
            error=self.error,
            connected=self.conn is not None,
            generation=self.generation,
            exit_code=self.exit_code,
            figures=figures,
            usage=usage,
        )


@dataclass(frozen=True)
class EngineTask:
    """The last thing an engine said about a slot's task (see ``EngineTaskUpdate``)."""

    task_id: str
    state: str
    message: str = ""

    def describe(self, engine: str) -> str:
        if not self.task_id:
            return f"{engine}: {self.message or self.state}"
        return f"{engine} task {self.task_id} {self.state}" + (f" ({self.message})" if self.message else "")


@dataclass(slots=True)
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

    def remember(self, node: Node) -> None:
        """Keep ``node`` as an earlier attempt (the newest ``MAX_HISTORY_PER_SLOT``)."""
        self.history.append(node)
        if len(self.history) > MAX_HISTORY_PER_SLOT:
            del self.history[0]


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
    #: No slot before this one is empty (a hint for ``views.brief``).
    first_missing: int = 0
    #: While the cluster completion goes on (see ``Continue``): the first slot whose
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
    #: first, bounded (see ``telemetry.SERIES_POINTS_*``).
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
    #: The cluster's generation: 0, then one more each time a failure restarts the cluster
    #: (``JobSpec.max_restarts``). Only nodes of the current generation hold slots; a message
    #: of an older one is refused, or told to rejoin (see :func:`stop_answer`).
    generation: int = 0
    #: One entry per restart: ``generation`` (the one it started), ``at``, ``node`` (who
    #: failed), ``cause`` (what happened to it), ``exit_code``, ``lost``.
    restarts: list[dict[str, Any]] = field(default_factory=list)
    #: Since when the slots are being filled: submission, then each restart (the
    #: reservation deadline counts from it).
    reserving_since: float = 0.0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_JOB

    def nodes(self) -> Iterable[Node]:
        return (s.node for s in self.slots if s.node is not None)

    def node(self, executor_id: int) -> Node | None:
        """The node now in slot ``executor_id`` (None: empty, or no such slot)."""
        if 0 <= executor_id < len(self.slots):
            return self.slots[executor_id].node
        return None

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

    def tolerated(self, node: Node) -> bool:
        """May ``node`` fail without failing the job?"""
        return node.role in self.spec.tolerate_failure

    def stopping(self) -> bool:
        """Must every live node of this job stop now?"""
        return self.state in (J.STOPPING, J.SUCCEEDED, J.FAILED, J.STOPPED)

    def must_stop(self, node: Node) -> bool:
        """Must ``node`` stop: its job is stopping, or a newer attempt took its slot?"""
        if self.stopping():
            return True
        return self.node(node.executor_id) is not node

    def current(self, executor_id: int, attempt: int, generation: int) -> Node | None:
        """The node in slot ``executor_id`` if it is this attempt of this generation."""
        node = self.node(executor_id)
        if node is None or node.attempt != attempt or node.generation != generation:
            return None
        return node

    def restarts_left(self) -> int:
        return self.spec.max_restarts - len(self.restarts)

    def restart_story(self) -> str:
        """Every restart with its cause, for the error of a job that ran out of them."""
        return "\n".join(
            f"  restart {i}/{self.spec.max_restarts} (generation {r['generation']}): {r['node']} {r['cause']}"
            for i, r in enumerate(self.restarts, 1)
        )

    def timeline_cap(self) -> int:
        return TIMELINE_BASE + TIMELINE_PER_SLOT * self.spec.size

    def executor_id(self, slot: Slot) -> int:
        """The slot's executor id, from the template (``JobSpec.slots`` numbers slots in order).

        Not ``job.slots.index(slot)``: that compares dataclasses one by one, which made the
        status of a large reserving job quadratic (seconds at 2,000 slots, on the loop).
        """
        offset = 0
        for role, count in self.spec.roles:
            if role == slot.role:
                return offset + slot.index
            offset += count
        raise KeyError(f"role {slot.role!r} is not in job {self.id}'s template")

    def holds(self, node: Node, now: float) -> bool:
        """Is ``node`` a live holder that no newer attempt may displace: connected, and
        heard from within its heartbeat timeout?"""
        return node.live and node.conn is not None and now - node.last_seen < self.spec.heartbeat_timeout_s


def stop_answer(job: Job, node: Node | None, attempt: int, generation: int = 0) -> StopAnswer:
    """What attempt ``attempt`` of a node of ``generation`` (now ``node`` in its slot) is told
    about stopping. A node of an older generation of a job that restarted is told to stop its
    work and rejoin (``restart``: the generation to register for) after ``backoff_s``."""
    if generation < job.generation and not job.stopping():
        last = job.restarts[-1] if job.restarts else {}
        return StopAnswer(
            stop=True,
            reason=f"the cluster restarts as generation {job.generation}: "
            f"{last.get('node', '')} {last.get('cause', '')}".rstrip(),
            job_state=job.state,
            restart=job.generation,
            backoff_s=job.spec.restart_backoff_s,
        )
    if (
        generation != job.generation
        or node is None
        or node.attempt != attempt
        or node.generation != generation
    ):
        return StopAnswer(stop=True, reason=f"attempt {attempt} was superseded", job_state=job.state)
    if job.stopping():
        reason = job.error or job.stop_reason or f"job {job.state.value}"
        if job.state == J.SUCCEEDED:
            reason = "the job succeeded; its remaining nodes stop"
        return StopAnswer(stop=True, reason=reason, job_state=job.state)
    return StopAnswer(stop=False, reason="", job_state=job.state)
