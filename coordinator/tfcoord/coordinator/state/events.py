"""What goes into the state machine (events) and what comes out of it (effects).

Each event is a small frozen dataclass carrying ``now`` (wall-clock seconds: deadlines
must survive a coordinator restart, and monotonic clocks do not). Each part of the state
machine marks the methods that handle an event class with :func:`handles`, and
:class:`~tfcoord.coordinator.state.CoordinatorState` dispatches on the event's class
through the one table :func:`handlers_of` builds (after dask's ``WorkerState``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tfcoord.client import messages as m
from tfcoord.client.vocab import FailureReason

#: (connection id, request id): where the answer to a request goes.
Waiter = tuple[int, int]

#: Whose jobs a driver request may see: the driver's owner digest (``auth.owner_digest``),
#: or None for every job (admins; nodes, whose job the server already checked).
Viewer = bytes | None


# -- events (inputs) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    now: float


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
    """Never journaled as an event: with a state directory the lines are copied beside the
    journal about once a second (``keptoutput.py``), else a restart shows only later ones."""

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
class DeadlineExpired(Event):
    """A job ran past ``JobSpec.deadline_s`` since submission (TFJob's activeDeadlineSeconds)."""

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


# -- handlers, registered by event class --------------------------------------------------

#: What handles one event: a part's bound method, taking that event (typed per method).
Handler = Callable[[Any], None]
_F = TypeVar("_F", bound=Callable[..., None])
_HANDLES = "_handles_event"


def handles(event: type[Event]) -> Callable[[_F], _F]:
    """Mark a part's method as the handler of ``event`` (see :func:`handlers_of`)."""

    def mark(method: _F) -> _F:
        setattr(method, _HANDLES, event)
        return method

    return mark


def handlers_of(*parts: object) -> dict[type[Event], Handler]:
    """Every event class the ``parts`` handle, with its handler (a bound method).

    Raises:
        ValueError: two methods handle the same event class.
    """
    table: dict[type[Event], Handler] = {}
    for part in parts:
        for name, method in vars(type(part)).items():
            event = getattr(method, _HANDLES, None)
            if event is None:
                continue
            if event in table:
                raise ValueError(f"{event.__name__} has two handlers: {table[event]} and {name}")
            table[event] = getattr(part, name)
    return table
