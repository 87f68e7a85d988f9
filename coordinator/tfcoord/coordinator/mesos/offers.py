"""Matching pending tasks to Mesos resource offers: pure, no I/O.

Theory of operation. An offer is what one agent has free, as a list of resource entries
(``cpus`` and ``mem`` SCALARs, ``ports`` RANGES, ``gpus`` as a SCALAR count or a SET of ids)
plus the agent's attributes. :func:`match` places tasks first-fit-decreasing: the largest
tasks (GPUs, then cpus, then memory) go first, each into the first offer with room for all
of it and whose attributes satisfy the task's constraints, so several tasks pack into one
offer when it has room. A task without GPUs prefers offers without GPUs, leaving GPU
agents to the tasks that need them. Each placement takes concrete values: the lowest free
port of the offer's ranges and, for a SET, the lowest GPU ids; it carries the resource
entries a TaskInfo must list, with the offer's role and allocation fields kept. Offers
that received nothing are to be declined; tasks left over wait for later offers.

A SCALAR GPU count names no device. Where nothing isolates GPUs (Docker, AMD; see
:mod:`.tasks`), two tasks on one agent would both take its first GPUs, so a task marked
``exclusive_gpus`` goes only to an agent that holds no other GPU task of the framework --
neither one placed in this round nor one of ``gpu_agents``, the agents already running
one -- and :attr:`Match.held_back` says why it waits.

:func:`explain_unfit` says when a task can never fit anything seen so far: every agent's
largest offer is remembered (:class:`AgentSize`), and a task bigger than all of them gets
a reason such as "needs 8 GPUs, the largest offer had 2".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import MesosConfigError

#: Mesos keeps scalar resources to three decimals; compare with room for float noise.
EPSILON = 1e-6
#: The fields of a resource entry that hold its value; the others (role, allocation_info,
#: reservations...) are copied onto what a task takes from it.
_VALUE_FIELDS = frozenset({"name", "type", "scalar", "ranges", "set"})
_CONSTRAINT_SPLIT = re.compile(r"[,;]")
#: A declined offer's reason names at most this many waiting tasks (a log line, not a report).
MAX_REASONS = 3


# -- attribute constraints ----------------------------------------------------------------


@dataclass(frozen=True)
class Constraint:
    """``key:value``: the agent's attribute ``key`` must equal ``value``.

    As in tfmesos2, keys and TEXT values compare case-insensitively; a SCALAR attribute
    matches when the value reads as the same number.
    """

    key: str
    value: str

    def matches(self, attributes: Mapping[str, str | float]) -> bool:
        for name, actual in attributes.items():
            if name.casefold() != self.key.casefold():
                continue
            if isinstance(actual, (int, float)):
                try:
                    return math.isclose(float(self.value), float(actual), abs_tol=EPSILON)
                except ValueError:
                    return False
            return str(actual).strip().casefold() == self.value.casefold()
        return False

    def __str__(self) -> str:
        return f"{self.key}:{self.value}"


def parse_constraints(text: str) -> tuple[Constraint, ...]:
    """Parse ``MESOS_ATTRIBUTES``: ``key:value[,key:value]`` (``;`` separates too).

    Raises:
        MesosConfigError: an entry without ``:``, an empty key or value, or one key asked
            for with two values; never a silent ignore.
    """
    out: dict[str, Constraint] = {}
    for raw in _CONSTRAINT_SPLIT.split(text or ""):
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise MesosConfigError(
                f"MESOS_ATTRIBUTES entry {item!r} is not key:value; write "
                "key:value[,key:value], e.g. MESOS_ATTRIBUTES=rack:r1,zone:eu"
            )
        prev = out.get(key.casefold())
        if prev is not None and prev.value.casefold() != value.casefold():
            raise MesosConfigError(
                f"MESOS_ATTRIBUTES asks for {key} twice ({prev.value} and {value}); an agent has one value"
            )
        out[key.casefold()] = Constraint(key, value)
    return tuple(out.values())


# -- offers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """One resource entry of an offer."""

    name: str
    kind: str  # SCALAR, RANGES or SET
    scalar: float = 0.0
    ranges: tuple[tuple[int, int], ...] = ()
    items: tuple[str, ...] = ()
    #: The entry's other fields (role, allocation_info, reservations) as JSON, kept verbatim.
    extra: str = "{}"

    @property
    def amount(self) -> float:
        if self.kind == "SCALAR":
            return self.scalar
        if self.kind == "RANGES":
            return float(sum(e - b + 1 for b, e in self.ranges))
        return float(len(self.items))


@dataclass(frozen=True)
class Offer:
    id: str
    agent_id: str
    hostname: str
    resources: tuple[Resource, ...]
    attributes: tuple[tuple[str, str | float], ...] = ()

    @classmethod
    def from_json(cls, obj: Any) -> Offer:
        """Parse one offer of an OFFERS event.

        Raises:
            ValueError: a required field is missing or malformed.
        """
        try:
            resources = tuple(_resource(r) for r in obj.get("resources", []))
            attributes = tuple(_attribute(a) for a in obj.get("attributes", []))
            return cls(
                id=_id(obj, "id"),
                agent_id=_id(obj, "agent_id"),
                hostname=str(obj.get("hostname") or ""),
                resources=resources,
                attributes=tuple(a for a in attributes if a is not None),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed offer ({e!r}): {str(obj)[:200]}") from None

    def total(self, name: str) -> float:
        return sum(r.amount for r in self.resources if r.name == name)

    @property
    def attribute_map(self) -> dict[str, str | float]:
        return dict(self.attributes)


def _id(obj: Mapping[str, Any], key: str) -> str:
    value = obj[key]["value"]
    if not isinstance(value, str) or not value:
        raise TypeError(f"{key} must hold a string value")
    return value


def _resource(r: Mapping[str, Any]) -> Resource:
    kind = r["type"]
    extra = json.dumps({k: v for k, v in r.items() if k not in _VALUE_FIELDS}, sort_keys=True)
    if kind == "SCALAR":
        return Resource(r["name"], kind, scalar=float(r["scalar"]["value"]), extra=extra)
    if kind == "RANGES":
        pairs = tuple((int(x["begin"]), int(x["end"])) for x in r["ranges"].get("range", []))
        return Resource(r["name"], kind, ranges=pairs, extra=extra)
    if kind == "SET":
        return Resource(r["name"], kind, items=tuple(str(x) for x in r["set"].get("item", [])), extra=extra)
    raise TypeError(f"unknown resource type {kind!r}")


def _attribute(a: Mapping[str, Any]) -> tuple[str, str | float] | None:
    kind = a.get("type")
    if kind == "TEXT":
        return str(a["name"]), str(a["text"]["value"])
    if kind == "SCALAR":
        return str(a["name"]), float(a["scalar"]["value"])
    return None  # RANGES and SET attributes cannot be matched by key:value; ignore them


# -- tasks and placements -----------------------------------------------------------------


@dataclass(frozen=True)
class TaskNeeds:
    """What one task asks for. ``key`` identifies it in the result; ``name`` is for people."""

    key: str
    name: str
    cpus: float
    mem: float
    gpus: int = 0
    ports: int = 1
    constraints: tuple[Constraint, ...] = ()
    #: On an agent offering GPUs as a SCALAR count, be its only GPU task (nothing isolates them).
    exclusive_gpus: bool = False

    def describe(self) -> str:
        return _describe(self.cpus, self.mem, self.gpus, self.ports)


@dataclass(frozen=True)
class Placement:
    """One task placed in one offer, with the concrete values it takes."""

    key: str
    offer_id: str
    agent_id: str
    hostname: str
    #: The task's TensorFlow port (the lowest of ``ports`` it took).
    port: int
    gpus: int
    #: The GPU ids of a SET offer; empty for a SCALAR count (the agent picks).
    gpu_ids: tuple[str, ...]
    #: The resource entries for ``TaskInfo.resources``.
    resources: tuple[dict[str, Any], ...] = field(hash=False)
    ports: tuple[int, ...] = ()
    gpu_kind: str = ""


@dataclass(frozen=True)
class Match:
    placements: tuple[Placement, ...]
    #: Offers nothing was placed in: decline them.
    declined: tuple[str, ...]
    #: Keys of the tasks no offer of this round had room for.
    unplaced: tuple[str, ...]
    #: (key, reason) of unplaced tasks that some offer had room for but could not take
    #: safely: an exclusive-GPU task on an agent whose SCALAR GPUs another task holds.
    held_back: tuple[tuple[str, str], ...] = ()
    #: (offer id, reason) for each offer in ``declined``: why it received nothing.
    decline_reasons: tuple[tuple[str, str], ...] = ()

    def by_offer(self) -> dict[str, list[Placement]]:
        out: dict[str, list[Placement]] = {}
        for p in self.placements:
            out.setdefault(p.offer_id, []).append(p)
        return out


class _Room:
    """What is left of one offer while tasks are placed into it."""

    def __init__(self, offer: Offer, gpu_tasks: int = 0) -> None:
        self.offer = offer
        #: GPU tasks of the framework on this agent: running already, or placed this round.
        self.gpu_tasks = gpu_tasks
        self.scalars: list[list[Any]] = []  # [name, remaining, extra]
        self.ranges: list[list[Any]] = []  # [name, [(b, e), ...], extra]
        self.sets: list[list[Any]] = []  # [name, [items], extra]
        for r in offer.resources:
            if r.kind == "SCALAR":
                self.scalars.append([r.name, r.scalar, r.extra])
            elif r.kind == "RANGES":
                self.ranges.append([r.name, sorted(r.ranges), r.extra])
            else:
                self.sets.append([r.name, sorted(r.items, key=_natural), r.extra])
        self.attributes = offer.attribute_map

    def free(self, name: str) -> float:
        total: float = sum(s[1] for s in self.scalars if s[0] == name)
        total += sum(len(s[1]) for s in self.sets if s[0] == name)
        total += sum(e - b + 1 for r in self.ranges if r[0] == name for b, e in r[1])
        return total

    def fits(self, t: TaskNeeds) -> bool:
        return (
            self.free("cpus") + EPSILON >= t.cpus
            and self.free("mem") + EPSILON >= t.mem
            and self.free("gpus") + EPSILON >= t.gpus
            and self.free("ports") >= t.ports
            and all(c.matches(self.attributes) for c in t.constraints)
        )

    def shortfall(self, t: TaskNeeds) -> str:
        """Why ``t`` does not go here, in a few words (empty if it would)."""
        missing = [c for c in t.constraints if not c.matches(self.attributes)]
        if missing:
            have = ",".join(
                f"{k}:{v:g}" if isinstance(v, float) else f"{k}:{v}" for k, v in self.offer.attributes
            )
            return f"attributes {','.join(map(str, missing))} not matched (offer has {have or 'none'})"
        short = [
            f"{_amount(dim, need)} (offer has {_num(self.free(dim))})"
            for dim, need in (
                ("cpus", t.cpus),
                ("mem", t.mem),
                ("gpus", float(t.gpus)),
                ("ports", float(t.ports)),
            )
            if self.free(dim) + EPSILON < need
        ]
        if short:
            return "needs " + ", ".join(short)
        if self.shares_scalar_gpus(t):
            return "the agent's GPUs are a count and it already runs a GPU task of this framework"
        return ""

    def shares_scalar_gpus(self, t: TaskNeeds) -> bool:
        """Placing ``t`` here would put two GPU tasks on GPUs that only a count describes."""
        scalar = any(s[0] == "gpus" for s in self.scalars) and not any(s[0] == "gpus" for s in self.sets)
        return bool(t.gpus and t.exclusive_gpus and scalar and self.gpu_tasks)

    def take(self, t: TaskNeeds) -> Placement:
        out: list[dict[str, Any]] = []
        self._take_scalar("cpus", t.cpus, out)
        self._take_scalar("mem", t.mem, out)
        ports = self._take_ports(t.ports, out)
        gpu_ids: tuple[str, ...] = ()
        kind = ""
        if t.gpus:
            kind = "SET" if any(s[0] == "gpus" for s in self.sets) else "SCALAR"
            gpu_ids = self._take_items("gpus", t.gpus, out) if kind == "SET" else ()
            if kind == "SCALAR":
                self._take_scalar("gpus", float(t.gpus), out)
            self.gpu_tasks += 1
        o = self.offer
        return Placement(
            key=t.key,
            offer_id=o.id,
            agent_id=o.agent_id,
            hostname=o.hostname,
            port=ports[0] if ports else 0,
            gpus=t.gpus,
            gpu_ids=gpu_ids,
            resources=tuple(out),
            ports=ports,
            gpu_kind=kind,
        )

    def _take_scalar(self, name: str, amount: float, out: list[dict[str, Any]]) -> None:
        left = round(amount, 3)
        for s in self.scalars:
            if s[0] != name or left <= EPSILON or s[1] <= EPSILON:
                continue
            part = round(min(left, s[1]), 3)
            s[1] = round(s[1] - part, 3)
            left = round(left - part, 3)
            out.append({"name": name, "type": "SCALAR", "scalar": {"value": part}, **json.loads(s[2])})

    def _take_ports(self, n: int, out: list[dict[str, Any]]) -> tuple[int, ...]:
        taken: list[int] = []
        for r in self.ranges:
            if r[0] != "ports":
                continue
            mine: list[int] = []
            while len(taken) + len(mine) < n and r[1]:
                b, e = r[1][0]
                mine.append(b)
                if b == e:
                    r[1].pop(0)
                else:
                    r[1][0] = (b + 1, e)
            if mine:
                taken += mine
                out.append(
                    {
                        "name": "ports",
                        "type": "RANGES",
                        "ranges": {"range": [{"begin": p, "end": p} for p in mine]},
                        **json.loads(r[2]),
                    }
                )
        return tuple(taken)

    def _take_items(self, name: str, n: int, out: list[dict[str, Any]]) -> tuple[str, ...]:
        taken: list[str] = []
        for s in self.sets:
            if s[0] != name or len(taken) >= n:
                continue
            mine, s[1] = s[1][: n - len(taken)], s[1][n - len(taken) :]
            if mine:
                taken += mine
                out.append({"name": name, "type": "SET", "set": {"item": mine}, **json.loads(s[2])})
        return tuple(taken)


def match(tasks: Sequence[TaskNeeds], offers: Sequence[Offer], gpu_agents: Collection[str] = ()) -> Match:
    """Place as many tasks as fit into the offers; see the module docstring for how.

    ``gpu_agents``: agents already running a GPU task of the framework.
    """
    busy = set(gpu_agents)
    rooms = [_Room(o, 1 if o.agent_id in busy else 0) for o in offers]
    order = sorted(range(len(tasks)), key=lambda i: (-tasks[i].gpus, -tasks[i].cpus, -tasks[i].mem, i))
    placed: dict[int, Placement] = {}
    held: dict[int, str] = {}
    for i in order:
        t = tasks[i]
        roomy = [r for r in rooms if r.fits(t)]
        candidates = [r for r in roomy if not r.shares_scalar_gpus(t)]
        if not t.gpus:  # leave GPU agents to the tasks that need them
            candidates.sort(key=lambda r: r.free("gpus") > 0)
        if candidates:
            placed[i] = candidates[0].take(t)
        elif roomy:
            hosts = ", ".join(sorted({r.offer.hostname or r.offer.agent_id for r in roomy}))
            held[i] = (
                f"waiting for an agent of its own: {hosts} offers GPUs only as a count, which names no "
                "device, and already runs a GPU task of this framework; two would share the first GPUs "
                "(offer GPUs as a SET of ids, or use the Mesos containerizer with NVIDIA, to share an agent)"
            )
    placements = tuple(placed[i] for i in sorted(placed))
    used = {p.offer_id for p in placements}
    left = [tasks[i] for i in order if i not in placed]
    reasons = []
    for r in rooms:
        if r.offer.id in used:
            continue
        if not left:
            why = "every task is placed" if tasks else "no task waits"
        else:
            why = "; ".join(f"{t.name} {r.shortfall(t) or 'fits elsewhere'}" for t in left[:MAX_REASONS])
            if len(left) > MAX_REASONS:
                why += f"; and {len(left) - MAX_REASONS} more waiting task(s)"
        reasons.append((r.offer.id, why))
    return Match(
        placements=placements,
        declined=tuple(o.id for o in offers if o.id not in used),
        unplaced=tuple(t.key for i, t in enumerate(tasks) if i not in placed),
        held_back=tuple((tasks[i].key, held[i]) for i in sorted(held)),
        decline_reasons=tuple(reasons),
    )


# -- tasks that can never fit -------------------------------------------------------------


@dataclass(frozen=True)
class AgentSize:
    """The most one agent has offered at once, per resource."""

    agent_id: str
    hostname: str
    cpus: float
    mem: float
    gpus: float
    ports: float
    attributes: tuple[tuple[str, str | float], ...] = ()

    @classmethod
    def of(cls, offer: Offer) -> AgentSize:
        return cls(
            offer.agent_id,
            offer.hostname,
            offer.total("cpus"),
            offer.total("mem"),
            offer.total("gpus"),
            offer.total("ports"),
            offer.attributes,
        )

    def merge(self, other: AgentSize) -> AgentSize:
        return AgentSize(
            self.agent_id,
            other.hostname or self.hostname,
            max(self.cpus, other.cpus),
            max(self.mem, other.mem),
            max(self.gpus, other.gpus),
            max(self.ports, other.ports),
            other.attributes or self.attributes,
        )

    def holds(self, t: TaskNeeds) -> bool:
        return (
            self.cpus + EPSILON >= t.cpus
            and self.mem + EPSILON >= t.mem
            and self.gpus + EPSILON >= t.gpus
            and self.ports >= t.ports
        )

    def describe(self) -> str:
        return _describe(self.cpus, self.mem, self.gpus, self.ports)


def explain_unfit(task: TaskNeeds, agents: Iterable[AgentSize]) -> str | None:
    """Why no agent seen so far could ever hold ``task``, or None when one could.

    With no agent seen yet nothing can be said, so None.
    """
    agents = list(agents)
    if not agents:
        return None
    eligible = [a for a in agents if all(c.matches(dict(a.attributes)) for c in task.constraints)]
    if not eligible:
        seen = sorted(
            {f"{k}:{_num(v) if isinstance(v, float) else v}" for a in agents for k, v in a.attributes}
        )
        return (
            f"no offer matched the attribute constraints {','.join(map(str, task.constraints))} "
            f"(offers had {', '.join(seen) or 'no attributes'})"
        )
    if any(a.holds(task) for a in eligible):
        return None
    short = []
    for dim, need in (
        ("cpus", task.cpus),
        ("mem", task.mem),
        ("gpus", float(task.gpus)),
        ("ports", float(task.ports)),
    ):
        best = max(getattr(a, dim) for a in eligible)
        if need > best + EPSILON:
            short.append(f"needs {_amount(dim, need)}, the largest offer had {_num(best)}")
    if short:
        return "; ".join(short)
    closest = max(
        eligible,
        key=lambda a: (
            sum(1 for d in ("cpus", "mem", "gpus") if getattr(a, d) + EPSILON >= getattr(task, d)),
            a.cpus + a.mem / 1024,
        ),
    )
    return (
        f"needs {task.describe()} on one agent, and no agent offered all of it at once "
        f"(closest: {closest.hostname or closest.agent_id} with {closest.describe()})"
    )


def _num(v: float) -> str:
    return f"{v:g}"


def _amount(dim: str, v: float) -> str:
    if dim == "mem":
        return f"{_num(v)} MB of memory"
    if dim == "gpus":
        return f"{_num(v)} GPU" + ("" if v == 1 else "s")
    if dim == "ports":
        return f"{_num(v)} port" + ("" if v == 1 else "s")
    return f"{_num(v)} cpus"


def _describe(cpus: float, mem: float, gpus: float, ports: float) -> str:
    parts = [f"{_num(cpus)} cpus", f"{_num(mem)} MB"]
    if gpus:
        parts.append(_amount("gpus", gpus))
    parts.append(_amount("ports", ports))
    return ", ".join(parts)


def _natural(item: str) -> tuple[int, str]:
    return (int(item), "") if item.isdigit() else (1 << 62, item)
