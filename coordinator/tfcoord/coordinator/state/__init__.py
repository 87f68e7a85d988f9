"""The coordinator's domain state: jobs, their slots and nodes, waits and deadlines.

Theory of operation (after dask's worker_state_machine and h11's _state): this
package is pure. ``CoordinatorState.handle(event)`` is the only thing that mutates
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
:class:`Journal` effect, including the ones the state machine derives itself when a
deadline passes (:class:`NodeLost`, :class:`ReservationExpired`). Replaying the
journaled events through ``handle`` in order rebuilds the same state. Heartbeats
and disconnects are not journaled: they only feed the liveness deadlines, and
after a restart every node gets a fresh grace period (:class:`Recovered`).

Life cycles are the tables ``JOB_TRANSITIONS`` and ``NODE_TRANSITIONS``; an
illegal transition raises :class:`InvalidTransition` (a bug, never user input).
Bad requests are refused with a :class:`Send` of an ``Error`` carrying a stable
code and a message that says what to do.

The machine is split by concern, each part a module that holds one thing and handles
the events about it (registered by event class, see ``events.handles``), all on one
shared ``ledger.Ledger`` (the jobs, the connection and GPU indexes, the timer heap, the
effects of the event in hand):

- ``transitions``: the life-cycle tables;  ``events``: events in, effects out;
- ``jobs``: jobs, slots and nodes, and the rules that only read them;
- ``registration``: filling slots, forming the cluster, ``await_cluster``;
- ``lifecycle``: submit, reports, stop and finish, how a job ends;
- ``liveness``: heartbeats, connections, lost nodes, recovery after a restart;
- ``waits``: pending requests and what answers them;  ``timers``: every deadline;
- ``telemetry``: metadata, progress series and output lines;  ``engines``: Mesos' word;
- ``retention``: finished jobs and when they are forgotten;  ``views``: status and friends;
- ``machine``: :class:`CoordinatorState`, which puts the parts together.

Every name other modules use is importable from this package.
"""

from __future__ import annotations

from tfcoord.client.vocab import TERMINAL_JOB, TERMINAL_NODE, JobState, NodeState

from .events import (
    AwaitClusterEvent,
    AwaitJobEvent,
    AwaitStopEvent,
    CompleteCluster,
    Continue,
    DeadlineExpired,
    Disconnected,
    Effect,
    EngineJobFailed,
    EngineTaskUpdate,
    Event,
    FinishJobEvent,
    Forget,
    GetLogsEvent,
    HeartbeatNode,
    Journal,
    Log,
    NodeLogsEvent,
    NodeLost,
    ProgressNode,
    Recovered,
    RegisterNode,
    ReportNode,
    ReservationExpired,
    Send,
    ServingGraceExpired,
    StatusEvent,
    StopJobEvent,
    SubmitJob,
    Tick,
    Viewer,
    Waiter,
)
from .jobs import (
    FINISHING_ROLES,
    MAX_ATTEMPTS_PER_SLOT,
    MAX_HISTORY_PER_SLOT,
    TIMELINE_BASE,
    TIMELINE_PER_SLOT,
    EngineTask,
    Job,
    Node,
    Slot,
)
from .ledger import MAX_MESSAGE_LEN, clip
from .machine import CoordinatorState
from .registration import COMPLETE_PER_EVENT
from .retention import FORGET_GRACE_S, KEEP_FINISHED_JOBS, KEEP_FINISHED_S
from .telemetry import (
    LOG_LINES_FINISHED,
    LOG_LINES_PER_JOB,
    LOG_LINES_PER_NODE,
    MAX_META_CHARS,
    SERIES_POINTS_FINISHED,
    SERIES_POINTS_PER_JOB,
    SERIES_POINTS_PER_NODE,
    meta_chars,
)
from .timers import STALE_TIMER_SLACK
from .transitions import JOB_TRANSITIONS, NODE_TRANSITIONS, InvalidTransition, next_state
from .views import BRIEF_MISSING, MAX_MISSING_LINES

__all__ = [
    "BRIEF_MISSING",
    "COMPLETE_PER_EVENT",
    "FINISHING_ROLES",
    "FORGET_GRACE_S",
    "JOB_TRANSITIONS",
    "KEEP_FINISHED_JOBS",
    "KEEP_FINISHED_S",
    "LOG_LINES_FINISHED",
    "LOG_LINES_PER_JOB",
    "LOG_LINES_PER_NODE",
    "MAX_ATTEMPTS_PER_SLOT",
    "MAX_HISTORY_PER_SLOT",
    "MAX_MESSAGE_LEN",
    "MAX_META_CHARS",
    "MAX_MISSING_LINES",
    "NODE_TRANSITIONS",
    "SERIES_POINTS_FINISHED",
    "SERIES_POINTS_PER_JOB",
    "SERIES_POINTS_PER_NODE",
    "STALE_TIMER_SLACK",
    "TERMINAL_JOB",
    "TERMINAL_NODE",
    "TIMELINE_BASE",
    "TIMELINE_PER_SLOT",
    "AwaitClusterEvent",
    "AwaitJobEvent",
    "AwaitStopEvent",
    "CompleteCluster",
    "Continue",
    "CoordinatorState",
    "DeadlineExpired",
    "Disconnected",
    "Effect",
    "EngineJobFailed",
    "EngineTask",
    "EngineTaskUpdate",
    "Event",
    "FinishJobEvent",
    "Forget",
    "GetLogsEvent",
    "HeartbeatNode",
    "InvalidTransition",
    "Job",
    "JobState",
    "Journal",
    "Log",
    "Node",
    "NodeLogsEvent",
    "NodeLost",
    "NodeState",
    "ProgressNode",
    "Recovered",
    "RegisterNode",
    "ReportNode",
    "ReservationExpired",
    "Send",
    "ServingGraceExpired",
    "Slot",
    "StatusEvent",
    "StopJobEvent",
    "SubmitJob",
    "Tick",
    "Viewer",
    "Waiter",
    "clip",
    "meta_chars",
    "next_state",
]
