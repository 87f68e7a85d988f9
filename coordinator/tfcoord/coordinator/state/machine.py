"""The coordinator's state machine: its parts, put together behind one ``handle``.

Each part holds one concern and registers its event handlers by class (see
``events.handles``); :class:`CoordinatorState` builds the parts on one shared
:class:`~.ledger.Ledger`, dispatches every event to its one handler, and hands back the
effects that event produced. It also answers the read-only questions of the server and
the HTTP API (status, series, logs) from the same jobs.
"""

from __future__ import annotations

from typing import Any

from tfcoord.client import messages as m

from . import telemetry, views
from .engines import Engines
from .events import Effect, Event, Handler, Viewer, handlers_of
from .jobs import Job
from .ledger import Ledger
from .lifecycle import Lifecycle
from .liveness import Liveness
from .registration import COMPLETE_PER_EVENT, Registration
from .retention import KEEP_FINISHED_JOBS, KEEP_FINISHED_S, Retention
from .telemetry import Telemetry
from .views import Views
from .waits import Waits


class CoordinatorState:
    """Every job the coordinator holds. Mutated only through :meth:`handle`."""

    def __init__(
        self,
        keep_finished: int = KEEP_FINISHED_JOBS,
        keep_finished_s: float = KEEP_FINISHED_S,
        complete_per_event: int = COMPLETE_PER_EVENT,
    ) -> None:
        self.ledger = ledger = Ledger()
        self.jobs: dict[str, Job] = ledger.jobs
        self.timers = ledger.timers
        self.waits = waits = Waits(ledger)
        self.retention = Retention(ledger, waits, keep_finished, keep_finished_s)
        self.telemetry = Telemetry(ledger, waits)
        self.lifecycle = Lifecycle(ledger, waits, self.retention, self.telemetry)
        self.registration = Registration(ledger, waits, self.lifecycle, complete_per_event)
        self.liveness = Liveness(
            ledger, waits, self.lifecycle, self.telemetry, self.registration, self.retention
        )
        self.engines = Engines(ledger, waits, self.lifecycle)
        self.views = Views(ledger)
        self._dispatch: dict[type[Event], Handler] = handlers_of(
            self.timers,
            self.waits,
            self.telemetry,
            self.lifecycle,
            self.registration,
            self.liveness,
            self.engines,
            self.views,
        )

    @property
    def complete_per_event(self) -> int:
        """Nodes made READY per event while a job's cluster forms (see ``Continue``)."""
        return self.registration.complete_per_event

    @complete_per_event.setter
    def complete_per_event(self, value: int) -> None:
        self.registration.complete_per_event = max(1, value)

    # -- public ---------------------------------------------------------------------------

    def set_credential_key(self, key: bytes) -> None:
        """Key the nodes' credentials (the server derives it from its secret); before any event."""
        self.ledger.credential_key = key

    @property
    def not_holder(self) -> int:
        """Messages refused for speaking for a slot they do not hold (see ``Ledger.holder``)."""
        return self.ledger.not_holder

    def handle(self, event: Event) -> list[Effect]:
        """Apply one event; return the effects to carry out, in order."""
        effects: list[Effect] = []
        self.ledger.effects = effects
        self._dispatch[type(event)](event)
        self.ledger.effects = []
        return effects

    def next_deadline(self) -> float | None:
        """The earliest time at which a ``Tick`` may change something."""
        return self.timers.next_deadline()

    def status(self, job_id: str) -> dict[str, Any]:
        """A JSON-able snapshot of one job (raises KeyError if unknown)."""
        return views.status(self.jobs[job_id]).to_wire()

    def brief(self, job_id: str) -> dict[str, Any]:
        """A job's status without its nodes, history and timeline (see ``views.brief``);
        raises KeyError if unknown."""
        return views.brief(self.jobs[job_id]).to_wire()

    def summary(self, viewer: Viewer = None) -> list[dict[str, Any]]:
        """One line per job ``viewer`` may see (every job for None)."""
        jobs: list[dict[str, Any]] = views.summary(self.jobs.values(), viewer).to_wire()["jobs"]
        return jobs

    @staticmethod
    def cluster_spec(job: Job) -> dict[str, list[str]]:
        """Role → addresses ordered by task index, as TF_CONFIG's ``cluster`` wants."""
        return views.cluster_spec(job)

    def series(self, job_id: str, executor_id: int | None = None, since: float = 0.0) -> dict[str, Any]:
        """A job's progress points per node (raises KeyError if the job is unknown).

        ``since`` keeps only later points (a dashboard polling for what is new).
        """
        return telemetry.series(self.jobs[job_id], executor_id, since).to_wire()

    def logs(
        self, job_id: str, executor_id: int = -1, since: int = 0, limit: int = m.MAX_LOGS_REPLY
    ) -> dict[str, Any]:
        """A job's node output from line ``since`` on, oldest first, at most ``limit`` lines
        (raises KeyError if the job is unknown)."""
        return telemetry.logs(self.jobs[job_id], executor_id, since, limit).to_wire()

    def validate(self) -> None:
        """Check every invariant; raise AssertionError naming the broken one."""
        self.ledger.validate()
        self.telemetry.validate()
        self.retention.validate()
        self.waits.validate()
        live_nodes = sum(1 for j in self.jobs.values() for n in j.nodes() if n.live)
        self.timers.validate(len(self.waits.pending) + live_nodes + 2 * len(self.jobs))
