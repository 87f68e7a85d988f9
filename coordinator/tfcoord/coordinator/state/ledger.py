"""The jobs, the indexes over their live nodes, and the effects of the event in hand.

Every part of the state machine shares one :class:`Ledger`: it holds the jobs (see
``jobs.py``), which connection speaks for which node, which GPU each live node claims,
the deadline heap, and the list of effects the event being handled has produced so far.
Its methods are the small changes every part makes the same way: answer a request,
journal an event, add a timeline line, move a node along its life cycle, (re)arm a node's
liveness deadline.
"""

from __future__ import annotations

import hashlib
import hmac

from tfcoord.client import messages as m
from tfcoord.client.replies import Answer
from tfcoord.client.vocab import TERMINAL_NODE, ErrorCode, FailureReason, JobState, NodeState

from .events import Effect, Event, Journal, Log, Send, Viewer, Waiter
from .jobs import MAX_ATTEMPTS_PER_SLOT, MAX_HISTORY_PER_SLOT, Job, Node, Slot
from .oneorset import OneOrSet
from .timers import TimerKind, Timers
from .transitions import NODE_TRANSITIONS, next_state

J, N = JobState, NodeState

#: The longest error message an Error frame may carry (see ``messages.Error``): longer
#: texts (a job error quoting a node's 64 KiB traceback and its description) are clipped.
MAX_MESSAGE_LEN = m.MAX_ERROR_LEN + m.MAX_TEXT_LEN

#: (job, host, GPU id): a GPU one live node of a job claims.
GpuClaim = tuple[str, str, str]


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


class Ledger:
    """What every part of the state machine reads and changes (see the module's docstring)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        #: The effects of the event being handled, in order.
        self.effects: list[Effect] = []
        self.timers = Timers()
        #: Per connection, the (job, executor id) of the nodes it speaks for, so a
        #: disconnect touches only what that connection held. Nearly every connection
        #: speaks for one node: no set per connection (see :mod:`.oneorset`).
        self.nodes_by_conn: OneOrSet[int, tuple[str, int]] = OneOrSet()
        #: GPU claim -> executor id, for live nodes: two nodes of one job on one host must
        #: never drive the same GPU. Per job, because GPU ids are what nodes say of
        #: themselves: a claim of one job must never refuse (or name) another job's nodes.
        self.gpu_owner: dict[GpuClaim, int] = {}
        #: Keys the nodes' credentials (the server sets it from its secret): a credential is
        #: HMAC(key, job, slot, attempt, generation), so a replayed journal gives every node the
        #: credential it had, and no other node of the job (which knows only the job token)
        #: can make it.
        self.credential_key = b""
        #: Messages refused because they spoke for a slot they do not hold (impersonation).
        self.not_holder = 0

    # -- effects --------------------------------------------------------------------------

    def emit(self, effect: Effect) -> None:
        self.effects.append(effect)

    def send(self, waiter: Waiter | None, msg: m.Message) -> None:
        if waiter is not None:
            self.effects.append(Send(waiter[0], msg))

    def reply(self, waiter: Waiter | None, answer: Answer) -> None:
        """Answer ``waiter`` with ``answer`` (encoded once, however many it answers)."""
        if waiter is not None:
            self.send(waiter, m.Reply(id=waiter[1], result=answer.wire))

    def error(self, waiter: Waiter | None, code: ErrorCode, message: str) -> None:
        if waiter is not None:
            self.send(waiter, m.Error(id=waiter[1], code=code, message=clip(message, MAX_MESSAGE_LEN)))

    def journal(self, event: Event) -> None:
        self.effects.append(Journal(event))

    def note(
        self,
        job: Job,
        now: float,
        text: str,
        node: str = "",
        state: str = "",
        reason: FailureReason = FailureReason.NONE,
    ) -> None:
        """Add a line to ``job``'s timeline (a change watchers see) and log it."""
        job.events.append((now, text))
        cap = job.timeline_cap()
        if len(job.events) > cap:
            # Drop a quarter at once, so trimming costs O(1) per line over time.
            cut = len(job.events) - cap + cap // 4
            del job.events[:cut]
            job.events_dropped += cut
        job.version += 1
        self.effects.append(Log(job.id, text, node, state, reason))

    # -- lookups that refuse ---------------------------------------------------------------

    def job_or_error(self, job_id: str, waiter: Waiter | None, viewer: Viewer = None) -> Job | None:
        """The job, or None after refusing ``waiter``: unknown, or not ``viewer``'s to see."""
        job = self.jobs.get(job_id)
        if job is not None and viewer is not None and job.owner != viewer:
            job = None  # another driver's job: as if it did not exist, so nothing leaks
        if job is None:
            self.error(
                waiter,
                ErrorCode.UNKNOWN_JOB,
                f"no job {job_id!r} on this coordinator; check the job id (tfcoord status lists them)",
            )
        return job

    def node_or_error(
        self, job_id: str, executor_id: int, attempt: int, waiter: Waiter | None, generation: int = 0
    ) -> tuple[Job, Node] | None:
        """The job and the node that is attempt ``attempt`` of its slot in ``generation``, or
        None after refusing ``waiter``."""
        job = self.job_or_error(job_id, waiter)
        if job is None:
            return None
        if generation != job.generation:
            self.error(
                waiter,
                ErrorCode.STALE_GENERATION,
                f"job {job_id} is at cluster generation {job.generation}; executor {executor_id} of "
                f"generation {generation} must rejoin (register again) or exit",
            )
            return None
        node = job.node(executor_id)
        if node is None:
            self.error(
                waiter,
                ErrorCode.NOT_REGISTERED,
                f"executor {executor_id} of job {job_id} is not registered; call register first",
            )
            return None
        if node.attempt != attempt:
            self.error(
                waiter,
                ErrorCode.STALE_ATTEMPT,
                f"executor {executor_id} of job {job_id} is now "
                f"attempt {node.attempt}; attempt {attempt} was superseded and must exit",
            )
            return None
        return job, node

    # -- nodes ----------------------------------------------------------------------------

    @staticmethod
    def count(job: Job, node: Node, delta: int) -> None:
        """Count ``node`` (in its present state) into its slot (+1) or out of it (-1)."""
        job.in_state[node.state] = job.in_state.get(node.state, 0) + delta
        if node.state == N.SUCCEEDED and job.decides(node.role):
            job.decided += delta

    def set_node(self, job: Job, node: Node, new: NodeState, now: float, detail: str = "") -> None:
        """Move ``node`` to ``new`` (see ``NODE_TRANSITIONS``); an ended node frees its GPUs."""
        new = next_state(NODE_TRANSITIONS, node.state, new)
        self.count(job, node, -1)
        node.state = new
        self.count(job, node, +1)
        if new in TERMINAL_NODE:
            node.ended_at = now
            node.timer = None
            for g in node.gpus:
                if self.gpu_owner.get((job.id, node.host, g)) == node.executor_id:
                    del self.gpu_owner[(job.id, node.host, g)]
        self.note(
            job,
            now,
            f"{node.name} {new.value}" + (f": {detail}" if detail else ""),
            node=node.name,
            state=new.value,
        )

    def credential(self, job: Job, executor_id: int, attempt: int, generation: int) -> str:
        """The credential of one attempt of one slot in one generation of ``job``."""
        msg = f"{job.id}\0{executor_id}\0{attempt}\0{generation}".encode()
        return hmac.new(self.credential_key, msg, hashlib.sha256).hexdigest()

    def credential_of(self, job: Job, node: Node) -> str:
        """What ``node`` proves itself with when it speaks from another connection than its
        registration's: hex, never shown."""
        return self.credential(job, node.executor_id, node.attempt, node.generation)

    def holder(self, job: Job, node: Node, conn: int | None, credential: str, waiter: Waiter | None) -> bool:
        """Does this message come from ``node`` itself: from the connection it is bound to, or
        with its credential (after a reconnect)? Else it is refused, counted and noted: another
        member of the job (which holds the same token) must not speak for this node's slot, as
        a kubelet may touch only its own Node. A replayed event (no connection) is its own."""
        if (
            conn is None
            or conn == node.conn
            or (credential and hmac.compare_digest(credential, self.credential_of(job, node)))
        ):
            return True
        self.not_holder += 1
        # Logged, not added to the timeline: a member flooding such messages must not churn
        # what the job's watchers see.
        self.emit(
            Log(
                job.id,
                f"refused a message for {node.describe()} from another connection of the job",
                node.name,
            )
        )
        self.error(
            waiter,
            ErrorCode.NOT_SLOT_HOLDER,
            f"{node.describe()} speaks from another connection; a node may act only for its own slot "
            "(a reconnected node proves itself with the credential its registration returned)",
        )
        return False

    def bind(self, job: Job, node: Node, conn: int | None) -> None:
        """Note that ``node`` now speaks through connection ``conn`` (it is connected)."""
        if conn is not None:
            node.conn, node.disconnected_at = conn, None
            self.nodes_by_conn.add(conn, (job.id, node.executor_id))

    def arm_node(self, job: Job, node: Node) -> float:
        """(Re)arm the liveness deadline of a live node, keeping one authoritative entry.

        Lazily: a deadline that moves later (every heartbeat) leaves the earlier entry in
        place, and when that fires the liveness part re-arms from the node's real deadline.
        Pushing an entry per heartbeat instead kept heartbeat_timeout_s of them alive per
        node (150,000 at 10,000 nodes), and the collector's passes over them stalled the
        loop for 100-250 ms.
        """
        deadline = node.last_seen + job.spec.heartbeat_timeout_s
        if node.disconnected_at is not None:
            deadline = min(deadline, node.disconnected_at + job.spec.reconnect_grace_s)
        if node.timer is None or deadline < node.timer:
            node.timer = deadline
            self.timers.push(deadline, (TimerKind.NODE, job.id, node.executor_id, node.attempt))
        return node.timer

    # -- invariants -----------------------------------------------------------------------

    def validate(self) -> None:
        """Check the invariants of every job and of the GPU index; raise AssertionError."""
        live_gpus: dict[GpuClaim, int] = {}
        for job in self.jobs.values():
            self._validate_job(job)
            for s in job.slots:
                self._validate_slot(job, s, live_gpus)
        assert live_gpus == self.gpu_owner, "GPU owner index out of step with live nodes"

    @staticmethod
    def _validate_job(job: Job) -> None:
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
        assert job.decided == sum(1 for n in job.nodes() if n.state == N.SUCCEEDED and job.decides(n.role)), (
            job.id
        )
        if job.state == J.RUNNING:
            assert all(n.state != N.REGISTERED for n in job.nodes()), job.id
        assert len(job.events) <= job.timeline_cap(), job.id

    @staticmethod
    def _validate_slot(job: Job, s: Slot, live_gpus: dict[GpuClaim, int]) -> None:
        if s.node is not None:
            n = s.node
            assert (n.role, n.index) == (s.role, s.index), (job.id, n.executor_id)
            assert all(h.attempt <= n.attempt for h in s.history), (job.id, n.executor_id)
            assert n.live == (n.ended_at is None), (job.id, n.executor_id, n.state)
            if n.live:
                for g in n.gpus:
                    assert (job.id, n.host, g) not in live_gpus, (job.id, n.host, g)
                    live_gpus[(job.id, n.host, g)] = n.executor_id
        assert len(s.history) <= MAX_HISTORY_PER_SLOT, (job.id, s.role, s.index)
        assert s.attempts <= MAX_ATTEMPTS_PER_SLOT + 1, (job.id, s.role, s.index)
        for h in s.history:
            assert not h.live, (job.id, h.executor_id)
