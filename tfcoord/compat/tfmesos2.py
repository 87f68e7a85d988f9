"""tfmesos2's API on tfcoord: ``from tfcoord.compat.tfmesos2 import cluster, Job``.

Code written for tfmesos2 0.4.0 moves over by changing its import::

    with cluster([Job(name="ps", num=1), Job(name="worker", num=2, cpus=2, mem=4096)],
                 client_ip="10.0.0.5") as c:
        c.targets      # {"/job:ps/task:0": "grpc://host:port", ...}
        c.cluster_def  # {"ps": ["host:port"], "worker": ["host:port", "host:port"]}

``cluster(jobs, client_ip=None, port=..., **kw)`` takes tfmesos2's arguments, positional
and keyword, with its defaults: the framework role ``tensorflow`` unless
``MESOS_FRAMEWORK_ROLE`` says otherwise, ``force_pull_image=True``, ``containerizer_type=
"DOCKER"``, ``readiness_timeout=600``, ``loglevel=logging.INFO`` and ``localhost:5050`` when
``MESOS_MASTER`` is unset. What it yields has tfmesos2's members too: ``tasks`` (Mesos task
id → a task with ``job_name``, ``task_index``, ``addr``, ``port``, ``state``,
``initialized``), ``get_tasks``, ``wait_until_ready()`` and ``shutdown()``.

Underneath, ``cluster`` starts an embedded coordinator whose Mesos framework launches one
task per TensorFlow task; each task runs the tfcoord node in server mode (a
``tf.distribute.Server`` for its role) and registers over tfcoord's authenticated protocol
instead of tfmesos2's open callback API. The context manager returns once every server
listens (no fixed sleeps, no polling), raises at once naming the task when one fails first,
and on exit stops the tasks and tears the framework down. Where tfmesos2 fixes its callback
API on port 11000, the coordinator binds a free port unless ``port`` is given (pass
``port=11000`` where a firewall was opened for it), so ``cluster`` can be used twice, even
at once, in one process. ``gpu_vendor`` defaults to NVIDIA (tfmesos2 passes no GPU to
Docker without one).

The environment keeps tfmesos2's meaning: ``MESOS_MASTER``, ``MESOS_SSL``,
``MESOS_VERIFY_SSL``, ``MESOS_USERNAME``, ``MESOS_PASSWORD``, ``MESOS_FRAMEWORK_ROLE``,
``DOCKER_IMAGE`` (default ``avhost/tensorflow-mesos:latest``: tasks fetch the node runtime
from the coordinator, so tfmesos2's images run them), ``MESOS_ATTRIBUTES``; the tasks'
``TFMESOS2_CLIENT_USERNAME``/``PASSWORD``, ``TFMESOS2_VERIFY_SSL`` and
``TFMESOS2_REQUEST_TIMEOUT`` are honoured where they mean something (docs/src/mesos.md) (plus ``MESOS_CA_FILE``, ``TFCOORD_TASK_PYTHON`` and
the ``TFCOORD_MESOS_*`` task settings, which the arguments override).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from tfcoord.client import DriverClient
from tfcoord.client.client import check_outcome
from tfcoord.client.jobreplies import JobStatus
from tfcoord.client.vocab import NodeState
from tfcoord.coordinator.embedded import EmbeddedCoordinator
from tfcoord.coordinator.mesos.config import (
    ARCHIVE_PASSWORD_ENV,
    ARCHIVE_USER_ENV,
    ENV_ENV,
    FORCE_PULL_ENV,
    PYTHON_ENV,
    FetchUri,
    MesosConfig,
    Volume,
    parse_env,
)
from tfcoord.coordinator.mesos.errors import MesosConfigError
from tfcoord.coordinator.mesos.jobs import MesosJob, RoleResources
from tfcoord.driver import mesos

if TYPE_CHECKING:
    from tfcoord.coordinator.mesos.engine import FrameworkView

__all__ = ["Cluster", "Job", "Task", "cluster", "plan"]


class Job:
    """One entry of tfmesos2's job list: ``num`` and ``start`` give the task indexes.

    As in tfmesos2, the entry makes tasks ``start`` .. ``num - 1`` (``num - start`` of them),
    each index raised by the number of ``worker`` tasks listed before it (so a second
    ``Job("worker", ...)`` continues the first one's numbering); ``name`` is any TensorFlow job
    name; ``gpus`` may be a fraction, and each task gets it rounded up to whole GPUs.

    Args:
        name: the TensorFlow job name (``ps``, ``worker`` or any other).
        num: one past the last task index of this entry (before the worker offset).
        cpus: CPUs each task needs.
        mem: memory each task needs, in MB.
        gpus: GPUs each task needs (rounded up).
        start: the first task index of this entry (before the worker offset).
    """

    def __init__(
        self, name: str, num: int, cpus: float = 1.0, mem: float = 1024.0, gpus: float = 0, start: int = 0
    ) -> None:
        self.name, self.num, self.cpus, self.mem, self.gpus, self.start = name, num, cpus, mem, gpus, start


#: tfmesos2's defaults where code written for it relies on them.
TFMESOS2_ROLE = "tensorflow"
TFMESOS2_MASTER = "localhost:5050"
TFMESOS2_IMAGE = "avhost/tensorflow-mesos:latest"
TFMESOS2_LOG_FORMAT = "%(asctime)s %(levelname)s: %(message)s"
#: tfmesos2 offsets every later entry's indexes by the tasks of the entries of this name.
OFFSET_JOB = "worker"
#: get_task_info's request to the master, as tfmesos2 bounds it.
TASK_INFO_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Planned:
    """One task as tfmesos2 numbers it, and the slot (role, position) tfcoord runs it in."""

    job_name: str
    #: tfmesos2's index: ``targets`` and ``Task.task_index`` use it.
    task_index: int
    cpus: float
    mem: float
    #: As asked for (a fraction stays one); the task is given ``math.ceil`` of it.
    gpus: float
    #: Position in its job name's list of ``cluster_def``: the task's TensorFlow index.
    position: int = 0


def plan(jobs: Sequence[Job]) -> list[Planned]:
    """tfmesos2's tasks in its order, each with its place in the cluster spec.

    Raises:
        MesosConfigError: an entry that is not a job name with whole numbers, or no task at all.
    """
    out: list[Planned] = []
    offset = 0
    for j in jobs:
        for field in ("num", "start"):
            v = getattr(j, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise MesosConfigError(f"Job({j.name!r}): {field} must be a whole number >= 0, not {v!r}")
        g = j.gpus
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or g < 0:
            raise MesosConfigError(f"Job({j.name!r}): gpus must be a number >= 0, not {g!r}")
        out += [Planned(j.name, i + offset, j.cpus, j.mem, g) for i in range(j.start, j.num)]
        if j.name == OFFSET_JOB:
            offset += j.num
    if not out:
        raise MesosConfigError("the job list makes no task: give a Job with num > start")
    # The cluster spec lists each name's tasks by tfmesos2's index (ties in list order).
    order = sorted(range(len(out)), key=lambda i: out[i].task_index)
    seen: dict[str, int] = {}
    for i in order:
        p = out[i]
        out[i] = replace(p, position=seen.get(p.job_name, 0))
        seen[p.job_name] = seen.get(p.job_name, 0) + 1
    return out


def runs(planned: Sequence[Planned]) -> list[RoleResources]:
    """The role runs of the Mesos job: each name's slots in position order, equal needs merged."""
    out: list[RoleResources] = []
    by_slot = sorted(planned, key=lambda p: p.position)
    names = list(dict.fromkeys(p.job_name for p in planned))
    for name in names:
        for p in (p for p in by_slot if p.job_name == name):
            need = (float(p.cpus), float(p.mem), math.ceil(p.gpus))
            last = out[-1] if out else None
            if last is not None and last.role == name and (last.cpus, last.mem, last.gpus) == need:
                out[-1] = replace(last, count=last.count + 1)
            else:
                out.append(RoleResources(name, 1, *need))
    return out


class Task:
    """One TensorFlow task as tfmesos2's ``Task`` shows it (``c.tasks[mesos_task_id]``).

    ``state`` is the task's Mesos state (``TASK_RUNNING``...), ``addr`` and ``port`` where
    its TensorFlow server listens (``port`` a string, as tfmesos2 has it), ``initialized``
    whether it serves. ``node_state`` is tfcoord's view of the node.
    """

    def __init__(
        self,
        mesos_task_id: str,
        p: Planned,
        addr: str | None,
        port: str | None,
        state: str,
        node_state: str,
        initialized: bool,
        gpu_vendor: str,
        volumes: dict[str, str],
        env: dict[str, str],
        fetcher: dict[str, Any],
    ) -> None:
        self.mesos_task_id = mesos_task_id
        self.job_name, self.task_index = p.job_name, p.task_index
        self.cpus, self.mem, self.gpus = p.cpus, p.mem, p.gpus
        self.addr, self.port, self.state, self.node_state = addr, port, state, node_state
        self.initialized = initialized
        self.offered = bool(mesos_task_id)
        self.connection = None
        self.gpu_vendor, self.volumes, self.env, self.fetcher = gpu_vendor, volumes, env, fetcher

    def __repr__(self) -> str:
        return f"Task({self.mesos_task_id!r}, /job:{self.job_name}/task:{self.task_index}, {self.state})"


class Cluster:
    """What ``with cluster(...) as c`` yields: tfmesos2's ``TensorflowMesos``, live.

    ``tasks``, ``targets``, ``cluster_def`` and ``task_queue`` are read from the coordinator
    and its Mesos framework each time, so they show the cluster as it is now.
    """

    def __init__(
        self,
        job: str,
        status: JobStatus,
        coordinator: EmbeddedCoordinator,
        driver: DriverClient,
        planned: list[Planned],
        config: MesosConfig,
        client_ip: str,
        port: int,
        extras: dict[str, Any],
    ) -> None:
        self.job = job
        #: ``host:port`` of the coordinator (``tfcoord status`` shows the job there).
        self.coordinator = coordinator.address
        #: tfmesos2's names: the address tasks dial back to, and the port they dial.
        self.client_ip = client_ip
        self.port = port
        self.framework_name = config.name
        self.framework_role = config.role
        self.master = config.master_description
        self.verify_ssl = config.verify_ssl
        self.readiness_timeout = extras.pop("readiness_timeout")
        self.containerizer_type = config.containerizer.upper()
        self.force_pull_image = config.force_pull_image
        self.extra_config = extras.pop("extra_config")
        self._extras = extras
        self._status = status
        self._coord = coordinator
        self._driver = driver
        self._planned = planned
        self._config = config
        self._shut = False

    # -- tfmesos2's members ---------------------------------------------------------------

    @property
    def cluster_def(self) -> dict[str, list[str]]:
        """Job name → ``host:port`` of its tasks, ordered by tfmesos2's task index."""
        cluster = self._status.cluster or {}
        out: dict[str, list[str]] = {}
        for p in sorted(self._planned, key=lambda p: p.task_index):
            addrs = cluster.get(p.job_name, [])
            if p.position < len(addrs):
                out.setdefault(p.job_name, []).append(addrs[p.position])
        return out

    @property
    def targets(self) -> dict[str, str]:
        """``{"/job:NAME/task:INDEX": "grpc://host:port"}`` by tfmesos2's task index."""
        cluster = self._status.cluster or {}
        out = {}
        for p in self._planned:
            addrs = cluster.get(p.job_name, [])
            if p.position < len(addrs):
                out[f"/job:{p.job_name}/task:{p.task_index}"] = f"grpc://{addrs[p.position]}"
        return out

    @property
    def tasks(self) -> dict[str, Task]:
        """Mesos task id → :class:`Task`, as they are now (tfmesos2's ``tasks``)."""
        status = self.status()
        view = self._framework()
        mesos_tasks = view.tasks if view is not None else {}
        nodes = {(n.role, n.index): n for n in status.nodes}
        out = {}
        for p in self._planned:
            n = nodes.get((p.job_name, p.position))
            mt = mesos_tasks.get((p.job_name, p.position), {})
            tid = mt.get("task_id") or (n.task_id if n is not None else "")
            node_state = str(n.state) if n is not None else "UNREGISTERED"
            port = str(n.port) if n is not None and n.port else None
            task = Task(
                tid,
                p,
                n.host if n is not None else None,
                port,
                mt.get("state") or "",
                node_state,
                n is not None and n.state == NodeState.RUNNING,
                self._config.gpu_vendor,
                **self._extras,
            )
            out[tid or f"unlaunched:/job:{p.job_name}/task:{p.task_index}"] = task
        return out

    @property
    def get_tasks(self) -> dict[str, Task]:
        """tfmesos2's other name for :attr:`tasks`."""
        return self.tasks

    @property
    def task_queue(self) -> queue.Queue[Task]:
        """The tasks waiting for an offer (none once the cluster is up), as tfmesos2's queue."""
        q: queue.Queue[Task] = queue.Queue()
        for t in self.tasks.values():
            if not t.offered or t.state == "PENDING":
                q.put(t)
        return q

    @property
    def framework_id(self) -> str | None:
        view = self._framework()
        return view.framework_id if view is not None else None

    @property
    def master_url(self) -> str:
        """The leading master's base URL (where the framework is subscribed)."""
        view = self._framework()
        leader = view.leader if view is not None else None
        return leader or next(iter(self._config.masters), "")

    def _framework(self) -> FrameworkView | None:
        """The Mesos framework and this job's tasks now; None once it has stopped."""
        return self._coord.mesos_view(self.job) if not self._shut else None

    def get_task_info(self, task_id: str) -> dict[str, Any]:
        """The leading master's ``/tasks`` answer for one task of this framework, as tfmesos2
        asks for it; ``{}`` (and a logged error) when the master cannot be asked."""
        query = urlencode({"task_id": task_id, "framework_id": self.framework_id or ""})
        return mesos.master_get(self._config, f"{self.master_url}/tasks/?{query}", TASK_INFO_TIMEOUT_S)

    def status(self) -> JobStatus:
        """The job's full status (nodes, their Mesos tasks, timeline)."""
        self._status = self._driver.status(self.job)
        return self._status

    def wait_until_ready(self) -> None:
        """tfmesos2's readiness wait: the cluster is ready once ``cluster()`` yields, so this
        only checks that it still is.

        Raises:
            JobFailed: a task failed since. JobStopped: the cluster was shut down.
        """
        check_outcome(self.status())

    def shutdown(self) -> None:
        """Stop the tasks and tear the framework down now (leaving the ``with`` block does it too)."""
        if self._shut:
            return
        self._shut = True
        try:
            mesos.stop_and_wait(self._driver, self.job, "shutdown() was called")
        finally:
            self._coord.stop()


def _jobs(jobs: Any) -> list[Job]:
    if isinstance(jobs, (dict, Job)):
        jobs = [jobs]
    return [j if isinstance(j, Job) else Job(**j) for j in jobs]


def scheduler_python_path(
    environ: Mapping[str, str], tasks_env: Mapping[str, str], *, image: str | None, python: str | None
) -> str | None:
    """The tasks' ``PYTHONPATH`` as tfmesos2 0.4.0 sets it: this process's ``sys.path``.

    tfmesos2 gives every task its scheduler's ``sys.path``, so tasks run without an image of
    their own (the Mesos containerizer, a filesystem shared with the agents) find what the
    scheduler imports, TensorFlow included. None where the user said otherwise: a task
    interpreter (``python=``, ``TFCOORD_TASK_PYTHON``) or an image (``image=``,
    ``DOCKER_IMAGE``) named, which bring their own packages, or ``PYTHONPATH`` in the tasks'
    ``env`` (tfmesos2 would drop it; an explicit choice wins here).
    """
    if python or environ.get(PYTHON_ENV) or image or environ.get("DOCKER_IMAGE") or "PYTHONPATH" in tasks_env:
        return None
    return os.pathsep.join(p for p in sys.path if p)


def _config(
    environ: Mapping[str, str],
    *,
    master: str | None,
    image: str | None,
    verify_ssl: bool | None,
    ca_file: str | None,
    python: str | None,
    containerizer_type: str | None,
    force_pull_image: bool | None,
    gpu_vendor: str | None,
    volumes: Mapping[str, str] | None,
    fetcher: Mapping[str, bool] | None,
    env: Mapping[str, str] | None,
) -> MesosConfig:
    """The framework's configuration with tfmesos2's defaults; arguments win over the environment.

    tfmesos2's tasks present TFMESOS2_CLIENT_USERNAME/PASSWORD (from the tasks' ``env``) to its
    driver's HTTP API; here they are what the Mesos fetcher presents to the coordinator's
    HTTP port for the node archive (from ``env``, else this process's environment).
    """
    defaults = {
        FORCE_PULL_ENV: "true",  # tfmesos2 pulls the image at every launch
        "DOCKER_IMAGE": TFMESOS2_IMAGE,  # and runs its own image unless DOCKER_IMAGE names one
    }
    task_env = dict(env or {})
    archive_auth = {k: task_env[k] for k in (ARCHIVE_USER_ENV, ARCHIVE_PASSWORD_ENV) if task_env.get(k)}
    # The tasks' environment: the argument, else TFCOORD_MESOS_ENV; then tfmesos2's PYTHONPATH.
    tasks_env = dict(env) if env is not None else dict(parse_env(environ.get(ENV_ENV, "")))
    python_path = scheduler_python_path(environ, tasks_env, image=image, python=python)
    if python_path is not None:
        env = {**tasks_env, "PYTHONPATH": python_path}
    return MesosConfig.from_env(
        {**defaults, **environ, **archive_auth},
        master=master or (None if environ.get("MESOS_MASTER") else TFMESOS2_MASTER),
        role=environ.get("MESOS_FRAMEWORK_ROLE") or TFMESOS2_ROLE,
        verify_ssl=verify_ssl,
        ca_file=ca_file,
        python=python,
        containerizer=containerizer_type.lower() if containerizer_type else None,
        force_pull_image=force_pull_image,
        gpu_vendor=gpu_vendor.lower() if gpu_vendor else None,
        volumes=tuple(Volume(src, dst) for src, dst in volumes.items()) if volumes is not None else None,
        uris=tuple(FetchUri(uri, bool(extract)) for uri, extract in fetcher.items())
        if fetcher is not None
        else None,
        env=tuple(env.items()) if env is not None else None,
    )


@contextmanager
def cluster(
    jobs: Job | Mapping[str, Any] | Sequence[Job | Mapping[str, Any]],
    client_ip: str | None = None,
    port: int | None = None,
    *,
    master: str | None = None,
    volumes: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    loglevel: int | None = logging.INFO,
    containerizer_type: str | None = None,
    force_pull_image: bool | None = None,
    fetcher: Mapping[str, bool] | None = None,
    gpu_vendor: str | None = None,
    extra_config: Any = None,
    readiness_timeout: float = 600.0,
    verify_ssl: bool | None = None,
    image: str | None = None,
    python: str | None = None,
    ca_file: str | None = None,
    command: Sequence[str] = (),
    name: str = "tfmesos2",
    plaintext: bool = False,
) -> Iterator[Cluster]:
    """Run a TensorFlow cluster on Mesos for the duration of the ``with`` block.

    tfmesos2 0.4.0's arguments keep their meaning and defaults: ``client_ip`` (the address
    tasks dial back; default this host's name, resolved), ``port`` (where they dial; default
    a free port, where tfmesos2 fixes 11000), ``volumes`` (host path → container path,
    read-write), ``env`` (the tasks' environment), ``loglevel`` (for tfcoord's log, which
    is set up as tfmesos2 does when nothing configured logging; None leaves logging alone),
    ``containerizer_type`` (``"DOCKER"`` or ``"MESOS"``), ``force_pull_image`` (default
    True), ``fetcher`` (URI → extract), ``gpu_vendor`` (``"nvidia"``, the default, or
    ``"amd"``), ``readiness_timeout`` (seconds until every task must be up), ``verify_ssl``
    (overrides MESOS_VERIFY_SSL), ``extra_config`` (accepted and, as in tfmesos2, unused).
    Left unset, ``containerizer_type``, ``force_pull_image``, ``gpu_vendor``, ``volumes``,
    ``env`` and ``fetcher`` come from the ``TFCOORD_MESOS_*`` variables, else these
    defaults. tfcoord adds ``master`` (overrides MESOS_MASTER), ``image`` (overrides
    DOCKER_IMAGE), ``python`` (the tasks' interpreter; without it and without an image
    named, tasks get this process's ``sys.path`` as ``PYTHONPATH``, as in tfmesos2, unless
    ``env`` sets one), ``ca_file`` (the masters' CA) and
    ``command`` (run it in every task with TF_CONFIG set instead of serving). The
    coordinator it embeds serves TLS with a CA of its own, which the tasks pin (tfmesos2's
    is plaintext); ``plaintext=True`` opts out, logged as a warning.

    Raises:
        MesosError: the framework cannot subscribe (e.g. wrong credentials: HTTP 401).
        JobFailed: a task failed, or the readiness timeout passed; the message names the
            tasks and their last Mesos state.
    """
    planned = plan(_jobs(jobs))
    mjob = MesosJob.of(runs(planned), tuple(command), image, os.environ.get("MESOS_ATTRIBUTES", ""))
    config = _config(
        os.environ,
        master=master,
        image=image,
        verify_ssl=verify_ssl,
        ca_file=ca_file,
        python=python,
        containerizer_type=containerizer_type,
        force_pull_image=force_pull_image,
        gpu_vendor=gpu_vendor,
        volumes=volumes,
        fetcher=fetcher,
        env=env,
    )
    if loglevel is not None:
        if not logging.getLogger().handlers:  # as tfmesos2 does; never over the caller's set-up
            logging.basicConfig(level=loglevel, format=TFMESOS2_LOG_FORMAT)
        logging.getLogger("tfcoord").setLevel(loglevel)
    advertise = client_ip or mesos.default_advertise_host()
    if plaintext:
        logging.getLogger("tfcoord").warning(
            "the embedded coordinator serves PLAINTEXT (plaintext=True): its tasks' traffic is unencrypted"
        )
    coord: EmbeddedCoordinator = mesos.start_coordinator(
        config, host="0.0.0.0", port=port or 0, advertise_host=advertise, gpus=mjob.gpus, plaintext=plaintext
    )
    c: Cluster | None = None
    try:
        with DriverClient(coord.address, coord.secret, ssl_context=mesos.driver_tls(coord)) as driver:
            job = driver.submit(mjob.to_spec(name=name, reservation_timeout_s=readiness_timeout))
            try:
                status = mesos.wait_running(driver, job, timeout_s=readiness_timeout + mesos.RUNNING_GRACE_S)
                extras = {
                    "readiness_timeout": readiness_timeout,
                    "extra_config": extra_config,
                    "volumes": dict(volumes or {}),
                    "env": dict(env or {}),
                    "fetcher": dict(fetcher or {}),
                }
                c = Cluster(
                    job,
                    status,
                    coord,
                    driver,
                    planned,
                    config,
                    advertise,
                    int(coord.address.rsplit(":", 1)[1]),
                    extras,
                )
                yield c
            finally:
                if c is None or not c._shut:
                    mesos.stop_and_wait(driver, job, "the cluster() block ended")
    finally:
        if c is None or not c._shut:
            coord.stop()
