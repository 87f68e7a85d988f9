"""Filling a job's slots: registration, the cluster spec, and the nodes waiting for it.

A node registers for its slot (an executor id) with an attempt number. The same attempt
again is the same node after a reconnect and gets the same answer; a second live node for
one slot is a duplicate and is refused; a newer attempt (a Spark task retry, a Mesos
relaunch) supersedes the older one while the job is still reserving, but only once the
holder is gone; after the cluster formed a TensorFlow cluster cannot change membership, so
a newer attempt fails the job. Two nodes of one job on one host never share a GPU.

Once every slot is filled the spec is encoded once (every node gets these bytes) and the
job is READY; every node READY and every cluster wait answered follow a chunk of nodes per
event (see ``Continue``), so at 10,000 nodes other jobs' heartbeats are answered between.
"""

from __future__ import annotations

from tfcoord.client import messages as m
from tfcoord.client.protocol import encode_spec
from tfcoord.client.replies import Registration as Registered
from tfcoord.client.vocab import ErrorCode, FailureReason, JobEvent, JobState, NodeState, WaitKind

from .events import AwaitClusterEvent, CompleteCluster, Continue, RegisterNode, handles
from .jobs import MAX_ATTEMPTS_PER_SLOT, Job, Node, Slot
from .ledger import Ledger
from .lifecycle import Lifecycle
from .transitions import NODE_TRANSITIONS, next_state
from .views import cluster_spec
from .waits import Wait, Waits

J, N, E = JobState, NodeState, JobEvent

#: Nodes made READY (their cluster waits answered) per event when a job's cluster forms;
#: the rest follow in :class:`CompleteCluster` events. 256 nodes are about 2 ms of work,
#: where a whole 10,000-node job in one event was a 60-90 ms turn every heartbeat waited behind.
COMPLETE_PER_EVENT = 256

#: Why a registration is refused: the code, and what to tell the node.
Refusal = tuple[ErrorCode, str]


def registration(job: Job, node: Node, credential: str) -> Registered:
    """The answer to a registration: the slot the node holds, and its ``credential``."""
    return Registered(
        job=job.id,
        role=node.role,
        index=node.index,
        size=job.spec.size,
        heartbeat_timeout_s=job.spec.heartbeat_timeout_s,
        state=job.state,
        generation=node.generation,
        restarts=len(job.restarts),
        max_restarts=job.spec.max_restarts,
        credential=credential,
    )


def _closed(job: Job, r: m.Register) -> Refusal | None:
    """Does the job take no registration now, or is there no such slot?"""
    if job.terminal or job.state == J.STOPPING:
        return (
            ErrorCode.job_is(job.state),
            f"job {job.id} is {job.state.value} and takes no registrations: {job.error or job.stop_reason}",
        )
    if r.executor_id >= len(job.slots):
        return (
            ErrorCode.BAD_SLOT,
            f"executor {r.executor_id} is out of range: job {job.id} "
            f"has {len(job.slots)} slots (executors 0..{len(job.slots) - 1})",
        )
    if r.generation not in (-1, job.generation):
        return (
            ErrorCode.STALE_GENERATION,
            f"job {job.id} is at cluster generation {job.generation}, not {r.generation}: "
            + (
                "this node's generation is over; it must exit"
                if r.generation < job.generation
                else "no such generation"
            ),
        )
    return None


def _against_holder(job: Job, cur: Node, r: m.Register, now: float) -> Refusal | None:
    """Why attempt ``r.attempt`` may not take the slot ``cur`` holds (not the same node again)."""
    if r.attempt == cur.attempt:
        if cur.live:
            return (
                ErrorCode.DUPLICATE,
                f"slot {cur.name} of job {job.id} is already held by {cur.describe()}; "
                f"two live nodes claim executor {r.executor_id} (is the executor id unique? "
                "check that no other driver or application submits under this job id)",
            )
        return (
            ErrorCode.ALREADY_TERMINAL,
            f"{cur.describe()} already ended {cur.state.value}; a new attempt must use a higher attempt number",
        )
    if r.attempt < cur.attempt:
        return (
            ErrorCode.STALE_ATTEMPT,
            f"executor {r.executor_id} of job {job.id} is "
            f"already at attempt {cur.attempt}; attempt {r.attempt} must exit",
        )
    if job.state.reserving and job.holds(cur, now):
        # Only a holder that is gone (disconnected, lost, silent) may be replaced: a
        # token holder must not take over a slot a live node is serving from.
        return (
            ErrorCode.SLOT_HELD,
            f"slot {cur.name} of job {job.id} is held by {cur.describe()}, which is "
            f"connected and heartbeating; attempt {r.attempt} may take it over only once "
            "that node has exited (its connection closed) or stopped heartbeating",
        )
    return None


def _slot_refusal(
    job: Job, slot: Slot, r: m.Register, gpu_owner: dict[tuple[str, str, str], int]
) -> Refusal | None:
    """Why attempt ``r.attempt`` may not take ``slot`` (free, or held by an older attempt):
    an older attempt than one it had, too many attempts, or a GPU another node claims."""
    cur = slot.node
    newest = max((h.attempt for h in slot.history), default=-1) if slot.history else -1
    if cur is None and r.attempt < newest:
        return (
            ErrorCode.STALE_ATTEMPT,
            f"executor {r.executor_id} of job {job.id} already had attempt {newest}; attempt {r.attempt} must exit",
        )
    if slot.attempts >= MAX_ATTEMPTS_PER_SLOT and (cur is None or r.attempt != cur.attempt):
        return (
            ErrorCode.TOO_MANY_ATTEMPTS,
            f"slot {slot.role}:{slot.index} of job {job.id} was already taken by "
            f"{slot.attempts} attempts (at most {MAX_ATTEMPTS_PER_SLOT}); something restarts "
            "this task in a loop: look at its earlier errors (tfcoord status)",
        )
    gpu_clash = [(g, gpu_owner.get((job.id, r.host, g))) for g in r.gpus] if r.gpus else []
    gpu_clash = [(g, o) for g, o in gpu_clash if o is not None and o != r.executor_id]
    if gpu_clash:
        g, oe = gpu_clash[0]
        return (
            ErrorCode.GPU_CONFLICT,
            f"GPU {g} on host {r.host} is already claimed by executor {oe} of this job; "
            "give each node its own GPU (Spark: spark.task.resource.gpu.amount, "
            "or set CUDA_VISIBLE_DEVICES per executor)",
        )
    return None


class Registration:
    """Fills slots and forms clusters (see the module's docstring)."""

    def __init__(
        self, ledger: Ledger, waits: Waits, lifecycle: Lifecycle, complete_per_event: int = COMPLETE_PER_EVENT
    ) -> None:
        self.ledger = ledger
        self.waits = waits
        self.lifecycle = lifecycle
        self.complete_per_event = max(1, complete_per_event)

    # -- registration ---------------------------------------------------------------------

    @handles(RegisterNode)
    def register(self, ev: RegisterNode) -> None:
        r = ev.req
        ledger = self.ledger
        job = ledger.job_or_error(r.job, ev.waiter)
        if job is None:
            return
        refused = _closed(job, r)
        if refused is not None:
            ledger.error(ev.waiter, *refused)
            return
        slot = job.slots[r.executor_id]
        cur = slot.node
        restarted = False
        if cur is not None:
            settled = self._settled_by_holder(job, cur, ev)
            if settled is not False:
                return
            restarted = job.generation != cur.generation
        refused = _slot_refusal(job, slot, r, ledger.gpu_owner)
        if refused is not None:
            ledger.error(ev.waiter, *refused)
            return
        if not restarted:  # a registration that restarted the cluster was journaled for it
            ledger.journal(RegisterNode(now=ev.now, req=r))
        node = self._take(job, slot, r, ev)
        if job.state == J.SUBMITTED:
            self.lifecycle.set_job(job, E.REGISTER, ev.now)
        ledger.note(
            job,
            ev.now,
            f"{node.name} REGISTERED from {node.host}:{node.port}"
            + (f" (task {node.task_id})" if node.task_id else ""),
            node=node.name,
            state=node.state.value,
        )
        ledger.arm_node(job, node)
        self.waits.wake_stops(job, r.executor_id)  # a superseded attempt waiting for stop learns it now
        if job.filled == len(job.slots):
            self.cluster_complete(job, ev.now)
        self.waits.wake_watchers(job)
        ledger.reply(ev.waiter, registration(job, node, ledger.credential_of(job, node)))

    def _settled_by_holder(self, job: Job, cur: Node, ev: RegisterNode) -> bool | None:
        """Deal with a registration for a slot ``cur`` holds, unless a newer attempt may take
        it: the same node again gets the same answer; a refusal; or, once the cluster formed,
        the job fails or restarts. True if the registration was answered; False if it goes on
        to take the slot (after a restart, ``cur`` is no longer in it)."""
        r = ev.req
        same = (cur.host, cur.port, cur.task_id, cur.gpus) == (r.host, r.port, r.task_id, r.gpus)
        if r.attempt == cur.attempt and same:
            # The same node again, after a reconnect: the same answer, nothing changes. From a
            # connection of its own while the node still holds one, it must prove it is that
            # node (a member of the job could copy a registration to take its credential).
            if cur.conn is not None and not self.ledger.holder(job, cur, ev.conn, r.credential, ev.waiter):
                return True
            if cur.live:
                self.ledger.bind(job, cur, ev.conn)
                cur.last_seen = ev.now
                self.ledger.arm_node(job, cur)
            self.ledger.reply(ev.waiter, registration(job, cur, self.ledger.credential_of(job, cur)))
            return True
        refused = _against_holder(job, cur, r, ev.now)
        if refused is not None:
            self.ledger.error(ev.waiter, *refused)
            return True
        if not job.state.reserving:
            # A TensorFlow cluster cannot change membership once its spec is out: a retried
            # task (its older attempt is gone) restarts the whole cluster as a new generation
            # when the job may, and fails it otherwise.
            self.ledger.journal(RegisterNode(now=ev.now, req=r))
            if self.lifecycle.restartable(job, lost=True, exit_code=0):
                cause = f"was replaced by attempt {r.attempt} on host {r.host} (its task was retried)"
                self.lifecycle.restart(job, cur, ev.now, cause, lost=True)
                return False  # the slot is empty now: the new attempt takes it below
            self.lifecycle.fail_job(
                job,
                ev.now,
                FailureReason.MEMBERSHIP_CHANGED,
                f"{cur.describe()} was restarted as attempt {r.attempt} on host {r.host} "
                "after the cluster was formed; a TensorFlow cluster cannot change "
                "membership, so the job fails (resubmit it)",
            )
            self.ledger.error(ev.waiter, ErrorCode.JOB_FAILED, job.error)
            return True
        return False

    def _take(self, job: Job, slot: Slot, r: m.Register, ev: RegisterNode) -> Node:
        """Put attempt ``r.attempt`` in ``slot``, superseding the node there (a newer
        attempt, or a replacement for a lost node)."""
        ledger = self.ledger
        cur = slot.node
        if cur is not None:
            if cur.live:
                ledger.set_node(job, cur, N.STOPPED, ev.now, f"superseded by attempt {r.attempt}")
                cur.error = f"superseded by attempt {r.attempt}"
                self.waits.refuse_node(
                    job,
                    cur,
                    ErrorCode.STALE_ATTEMPT,
                    f"{cur.describe()} was superseded by attempt {r.attempt}",
                )
            slot.remember(cur)
            ledger.count(job, cur, -1)
        slot.attempts += 1
        node = Node(
            executor_id=r.executor_id,
            attempt=r.attempt,
            role=slot.role,
            index=slot.index,
            host=r.host,
            port=r.port,
            gpus=r.gpus,
            task_id=r.task_id,
            meta=dict(r.meta),
            registered_at=ev.now,
            last_seen=ev.now,
            generation=job.generation,
        )
        ledger.bind(job, node, ev.conn)
        if slot.node is None:
            job.filled += 1
        slot.node = node
        ledger.count(job, node, +1)
        for g in node.gpus:
            ledger.gpu_owner[(job.id, node.host, g)] = node.executor_id
        return node

    # -- the cluster ----------------------------------------------------------------------

    def cluster_complete(self, job: Job, now: float) -> None:
        """Every slot is filled: the spec, encoded once (every node gets these bytes), and the
        job READY; every node READY and every cluster wait answered follow in
        :class:`CompleteCluster` events, a chunk of nodes each (see :class:`Continue`)."""
        job.spec_blob = encode_spec(cluster_spec(job))
        self.lifecycle.set_job(job, E.COMPLETE, now)
        job.completing = 0
        self.ledger.emit(Continue(job.id))

    @handles(CompleteCluster)
    def complete_cluster(self, ev: CompleteCluster) -> None:
        job = self.ledger.jobs.get(ev.job)
        if job is not None:
            upto = self.complete_some(job, ev.now, ev.upto)
            if upto is not None:
                self.ledger.journal(CompleteCluster(now=ev.now, job=job.id, upto=upto))

    def finish_completion(self, job: Job, now: float) -> None:
        """Complete what a completion stopped (the coordinator was killed) left undone."""
        while job.completing is not None:
            self.complete_some(job, now, len(job.slots))

    def complete_some(self, job: Job, now: float, upto: int = -1) -> int | None:
        """The next slots of a completing job, up to ``upto`` (-1: the next
        :attr:`complete_per_event`): each node READY (unless it reported meanwhile), each of
        its cluster waits answered; per node only what ``Ledger.set_node`` and ``Waits.pop``
        would do (same effects, same order). Returns the slot it stopped before (None:
        nothing done)."""
        first = job.completing
        if first is None:
            return None
        if not job.state.formed:
            # Failed or stopping meanwhile: the cluster waits left were refused with it,
            # and nodes not yet READY stay as they are (live, told to stop by their waits).
            job.completing = None
            return None
        spec = job.spec_blob
        assert spec is not None  # set with ``completing``
        slots = job.slots
        last = min(len(slots), first + self.complete_per_event if upto < 0 else max(upto, first + 1))
        ready = next_state(NODE_TRANSITIONS, N.REGISTERED, N.READY)
        ledger, take = self.ledger, self.waits.take_cluster
        moved = stale = 0
        for eid in range(first, last):
            node = slots[eid].node
            assert node is not None  # every slot is filled once a job completes
            if node.state == N.REGISTERED:
                node.state = ready
                moved += 1
                name = node.name
                ledger.note(job, now, f"{name} {ready.value}", node=name, state=ready.value)
            taken = take(job.id, eid)
            stale += len(taken)
            for w, wait in taken:
                if node.attempt == wait.attempt and node.generation == wait.generation:
                    ledger.send(w, m.ClusterReply(id=w[1], role=node.role, index=node.index, spec=spec))
                else:
                    ledger.error(
                        w,
                        ErrorCode.STALE_ATTEMPT,
                        f"executor {wait.executor_id} attempt {wait.attempt} was replaced before the cluster formed",
                    )
        if moved:
            job.in_state[N.REGISTERED] -= moved
            job.in_state[ready] = job.in_state.get(ready, 0) + moved
        ledger.timers.dropped(stale)
        if last < len(slots):
            job.completing = last
            ledger.emit(Continue(job.id))
        else:
            job.completing = None
            self.waits.wake_watchers(job)  # they heard of READY already; now of every node's too
        return last

    @handles(AwaitClusterEvent)
    def await_cluster(self, ev: AwaitClusterEvent) -> None:
        r = ev.req
        found = self.ledger.node_or_error(r.job, r.executor_id, r.attempt, ev.waiter, r.generation)
        if found is None:
            return
        job, node = found
        if not self.ledger.holder(job, node, ev.conn, r.credential, ev.waiter):
            return
        self.ledger.bind(job, node, ev.conn)
        if job.spec_blob is not None and not (job.terminal and job.state != J.SUCCEEDED):
            self.ledger.send(
                ev.waiter,
                m.ClusterReply(id=ev.waiter[1], role=node.role, index=node.index, spec=job.spec_blob),
            )
        elif job.terminal or job.state == J.STOPPING:
            self.ledger.error(
                ev.waiter,
                ErrorCode.job_is(job.state),
                f"job {job.id} is {job.state.value}: {job.error or job.stop_reason}",
            )
        elif not node.live:
            self.ledger.error(
                ev.waiter, ErrorCode.node_is(node.state), f"{node.describe()} is {node.state.value}"
            )
        else:
            wait = Wait(
                WaitKind.CLUSTER,
                job.id,
                ev.now + r.timeout_s,
                r.executor_id,
                r.attempt,
                generation=r.generation,
            )
            self.waits.add(ev.waiter, wait)
