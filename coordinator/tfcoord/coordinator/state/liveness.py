"""Is each live node still there: heartbeats, connections, and the deadlines they feed.

Every live node has one liveness deadline: its last heartbeat plus the job's heartbeat
timeout, or sooner, once its connection closed, the end of its reconnect grace. A node past
its deadline is LOST (a :class:`NodeLost`, journaled like any other event), which fails its
job unless its role is tolerated or the job is still reserving (then its slot is freed for
a retry). Heartbeats and disconnects themselves are not journaled: after a restart every
live node gets a fresh grace (:class:`Recovered`).
"""

from __future__ import annotations

from tfcoord.client.vocab import ErrorCode, NodeState

from .events import Disconnected, HeartbeatNode, NodeLost, Recovered, handles
from .jobs import stop_answer
from .ledger import Ledger
from .lifecycle import Lifecycle
from .registration import Registration
from .retention import Retention
from .telemetry import Telemetry
from .timers import TimerKey, TimerKind
from .waits import Waits


class Liveness:
    """Heartbeats, connections and liveness deadlines (see the module's docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        waits: Waits,
        lifecycle: Lifecycle,
        telemetry: Telemetry,
        registration: Registration,
        retention: Retention,
    ) -> None:
        self.ledger = ledger
        self.waits = waits
        self.lifecycle = lifecycle
        self.telemetry = telemetry
        self.registration = registration
        self.retention = retention
        ledger.timers.on(TimerKind.NODE, self._deadline, self._armed)

    @handles(HeartbeatNode)
    def heartbeat(self, ev: HeartbeatNode) -> None:
        r = ev.req
        job = self.ledger.job_or_error(r.job, ev.waiter)
        if job is None:
            return
        if r.generation < job.generation:
            # A node of an older generation: it hears that it must stop and rejoin; it no
            # longer holds a slot to keep alive.
            self.ledger.reply(ev.waiter, stop_answer(job, None, r.attempt, r.generation))
            return
        node = job.node(r.executor_id)
        if node is not None and node.attempt == r.attempt and node.generation == r.generation:
            if not self.ledger.holder(job, node, ev.conn, r.credential, ev.waiter):
                return  # a heartbeat from another member must not keep (or take) this slot
            self.ledger.bind(job, node, ev.conn)
            node.last_seen = ev.now
            if node.live:
                self.ledger.arm_node(job, node)
            if self.telemetry.update_meta(job, node, r.meta):
                self.ledger.journal(HeartbeatNode(now=ev.now, req=r))
        elif node is None or node.attempt < r.attempt or r.generation > job.generation:
            self.ledger.error(
                ev.waiter,
                ErrorCode.NOT_REGISTERED,
                f"executor {r.executor_id} attempt {r.attempt} of job {job.id} is not registered; register first",
            )
            return
        self.ledger.reply(ev.waiter, stop_answer(job, node, r.attempt, r.generation))

    @handles(Disconnected)
    def disconnected(self, ev: Disconnected) -> None:
        self.waits.drop_conn(ev.conn)
        for job_id, executor_id in self.ledger.nodes_by_conn.pop(ev.conn):
            job = self.ledger.jobs.get(job_id)
            if job is None:  # forgotten since
                continue
            node = job.node(executor_id)
            if node is not None and node.conn == ev.conn and node.live and not job.terminal:
                node.conn, node.disconnected_at = None, ev.now
                self.ledger.arm_node(job, node)

    @handles(Recovered)
    def recovered(self, ev: Recovered) -> None:
        self.retention.recovered(ev.now)
        for job in self.ledger.jobs.values():
            self.registration.finish_completion(job, ev.now)
            if not job.terminal:
                self.lifecycle.arm_reservation(job)
                self.lifecycle.arm_deadline(job)
            for node in job.nodes():
                if node.live:
                    # The restart cost every node its connection; give each the full heartbeat
                    # timeout to come back rather than the short reconnect grace.
                    node.conn, node.disconnected_at, node.last_seen = None, None, ev.now
                    node.timer = None
                    self.ledger.arm_node(job, node)

    def _armed(self, when: float, key: TimerKey) -> bool:
        job = self.ledger.jobs.get(key[1])
        node = job.node(key[2]) if job is not None else None
        return node is not None and node.attempt == key[3] and node.timer == when

    def _deadline(self, when: float, key: TimerKey, now: float) -> None:
        _, job_id, executor_id, attempt = key
        job = self.ledger.jobs.get(job_id)
        if job is None:  # forgotten since
            return
        node = job.node(executor_id)
        if node is None or node.attempt != attempt or not node.live or node.timer != when:
            return  # superseded entry (lazy deletion)
        node.timer = None
        deadline = self.ledger.arm_node(job, node)
        if deadline > now:
            return
        if node.disconnected_at is not None and now >= node.disconnected_at + job.spec.reconnect_grace_s:
            reason = (
                f"connection lost and not re-established within "
                f"{job.spec.reconnect_grace_s:g} s (process or host died?)"
            )
        else:
            reason = (
                f"no heartbeat for {job.spec.heartbeat_timeout_s:g} s (process hung or host unreachable?)"
            )
        self.node_lost(NodeLost(now=now, job=job_id, executor_id=executor_id, attempt=attempt, reason=reason))

    @handles(NodeLost)
    def node_lost(self, ev: NodeLost) -> None:
        job = self.ledger.jobs.get(ev.job)
        node = job.node(ev.executor_id) if job else None
        if job is None or node is None or node.attempt != ev.attempt or not node.live:
            return
        self.ledger.journal(
            NodeLost(now=ev.now, job=ev.job, executor_id=ev.executor_id, attempt=ev.attempt, reason=ev.reason)
        )
        node.error = ev.reason
        self.ledger.set_node(job, node, NodeState.LOST, ev.now, ev.reason)
        self.lifecycle.node_down(job, node, ev.now, f"{node.describe()} was lost: {ev.reason}")
        self.waits.wake_stops(job, ev.executor_id)  # its slot may have been freed
        self.waits.wake_stops(job)
        self.waits.wake_watchers(job)
