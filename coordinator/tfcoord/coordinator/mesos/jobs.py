"""A Mesos job: per-role resources, image and command, carried in its job spec's launch spec.

A driver (``tfcoord submit --engine mesos``, ``tfmesos2.cluster``) builds a
:class:`MesosJob` and submits ``job.to_spec()``: an ordinary :class:`JobSpec` with
``engine="mesos"`` whose typed, versioned :class:`~tfcoord.client.messages.LaunchSpec` says
what each role needs, which image and command the tasks run, and the attribute
constraints. The coordinator's Mesos engine reads it back with :meth:`MesosJob.from_spec`.
Pure: no I/O, no aiohttp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfcoord.client.errors import LocalProtocolError
from tfcoord.client.messages import MAX_ROLE_LEN, ROLE_RE, SINGLETON_ROLES, JobSpec, LaunchSpec, role_rank

from .errors import MesosConfigError
from .offers import parse_constraints

ENGINE = "mesos"
#: Mesos refuses a task below its minimum allocatable share; 0.01 cpus and 32 MB are the
#: master's defaults (``--min_allocatable_resources``).
MIN_CPUS = 0.01
MIN_MEM_MB = 32.0
DEFAULT_CPUS = 1.0
DEFAULT_MEM_MB = 1024.0
ROLE_SYNTAX = "ROLE:COUNT[:cpus=N,mem=MB,gpus=N], e.g. worker:2:cpus=2,mem=4096,gpus=1"


@dataclass(frozen=True)
class RoleResources:
    """A run of tasks of one role that need the same: how many, and what each one needs.

    A role is any TensorFlow job name: ps, chief, master, evaluator, worker or a custom one.
    A job may hold several runs of one role (tfmesos2 lists a name twice with different
    resources); they follow each other, and the role's task indexes count through them.
    """

    role: str
    count: int
    cpus: float = DEFAULT_CPUS
    mem: float = DEFAULT_MEM_MB
    gpus: int = 0

    def __post_init__(self) -> None:
        if (
            not isinstance(self.role, str)
            or len(self.role) > MAX_ROLE_LEN
            or not ROLE_RE.fullmatch(self.role)
        ):
            raise MesosConfigError(
                f"{self.role!r} is not a TensorFlow job name (a letter, then letters, digits or '_')"
            )
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            raise MesosConfigError(
                f"{self.role}: the task count must be a whole number >= 1, not {self.count!r}"
            )
        if self.role in SINGLETON_ROLES and self.count > 1:
            raise MesosConfigError(f"a cluster has at most one {self.role}, not {self.count}")
        for name, lo in (("cpus", MIN_CPUS), ("mem", MIN_MEM_MB)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
                raise MesosConfigError(f"{self.role}: {name} must be a number >= {lo:g}, not {v!r}")
        if not isinstance(self.gpus, int) or isinstance(self.gpus, bool) or self.gpus < 0:
            raise MesosConfigError(
                f"{self.role}: gpus must be a whole number >= 0 (Mesos grants whole GPUs), not {self.gpus!r}"
            )

    def resources_text(self) -> str:
        return f"cpus={self.cpus:g},mem={self.mem:g},gpus={self.gpus}"


def parse_resources(role: str, count: int, text: str) -> RoleResources:
    """``cpus=2,mem=4096,gpus=1`` (any subset, any order) for one role.

    Raises:
        MesosConfigError: an unknown key, a repeated key, or a value that is not a number.
    """
    values: dict[str, Any] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("cpus", "mem", "gpus"):
            raise MesosConfigError(f"{role}: {item!r} is not cpus=N, mem=MB or gpus=N ({ROLE_SYNTAX})")
        if key in values:
            raise MesosConfigError(f"{role}: {key} is given twice")
        try:
            number = float(value)
        except ValueError:
            raise MesosConfigError(f"{role}: {key}={value!r} is not a number") from None
        if key == "gpus":
            if number != int(number):
                raise MesosConfigError(
                    f"{role}: gpus={value} must be a whole number (Mesos grants whole GPUs)"
                )
            values[key] = int(number)
        else:
            values[key] = number
    return RoleResources(role, count, **values)


def parse_role(text: str) -> RoleResources:
    """``worker:2:cpus=2,mem=4096,gpus=1`` → :class:`RoleResources`.

    Raises:
        MesosConfigError: the text does not follow :data:`ROLE_SYNTAX`.
    """
    parts = text.strip().split(":", 2)
    if len(parts) < 2 or not parts[0] or not parts[1].strip().isdigit():
        raise MesosConfigError(f"{text!r} is not {ROLE_SYNTAX}")
    return parse_resources(parts[0].strip(), int(parts[1]), parts[2] if len(parts) == 3 else "")


@dataclass(frozen=True)
class MesosJob:
    """What the Mesos engine needs to run one job.

    ``command`` empty is server mode: each task runs a ``tf.distribute.Server`` for its
    role and waits to be stopped (a client outside drives it, as with tfmesos2).
    """

    roles: tuple[RoleResources, ...]
    command: tuple[str, ...] = ()
    image: str | None = None
    attributes: str = ""

    def __post_init__(self) -> None:
        if not self.roles:
            raise MesosConfigError(f"a Mesos job needs at least one role ({ROLE_SYNTAX})")
        names = [r.role for r in self.roles]
        for i, name in enumerate(names):
            if name in names[:i] and names[i - 1] != name:
                raise MesosConfigError(f"the runs of role {name} must follow each other: {', '.join(names)}")
        for name in SINGLETON_ROLES:
            if sum(r.count for r in self.roles if r.role == name) > 1:
                raise MesosConfigError(f"a cluster has at most one {name}")
        if "chief" in names and "master" in names:
            raise MesosConfigError("use either chief or master, not both")
        parse_constraints(self.attributes)  # refuse bad constraints here, at the driver

    @classmethod
    def of(
        cls,
        roles: Sequence[RoleResources],
        command: Sequence[str] = (),
        image: str | None = None,
        attributes: str = "",
    ) -> MesosJob:
        """Roles in any order (they are put in tfcoord's assignment order)."""
        first: dict[str, int] = {}
        for i, r in enumerate(roles):
            first.setdefault(r.role, i)
        ordered = tuple(sorted(roles, key=lambda r: (role_rank(r.role), first[r.role])))
        return cls(ordered, tuple(command), image or None, attributes)

    @property
    def server_mode(self) -> bool:
        return not self.command

    @property
    def gpus(self) -> bool:
        return any(r.gpus for r in self.roles)

    def slot(self, executor_id: int) -> RoleResources:
        """The role (and its needs) of executor ``executor_id``, in the job's slot order."""
        for r in self.roles:
            if executor_id < r.count:
                return r
            executor_id -= r.count
        raise IndexError(executor_id)

    def to_spec(self, **spec: Any) -> JobSpec:
        """The job spec to submit; ``spec`` gives JobSpec's other fields (name, timeouts, labels)."""
        runs = self.runs()
        needs = tuple(
            (
                r.role,
                (("cpus", r.cpus), ("mem", r.mem), ("gpus", float(r.gpus))),
                *((r.count,) if len(runs[r.role]) > 1 else ()),
            )
            for r in self.roles
        )
        try:
            launch = LaunchSpec(needs, self.command, self.image or "", self.attributes)
        except LocalProtocolError as e:  # a command too long to travel: the message says what to do
            raise MesosConfigError(str(e)) from None
        counts = {name: sum(r.count for r in rs) for name, rs in runs.items()}
        return JobSpec(roles=tuple(counts.items()), engine=ENGINE, launch=launch, **spec)

    def runs(self) -> dict[str, list[RoleResources]]:
        """Role → its runs, in slot order."""
        out: dict[str, list[RoleResources]] = {}
        for r in self.roles:
            out.setdefault(r.role, []).append(r)
        return out

    @classmethod
    def from_spec(cls, spec: JobSpec) -> MesosJob:
        """Read a job spec's launch spec back; a role it does not name gets the defaults.

        Raises:
            MesosConfigError: the spec is not a Mesos job's, or its resources do not fit Mesos.
        """
        if spec.engine != ENGINE:
            raise MesosConfigError(f"job spec is for engine {spec.engine!r}, not {ENGINE}")
        launch = spec.launch or LaunchSpec(resources=())
        roles = []
        for role, count in spec.roles:
            runs = launch.runs(role) or [(None, {})]
            if len(runs) > 1 and sum(n or 0 for n, _ in runs) != count:
                raise MesosConfigError(
                    f"{role}: its runs hold {sum(n or 0 for n, _ in runs)} tasks, not {count}"
                )
            for n, needs in runs:
                gpus = needs.get("gpus", 0.0)
                if gpus != int(gpus):
                    raise MesosConfigError(
                        f"{role}: gpus={gpus:g} must be a whole number (Mesos grants whole GPUs)"
                    )
                roles.append(
                    RoleResources(
                        role,
                        count if n is None else n,
                        cpus=needs.get("cpus", DEFAULT_CPUS),
                        mem=needs.get("mem", DEFAULT_MEM_MB),
                        gpus=int(gpus),
                    )
                )
        return cls(tuple(roles), launch.command, launch.image or None, launch.attributes)
