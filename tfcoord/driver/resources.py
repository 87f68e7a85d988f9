"""Resources per role: one description (``{"worker": {"cpus": 2, "gpus": 1}}``) for every engine.

``run(..., role_resources=...)``, ``tfcoord submit --role-resources worker:cpus=2,gpus=1`` and the
Spark configuration keys ``spark.tfcoord.resources.<role>.<key>`` all build the same
``{role: Resources}``. Each engine then honours it its own way:

- Spark: each role that has resources runs as its own Spark job whose RDD carries a
  ``ResourceProfile`` (stage-level scheduling). With dynamic allocation Spark starts executors
  of that profile (executor cores, memory and GPUs); without it the profile holds task
  resources only and the job's tasks share the executors there are (standalone since Spark
  3.4, Kubernetes since 3.5). :func:`check_spark` refuses, before anything starts, what the
  cluster cannot honour, so a job never waits forever for an executor that will not come.
- Mesos: the roles' tasks are matched to offers sized per role (:func:`mesos_roles`).
- Local: the node processes are pinned to CPUs (see :mod:`tfcoord.driver.local`).

Pure apart from building pyspark's profile objects: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfcoord.client.messages import MAX_ROLE_LEN, ROLE_RE

#: The keys a role's resources may have.
KEYS = ("cpus", "gpus", "memory")
#: ``--role-resources`` and ``spark.tfcoord.resources.*`` in one line, for error messages.
SYNTAX = "ROLE:cpus=N,gpus=N,memory=SIZE (memory as 2g, 512m or MiB), e.g. worker:cpus=2,gpus=1"
#: Spark configuration keys read by ``run`` (so ``TFCluster.run`` programs get them unchanged):
#: ``spark.tfcoord.resources.worker.cpus=2``, ``...worker.gpus=1``, ``...ps.memory=2g``.
CONF_PREFIX = "spark.tfcoord.resources."
#: Stage-level scheduling without dynamic allocation (task-only profiles): standalone since
#: Spark 3.4 (SPARK-39853), Kubernetes since 3.5 (SPARK-45495).
TASK_ONLY_SINCE = {"standalone": (3, 4), "kubernetes": (3, 5)}
#: With dynamic allocation every one of these acquires executors of each profile (Spark 3.1+).
PROFILES_SINCE = (3, 1)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?", re.IGNORECASE)
_UNIT_MIB = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}


class ResourcesError(ValueError):
    """A role's resources are malformed, or the cluster cannot honour them; the text says what to change."""


@dataclass(frozen=True)
class Resources:
    """What each task of one role needs. ``None`` leaves a value to the engine's default.

    ``cpus``: cores per task (Spark: whole cores; Mesos: any share). ``gpus``: whole GPUs.
    ``memory_mb``: memory per task in MiB (Spark: the executor memory of the role's executors).
    """

    cpus: float | None = None
    gpus: int = 0
    memory_mb: int | None = None

    def __post_init__(self) -> None:
        if self.cpus is not None and (
            isinstance(self.cpus, bool)
            or not isinstance(self.cpus, (int, float))
            or not math.isfinite(self.cpus)
            or self.cpus <= 0
        ):
            raise ResourcesError(f"cpus must be a number above 0, not {self.cpus!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise ResourcesError(f"gpus must be a whole number >= 0, not {self.gpus!r}")
        if self.memory_mb is not None and (
            isinstance(self.memory_mb, bool) or not isinstance(self.memory_mb, int) or self.memory_mb < 1
        ):
            raise ResourcesError(f"memory must be at least 1 MiB, not {self.memory_mb!r}")

    def text(self) -> str:
        """``cpus=2,gpus=1,memory=2048m``: what ``--role-resources`` takes back."""
        parts = [] if self.cpus is None else [f"cpus={self.cpus:g}"]
        parts += [f"gpus={self.gpus}"] if self.gpus else []
        parts += [] if self.memory_mb is None else [f"memory={self.memory_mb}m"]
        return ",".join(parts) or "engine defaults"


def memory_mib(value: Any) -> int:
    """``"2g"`` → 2048, ``"512m"`` → 512, ``1024`` → 1024 (a bare number is MiB).

    Raises:
        ResourcesError: not a size.
    """
    if isinstance(value, bool):
        raise ResourcesError(f"memory must be a size such as 2g, 512m or a number of MiB, not {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        found = _SIZE.fullmatch(str(value).strip())
        if found is None:
            raise ResourcesError(f"memory={value!r} is not a size such as 2g, 512m or a number of MiB")
        number, unit = float(found.group(1)), found.group(2).lower()
    mib = number * _UNIT_MIB[unit]
    if not math.isfinite(mib) or mib < 1:
        raise ResourcesError(f"memory={value!r} is below 1 MiB")
    return math.ceil(mib)


def _number(role: str, key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ResourcesError(f"{role}: {key}={value!r} is not a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ResourcesError(f"{role}: {key}={value!r} is not a number") from None


def resources(role: str, values: Mapping[str, Any]) -> Resources:
    """One role's ``{"cpus": 2, "gpus": 1, "memory": "2g"}`` (any subset).

    Raises:
        ResourcesError: an unknown key or a value out of range, naming the role.
    """
    if not isinstance(role, str) or len(role) > MAX_ROLE_LEN or not ROLE_RE.fullmatch(role):
        raise ResourcesError(f"{role!r} is not a TensorFlow job name (a letter, then letters, digits or '_')")
    if not isinstance(values, Mapping):
        raise ResourcesError(f"{role}: give a dict of {', '.join(KEYS)}, not {values!r}")
    unknown = sorted(str(k) for k in values if k not in KEYS)
    if unknown:
        raise ResourcesError(f"{role}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(KEYS)}")
    kw: dict[str, Any] = {}
    if values.get("cpus") is not None:
        kw["cpus"] = _number(role, "cpus", values["cpus"])
    if values.get("gpus") is not None:
        gpus = _number(role, "gpus", values["gpus"])
        if gpus != int(gpus):
            raise ResourcesError(f"{role}: gpus={values['gpus']!r} must be a whole number")
        kw["gpus"] = int(gpus)
    if values.get("memory") is not None:
        try:
            kw["memory_mb"] = memory_mib(values["memory"])
        except ResourcesError as e:
            raise ResourcesError(f"{role}: {e}") from None
    try:
        return Resources(**kw)
    except ResourcesError as e:
        raise ResourcesError(f"{role}: {e}") from None


def role_resources(value: Mapping[str, Any] | None) -> dict[str, Resources]:
    """``run``'s ``role_resources``: role → its needs (values may already be :class:`Resources`).

    Raises:
        ResourcesError: not a dict of dicts, or a role's resources are invalid.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ResourcesError(
            f"role_resources must be a dict such as {{'worker': {{'cpus': 2, 'gpus': 1}}}}, not {value!r}"
        )
    return {role: r if isinstance(r, Resources) else resources(role, r) for role, r in value.items()}


def parse_flag(text: str) -> tuple[str, Resources]:
    """``worker:cpus=2,gpus=1,memory=4g`` → ``("worker", Resources(2, 1, 4096))``.

    Raises:
        ResourcesError: the text does not follow :data:`SYNTAX`.
    """
    role, sep, rest = text.strip().partition(":")
    if not sep or not role or not rest.strip():
        raise ResourcesError(f"{text!r} is not {SYNTAX}")
    values: dict[str, str] = {}
    for item in (p.strip() for p in rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or not value.strip():
            raise ResourcesError(f"{role}: {item!r} is not KEY=VALUE ({SYNTAX})")
        if key in values:
            raise ResourcesError(f"{role}: {key} is given twice")
        values[key] = value.strip()
    return role.strip(), resources(role.strip(), values)


def parse_flags(items: Iterable[str]) -> dict[str, Resources]:
    """Every ``--role-resources`` given; a role given twice is refused."""
    out: dict[str, Resources] = {}
    for item in items:
        role, res = parse_flag(item)
        if role in out:
            raise ResourcesError(f"--role-resources for {role} is given twice; give each role once")
        out[role] = res
    return out


def check_roles(given: Mapping[str, Resources], roles: Sequence[tuple[str, int]]) -> None:
    """Every role named has tasks in the cluster (a misspelt role would be silently unused)."""
    names = [r for r, n in roles if n > 0]
    for role in given:
        if role not in names:
            raise ResourcesError(
                f"role_resources names {role!r}, which this cluster has no task of (its roles: {', '.join(names)})"
            )


# -- Spark configuration keys ------------------------------------------------------------------


def to_conf(given: Mapping[str, Resources]) -> dict[str, str]:
    """The ``spark.tfcoord.resources.<role>.<key>`` settings that :func:`from_conf` reads back."""
    conf: dict[str, str] = {}
    for role, r in given.items():
        if r.cpus is not None:
            conf[f"{CONF_PREFIX}{role}.cpus"] = f"{r.cpus:g}"
        if r.gpus:
            conf[f"{CONF_PREFIX}{role}.gpus"] = str(r.gpus)
        if r.memory_mb is not None:
            conf[f"{CONF_PREFIX}{role}.memory"] = f"{r.memory_mb}m"
    return conf


def from_conf(pairs: Iterable[tuple[str, str]]) -> dict[str, Resources]:
    """Role resources from a Spark configuration's ``spark.tfcoord.resources.<role>.<key>`` entries.

    Raises:
        ResourcesError: a key that is not ``<role>.<cpus|gpus|memory>``, or a bad value, naming the key.
    """
    values: dict[str, dict[str, str]] = {}
    for key, value in pairs:
        if not key.startswith(CONF_PREFIX):
            continue
        role, _, name = key[len(CONF_PREFIX) :].rpartition(".")
        if not role or name not in KEYS:
            raise ResourcesError(f"Spark configuration {key} is not {CONF_PREFIX}<role>.<{'|'.join(KEYS)}>")
        values.setdefault(role, {})[name] = value
    try:
        return {role: resources(role, v) for role, v in values.items()}
    except ResourcesError as e:
        raise ResourcesError(f"Spark configuration {CONF_PREFIX}*: {e}") from None


# -- what a Spark cluster can honour -----------------------------------------------------------


def cluster_manager(master: str) -> str:
    """``standalone``, ``yarn``, ``kubernetes`` or ``local`` for a Spark master URL."""
    if master.startswith(("spark://", "local-cluster[")):
        return "standalone"
    if master.startswith("yarn"):
        return "yarn"
    if master.startswith("k8s://"):
        return "kubernetes"
    return "local" if master.startswith("local") else master.partition(":")[0] or "unknown"


def _version(text: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _true(conf: Mapping[str, str], key: str) -> bool:
    return str(conf.get(key, "false")).strip().lower() == "true"


def _int_conf(conf: Mapping[str, str], key: str) -> int | None:
    raw = conf.get(key)
    try:
        return int(str(raw).strip()) if raw is not None and str(raw).strip() else None
    except ValueError:
        return None


@dataclass(frozen=True)
class SparkPlan:
    """How a Spark cluster honours the roles' resources: ``dynamic`` builds executor profiles."""

    manager: str
    dynamic: bool
    discovery_script: str | None


def check_spark(
    given: Mapping[str, Resources], master: str, version: str, conf: Mapping[str, str]
) -> SparkPlan:
    """Refuse, in one line, what this Spark application cannot honour; else say how it will.

    ``conf`` is the application's configuration (``dict(sc.getConf().getAll())``).

    Raises:
        ResourcesError: fractional cpus; a cluster manager without stage-level scheduling
            (local mode); a Spark too old for it; YARN without dynamic allocation; more task
            cpus than executor cores or more memory than executors have, without dynamic
            allocation; GPUs on executors that have none, or with no discovery script to find them.
    """
    manager = cluster_manager(master)
    dynamic = _true(conf, "spark.dynamicAllocation.enabled")
    have = _version(version)
    for role, r in given.items():
        if r.cpus is not None and r.cpus != int(r.cpus):
            raise ResourcesError(
                f"{role}: cpus={r.cpus:g}, but Spark gives tasks whole cores; give a whole number"
            )
    if manager not in ("standalone", "yarn", "kubernetes"):
        raise ResourcesError(
            f"the Spark master {master} ({manager} mode) has no stage-level scheduling, so roles cannot "
            "get their own resources: run on a standalone, YARN or Kubernetes cluster, or drop role_resources"
        )
    if dynamic and have < PROFILES_SINCE:
        raise ResourcesError(
            f"Spark {version} cannot give roles their own executors: resource profiles need Spark 3.1 or later"
        )
    if not dynamic:
        if manager == "yarn":
            raise ResourcesError(
                "role_resources on YARN needs dynamic allocation, which starts executors of each role's "
                "profile: set spark.dynamicAllocation.enabled=true (and spark.dynamicAllocation.shuffleTracking."
                "enabled=true or the external shuffle service)"
            )
        since = TASK_ONLY_SINCE[manager]
        if have < since:
            raise ResourcesError(
                f"Spark {version} on {manager} cannot run a role's tasks with their own resources without "
                f"dynamic allocation (Spark {since[0]}.{since[1]} or later can): upgrade Spark or set "
                "spark.dynamicAllocation.enabled=true"
            )
        _fits_executors(given, conf)
    script = conf.get("spark.executor.resource.gpu.discoveryScript") or None
    wants_gpus = [role for role, r in given.items() if r.gpus]
    if wants_gpus:
        if not dynamic and not _int_conf(conf, "spark.executor.resource.gpu.amount"):
            raise ResourcesError(
                f"{wants_gpus[0]} asks for GPUs but the executors have none: set "
                "spark.executor.resource.gpu.amount (the GPUs per executor) and a discovery script "
                "(spark.worker.resource.gpu.discoveryScript on standalone workers, "
                "spark.executor.resource.gpu.discoveryScript on YARN and Kubernetes)"
            )
        if manager != "standalone" and script is None:
            raise ResourcesError(
                f"{wants_gpus[0]} asks for GPUs but spark.executor.resource.gpu.discoveryScript is not set: "
                f"{manager} executors find their GPUs with it (Spark ships examples/src/main/scripts/getGpusResources.sh)"
            )
    return SparkPlan(manager, dynamic, script)


def _fits_executors(given: Mapping[str, Resources], conf: Mapping[str, str]) -> None:
    """Without dynamic allocation the executors there are must fit each role's task."""
    cores = _int_conf(conf, "spark.executor.cores")
    gpus = _int_conf(conf, "spark.executor.resource.gpu.amount") or 0
    memory = conf.get("spark.executor.memory")
    for role, r in given.items():
        if cores is not None and r.cpus is not None and r.cpus > cores:
            raise ResourcesError(
                f"{role} asks for {r.cpus:g} cpus per task but executors have {cores} cores "
                "(spark.executor.cores): raise spark.executor.cores, lower cpus, or turn on dynamic allocation"
            )
        if gpus and r.gpus > gpus:
            raise ResourcesError(
                f"{role} asks for {r.gpus} GPUs per task but executors have {gpus} "
                "(spark.executor.resource.gpu.amount): raise it or lower gpus"
            )
        if r.memory_mb is not None:
            have = memory_mib(memory) if memory else 1024  # Spark's default executor memory
            if r.memory_mb > have:
                raise ResourcesError(
                    f"{role} asks for {r.memory_mb} MiB but executors have {have} MiB (spark.executor.memory): "
                    "raise spark.executor.memory, lower memory, or turn on dynamic allocation"
                )


def spark_profile(r: Resources, plan: SparkPlan) -> Any:
    """The ``pyspark.resource.ResourceProfile`` for one role's tasks.

    Task resources always (cpus, GPUs); with dynamic allocation the executor resources too, so
    Spark starts executors of exactly one task's size for the role (cores, memory, GPUs).
    """
    from pyspark.resource import ExecutorResourceRequests, ResourceProfileBuilder, TaskResourceRequests

    task = TaskResourceRequests().cpus(int(r.cpus or 1))
    if r.gpus:
        task.resource("gpu", r.gpus)
    builder = ResourceProfileBuilder().require(task)
    if plan.dynamic:
        executor = ExecutorResourceRequests().cores(int(r.cpus or 1))
        if r.memory_mb is not None:
            executor.memory(f"{r.memory_mb}m")
        if r.gpus:
            executor.resource("gpu", r.gpus, plan.discovery_script or "")
        builder.require(executor)
    return builder.build


# -- Mesos ---------------------------------------------------------------------------------------


def mesos_roles(roles: Sequence[tuple[str, int]], given: Mapping[str, Resources]) -> list[Any]:
    """The Mesos engine's per-role needs (``coordinator.mesos.jobs.RoleResources``) for a cluster's
    roles; a role without an entry gets the Mesos engine's defaults.

    Raises:
        ResourcesError: a role named that the cluster lacks, or needs Mesos refuses.
    """
    from tfcoord.coordinator.mesos.errors import MesosConfigError
    from tfcoord.coordinator.mesos.jobs import RoleResources

    check_roles(given, roles)
    out = []
    for role, count in roles:
        if count < 1:
            continue
        r = given.get(role, Resources())
        kw: dict[str, Any] = {"gpus": r.gpus}
        if r.cpus is not None:
            kw["cpus"] = float(r.cpus)
        if r.memory_mb is not None:
            kw["mem"] = float(r.memory_mb)
        try:
            out.append(RoleResources(role, count, **kw))
        except MesosConfigError as e:
            raise ResourcesError(str(e)) from None
    return out
