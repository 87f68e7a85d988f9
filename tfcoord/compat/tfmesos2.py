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
``DOCKER_IMAGE``, ``MESOS_ATTRIBUTES`` (plus ``MESOS_CA_FILE``, ``TFCOORD_TASK_PYTHON`` and
the ``TFCOORD_MESOS_*`` task settings, which the arguments override).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tfcoord.client import DriverClient
from tfcoord.client.client import check_outcome
from tfcoord.client.replies import JobStatus
from tfcoord.client.vocab import NodeState
from tfcoord.coordinator.embedded import EmbeddedCoordinator
from tfcoord.coordinator.mesos import driver as mesos
from tfcoord.coordinator.mesos.config import FORCE_PULL_ENV, FetchUri, MesosConfig, Volume
from tfcoord.coordinator.mesos.errors import MesosConfigError
from tfcoord.coordinator.mesos.jobs import MesosJob, RoleResources

__all__ = ["Cluster", "Job", "Task", "cluster"]


class Job:
    """One role of the cluster, as tfmesos2 declares it.

    Args:
        name: the role (``ps``, ``chief``, ``master``, ``evaluator`` or ``worker``).
        num: how many tasks.
        cpus: CPUs each task needs.
        mem: memory each task needs, in MB.
        gpus: whole GPUs each task needs.
        start: tfmesos2's first task index; tfcoord numbers every role from 0, so only 0.

    Raises:
        MesosConfigError: an unknown role or a resource out of range.
    """

    def __init__(
        self, name: str, num: int, cpus: float = 1.0, mem: float = 1024.0, gpus: int = 0, start: int = 0
    ) -> None:
        if start != 0:
            raise MesosConfigError(
                f"Job(start={start}): tfcoord numbers each role's tasks from 0; use start=0"
            )
        self.name, self.num, self.cpus, self.mem, self.gpus, self.start = name, num, cpus, mem, gpus, start
        self.resources = RoleResources(name, num, float(cpus), float(mem), int(gpus))


#: tfmesos2's defaults where code written for it relies on them.
TFMESOS2_ROLE = "tensorflow"
TFMESOS2_MASTER = "localhost:5050"
TFMESOS2_LOG_FORMAT = "%(asctime)s %(levelname)s: %(message)s"


@dataclass(frozen=True)
class Task:
    """One TensorFlow task as tfmesos2's ``Task`` shows it (``c.tasks[mesos_task_id]``)."""

    mesos_task_id: str
    job_name: str
    task_index: int
    #: The agent's address and the task's TensorFlow port (a string, as tfmesos2 has it).
    addr: str | None
    port: str | None
    #: The node's state (RUNNING once its server listens), or the last Mesos task state.
    state: str
    initialized: bool
    cpus: float
    mem: float
    gpus: int


class Cluster:
    """What ``with cluster(...) as c`` yields: the running cluster's addresses."""

    def __init__(
        self,
        job: str,
        status: JobStatus,
        coordinator: EmbeddedCoordinator,
        driver: DriverClient,
        mjob: MesosJob,
        client_ip: str,
        port: int,
    ) -> None:
        self.job = job
        #: Role → ["host:port", ...] ordered by task index.
        self.cluster_def: dict[str, list[str]] = dict(status.cluster or {})
        #: ``host:port`` of the coordinator (``tfcoord status`` shows the job there).
        self.coordinator = coordinator.address
        #: tfmesos2's names: the address tasks dial back to, and the port they dial.
        self.client_ip = client_ip
        self.port = port
        self._status = status
        self._coord = coordinator
        self._driver = driver
        self._mjob = mjob
        self._shut = False

    @property
    def targets(self) -> dict[str, str]:
        """``{"/job:ROLE/task:I": "grpc://host:port"}`` for every task."""
        return mesos.targets(self.cluster_def)

    @property
    def tasks(self) -> dict[str, Task]:
        """Mesos task id → :class:`Task`, as tfmesos2's ``tasks``."""
        out = {}
        for n in self._status.nodes:
            need = self._mjob.slot(n.executor_id)
            port = str(n.port) if n.port else None
            out[n.task_id] = Task(
                n.task_id,
                n.role,
                n.index,
                n.host,
                port,
                n.state,
                n.state == NodeState.RUNNING,
                need.cpus,
                need.mem,
                need.gpus,
            )
        return out

    @property
    def get_tasks(self) -> dict[str, Task]:
        """tfmesos2's other name for :attr:`tasks`."""
        return self.tasks

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


def _config(
    environ: Mapping[str, str],
    *,
    master: str | None,
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
    """The framework's configuration with tfmesos2's defaults; arguments win over the environment."""
    defaults = {FORCE_PULL_ENV: "true"}  # tfmesos2 pulls the image at every launch
    return MesosConfig.from_env(
        {**defaults, **environ},
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
    DOCKER_IMAGE), ``python`` (the tasks' interpreter), ``ca_file`` (the masters' CA) and
    ``command`` (run it in every task with TF_CONFIG set instead of serving).

    Raises:
        MesosError: the framework cannot subscribe (e.g. wrong credentials: HTTP 401).
        JobFailed: a task failed, or the readiness timeout passed; the message names the
            tasks and their last Mesos state.
    """
    del extra_config
    roles = [j.resources for j in _jobs(jobs)]
    mjob = MesosJob.of(roles, tuple(command), image, os.environ.get("MESOS_ATTRIBUTES", ""))
    config = _config(
        os.environ,
        master=master,
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
    coord: EmbeddedCoordinator = mesos.start_coordinator(
        config, host="0.0.0.0", port=port or 0, advertise_host=advertise, gpus=mjob.gpus
    )
    c: Cluster | None = None
    try:
        with DriverClient(coord.address, coord.secret) as driver:
            job = driver.submit(mjob.to_spec(name=name, reservation_timeout_s=readiness_timeout))
            try:
                status = mesos.wait_running(driver, job, timeout_s=readiness_timeout + mesos.RUNNING_GRACE_S)
                c = Cluster(job, status, coord, driver, mjob, advertise, int(coord.address.rsplit(":", 1)[1]))
                yield c
            finally:
                if c is None or not c._shut:
                    mesos.stop_and_wait(driver, job, "the cluster() block ended")
    finally:
        if c is None or not c._shut:
            coord.stop()
