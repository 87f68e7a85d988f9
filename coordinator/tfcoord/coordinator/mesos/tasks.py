"""Building the TaskInfo of one TensorFlow task: container, command, environment. Pure.

Every task runs the tfcoord node entry point,
``python3 -m tfcoord.node --address COORDINATOR --job J --executor-id I --attempt A
--task-id T --host AGENT [--gpus IDS] (--server-mode | -- COMMAND...)``, which binds
``TENSORFLOW_PORT`` (a port taken from the offer), registers, waits for the cluster and then
serves or runs the command with ``TF_CONFIG`` set. The job's token reaches it in the
environment (``TFCOORD_TOKEN``), never on the command line, so it does not show in process
listings; it is the per-job token, which can act only within that job, never the
coordinator's secret. (Like any TaskInfo field it is visible to whoever can read the
master's state.)

Where the coordinator serves the node archive (``coordinator.nodearchive``: the node runtime
as one zipapp, on its HTTP port), the image needs no tfcoord at all: ``CommandInfo.uris``
names the archive (``executable``, so the fetcher neither extracts it nor leaves it
read-only), the fetcher puts it in the sandbox, and the command checks it against the SHA-256
the TaskInfo carries and runs it -- ``python3 -c BOOTSTRAP $MESOS_SANDBOX/ARCHIVE SHA256
--address ...``, the same node arguments. Only an image with Python 3 (and TensorFlow, to
serve) is needed, tfmesos2's included.

Where the master resolves secrets (Mesos 1.4 and later, under the Mesos containerizer only:
Docker's does not support them), the token travels as a ``Secret`` of type VALUE in the
environment (:func:`token_variable`), so the master's task listings and state endpoints show
no token; elsewhere as a plain variable, as before.

The command is a shell line starting with ``exec`` so the node process replaces the shell
and receives the agent's signals; ``shell=true`` means the same under the Docker and the
Mesos containerizer, where ``shell=false`` does not.

Containers: Docker on the host network (TensorFlow's gRPC ports are the offer's ports, on
the agent's address), or the Mesos containerizer with a Docker image; an empty image runs
the task straight on the agent.

GPUs. What a task sees depends on who exposes the devices, and the node must be told the
ids as *it* sees them (they become ``CUDA_VISIBLE_DEVICES``):

=====================  =========================  ======================================
containerizer, vendor  SET of ids (2,3)           SCALAR count (2)
=====================  =========================  ======================================
Docker, NVIDIA         ``--gpus "device=2,3"``;   ``--gpus 2`` (the first two); node
                       renumbered: node ``0,1``   ``0,1``; one GPU task per agent
Docker, AMD            ``/dev/kfd``, ``/dev/dri``  all visible; node ``0,1``; one GPU
                       (all visible): node ``2,3`` task per agent
Mesos image, NVIDIA    not Mesos' own resource:   Mesos' GPU isolator exposes only the
/ no image, NVIDIA     physical ids: node ``2,3``  allocated GPUs, from 0: node ``0,1``
Mesos image / no       physical ids: node ``2,3``  all visible (no AMD isolator): node
image, AMD                                        ``0,1``; one GPU task per agent
=====================  =========================  ======================================

A SCALAR count names no device, so where nothing isolates the GPUs (Docker, which Mesos'
GPU isolator does not cover, and AMD, which it does not know) two tasks on one agent would
both take the first GPUs: :func:`scalar_gpus_isolated` says when that is so, and the engine
then places at most one GPU task of the framework per agent (the others wait for another
agent, and the job's status says why). A single task there takes the first GPUs, which is
right only while no other framework uses that agent's GPUs: offer them as a SET of ids to
share an agent safely.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from tfcoord.client.auth import TOKEN_ENV

from ..nodearchive import bootstrap_argv
from .config import MesosConfig
from .jobs import MesosJob
from .offers import Placement

TASK_ID_PREFIX = "tfcoord"
PORT_ENV = "TENSORFLOW_PORT"
#: Mesos resolves environment secrets from this release on (the Secret message is older).
SECRETS_SINCE = (1, 4)


def task_id(job: str, executor_id: int, attempt: int) -> str:
    """The Mesos task id of one attempt of one slot: unique per framework, and parseable."""
    return f"{TASK_ID_PREFIX}.{job}.{executor_id}.{attempt}"


def parse_task_id(value: str) -> tuple[str, int, int] | None:
    """(job, executor id, attempt) of a task id made by :func:`task_id`; None otherwise."""
    prefix, _, rest = value.partition(".")
    job, _, tail = rest.rpartition(".")
    job, _, executor = job.rpartition(".")
    if prefix != TASK_ID_PREFIX or not job or not executor.isdigit() or not tail.isdigit():
        return None
    return job, int(executor), int(tail)


@dataclass(frozen=True)
class ArchiveFetch:
    """The node archive as a task fetches it: the URL with its download credential, the file
    name it gets in the sandbox and the digest the task checks before running it."""

    url: str
    name: str
    sha256: str

    @classmethod
    def at(cls, base_url: str, username: str, password: str, name: str, sha256: str) -> ArchiveFetch:
        """The archive served under ``base_url`` (``https://host:port``), the credential in
        the URL's userinfo: the Mesos fetcher (libcurl) sends it as HTTP Basic."""
        scheme, _, rest = base_url.partition("://")
        cred = f"{quote(username, safe='')}:{quote(password, safe='')}@"
        return cls(f"{scheme}://{cred}{rest}/v1/node-archive/{name}", name, sha256)


@dataclass(frozen=True)
class TaskLaunch:
    """One task to launch: which slot, where, and how the node reaches its coordinator."""

    job: str
    executor_id: int
    attempt: int
    role: str
    index: int
    #: ``host:port`` the node dials.
    coordinator: str
    token_hex: str
    mesos_job: MesosJob
    placement: Placement
    #: Fetch and run the node archive (None: the image's own ``python3 -m tfcoord.node``).
    archive: ArchiveFetch | None = None
    #: Pass the token as a Mesos secret (the master and the containerizer resolve them).
    secret_token: bool = False

    @property
    def task_id(self) -> str:
        return task_id(self.job, self.executor_id, self.attempt)


def task_image(config: MesosConfig, launch: TaskLaunch) -> str:
    """The task's image: its job's, else the configured one; empty runs it on the agent."""
    return launch.mesos_job.image or config.image


def scalar_gpus_isolated(config: MesosConfig, image: str) -> bool:
    """Whether Mesos keeps apart the SCALAR GPUs of two tasks on one agent.

    Only Mesos' own NVIDIA GPU isolator does, and only under the Mesos containerizer (with
    an image or without one); Docker tasks and AMD GPUs see every GPU of the agent.
    """
    return config.gpu_vendor == "nvidia" and (not image or config.containerizer == "mesos")


def visible_gpus(config: MesosConfig, image: str, p: Placement) -> tuple[str, ...]:
    """The GPU ids the node inside the task selects (``CUDA_VISIBLE_DEVICES``); see the table above."""
    if not p.gpus:
        return ()
    renumbered = tuple(str(i) for i in range(p.gpus))
    if not p.gpu_ids:  # SCALAR: isolated and renumbered, or the agent's only GPU task: the first ones
        return renumbered
    if image and config.containerizer == "docker" and config.gpu_vendor == "nvidia":
        return renumbered  # --gpus device=<ids> shows exactly those, from 0
    return p.gpu_ids  # every GPU visible (AMD's /dev/dri, or the agent itself): the physical ids


def secrets_supported(master_version: str, config: MesosConfig, image: str) -> bool:
    """Whether a task of ``image`` gets environment secrets resolved: Mesos 1.4 or later, and
    the Mesos containerizer (a task without an image runs under it too)."""
    parts = []
    for item in master_version.split(".")[:2]:
        digits = "".join(c for c in item if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= SECRETS_SINCE and (not image or config.containerizer == "mesos")


def token_variable(launch: TaskLaunch) -> dict[str, Any]:
    """The job token's environment variable: a Secret of type VALUE, or a plain value."""
    if launch.secret_token:
        data = base64.b64encode(launch.token_hex.encode()).decode()
        return {"name": TOKEN_ENV, "type": "SECRET", "secret": {"type": "VALUE", "value": {"data": data}}}
    return {"name": TOKEN_ENV, "value": launch.token_hex}


def node_argv(config: MesosConfig, launch: TaskLaunch) -> list[str]:
    """The node entry point's argv for this task: the image's ``python3 -m tfcoord.node``, or
    the fetched archive's bootstrap (its path as ``$MESOS_SANDBOX/NAME``, for a shell)."""
    if launch.archive is not None:
        a = launch.archive
        entry = bootstrap_argv(config.python, f"{SANDBOX_MARK}/{a.name}", a.sha256)
    else:
        entry = [config.python, "-m", "tfcoord.node"]
    return entry + node_args(config, launch)


#: Stands for the sandbox in :func:`node_argv`; the shell line expands it.
SANDBOX_MARK = "$MESOS_SANDBOX"


def node_args(config: MesosConfig, launch: TaskLaunch) -> list[str]:
    """The node's own arguments (``tfcoord node ...``), whichever entry point runs it."""
    p = launch.placement
    argv = [
        "--address",
        launch.coordinator,
        "--job",
        launch.job,
        "--executor-id",
        str(launch.executor_id),
        "--attempt",
        str(launch.attempt),
        "--task-id",
        launch.task_id,
    ]
    if p.hostname:
        argv += ["--host", p.hostname]
    gpus = visible_gpus(config, task_image(config, launch), p)
    if gpus:
        argv += ["--gpus", ",".join(gpus)]
    if launch.mesos_job.server_mode:
        argv.append("--server-mode")
    else:
        argv += ["--", *launch.mesos_job.command]
    return argv


def docker_parameters(config: MesosConfig, p: Placement) -> list[dict[str, str]]:
    params: list[dict[str, str]] = []
    if not p.gpus:
        return params
    if config.gpu_vendor == "nvidia":
        # Docker reads --gpus as CSV: a list of ids must be quoted to stay one field.
        value = f'"device={",".join(p.gpu_ids)}"' if p.gpu_ids else str(p.gpus)
        params.append({"key": "gpus", "value": value})
    else:
        params += [
            {"key": "device", "value": "/dev/kfd"},
            {"key": "device", "value": "/dev/dri"},
            {"key": "group-add", "value": "video"},
            {"key": "security-opt", "value": "seccomp=unconfined"},
        ]
    return params


def container_info(config: MesosConfig, launch: TaskLaunch) -> dict[str, Any] | None:
    image = task_image(config, launch)
    volumes = [
        {"container_path": v.container_path, "host_path": v.host_path, "mode": v.mode} for v in config.volumes
    ]
    if not image:
        return {"type": "MESOS", "volumes": volumes} if volumes else None
    if config.containerizer == "docker":
        docker: dict[str, Any] = {
            "image": image,
            "network": "HOST",
            "force_pull_image": config.force_pull_image,
        }
        params = docker_parameters(config, launch.placement)
        if params:
            docker["parameters"] = params
        out: dict[str, Any] = {"type": "DOCKER", "docker": docker}
    else:
        out = {
            "type": "MESOS",
            "mesos": {
                "image": {"type": "DOCKER", "docker": {"name": image}, "cached": not config.force_pull_image}
            },
        }
    if volumes:
        out["volumes"] = volumes
    return out


def shell_line(argv: list[str]) -> str:
    """``exec ARGV`` for ``/bin/sh -c``, each word quoted; :data:`SANDBOX_MARK` left to expand."""
    words = []
    for word in argv:
        if word.startswith(SANDBOX_MARK + "/"):
            words.append('"$MESOS_SANDBOX"/' + shlex.quote(word[len(SANDBOX_MARK) + 1 :]))
        else:
            words.append(shlex.quote(word))
    return "exec " + " ".join(words)


def build_task_info(config: MesosConfig, launch: TaskLaunch) -> dict[str, Any]:
    """The TaskInfo (JSON) for a LAUNCH operation."""
    p = launch.placement
    variables = [
        token_variable(launch),
        {"name": PORT_ENV, "value": str(p.port)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    variables += [{"name": k, "value": v} for k, v in config.env if k not in (TOKEN_ENV, PORT_ENV)]
    command: dict[str, Any] = {
        "shell": True,
        "value": shell_line(node_argv(config, launch)),
        "environment": {"variables": variables},
    }
    uris = []
    if launch.archive is not None:
        # executable: chmod'ed and neither extracted nor cached under a shared name; the
        # output_file pins the name the command runs, whatever the URL looks like.
        uris.append(
            {
                "value": launch.archive.url,
                "executable": True,
                "extract": False,
                "cache": False,
                "output_file": launch.archive.name,
            }
        )
    uris += [
        {"value": u.value, "extract": u.extract, "executable": u.executable, "cache": u.cache}
        for u in config.uris
    ]
    if uris:
        command["uris"] = uris
    labels = [
        {"key": "tfcoord.job", "value": launch.job},
        {"key": "tfcoord.task", "value": f"{launch.role}:{launch.index}"},
    ]
    labels += [{"key": k, "value": v} for k, v in config.task_labels]
    info: dict[str, Any] = {
        "name": f"tfcoord {launch.job} /job:{launch.role}/task:{launch.index}",
        "task_id": {"value": launch.task_id},
        "agent_id": {"value": p.agent_id},
        "resources": [dict(r) for r in p.resources],
        "command": command,
        "labels": {"labels": labels},
    }
    container = container_info(config, launch)
    if container is not None:
        info["container"] = container
    return info
