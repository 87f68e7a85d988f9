"""The Mesos engine: the coordinator's "mesos" jobs become tasks of one Mesos framework.

Theory of operation. The engine watches the state machine's effects (it is a
:class:`~tfcoord.coordinator.server.ServerObserver`): a journaled SubmitJob of engine
"mesos" adds the job's slots as pending tasks and REVIVEs offers; a job reaching a
terminal state drops its pending tasks and, after a short grace in which its nodes stop by
themselves, KILLs the tasks still alive. Each OFFERS event is answered at once: pending
tasks are matched (:func:`~.offers.match`), ACCEPTed with LAUNCH, unused offers DECLINEd
with a refusal filter, and once nothing is pending the framework SUPPRESSes offers. A task
that no agent seen so far could ever hold is shown in the job's status with the reason.

Task updates are ACKNOWLEDGEd and become :class:`~tfcoord.coordinator.state.EngineTaskUpdate`
events: the state machine records each slot's task id and last state (so a timeout names
them) and fails the job at once when a task ends before its node has (TASK_FAILED, LOST,
ERROR, DROPPED, GONE, KILLED...). A launch the master lost before it ran (an offer
rescinded while we accepted it, a LAUNCH reconciliation says it never saw) is placed again
under a new attempt instead.

A call the master did not take while the stream stayed up (a timeout, a 5xx) is recovered
from (:meth:`MesosEngine.on_call_failed`): a failed ACCEPT declines its offers and
reconciles its tasks, which the reconciliation's TASK_LOST then places again; KILL, REVIVE,
DECLINE and RECONCILE are sent again a few times; SUPPRESS is redone at the next offers. A
FAILURE event reconciles the failed agent's tasks at once.

Everything runs on the coordinator's event loop; state changes go through
``server.apply``, deferred with ``call_soon`` so the state machine is never re-entered. The
framework id is kept in the journal's meta table, so a restarted coordinator resubscribes
as the same framework and its running tasks survive; after (re)subscribing the engine
reconciles its tasks explicitly and then implicitly (tasks nobody owns are killed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfcoord.client import auth
from tfcoord.client.vocab import JobState

from .. import state as s
from ..nodearchive import node_archive
from .config import MesosConfig
from .errors import MesosConfigError, MesosError
from .jobs import ENGINE, MesosJob, RoleResources
from .offers import (
    AgentSize,
    Constraint,
    Offer,
    Placement,
    TaskNeeds,
    explain_unfit,
    match,
    parse_constraints,
)
from .scheduler import Call, SchedulerClient
from .tasks import (
    ArchiveFetch,
    TaskLaunch,
    build_task_info,
    parse_task_id,
    scalar_gpus_isolated,
    secrets_supported,
    task_id,
)

if TYPE_CHECKING:
    from ..server import CoordinatorServer
    from ..service import ArchiveSite

log = logging.getLogger("tfcoord.mesos")

#: The journal meta key holding the framework id across coordinator restarts.
FRAMEWORK_ID_META = "mesos.framework_id"
#: Offers declined while no task waits: REVIVE clears the filter when one does, so it can
#: be long and spare the master pointless offer rounds.
IDLE_REFUSE_S = 3600.0
#: Offers declined while tasks wait for room elsewhere: short, so resources freed meanwhile
#: come back quickly (a task ending also re-offers its agent at once).
PENDING_REFUSE_S = 2.0
#: A failed call worth sending again (KILL, REVIVE, RECONCILE...) goes out after this: long
#: enough for a master that answered 503 mid-election to have a leader again.
CALL_RETRY_S = 1.0
#: A slot whose launch the master lost (rescinded offer, unknown to reconciliation) is placed
#: again at most this often; past it the job fails rather than loop.
MAX_PLACEMENTS = 5

TERMINAL_STATES = frozenset(
    {
        "TASK_FINISHED",
        "TASK_FAILED",
        "TASK_KILLED",
        "TASK_ERROR",
        "TASK_LOST",
        "TASK_DROPPED",
        "TASK_GONE",
        "TASK_GONE_BY_OPERATOR",
        "TASK_UNKNOWN",
        "TASK_UNREACHABLE",
    }
)
STARTED_STATES = frozenset({"TASK_STARTING", "TASK_RUNNING", "TASK_KILLING"})
#: What the master says of a launch it never ran: the offer was gone, or it does not know the task.
_NEVER_RAN_STATES = frozenset({"TASK_LOST", "TASK_DROPPED", "TASK_GONE", "TASK_UNKNOWN"})
_NEVER_RAN_REASONS = frozenset({"REASON_INVALID_OFFERS", "REASON_RECONCILIATION"})
_TERMINAL_JOB = frozenset(st.value for st in s.TERMINAL_JOB)
_RESERVING = JobState.RESERVING.value


@dataclass
class _Task:
    job: str
    executor_id: int
    role: str
    index: int
    needs: RoleResources
    attempt: int = 0
    task_id: str = ""  # empty until launched
    state: str = "PENDING"
    agent_id: str = ""
    started: bool = False
    placements: int = 0
    note: str = ""  # the last "cannot fit" reason shown for it

    @property
    def key(self) -> str:
        return f"{self.job}/{self.executor_id}"

    @property
    def live(self) -> bool:
        return bool(self.task_id) and self.state not in TERMINAL_STATES

    def update(
        self, state: str, message: str, *, task_id: str | None = None, ended: bool = False
    ) -> s.EngineTaskUpdate:
        """What the state machine is told of this task now (of ``task_id``, else its current one)."""
        return s.EngineTaskUpdate(
            now=time.time(),
            job=self.job,
            executor_id=self.executor_id,
            task_id=self.task_id if task_id is None else task_id,
            state=state,
            message=message,
            ended=ended,
        )


def _recover_task(t: _Task, slot: s.Slot) -> None:
    """A job replayed from the journal: pick up the task its slot already runs, if any."""
    known = slot.node.task_id if slot.node is not None else ""
    if not known and slot.task is not None:
        known = slot.task.task_id
    parsed = parse_task_id(known) if known else None
    if parsed is None:
        return
    t.task_id, t.attempt = known, parsed[2]
    t.state = slot.task.state if slot.task is not None and slot.task.task_id == known else "TASK_STAGING"
    t.started = slot.node is not None or t.state in STARTED_STATES
    t.placements = 1


def _never_ran(t: _Task, status: dict[str, Any], job: s.Job | None) -> bool:
    """Does a terminal update say the master never ran this launch (the offer was gone), so
    the task is placed again rather than its node failed? Not if a node registered from it."""
    if t.started or t.placements >= MAX_PLACEMENTS:
        return False
    if status.get("state") not in _NEVER_RAN_STATES or status.get("reason") not in _NEVER_RAN_REASONS:
        return False
    node = job.slots[t.executor_id].node if job is not None else None
    return node is None or node.task_id != t.task_id  # a node that registered from it did run


def _task_states(tasks: list[_Task]) -> dict[tuple[str, int], dict[str, str]]:
    return {
        (t.role, t.index): {"task_id": t.task_id, "state": t.state, "agent_id": t.agent_id} for t in tasks
    }


@dataclass
class _Job:
    id: str
    mesos: MesosJob
    constraints: tuple[Constraint, ...]
    tasks: list[_Task]
    ended: bool = False
    kill_timer: asyncio.TimerHandle | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    #: The cluster generation whose tasks were placed (a restart places ended ones again).
    generation: int = 0


@dataclass(frozen=True)
class FrameworkView:
    """A snapshot of the Mesos framework as one job's driver sees it (``EmbeddedCoordinator.mesos_view``)."""

    #: The framework's id once subscribed, else None.
    framework_id: str | None
    #: The base URL of the leading master while subscribed, else None.
    leader: str | None
    #: (role, index) → the slot's current Mesos task: ``task_id``, ``state``, ``agent_id``.
    tasks: dict[tuple[str, int], dict[str, str]]


class MesosEngine:
    """Runs the coordinator's Mesos jobs. ``await start()`` subscribes; ``await close()`` ends.

    Args:
        server: the coordinator whose state and journal it shares.
        config: the framework's configuration.
        coordinator_address: ``host:port`` the tasks' nodes dial.
        teardown_on_close: end the framework (killing its tasks) on close; false for a
            coordinator with a journal, whose framework lives on across restarts.
        gpu_resources: advertise GPU_RESOURCES from the start (else once a job wants GPUs).
        archive: where the coordinator's HTTP API serves the node archive; tasks fetch and
            run it unless the configuration says not to (None: no HTTP API, so tasks run the
            image's own tfcoord).
    """

    def __init__(
        self,
        server: CoordinatorServer,
        config: MesosConfig,
        coordinator_address: str,
        *,
        teardown_on_close: bool = True,
        gpu_resources: bool = False,
        archive: ArchiveSite | None = None,
    ) -> None:
        self.server = server
        self.config = config
        self.address = coordinator_address
        self.teardown_on_close = teardown_on_close
        self._gpu = gpu_resources
        self._jobs: dict[str, _Job] = {}
        self._tasks: dict[str, _Task] = {}
        self._pending: list[_Task] = []
        self._agents: dict[str, AgentSize] = {}
        self._suppressed = False
        #: Why each task the last offer round held back waits (see offers.Match.held_back).
        self._held: dict[str, str] = {}
        self.fatal: MesosError | None = None
        #: Per job: offer rounds seen while it waited, when it was fully launched, ...
        self.stats: dict[str, dict[str, Any]] = {}
        self.counters = {"offer_rounds": 0, "rescinds": 0, "relaunches": 0, "declined": 0}
        self.client = SchedulerClient(config, self, framework_id=server.journal.get_meta(FRAMEWORK_ID_META))
        self.archive: ArchiveFetch | None = None
        if archive is not None and config.node_archive:
            built = node_archive()  # once per process, before the first offer needs it
            self.archive = ArchiveFetch.at(
                archive.base_url, archive.username, archive.password, built.name, built.sha256
            )

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> MesosEngine:
        """Adopt the Mesos jobs the coordinator already holds, then subscribe.

        Raises:
            MesosError: the framework cannot subscribe (credentials, TLS, no master).
        """
        for job in list(self.server.state.jobs.values()):
            if job.spec.engine == ENGINE and not job.terminal:
                self._add_job(job.id, recovered=True)
        self.server.observers.append(self)
        self.server.engines[ENGINE] = self
        try:
            await self.client.start()
        except BaseException:
            self._detach()
            raise
        return self

    async def close(self) -> None:
        for job in self._jobs.values():
            if job.kill_timer is not None:
                job.kill_timer.cancel()
        await self.client.close(teardown=self.teardown_on_close)
        self._detach()

    def _detach(self) -> None:
        if self in self.server.observers:
            self.server.observers.remove(self)
        if self.server.engines.get(ENGINE) is self:
            del self.server.engines[ENGINE]

    # -- the state machine's side -------------------------------------------------------

    def on_effects(self, event: s.Event, effects: Sequence[s.Effect]) -> None:
        loop = asyncio.get_running_loop()
        for eff in effects:
            if isinstance(eff, s.Journal) and isinstance(eff.event, s.SubmitJob):
                if eff.event.spec.engine == ENGINE:
                    loop.call_soon(self._add_job, eff.event.job)
            elif (
                isinstance(eff, s.Log)
                and not eff.node
                and eff.state in _TERMINAL_JOB
                and eff.job in self._jobs
            ):
                loop.call_soon(self._job_ended, eff.job)
            elif (
                isinstance(eff, s.Log) and not eff.node and eff.state == _RESERVING and eff.job in self._jobs
            ):
                loop.call_soon(self._restart_job, eff.job)

    def on_commit(self, seconds: float) -> None:
        pass

    def _apply(self, event: s.Event) -> None:
        self.server.apply(event)

    def _add_job(self, job_id: str, recovered: bool = False) -> None:
        job = self.server.state.jobs.get(job_id)
        if job is None or job.terminal or job_id in self._jobs:
            return
        if self.fatal is not None:
            self._apply(
                s.EngineJobFailed(
                    now=time.time(), job=job_id, reason=f"the Mesos framework has stopped: {self.fatal}"
                )
            )
            return
        try:
            mj = MesosJob.from_spec(job.spec)
            constraints = parse_constraints(mj.attributes) if mj.attributes else self.config.constraints
        except MesosConfigError as e:
            self._apply(s.EngineJobFailed(now=time.time(), job=job_id, reason=f"cannot run on Mesos: {e}"))
            return
        tasks = []
        for eid, (role, index) in enumerate(job.spec.slots()):
            t = _Task(job_id, eid, role, index, mj.slot(eid))
            if recovered:
                _recover_task(t, job.slots[eid])
            tasks.append(t)
        self._jobs[job_id] = _Job(job_id, mj, constraints, tasks)
        self.stats[job_id] = {
            "submitted": time.monotonic(),
            "offer_rounds": 0,
            "launched": None,
            "tasks": len(tasks),
        }
        for t in tasks:
            if t.task_id:
                self._tasks[t.task_id] = t
            elif not t.started:
                self._pending.append(t)
        if mj.gpus and not self._gpu:
            self._gpu = True
            if self.client.subscribed:  # advertise GPU_RESOURCES now, or GPU agents are never offered
                info = {**self.framework_info(), "id": {"value": self.client.framework_id}}
                self.client.call(
                    "UPDATE_FRAMEWORK", update_framework={"framework_info": info, "suppressed_roles": []}
                )
        log.info(
            "job %s: %d Mesos task(s) to place%s",
            job_id,
            sum(1 for t in tasks if not t.task_id),
            " (recovered)" if recovered else "",
        )
        if any(not t.task_id for t in tasks):
            self._revive()

    def _restart_job(self, job_id: str) -> None:
        """The job restarted its cluster as a new generation: place again, as the slot's next
        attempt, every task that ended (the lost one); the others' nodes rejoin from where they
        run."""
        job, held = self._jobs.get(job_id), self.server.state.jobs.get(job_id)
        if job is None or job.ended or held is None or held.generation <= job.generation:
            return
        job.generation = held.generation
        again = [t for t in job.tasks if t.task_id and not t.live and t not in self._pending]
        for t in again:
            self._tasks.pop(t.task_id, None)  # a late word about the old task finds nothing
            t.state, t.started, t.placements, t.note = "PENDING", False, 0, ""
            self._pending.append(t)
        if again:
            self.counters["relaunches"] += len(again)
            log.info(
                "job %s: generation %d: placing %d ended task(s) again: %s",
                job_id,
                job.generation,
                len(again),
                ", ".join(f"{t.role}:{t.index}" for t in again),
            )
            self._revive()

    def _job_ended(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.ended:
            return
        job.ended = True
        self._pending = [t for t in self._pending if t.job != job_id]
        if not self._pending:
            self._suppress()
        if any(t.live for t in job.tasks):
            # Its nodes were told to stop and exit by themselves; kill what is left after a grace.
            loop = asyncio.get_running_loop()
            job.kill_timer = loop.call_later(self.config.kill_after_end_s, self._kill_job, job_id)
        else:
            self._forget(job)

    def _kill_job(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            return
        job.kill_timer = None
        for t in job.tasks:
            if t.live:
                log.info("job %s ended: killing task %s", job_id, t.task_id)
                self._kill(t.task_id, t.agent_id)

    def _forget(self, job: _Job) -> None:
        if job.kill_timer is not None:
            job.kill_timer.cancel()
        for t in job.tasks:
            self._tasks.pop(t.task_id, None)
        self._jobs.pop(job.id, None)

    # -- the framework's side (SchedulerListener) -----------------------------------------

    def framework_info(self) -> dict[str, Any]:
        caps: list[dict[str, str]] = []
        info: dict[str, Any] = {
            "user": self.config.user,
            "name": self.config.name,
            "failover_timeout": self.config.failover_timeout_s,
        }
        if self.config.role:
            info["roles"] = [self.config.role]
            caps.append({"type": "MULTI_ROLE"})
        if self._gpu:
            caps.append({"type": "GPU_RESOURCES"})
        if caps:
            info["capabilities"] = caps
        return info

    def suppressed_roles(self) -> list[str]:
        return [] if self._pending else [self.config.role or "*"]

    def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        self.server.journal.set_meta(FRAMEWORK_ID_META, framework_id)
        self._suppressed = not self._pending
        launched = [t for t in self._tasks.values() if t.live]
        if launched:
            self.client.call(
                "RECONCILE",
                reconcile={
                    "tasks": [
                        {
                            "task_id": {"value": t.task_id},
                            **({"agent_id": {"value": t.agent_id}} if t.agent_id else {}),
                        }
                        for t in launched
                    ]
                },
            )
        self.client.call("RECONCILE", reconcile={"tasks": []})  # and whatever else the master knows of ours
        if self._pending:
            self._revive()

    def on_disconnected(self, reason: str) -> None:
        log.warning(
            "Mesos framework %s disconnected (%s); resubscribing keeps its tasks for %g s",
            self.client.framework_id,
            reason,
            self.config.failover_timeout_s,
        )

    def on_framework_removed(self, reason: str) -> None:
        self.server.journal.set_meta(FRAMEWORK_ID_META, "")
        self._fail_jobs(
            f"the Mesos master removed this coordinator's framework, killing its tasks ({reason})"
        )
        self._agents.clear()

    def on_fatal(self, error: MesosError) -> None:
        self.fatal = error
        self._fail_jobs(f"the Mesos framework has stopped: {error}")

    def _fail_jobs(self, reason: str) -> None:
        """Every job not yet ended fails, saying ``reason``."""
        for job in list(self._jobs.values()):
            if not job.ended:
                self._apply(s.EngineJobFailed(now=time.time(), job=job.id, reason=reason))

    def on_call_failed(self, call: Call, reason: str) -> None:
        """Recover from a call the master did not take while the stream stayed up."""
        kind = call.type
        if kind == "ACCEPT":
            self._accept_failed(call, reason)
        elif kind == "SUPPRESS":
            self._suppressed = False  # the next offers are declined and suppressed again
        elif kind == "ACKNOWLEDGE":
            pass  # the agent resends an unacknowledged update, and it is acknowledged then
        elif kind == "REVIVE":
            if self._pending:
                self.client.resend(call, CALL_RETRY_S)
        elif kind == "KILL":
            t = self._tasks.get(call.fields["kill"]["task_id"]["value"])
            if t is None or t.live:  # ours still running, or an orphan still to end
                self.client.resend(call, CALL_RETRY_S)
        else:  # DECLINE (or its offers stay held), RECONCILE, UPDATE_FRAMEWORK
            self.client.resend(call, CALL_RETRY_S)

    def _accept_failed(self, call: Call, reason: str) -> None:
        # The master may or may not have launched the tasks (a timeout can hide a success),
        # so ask it: reconciliation answers a launch it never saw with TASK_LOST (reason
        # REASON_RECONCILIATION), which places the task again (see _update), and one it did
        # see with its state. Declining the offers frees them if the ACCEPT never arrived
        # (a master ignores the DECLINE of an offer already used).
        accept = call.fields.get("accept") or {}
        infos = [
            info
            for op in accept.get("operations", [])
            if op.get("type") == "LAUNCH"
            for info in op["launch"]["task_infos"]
        ]
        log.warning(
            "ACCEPT of offer(s) %s failed (%s); reconciling its %d task(s)",
            ", ".join(o["value"] for o in accept.get("offer_ids", [])),
            reason,
            len(infos),
        )
        self.client.call(
            "DECLINE", decline={"offer_ids": accept.get("offer_ids", []), "filters": {"refuse_seconds": 0}}
        )
        self.client.call(
            "RECONCILE",
            reconcile={"tasks": [{"task_id": i["task_id"], "agent_id": i["agent_id"]} for i in infos]},
        )
        for info in infos:
            t = self._tasks.get(info["task_id"]["value"])
            if t is not None and t.state == "TASK_STAGING":
                self._apply(t.update(t.state, f"launch not confirmed ({reason}); reconciling"))

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "OFFERS":
            self._offers((event.get("offers") or {}).get("offers") or [])
        elif kind == "UPDATE":
            self._update((event.get("update") or {}).get("status") or {})
        elif kind == "RESCIND":
            # Offers are answered as soon as they arrive, so a rescind at most races an ACCEPT;
            # the master then reports its tasks lost with REASON_INVALID_OFFERS and they are
            # placed again (see _update).
            self.counters["rescinds"] += 1
            log.info("offer %s rescinded", ((event.get("rescind") or {}).get("offer_id") or {}).get("value"))
        elif kind == "FAILURE":
            f = event.get("failure") or {}
            agent_id = (f.get("agent_id") or {}).get("value") or ""
            log.warning(
                "Mesos reports a failure: agent %s, executor %s, status %s",
                agent_id,
                (f.get("executor_id") or {}).get("value"),
                f.get("status"),
            )
            # The master reports the tasks of a failed agent in its own time; ask now, so a
            # job waiting on one of them learns at once (an update per task comes back).
            ours = [t for t in self._tasks.values() if t.live and t.agent_id == agent_id]
            if ours:
                self.client.call(
                    "RECONCILE",
                    reconcile={
                        "tasks": [
                            {"task_id": {"value": t.task_id}, "agent_id": {"value": agent_id}} for t in ours
                        ]
                    },
                )
        elif kind == "MESSAGE":
            log.info(
                "message from executor %s (ignored: tfcoord tasks use the command executor)",
                ((event.get("message") or {}).get("executor_id") or {}).get("value"),
            )

    # -- offers -------------------------------------------------------------------------

    def _offers(self, raw: list[Any]) -> None:
        offers: list[Offer] = []
        for item in raw:
            try:
                offers.append(Offer.from_json(item))
            except ValueError as e:
                log.warning("ignoring an offer: %s", e)
        self.counters["offer_rounds"] += 1
        for o in offers:
            size = AgentSize.of(o)
            prev = self._agents.get(o.agent_id)
            self._agents[o.agent_id] = size if prev is None else prev.merge(size)
        for job_id in {t.job for t in self._pending}:
            # A job can end between the event that ended it and the _job_ended call that
            # event scheduled (an offer arriving in the same loop turn): place nothing for it.
            ended = self.server.state.jobs.get(job_id)
            if ended is None or ended.terminal:
                self._job_ended(job_id)
        if not self._pending:
            for o in offers:
                log.info(
                    "declining offer %s from %s: no task waits (refused for %g s)",
                    o.id,
                    o.hostname or o.agent_id,
                    IDLE_REFUSE_S,
                )
            self._decline([o.id for o in offers], IDLE_REFUSE_S)
            self._suppress()
            return
        for job_id in {t.job for t in self._pending}:
            self.stats[job_id]["offer_rounds"] += 1
        needs = [self._needs(t) for t in self._pending]
        gpu_agents = {t.agent_id for t in self._tasks.values() if t.live and t.needs.gpus and t.agent_id}
        result = match(needs, offers, gpu_agents)
        self._held = dict(result.held_back)
        by_key = {t.key: t for t in self._pending}
        placed = {p.key for p in result.placements}
        self._pending = [t for t in self._pending if t.key not in placed]
        refuse = PENDING_REFUSE_S if self._pending else IDLE_REFUSE_S
        for offer_id, placements in result.by_offer().items():
            infos = [self._launch(by_key[p.key], p) for p in placements]
            self.client.call(
                "ACCEPT",
                accept={
                    "offer_ids": [{"value": offer_id}],
                    "operations": [{"type": "LAUNCH", "launch": {"task_infos": infos}}],
                    "filters": {"refuse_seconds": refuse},
                },
            )
        hosts = {o.id: o.hostname or o.agent_id for o in offers}
        for offer_id, why in result.decline_reasons:  # as tfmesos2 logs them, with the reason
            log.info(
                "declining offer %s from %s: %s (refused for %g s)", offer_id, hosts[offer_id], why, refuse
            )
        self._decline(list(result.declined), refuse)
        for job_id in {by_key[k].job for k in placed}:
            stats = self.stats[job_id]
            if stats["launched"] is None and not any(t.job == job_id for t in self._pending):
                stats["launched"] = time.monotonic()
                stats["launched_in_rounds"] = stats["offer_rounds"]
        if self._pending:
            self._explain_waiting()
        else:
            self._suppress()

    def _needs(self, t: _Task) -> TaskNeeds:
        r, job = t.needs, self._jobs[t.job]
        image = job.mesos.image or self.config.image
        return TaskNeeds(
            key=t.key,
            name=f"{t.role}:{t.index} of job {t.job}",
            cpus=r.cpus,
            mem=r.mem,
            gpus=r.gpus,
            ports=1,
            constraints=job.constraints,
            exclusive_gpus=not scalar_gpus_isolated(self.config, image),
        )

    def _launch(self, t: _Task, p: Placement) -> dict[str, Any]:
        job = self._jobs[t.job]
        if t.task_id:  # placed before and lost: a new attempt under a new id
            t.attempt += 1
        t.task_id = task_id(t.job, t.executor_id, t.attempt)
        t.state, t.agent_id, t.started, t.note = "TASK_STAGING", p.agent_id, False, ""
        t.placements += 1
        self._tasks[t.task_id] = t
        owner = self.server.state.jobs[t.job].owner if t.job in self.server.state.jobs else b""
        token = auth.job_token(self.server.config.secret, t.job, owner).hex()
        image = job.mesos.image or self.config.image
        secret = secrets_supported(str(self.client.master_info.get("version") or ""), self.config, image)
        launch = TaskLaunch(
            t.job,
            t.executor_id,
            t.attempt,
            t.role,
            t.index,
            self.address,
            token,
            job.mesos,
            p,
            archive=self.archive,
            secret_token=secret,
        )
        where = f"{p.hostname or p.agent_id}:{p.port}" + (
            f" with GPUs {','.join(p.gpu_ids)}" if p.gpu_ids else ""
        )
        self._apply(t.update("TASK_STAGING", f"launching on {where}"))
        log.info("job %s: launching %s:%d as task %s on %s", t.job, t.role, t.index, t.task_id, where)
        return build_task_info(self.config, launch)

    def _explain_waiting(self) -> None:
        for t in self._pending:
            reason = explain_unfit(self._needs(t), self._agents.values()) or ""
            held = self._held.get(t.key, "")
            if (reason or held) == t.note:
                continue
            t.note = reason or held
            message = (
                f"no offer can ever fit it: {reason}" if reason else held or "waiting for an offer with room"
            )
            if t.note:
                log.warning("job %s: %s:%d %s", t.job, t.role, t.index, message)
            self._apply(t.update("UNPLACED", message, task_id=""))

    def _decline(self, offer_ids: list[str], refuse_s: float) -> None:
        if offer_ids:
            self.counters["declined"] += len(offer_ids)
            self.client.call(
                "DECLINE",
                decline={
                    "offer_ids": [{"value": i} for i in offer_ids],
                    "filters": {"refuse_seconds": refuse_s},
                },
            )

    def _revive(self) -> None:
        self.client.call("REVIVE")
        self._suppressed = False

    def _suppress(self) -> None:
        if not self._suppressed:
            self.client.call("SUPPRESS")
            self._suppressed = True

    def _kill(self, tid: str, agent_id: str) -> None:
        kill: dict[str, Any] = {"task_id": {"value": tid}}
        if agent_id:
            kill["agent_id"] = {"value": agent_id}
        self.client.call("KILL", kill=kill)

    # -- task updates -------------------------------------------------------------------

    def _update(self, status: dict[str, Any]) -> None:
        tid = (status.get("task_id") or {}).get("value")
        state = status.get("state")
        agent_id = (status.get("agent_id") or {}).get("value") or ""
        if not isinstance(tid, str) or not isinstance(state, str):
            log.warning("ignoring a malformed status update: %s", str(status)[:200])
            return
        if status.get("uuid") and agent_id:
            self.client.call(
                "ACKNOWLEDGE",
                acknowledge={
                    "agent_id": {"value": agent_id},
                    "task_id": {"value": tid},
                    "uuid": status["uuid"],
                },
            )
        t = self._tasks.get(tid)
        if t is None:
            if state not in TERMINAL_STATES:
                log.info("killing task %s (%s): no job of this coordinator owns it", tid, state)
                self._kill(tid, agent_id)
            return
        if state == t.state:
            return  # reconciliation repeating what we know
        t.state = state
        t.agent_id = agent_id or t.agent_id
        if state in STARTED_STATES:
            t.started = True
        job = self._jobs.get(t.job)
        terminal = state in TERMINAL_STATES
        if job is None or job.ended:
            if job is not None and not any(x.live for x in job.tasks):
                self._forget(job)
            return
        message = str(status.get("message") or status.get("reason") or "")
        if terminal and _never_ran(t, status, self.server.state.jobs.get(t.job)):
            self.counters["relaunches"] += 1
            self._tasks.pop(tid, None)
            t.state = "PENDING"
            self._pending.append(t)
            self._apply(t.update(state, f"{message}; placing it again", task_id=tid))
            log.info("job %s: task %s was never run (%s: %s); placing it again", t.job, tid, state, message)
            self._revive()
            return
        self._apply(t.update(state, message, task_id=tid, ended=terminal))

    # -- for drivers and benchmarks -----------------------------------------------------

    def view(self, job_id: str) -> FrameworkView:
        """What a driver may show of the framework and one job's tasks, as a snapshot."""
        return FrameworkView(self.client.framework_id, self.client.leader, self.task_states(job_id))

    def task_states(self, job_id: str) -> dict[tuple[str, int], dict[str, str]]:
        """(role, index) → the slot's current Mesos task: ``task_id``, ``state``, ``agent_id``
        (``state`` is PENDING before its launch)."""
        job = self._jobs.get(job_id)
        return _task_states(job.tasks) if job is not None else {}

    def job_stats(self, job_id: str) -> dict[str, Any]:
        """When the job's tasks were all launched, and in how many offer rounds."""
        st = dict(self.stats.get(job_id, {}))
        if st.get("launched") is not None:
            st["launch_s"] = st["launched"] - st["submitted"]
        return st
