"""Prometheus metrics of one coordinator, exposed by the HTTP API at ``/metrics``.

Two kinds of numbers, gathered two ways so the pure state machine never learns about
Prometheus:

- What *is* (jobs and nodes by state, open connections, the server's own counters of
  rejected frames and failed handshakes) is read from the live objects at scrape
  time by a custom collector: nothing to keep in step, never stale.
- What *happened* (registrations, how long reservations and readiness took, failures
  by reason, journal commit latency) is counted as it happens by a
  :class:`~tfcoord.coordinator.server.ServerObserver` that watches the effects each
  event produces; state changes carry their node and new state as data (``Log``), so
  nothing here parses log text.

Every coordinator gets its own :class:`CollectorRegistry`, so several coordinators in
one process (tests, drivers with an embedded coordinator) never clash over names.
Event counters start at zero when the process starts; jobs replayed from the journal
show in the state gauges but are not counted again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tfcoord.client import __version__
from tfcoord.client.vocab import TERMINAL_JOB, FailureReason, JobState, NodeState

from . import state as s

if TYPE_CHECKING:
    from .server import CoordinatorServer

#: Submitted → READY: from seconds (everything already waiting) to the reservation
#: timeout (600 s by default), and beyond for long ones.
RESERVATION_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
#: READY → RUNNING: every node got the spec and must only report that it started; slow
#: means a node hangs in its set-up (TensorFlow import is about 6 s).
READINESS_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: One SQLite WAL commit: sub-millisecond on local disk, tens of ms on a slow network disk.
COMMIT_BUCKETS_S = (0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)

#: Reasons of ``tfcoord_failures_total``: a node reported failure (or stopped unasked), a
#: node was declared lost (no heartbeat, connection gone, engine said so), or a job's
#: reservation deadline passed with slots still missing.
FAILURE_REASONS = (FailureReason.NODE_FAILED, FailureReason.NODE_LOST, FailureReason.RESERVATION_TIMEOUT)
_NODE_FAILURE = {NodeState.FAILED: FailureReason.NODE_FAILED, NodeState.LOST: FailureReason.NODE_LOST}
#: Job states after which a job that was READY will never report RUNNING.
_READINESS_OVER = frozenset({JobState.STOPPING} | TERMINAL_JOB)

JOB_STATES = tuple(JobState)
NODE_STATES = tuple(NodeState)

#: The Prometheus text exposition format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StateCollector(Collector):
    """Gauges and counters read from the server and its state at scrape time."""

    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        srv = self._metrics.server
        jobs = {st: 0 for st in JOB_STATES}
        nodes = {st: 0 for st in NODE_STATES}
        for job in srv.state.jobs.values():
            jobs[job.state] += 1
            for ns, n in job.in_state.items():  # kept by the state machine: no walk over the nodes
                nodes[ns] += n
        g = GaugeMetricFamily("tfcoord_jobs", "Jobs held by the coordinator, by state.", labels=["state"])
        for js, n in jobs.items():
            g.add_metric([js], n)
        yield g
        g = GaugeMetricFamily(
            "tfcoord_nodes", "Nodes currently holding a slot of some job, by state.", labels=["state"]
        )
        for ns, n in nodes.items():
            g.add_metric([ns], n)
        yield g
        yield GaugeMetricFamily(
            "tfcoord_connections", "Open client connections (TCP protocol).", value=len(srv.peers)
        )
        yield CounterMetricFamily(
            "tfcoord_connections_rejected",
            "Connections refused because the coordinator held its maximum.",
            value=srv.rejected_connections,
        )
        yield CounterMetricFamily(
            "tfcoord_rejected_frames",
            "Frames that broke the wire protocol (oversized, truncated, undecodable, invalid); "
            "each closed its connection.",
            value=srv.rejected_frames,
        )
        yield CounterMetricFamily(
            "tfcoord_not_slot_holder",
            "Node messages refused for speaking for a slot from another connection without that "
            "node's credential (a member of a job acting as another).",
            value=srv.state.not_holder,
        )
        c = CounterMetricFamily(
            "tfcoord_auth_failures",
            "Failed authentications: TCP handshakes with a wrong proof, HTTP requests with a "
            "missing or wrong bearer token.",
            labels=["interface"],
        )
        c.add_metric(["tcp"], srv.auth_failures)
        c.add_metric(["http"], self._metrics.http_auth_failures)
        yield c
        info = GaugeMetricFamily("tfcoord_build_info", "The running tfcoord version.", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


class CoordinatorMetrics:
    """The metrics of one :class:`CoordinatorServer`; attach with :meth:`attach`.

    ``http_auth_failures`` is counted by the HTTP layer, like the server counts its own
    rejected frames and handshakes; the collector reads both at scrape time.
    """

    def __init__(self, server: CoordinatorServer) -> None:
        self.server = server
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_auth_failures = 0
        self.registrations = Counter(
            "tfcoord_registrations",
            "Node registrations accepted (new nodes, newer attempts and replacements).",
            registry=self.registry,
        )
        self.reservation_seconds = Histogram(
            "tfcoord_reservation_duration_seconds",
            "Time from a job's submission until every slot was registered (READY).",
            buckets=RESERVATION_BUCKETS_S,
            registry=self.registry,
        )
        self.readiness_seconds = Histogram(
            "tfcoord_readiness_duration_seconds",
            "Time from READY (every node has the cluster spec) until every node reported running.",
            buckets=READINESS_BUCKETS_S,
            registry=self.registry,
        )
        self.failures = Counter(
            "tfcoord_failures",
            "Failures by reason: nodes that ended FAILED (node_failed) or LOST (node_lost), and "
            "jobs whose reservation deadline passed (reservation_timeout).",
            labelnames=["reason"],
            registry=self.registry,
        )
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)  # present, at zero, before the first one
        self.restarts = Counter(
            "tfcoord_restarts",
            "Cluster restarts: a job's failure its restart policy retried as a new generation "
            "(JobSpec.max_restarts); each cause is in the job's status.",
            registry=self.registry,
        )
        self.commit_seconds = Histogram(
            "tfcoord_journal_commit_duration_seconds",
            "Time one group commit of the journal took (SQLite under --state-dir).",
            buckets=COMMIT_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))
        #: job id → when it became READY, until it runs or ends.
        self._ready_at: dict[str, float] = {}

    def attach(self) -> CoordinatorMetrics:
        """Start observing the server; returns self."""
        if self not in self.server.observers:
            self.server.observers.append(self)
        return self

    def detach(self) -> None:
        if self in self.server.observers:
            self.server.observers.remove(self)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric (call on the server's event loop)."""
        return generate_latest(self.registry)

    # -- ServerObserver -------------------------------------------------------------------

    def on_effects(self, event: s.Event, effects: Sequence[s.Effect]) -> None:
        for eff in effects:
            if isinstance(eff, s.Log) and eff.state:
                self._state_change(eff, event.now)

    def on_commit(self, seconds: float) -> None:
        self.commit_seconds.observe(seconds)

    def _state_change(self, eff: s.Log, now: float) -> None:
        if eff.node:
            if eff.state == NodeState.REGISTERED:
                self.registrations.inc()
            elif eff.state in _NODE_FAILURE:
                self.failures.labels(_NODE_FAILURE[NodeState(eff.state)]).inc()
            return
        if eff.state == JobState.FAILED and eff.reason == FailureReason.RESERVATION_TIMEOUT:
            self.failures.labels(FailureReason.RESERVATION_TIMEOUT).inc()
        if eff.state == JobState.RESERVING:
            job = self.server.state.jobs.get(eff.job)
            if job is not None and job.generation > 0:  # reserving again: a restart began
                self.restarts.inc()
        if eff.state == JobState.READY:
            job = self.server.state.jobs.get(eff.job)
            if job is not None:
                self.reservation_seconds.observe(max(0.0, now - job.submitted_at))
            self._ready_at[eff.job] = now
        elif eff.state == JobState.RUNNING:
            ready = self._ready_at.pop(eff.job, None)
            if ready is not None:
                self.readiness_seconds.observe(max(0.0, now - ready))
        elif eff.state in _READINESS_OVER:
            self._ready_at.pop(eff.job, None)
