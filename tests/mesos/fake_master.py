"""A fake Mesos master: the v1 scheduler HTTP API on aiohttp, with tasks run as local processes.

No real Mesos can run on the test machines, so tfcoord's Mesos framework is tested against
this stand-in. It speaks the wire format of a Mesos 1.11 master byte for byte and keeps the
behaviours a framework depends on; what it leaves out is listed below.

Theory of operation
-------------------
* ``POST /api/v1/scheduler`` with a SUBSCRIBE call answers 200, ``Content-Type:
  application/json``, chunked transfer encoding and a ``Mesos-Stream-Id`` header, then keeps
  the response open and writes one RecordIO record per chunk: ``b"<len>\\n" + json`` where
  ``len`` counts the bytes of the compact UTF-8 JSON and no newline follows. SUBSCRIBED comes
  first. Every other event is followed by a HEARTBEAT record, and a HEARTBEAT is also written
  whenever the stream has been idle for ``heartbeat_interval_s``: clients that read the stream
  line by line (pymesos, avmesos) only see a record once the next record's newline arrives.
* Every other call is a POST to the same path with the ``Mesos-Stream-Id`` header and a
  ``framework_id``; the master answers 202 with an empty body and acts asynchronously, or 400
  with a text reason (wrong stream id, malformed JSON, unknown call type), 401 when Basic auth
  is configured and missing, 403 for a framework that is not subscribed, 307 with a
  scheme-relative ``Location: //host:port/api/v1/scheduler`` (what a real master sends) when
  :meth:`FakeMaster.set_leader` named another leader.
* The allocator offers each agent's unallocated resources (total minus running tasks minus
  outstanding offers) to one subscribed, unsuppressed framework, all agents of one round in one
  OFFERS event. DECLINE and ACCEPT install a refusal filter over the declined / unused
  resources for ``filters.refuse_seconds`` (default 5 s, as in Mesos): the agent is not
  offered again until the filter expires, a REVIVE clears it, or a task there ends and frees
  resources the filter did not cover. Agents with GPUs are offered only to frameworks with the
  GPU_RESOURCES capability (the master's ``--filter_gpu_resources`` default).
* ACCEPT checks the offers (unknown, rescinded, foreign or mixed-agent offers fail the whole
  call: every task gets TASK_DROPPED, or TASK_LOST for a framework that is not PARTITION_AWARE,
  reason REASON_INVALID_OFFERS) and then each task in turn against what is left of the offered
  resources (too much, duplicate id, no command...: TASK_ERROR, reason REASON_TASK_INVALID).
  These master-generated updates carry no uuid and need no acknowledgement.
* A launched task's ``command.uris`` are fetched into a fresh sandbox directory first, as a
  Mesos agent's fetcher does (``tests/mesos/fetcher.py``: files and HTTP(S) with Basic auth
  from the URI and TLS verified against the system's CAs plus ``fetcher_ca_file``;
  ``executable``, ``extract`` and ``output_file`` honoured); a failed fetch is TASK_FAILED
  with REASON_CONTAINER_LAUNCH_FAILED and no TASK_STARTING. Environment variables of type
  SECRET (a ``Secret`` of type VALUE) are resolved into the task's environment under the
  Mesos containerizer (a task without a container, or a MESOS one) by a master of version
  1.4 or later (``version``); a Docker task carrying one fails to launch (Docker's
  containerizer resolves no secrets), and an older master refuses the task (TASK_ERROR).
* A launched task then runs as a local process in its sandbox (its cwd, holding
  ``stdout`` and ``stderr``): ``/bin/sh -c value`` when ``command.shell`` is true (the
  default), else ``execvp(value, arguments)`` -- ``arguments`` is the whole argv, argv[0]
  included, exactly as Mesos defines it. A Docker (or Mesos-image) container cannot run here:
  its command runs as a plain process the same way, and the TaskInfo is kept so tests can
  assert on the image, network, parameters and volumes. The environment is this process's own
  (``inherit_env``), plus ``command.environment.variables`` and MESOS_TASK_ID,
  MESOS_AGENT_ID, MESOS_SLAVE_ID, MESOS_FRAMEWORK_ID, MESOS_EXECUTOR_ID, MESOS_SANDBOX,
  MESOS_DIRECTORY, MESOS_CONTAINER_IP=127.0.0.1 and HOST (the agent's hostname).
* Status updates go through a per-task stream like a Mesos agent's status update manager:
  TASK_STARTING, TASK_RUNNING (with ``container_status.network_infos[0].ip_addresses[0]
  .ip_address`` = 127.0.0.1), then TASK_FINISHED / TASK_FAILED ("Command exited with status
  N") / TASK_KILLED. Each carries a base64 uuid and the **next update of a task is sent only
  after the previous one is acknowledged**; unacknowledged heads are resent after a resubscribe
  and every ``update_retry_s``. :attr:`FakeMaster.unacknowledged` lists what waits for an ack.
* A stream that closes (client gone, :meth:`FakeMaster.disconnect`) deactivates its framework:
  its outstanding offers are withdrawn, and after ``framework_info.failover_timeout`` seconds
  (0 when unset, so at once -- as in Mesos) the framework is torn down and its tasks killed.
  A SUBSCRIBE that carries the framework's id before then gets the same framework back, tasks
  included. TEARDOWN kills every task and ends the stream; a later SUBSCRIBE with that id gets
  an ERROR event ("Framework has been removed").

* Several masters, as production runs them: each can register in a real ZooKeeper the way a
  Mesos master contends for leadership (:meth:`FakeMaster.register_in_zookeeper`: an
  ephemeral sequential znode ``<path>/json.info_<seq>`` holding its MasterInfo JSON; the
  lowest sequence leads), a standby answers every request with a 307 to the leader
  (:meth:`FakeMaster.set_leader`), and :meth:`FakeMaster.take_over` is a master failover: the
  standby leads with what the agents report to it (the agents, the frameworks, their tasks and
  unacknowledged updates -- the task processes keep running), every framework is disconnected
  and keeps its tasks if it resubscribes within its ``failover_timeout`` (counted from the
  failover), the old leader redirects to the new one, and :meth:`FakeMaster.leave_zookeeper`
  ends its ZooKeeper session so its znode goes. :func:`fail_over` does the whole sequence.

* :meth:`FakeMaster.fail_next` answers the next calls of a type with an error status (503 by
  default) and ignores them, with the stream left up: a master mid-election, a proxy timing out.

Left out: protobuf bodies (415), reservations, volumes and other offer operations (accepted
and ignored), LAUNCH_GROUP (its tasks get TASK_ERROR), custom executors (TASK_ERROR), inverse
offers, maintenance, multi-role offers (a framework is offered for its first role only),
offer timeouts, DRF (a framework with fewer tasks and offers is simply preferred).

Use it from tests as ``async with FakeMaster(agents=[AgentSpec(cpus=4, gpus=2)]) as master:``
and point the framework at ``master.url``; from blocking code, ``with ThreadedFakeMaster(...)``
runs it on its own event loop in a thread. ``python tests/mesos/fake_master.py --port 0
--port-file FILE`` runs it as a process until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import hmac
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

if __package__:
    from .fetcher import FetchError, fetch_uris
else:  # run as a script (python tests/mesos/fake_master.py): its own folder is on sys.path
    from fetcher import FetchError, fetch_uris

log = logging.getLogger("tfcoord.tests.fake_mesos")

#: What ``GET /version`` reports. Clients parse it as dotted numbers (pymesos compares it
#: to (1, 0, 0) to decide on GPU_RESOURCES), so no ``-dev`` suffix.
MESOS_VERSION = "1.11.0"

#: A real master's default heartbeat interval; tests pass a shorter one.
DEFAULT_HEARTBEAT_INTERVAL_S = 15.0

#: Environment secrets are resolved from this Mesos release on (by the Mesos containerizer).
SECRETS_SINCE = (1, 4, 0)

#: Mesos' default ``Filters.refuse_seconds``, used when DECLINE or ACCEPT carries none.
DEFAULT_REFUSE_SECONDS = 5.0

#: Mesos caps refuse_seconds at a year; larger values are clamped the same way.
MAX_REFUSE_SECONDS = 365 * 24 * 3600.0

#: Mesos' default KillPolicy grace period between SIGTERM and SIGKILL for command tasks.
DEFAULT_KILL_GRACE_S = 3.0

#: A Mesos agent first retries an unacknowledged status update after 10 s.
DEFAULT_UPDATE_RETRY_S = 10.0

#: Largest call body read; an ACCEPT launching thousands of tasks stays far below it.
MAX_CALL_BYTES = 16 * 1024 * 1024

#: aiohttp waits this long for open handlers on shutdown; streams are closed before that.
SHUTDOWN_TIMEOUT_S = 2.0

#: The allocator's minimum offer, as the master's ``--min_allocatable_resources`` default.
MIN_ALLOCATABLE_CPUS = 0.01
MIN_ALLOCATABLE_MEM = 32.0

SCHEDULER_PATHS = ("/api/v1/scheduler", "/master/api/v1/scheduler")

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
    }
)

#: States :meth:`FakeMaster.fail_task` injects. TASK_FAILED comes from the task's executor,
#: reliably (with a uuid); the others are what a master says about a task it has lost track
#: of, so they carry no uuid and need no acknowledgement.
INJECTABLE_STATES = frozenset({"TASK_FAILED", "TASK_LOST", "TASK_ERROR", "TASK_DROPPED", "TASK_GONE"})

#: Every call type of the v1 scheduler API, and the field each one must carry.
CALL_FIELDS: dict[str, str | None] = {
    "SUBSCRIBE": "subscribe",
    "TEARDOWN": None,
    "ACCEPT": "accept",
    "DECLINE": "decline",
    "ACCEPT_INVERSE_OFFERS": "accept_inverse_offers",
    "DECLINE_INVERSE_OFFERS": "decline_inverse_offers",
    "REVIVE": None,
    "KILL": "kill",
    "SHUTDOWN": "shutdown",
    "ACKNOWLEDGE": "acknowledge",
    "ACKNOWLEDGE_OPERATION_STATUS": "acknowledge_operation_status",
    "RECONCILE": "reconcile",
    "RECONCILE_OPERATIONS": "reconcile_operations",
    "MESSAGE": "message",
    "REQUEST": "request",
    "SUPPRESS": None,
    "UPDATE_FRAMEWORK": "update_framework",
}

HEARTBEAT_EVENT: dict[str, Any] = {"type": "HEARTBEAT"}


class CallError(Exception):
    """A call the master refuses; ``status`` is the HTTP status, the text its body."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def encode_record(event: Mapping[str, Any]) -> bytes:
    """One RecordIO record: the decimal byte length, a newline, the compact JSON, no newline."""
    body = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
    return str(len(body)).encode() + b"\n" + body


def new_uuid_b64() -> str:
    """A status update uuid as the JSON API carries ``bytes``: base64 of 16 random bytes."""
    return base64.b64encode(uuid.uuid4().bytes).decode()


# --------------------------------------------------------------------------------------
# Resources: unreserved values by name, with the arithmetic the allocator needs.
# --------------------------------------------------------------------------------------

Ranges = tuple[tuple[int, int], ...]
Value = float | frozenset[str] | Ranges

#: Order of resources in an offer, as a Mesos agent lists them; others follow by name.
_RESOURCE_ORDER = {"cpus": 0, "gpus": 1, "mem": 2, "disk": 3, "ports": 4}


def _merge(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for b, e in sorted(ranges):
        if out and b <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return tuple(out)


def _ranges_minus(a: Ranges, b: Ranges) -> Ranges:
    out = list(a)
    for bb, be in b:
        nxt: list[tuple[int, int]] = []
        for ab, ae in out:
            if be < ab or bb > ae:
                nxt.append((ab, ae))
                continue
            if ab < bb:
                nxt.append((ab, bb - 1))
            if be < ae:
                nxt.append((be + 1, ae))
        out = nxt
    return tuple(out)


def _ranges_cover(outer: Ranges, inner: Ranges) -> bool:
    return not _ranges_minus(inner, outer)


@dataclass(frozen=True)
class Resources:
    """Unreserved resources by name: a float (SCALAR), a frozenset (SET) or merged inclusive
    ranges (RANGES). Roles and reservations in the JSON are ignored: every agent resource here
    is unreserved (``"role": "*"``)."""

    values: Mapping[str, Value] = field(default_factory=dict)

    @classmethod
    def from_json(cls, items: Any) -> Resources:
        """Parse a JSON list of Resource messages; raises ValueError for a malformed one."""
        if not isinstance(items, list):
            raise ValueError("'resources' must be a list")
        total = cls()
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise ValueError(f"malformed resource {item!r}")
            name, kind = item["name"], item.get("type")
            value: Value
            try:
                if kind == "SCALAR":
                    value = round(float(item["scalar"]["value"]), 3)
                    if value < 0:
                        raise ValueError(f"negative scalar resource {name}")
                elif kind == "RANGES":
                    pairs = [(int(r["begin"]), int(r["end"])) for r in item["ranges"].get("range", [])]
                    if any(b > e for b, e in pairs):
                        raise ValueError(f"range with begin > end in {name}")
                    value = _merge(pairs)
                elif kind == "SET":
                    value = frozenset(str(x) for x in item["set"].get("item", []))
                else:
                    raise ValueError(f"resource {name} has unknown type {kind!r}")
            except (KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"malformed resource {item!r}") from e
            total = total + cls({name: value})
        return total

    def to_json(self, allocation_role: str | None = None) -> list[dict[str, Any]]:
        """The JSON list a master puts in an offer."""
        out = []
        for name in sorted(self.values, key=lambda n: (_RESOURCE_ORDER.get(n, 99), n)):
            value = self.values[name]
            item: dict[str, Any] = {"name": name}
            if isinstance(value, float):
                item.update(type="SCALAR", scalar={"value": value})
            elif isinstance(value, frozenset):
                item.update(type="SET", set={"item": sorted(value, key=_natural)})
            else:
                item.update(type="RANGES", ranges={"range": [{"begin": b, "end": e} for b, e in value]})
            item["role"] = "*"
            if allocation_role is not None:
                item["allocation_info"] = {"role": allocation_role}
            out.append(item)
        return out

    def scalar(self, name: str) -> float:
        value = self.values.get(name, 0.0)
        return value if isinstance(value, float) else float(len(value))

    def __bool__(self) -> bool:
        return bool(self.values)

    def __add__(self, other: Resources) -> Resources:
        out = dict(self.values)
        for name, value in other.values.items():
            mine = out.get(name)
            if mine is None:
                out[name] = value
            elif isinstance(mine, float) and isinstance(value, float):
                out[name] = round(mine + value, 3)
            elif isinstance(mine, frozenset) and isinstance(value, frozenset):
                out[name] = mine | value
            elif isinstance(mine, tuple) and isinstance(value, tuple):
                out[name] = _merge(mine + value)
            else:
                raise ValueError(f"resource {name} used with two different types")
        return Resources(_nonempty(out))

    def __sub__(self, other: Resources) -> Resources:
        out = dict(self.values)
        for name, value in other.values.items():
            mine = out.get(name)
            if mine is None:
                continue
            if isinstance(mine, float) and isinstance(value, float):
                out[name] = max(0.0, round(mine - value, 3))
            elif isinstance(mine, frozenset) and isinstance(value, frozenset):
                out[name] = mine - value
            elif isinstance(mine, tuple) and isinstance(value, tuple):
                out[name] = _ranges_minus(mine, value)
        return Resources(_nonempty(out))

    def contains(self, other: Resources) -> bool:
        """Whether every resource of ``other`` is within this one (same name, same type)."""
        for name, value in other.values.items():
            mine = self.values.get(name)
            if isinstance(value, float):
                if not isinstance(mine, float) or value > mine + 1e-9:
                    return False
            elif isinstance(value, frozenset):
                if not isinstance(mine, frozenset) or not value <= mine:
                    return False
            elif not isinstance(mine, tuple) or not _ranges_cover(mine, value):
                return False
        return True

    def allocatable(self) -> bool:
        return self.scalar("cpus") >= MIN_ALLOCATABLE_CPUS or self.scalar("mem") >= MIN_ALLOCATABLE_MEM

    def describe(self) -> str:
        """Mesos' text form, e.g. ``cpus:4; mem:1024; ports:[31000-32000]``."""
        parts = []
        for name in sorted(self.values, key=lambda n: (_RESOURCE_ORDER.get(n, 99), n)):
            value = self.values[name]
            if isinstance(value, float):
                parts.append(f"{name}:{value:g}")
            elif isinstance(value, frozenset):
                parts.append(f"{name}:{{{','.join(sorted(value, key=_natural))}}}")
            else:
                parts.append(f"{name}:[{','.join(f'{b}-{e}' for b, e in value)}]")
        return "; ".join(parts) or "{}"


def _nonempty(values: dict[str, Value]) -> dict[str, Value]:
    return {k: v for k, v in values.items() if (v > 0 if isinstance(v, float) else bool(v))}


def _natural(item: str) -> tuple[int, str]:
    return (int(item), "") if item.isdigit() else (sys.maxsize, item)


# --------------------------------------------------------------------------------------
# The model: agents, offers, frameworks, tasks.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentSpec:
    """One fake agent. ``gpu_kind`` is "SCALAR" (a count, as Mesos' own GPU isolator offers
    them) or "SET" (GPU indices "0", "1", ...); ``attributes`` values are TEXT when strings and
    SCALAR when numbers."""

    hostname: str = "127.0.0.1"
    cpus: float = 4.0
    mem: float = 8192.0
    disk: float = 10240.0
    gpus: int = 0
    gpu_kind: str = "SCALAR"
    ports: tuple[tuple[int, int], ...] = ((31000, 32000),)
    attributes: Mapping[str, str | float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gpu_kind not in ("SCALAR", "SET"):
            raise ValueError(f"gpu_kind must be 'SCALAR' or 'SET', not {self.gpu_kind!r}")

    def resources(self) -> Resources:
        values: dict[str, Value] = {
            "cpus": float(self.cpus),
            "mem": float(self.mem),
            "disk": float(self.disk),
            "ports": _merge(tuple(p) for p in self.ports),
        }
        if self.gpus:
            values["gpus"] = (
                float(self.gpus) if self.gpu_kind == "SCALAR" else frozenset(str(i) for i in range(self.gpus))
            )
        return Resources(_nonempty(values))

    def attributes_json(self) -> list[dict[str, Any]]:
        out = []
        for name, value in self.attributes.items():
            if isinstance(value, str):
                out.append({"name": name, "type": "TEXT", "text": {"value": value}})
            else:
                out.append({"name": name, "type": "SCALAR", "scalar": {"value": float(value)}})
        return out


@dataclass
class Agent:
    id: str
    spec: AgentSpec
    total: Resources

    @property
    def hostname(self) -> str:
        return self.spec.hostname


@dataclass
class Offer:
    id: str
    framework_id: str
    agent_id: str
    resources: Resources


@dataclass
class Ack:
    """One ACKNOWLEDGE call as received."""

    framework_id: str
    agent_id: str
    task_id: str
    uuid: str


@dataclass
class _Filter:
    agent_id: str
    resources: Resources
    expires: float  # time.monotonic()


@dataclass
class FakeTask:
    """A task the master knows: its TaskInfo as sent, its latest state and its process."""

    task_id: str
    framework_id: str
    agent_id: str
    task_info: dict[str, Any]
    resources: Resources
    state: str = "TASK_STAGING"
    sandbox: Path | None = None
    pid: int | None = None
    returncode: int | None = None
    #: Every update generated for the task, in order (reconciliation answers excluded).
    statuses: list[dict[str, Any]] = field(default_factory=list)
    #: Reliable updates not yet acknowledged; the head is the one the framework has seen.
    pending: deque[dict[str, Any]] = field(default_factory=deque)
    kill_requested: bool = False
    #: Nothing of the task runs or will: its process exited, or it was killed before it had one.
    gone: bool = False
    container_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    head_sent_at: float | None = None
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)
    #: The files the fetcher put in the sandbox, in ``command.uris`` order.
    fetched: list[Path] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def completed(self) -> bool:
        """Terminal with every update acknowledged: the master has forgotten it."""
        return self.terminal and not self.pending

    @property
    def container(self) -> dict[str, Any] | None:
        """``TaskInfo.container`` (docker image, network, parameters, volumes), if any."""
        return self.task_info.get("container")

    @property
    def latest_status(self) -> dict[str, Any] | None:
        return self.statuses[-1] if self.statuses else None


class _Stream:
    """One subscription's open response: a queue of events written by its handler."""

    def __init__(self) -> None:
        self.id = str(uuid.uuid4())
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.transport: asyncio.BaseTransport | None = None
        self.closed = False

    def send(self, event: dict[str, Any]) -> None:
        if not self.closed:
            self.queue.put_nowait(event)

    def end(self) -> None:
        """End the response cleanly (the zero-length chunk), as a master does on TEARDOWN."""
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)

    def abort(self) -> None:
        """Drop the connection without ending the response: the client sees a broken stream."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self.queue.put_nowait(None)


@dataclass
class FakeFramework:
    id: str
    info: dict[str, Any]
    stream: _Stream | None = None
    suppressed: bool = False
    removed: bool = False
    filters: list[_Filter] = field(default_factory=list)
    tasks: dict[str, FakeTask] = field(default_factory=dict)
    #: Every event written to this framework's streams, heartbeats excluded.
    events: list[dict[str, Any]] = field(default_factory=list)
    failover_handle: asyncio.TimerHandle | None = field(default=None, repr=False)

    @property
    def connected(self) -> bool:
        return self.stream is not None

    @property
    def capabilities(self) -> set[str]:
        return {c.get("type") for c in self.info.get("capabilities", []) if isinstance(c, dict)}

    @property
    def partition_aware(self) -> bool:
        return "PARTITION_AWARE" in self.capabilities

    @property
    def role(self) -> str:
        roles = self.info.get("roles")
        if "MULTI_ROLE" in self.capabilities and isinstance(roles, list) and roles:
            return str(roles[0])
        return str(self.info.get("role", "*"))

    def send(self, event: dict[str, Any]) -> bool:
        if self.stream is None or self.stream.closed:
            return False
        self.events.append(event)
        self.stream.send(event)
        return True


# --------------------------------------------------------------------------------------
# The master.
# --------------------------------------------------------------------------------------


class FakeMaster:
    """A fake Mesos master on aiohttp. Bind with port 0 and read :attr:`port` back.

    Args:
        agents: the agents and their resources (default: one ``AgentSpec()``).
        host, port: where to listen.
        heartbeat_interval_s: HEARTBEAT period on idle streams, also sent in SUBSCRIBED.
        username, password: require HTTP Basic auth on the scheduler API when both are set.
        ssl_context: serve HTTPS with it.
        inherit_env: start tasks with this process's environment (else only PATH).
        kill_grace_s: SIGTERM-to-SIGKILL grace for a KILL without a kill policy.
        update_retry_s: resend an unacknowledged update after this long (None: never).
        filter_gpu_resources: offer GPU agents only to GPU_RESOURCES frameworks.
        sandbox_root: where task sandboxes go (default: a temporary directory, removed on stop).
        version: the Mesos version it reports (``/version``, SUBSCRIBED's master_info); below
            1.4 it refuses environment secrets, as such a master cannot resolve them.
        fetcher_ca_file: a CA the agents' fetcher trusts besides the system's.
    """

    def __init__(
        self,
        agents: Iterable[AgentSpec] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        username: str | None = None,
        password: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        inherit_env: bool = True,
        kill_grace_s: float = DEFAULT_KILL_GRACE_S,
        update_retry_s: float | None = DEFAULT_UPDATE_RETRY_S,
        filter_gpu_resources: bool = True,
        sandbox_root: str | os.PathLike[str] | None = None,
        version: str = MESOS_VERSION,
        fetcher_ca_file: str | None = None,
    ) -> None:
        self.id = str(uuid.uuid4())
        specs = list(agents) if agents is not None else [AgentSpec()]
        self.agents: list[Agent] = [
            Agent(f"{self.id}-S{i}", spec, spec.resources()) for i, spec in enumerate(specs)
        ]
        self.host = host
        self.port = port
        self.heartbeat_interval_s = heartbeat_interval_s
        self._credentials = (username, password) if username is not None and password is not None else None
        self._ssl = ssl_context
        self._inherit_env = inherit_env
        self.kill_grace_s = kill_grace_s
        self.update_retry_s = update_retry_s
        self.filter_gpu_resources = filter_gpu_resources
        self._sandbox_root_arg = sandbox_root
        self.version = version
        self.fetcher_ca_file = fetcher_ca_file
        self.sandbox_root: Path | None = None

        self.frameworks: dict[str, FakeFramework] = {}
        self.offers: dict[str, Offer] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.acks: list[Ack] = []
        #: Tasks replaced by a relaunch under the same id, oldest first.
        self.task_history: list[FakeTask] = []
        #: Allocation rounds run so far: a test that waits for this to grow knows that any
        #: offer the round made is already queued on the streams.
        self.allocation_rounds = 0
        self._leader: str | None = None
        #: Requests answered with a 307 to the leader.
        self.redirects = 0
        #: The master that took over from this one (see :meth:`take_over`): the agents report
        #: to it, so every task update goes there.
        self._successor: FakeMaster | None = None
        self._zk: Any = None
        #: This master's znode in ZooKeeper while it is registered there.
        self.znode: str | None = None
        #: Injected call failures: call type -> [(status, text), ...], the next ones first.
        self._failures: dict[str, deque[tuple[int, str]]] = {}
        self._framework_seq = itertools.count()
        self._offer_seq = itertools.count()
        self._runner: web.AppRunner | None = None
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[Any]] = []
        self._stopping = False
        self._handlers: dict[str, Callable[[FakeFramework, dict[str, Any]], None]] = {
            "TEARDOWN": self._on_teardown,
            "ACCEPT": self._on_accept,
            "DECLINE": self._on_decline,
            "REVIVE": self._on_revive,
            "SUPPRESS": self._on_suppress,
            "KILL": self._on_kill,
            "ACKNOWLEDGE": self._on_acknowledge,
            "RECONCILE": self._on_reconcile,
            "UPDATE_FRAMEWORK": self._on_update_framework,
        }

    @classmethod
    def uniform(
        cls,
        n: int,
        *,
        cpus: float = 4.0,
        mem: float = 8192.0,
        gpus: int = 0,
        gpu_kind: str = "SCALAR",
        hostname: str = "127.0.0.1",
        ports_per_agent: int = 1000,
        first_port: int = 31000,
        attributes: Mapping[str, str | float] | None = None,
        **options: Any,
    ) -> FakeMaster:
        """``n`` identical agents. All tasks run on this one machine, so each agent gets its
        own port range (``first_port + i * ports_per_agent`` onwards): two tasks on two
        agents are then never told to bind the same port."""
        specs = [
            AgentSpec(
                hostname=hostname,
                cpus=cpus,
                mem=mem,
                gpus=gpus,
                gpu_kind=gpu_kind,
                ports=((first_port + i * ports_per_agent, first_port + (i + 1) * ports_per_agent - 1),),
                attributes=dict(attributes or {}),
            )
            for i in range(n)
        ]
        return cls(specs, **options)

    # ---- life cycle ------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The master's base URL, e.g. ``http://127.0.0.1:40123``."""
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{self._advertised_host}:{self.port}"

    @property
    def address(self) -> str:
        """``host:port``, the form ``MESOS_MASTER`` takes."""
        return f"{self._advertised_host}:{self.port}"

    @property
    def _advertised_host(self) -> str:
        return "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host

    async def start(self) -> FakeMaster:
        """Bind and serve; ``port`` holds the bound port afterwards."""
        if self._sandbox_root_arg is None:
            self.sandbox_root = Path(tempfile.mkdtemp(prefix="fake-mesos-"))
        else:
            self.sandbox_root = Path(self._sandbox_root_arg)
            self.sandbox_root.mkdir(parents=True, exist_ok=True)
        app = web.Application(client_max_size=MAX_CALL_BYTES)
        for path in SCHEDULER_PATHS:
            app.router.add_route("*", path, self._handle_scheduler)
        app.router.add_get("/version", self._handle_version)
        app.router.add_get("/master/state", self._handle_state)
        app.router.add_get("/master/state.json", self._handle_state)
        for path in ("/tasks", "/tasks/", "/master/tasks", "/master/tasks/"):
            app.router.add_route("GET", path, self._handle_tasks)
            app.router.add_route("POST", path, self._handle_tasks)
        app.router.add_get("/health", self._handle_health)
        app.router.add_get("/master/health", self._handle_health)
        # handler_cancellation: a subscriber that hangs up cancels its stream handler at once,
        # so the framework is marked disconnected as promptly as a real master notices.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self._ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._loops = [asyncio.create_task(self._allocator())]
        if self.update_retry_s is not None:
            self._loops.append(asyncio.create_task(self._retry_updates(self.update_retry_s)))
        log.info("fake Mesos master %s listening on %s", self.id, self.url)
        return self

    async def stop(self) -> None:
        """Kill every task process, drop every stream, stop serving, remove the sandboxes."""
        self._stopping = True
        await self.leave_zookeeper()
        for fw in self.frameworks.values():
            if fw.failover_handle is not None:
                fw.failover_handle.cancel()
            if fw.stream is not None:
                fw.stream.abort()
            for task in fw.tasks.values():
                _signal_group(task, signal.SIGKILL, force=True)
        for t in self._loops:
            t.cancel()
        # Let every task watcher reap its process: no zombie, no unclosed-transport warning.
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._sandbox_root_arg is None and self.sandbox_root is not None:
            shutil.rmtree(self.sandbox_root, ignore_errors=True)

    async def __aenter__(self) -> FakeMaster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- accessors for tests ---------------------------------------------------------

    @property
    def tasks(self) -> dict[str, FakeTask]:
        """Every task by id, across frameworks (the latest launch of an id wins)."""
        return {t.task_id: t for fw in self.frameworks.values() for t in fw.tasks.values()}

    def task(self, task_id: str) -> FakeTask:
        """The task with this id; raises KeyError."""
        return self.tasks[task_id]

    def calls_of(self, call_type: str) -> list[dict[str, Any]]:
        """The bodies of every call of one type received so far."""
        return [body for t, body in self.calls if t == call_type]

    @property
    def unacknowledged(self) -> list[dict[str, Any]]:
        """Every reliable update (with a uuid) not acknowledged yet, by task."""
        return [s for fw in self.frameworks.values() for t in fw.tasks.values() for s in t.pending]

    def used(self, agent_id: str) -> Resources:
        """Resources held by live tasks on an agent."""
        total = Resources()
        for fw in self.frameworks.values():
            for task in fw.tasks.values():
                if task.agent_id == agent_id and not task.terminal:
                    total = total + task.resources
        return total

    def unallocated(self, agent_id: str) -> Resources:
        """An agent's resources neither used by tasks nor in an outstanding offer."""
        agent = self._agent(agent_id)
        offered = Resources()
        for offer in self.offers.values():
            if offer.agent_id == agent_id:
                offered = offered + offer.resources
        return agent.total - self.used(agent_id) - offered

    async def wait_until(self, predicate: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        """Wait until ``predicate()`` is truthy (checked after every state change); return it.

        Raises TimeoutError when it is still falsy after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            changed = self._changed
            result = predicate()
            if result:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout_s} s")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()

    async def wait_task_state(self, task_id: str, state: str, timeout_s: float = 10.0) -> FakeTask:
        """Wait until the task's latest state (as the master sees it) is ``state``."""
        return await self.wait_until(
            lambda: (t := self.tasks.get(task_id)) is not None and t.state == state and t, timeout_s
        )

    async def allocation_round(self, timeout_s: float = 10.0) -> None:
        """Run an allocation round now and wait for it: the offers it makes are queued on the
        streams when this returns, so a test can tell "no offer" without sleeping."""
        rounds = self.allocation_rounds
        self._wake.set()
        await self.wait_until(lambda: self.allocation_rounds > rounds, timeout_s)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        owner = self._owner()
        if owner is not self:
            owner._notify()

    def _owner(self) -> FakeMaster:
        """The master the agents report to now: this one, or the one that took over from it."""
        master = self
        while master._successor is not None:
            master = master._successor
        return master

    # ---- fault injection -------------------------------------------------------------

    async def fail_task(
        self,
        task_id: str,
        state: str = "TASK_FAILED",
        message: str = "Injected failure",
        *,
        reason: str | None = None,
    ) -> None:
        """Kill the task's process (SIGKILL) if it runs and report ``state`` for it.

        TASK_FAILED arrives as from the executor, with a uuid to acknowledge; TASK_LOST,
        TASK_ERROR, TASK_DROPPED and TASK_GONE as from the master, without one.
        Raises KeyError for an unknown task, ValueError for a terminal one or another state.
        """
        if state not in INJECTABLE_STATES:
            raise ValueError(f"cannot inject {state}; use one of {sorted(INJECTABLE_STATES)}")
        task = self.task(task_id)
        if task.terminal:
            raise ValueError(f"task {task_id} is already {task.state}")
        fw = self.frameworks[task.framework_id]
        if state == "TASK_FAILED":
            self._push_update(task, self._status(task, state, message=message, reason=reason))
        else:
            task.pending.clear()  # the agent that held them is gone
            status = self._status(task, state, message=message, reason=reason, reliable=False)
            self._record(task, status)
            self._send_update(fw, status)
        if task.proc is not None and task.proc.returncode is None:
            _signal_group(task, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.kill_grace_s + 5.0):
                    await task.proc.wait()

    async def rescind(self, offer_id: str | None = None) -> list[str]:
        """Rescind one outstanding offer, or all of them; returns the ids rescinded.
        The resources go back to the allocator and are offered again."""
        ids = [offer_id] if offer_id is not None else list(self.offers)
        done = []
        for oid in ids:
            offer = self.offers.pop(oid, None)
            if offer is None:
                continue
            done.append(oid)
            fw = self.frameworks.get(offer.framework_id)
            if fw is not None:
                fw.send({"type": "RESCIND", "rescind": {"offer_id": {"value": oid}}})
        self._wake.set()
        self._notify()
        return done

    async def disconnect(self, framework_id: str | None = None) -> None:
        """Abort the subscription stream of one framework (or of all): the client must
        resubscribe, within its failover_timeout, to keep its tasks."""
        for fw in list(self.frameworks.values()):
            if (framework_id is None or fw.id == framework_id) and fw.stream is not None:
                stream = fw.stream
                stream.abort()
                self._stream_closed(fw, stream)

    async def send_error(self, message: str, framework_id: str | None = None) -> None:
        """Send an ERROR event to one subscribed framework, or to all."""
        for fw in self.frameworks.values():
            if framework_id is None or fw.id == framework_id:
                fw.send({"type": "ERROR", "error": {"message": message}})

    async def send_event(self, event: dict[str, Any], framework_id: str | None = None) -> None:
        """Send any event (MESSAGE, FAILURE...) as given to one subscribed framework, or to all."""
        for fw in self.frameworks.values():
            if framework_id is None or fw.id == framework_id:
                fw.send(event)

    async def fail_next(
        self, call_type: str, status: int = 503, times: int = 1, text: str = "Injected failure"
    ) -> None:
        """Answer the next ``times`` calls of ``call_type`` with ``status`` and do nothing for
        them, as a master mid-election (503) or a proxy timing out (504) does; the calls are
        still recorded in :attr:`calls`. The stream stays up."""
        if call_type not in CALL_FIELDS or call_type == "SUBSCRIBE":
            raise ValueError(f"cannot fail {call_type!r} calls")
        self._failures.setdefault(call_type, deque()).extend([(status, text)] * times)

    async def set_leader(self, leader: str | None, *, drop_streams: bool = True) -> None:
        """Act as a non-leading master that redirects to ``leader`` ("host:port" or a URL),
        or as the leader again with None. Losing leadership drops every stream, as a master
        that loses its ZooKeeper lease exits."""
        if leader is None:
            self._leader = None
        else:
            parts = urlsplit(leader if "//" in leader else f"//{leader}")
            if not parts.hostname or not parts.port:
                raise ValueError(f"leader must be host:port or a URL with a port, not {leader!r}")
            self._leader = f"{parts.hostname}:{parts.port}"
            if drop_streams:
                await self.disconnect()
        self._wake.set()

    # ---- several masters: ZooKeeper and failover -----------------------------------

    async def register_in_zookeeper(self, servers: str, path: str = "/mesos") -> str:
        """Contend for leadership as a Mesos master does: in a ZooKeeper session of its own,
        create the ephemeral sequential znode ``<path>/json.info_<seq>`` holding this master's
        MasterInfo as JSON. The lowest sequence leads; this does not make the master lead or
        follow (:meth:`set_leader`, :meth:`take_over` do). Returns the znode's path."""
        from kazoo.client import KazooClient

        if self._zk is not None:
            raise RuntimeError(f"master {self.id} is already registered as {self.znode}")
        client = KazooClient(hosts=servers, timeout=10.0)
        await asyncio.to_thread(client.start, 30.0)
        self._zk = client
        data = json.dumps(self._master_info()).encode()
        self.znode = await asyncio.to_thread(
            client.create,
            f"{path.rstrip('/')}/json.info_",
            data,
            ephemeral=True,
            sequence=True,
            makepath=True,
        )
        log.info("fake Mesos master %s registered in ZooKeeper as %s", self.id, self.znode)
        return str(self.znode)

    async def leave_zookeeper(self) -> None:
        """End this master's ZooKeeper session, as a master that exits or loses its lease
        does: its znode is deleted with the session, and the next master in line leads."""
        client, self._zk, self.znode = self._zk, None, None
        if client is not None:

            def close() -> None:
                client.stop()
                client.close()

            await asyncio.to_thread(close)

    async def take_over(self, old: FakeMaster) -> None:
        """Lead in place of ``old`` (a master failover; call it on a standby).

        What a new Mesos master learns from the agents re-registering with it comes over:
        the agents, every framework with its tasks (still running, their processes untouched)
        and their unacknowledged updates; outstanding offers do not. Every framework is
        disconnected (its stream to ``old`` is dropped) and is torn down unless it
        resubscribes here within its ``failover_timeout``, counted from now. ``old`` answers
        every request with a 307 to this master from now on, and allocates nothing.
        """
        if old is self or old._successor is not None:
            raise ValueError("take over from another master that still leads")
        old._leader = self.address
        old._successor = self
        streams = []
        for fw in old.frameworks.values():
            if fw.failover_handle is not None:
                fw.failover_handle.cancel()
                fw.failover_handle = None
            if fw.stream is not None:
                streams.append(fw.stream)
                fw.stream = None
        self.agents = old.agents
        self.frameworks.update(old.frameworks)
        self.task_history.extend(old.task_history)
        self._background |= old._background
        old.frameworks, old.offers, old.task_history, old._background = {}, {}, [], set()
        self._leader = None
        loop = asyncio.get_running_loop()
        for fw in self.frameworks.values():
            if fw.removed or fw.stream is not None:
                continue
            fw.filters.clear()  # the new allocator starts without the old one's filters
            timeout = float(fw.info.get("failover_timeout", 0.0) or 0.0)
            fw.failover_handle = loop.call_later(max(timeout, 0.0), self._failover_expired, fw)
        for stream in streams:
            stream.abort()
        log.info("fake Mesos master %s took over from %s", self.id, old.id)
        self._wake.set()
        old._wake.set()
        self._notify()
        old._notify()

    # ---- HTTP ------------------------------------------------------------------------

    async def _handle_version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "version": self.version,
                "build_date": "2020-11-18 22:36:20",
                "build_time": 1605738980.0,
                "build_user": "fake-mesos",
                "git_sha": "0000000000000000000000000000000000000000",
                "git_tag": self.version,
            }
        )

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _handle_state(self, request: web.Request) -> web.StreamResponse:
        if self._leader is not None:
            return self._redirect(request)
        slaves = []
        for agent in self.agents:
            slaves.append(
                {
                    "id": agent.id,
                    "hostname": agent.hostname,
                    "port": 5051,
                    "pid": f"slave(1)@{agent.hostname}:5051",
                    "active": True,
                    "resources": _state_resources(agent.total),
                    "used_resources": _state_resources(self.used(agent.id)),
                    "unreserved_resources": _state_resources(agent.total),
                    "attributes": dict(agent.spec.attributes),
                }
            )
        frameworks = [
            {
                "id": fw.id,
                "name": fw.info.get("name"),
                "user": fw.info.get("user"),
                "role": fw.role,
                "active": fw.connected and not fw.removed,
                "connected": fw.connected,
                "tasks": [
                    {
                        "id": t.task_id,
                        "name": t.task_info.get("name"),
                        "slave_id": t.agent_id,
                        "state": t.state,
                        "resources": _state_resources(t.resources),
                    }
                    for t in fw.tasks.values()
                    if not t.completed
                ],
                "offers": [
                    {"id": o.id, "slave_id": o.agent_id, "resources": _state_resources(o.resources)}
                    for o in self.offers.values()
                    if o.framework_id == fw.id
                ],
            }
            for fw in self.frameworks.values()
            if not fw.removed
        ]
        pid = f"master@{self._advertised_host}:{self.port}"
        return web.json_response(
            {
                "version": MESOS_VERSION,
                "id": self.id,
                "pid": pid,
                "hostname": self._advertised_host,
                "leader": pid,
                "activated_slaves": len(self.agents),
                "slaves": slaves,
                "frameworks": frameworks,
            }
        )

    async def _handle_tasks(self, request: web.Request) -> web.Response:
        """``/tasks?framework_id=F&task_id=T``: the tasks the master knows, as Mesos lists them."""
        if self._leader is not None:
            return self._redirect(request)
        if not self._authenticated(request):
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="mesos"'})
        fid, tid = request.query.get("framework_id"), request.query.get("task_id")
        tasks = [
            {
                "id": t.task_id,
                "name": t.task_info.get("name"),
                "framework_id": fw.id,
                "executor_id": "",
                "slave_id": t.agent_id,
                "state": t.state,
                "resources": _state_resources(t.resources),
                "statuses": [{k: v for k, v in st.items() if k != "uuid"} for st in t.statuses],
                "container": t.container or {},
            }
            for fw in self.frameworks.values()
            if not fid or fw.id == fid
            for t in fw.tasks.values()
            if (not tid or t.task_id == tid) and not t.completed
        ]
        return web.json_response({"tasks": tasks})

    def _redirect(self, request: web.Request) -> web.Response:
        self.redirects += 1
        # A real master answers with a scheme-relative URL to the same path on the leader.
        return web.Response(
            status=307,
            headers={"Location": f"//{self._leader}{request.path_qs}"},
        )

    def _authenticated(self, request: web.Request) -> bool:
        if self._credentials is None:
            return True
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        want_user, want_password = self._credentials
        return bool(sep) & hmac.compare_digest(user, want_user) & hmac.compare_digest(password, want_password)

    async def _handle_scheduler(self, request: web.Request) -> web.StreamResponse:
        if not self._authenticated(request):
            return web.Response(
                status=401, text="Unauthorized", headers={"WWW-Authenticate": 'Basic realm="mesos"'}
            )
        if self._leader is not None:
            return self._redirect(request)
        if request.method != "POST":
            return web.Response(
                status=405, text=f"Expecting 'POST', received '{request.method}'", headers={"Allow": "POST"}
            )
        try:
            call = await self._read_call(request)
            call_type = call["type"]
            if call_type == "SUBSCRIBE":
                return await self._subscribe(request, call)
            fw = self._calling_framework(request, call)
            failures = self._failures.get(call_type)
            if failures:
                raise CallError(*failures.popleft())
            handler = self._handlers.get(call_type)
            if handler is not None:
                try:
                    handler(fw, call)
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise CallError(400, f"Failed to validate scheduler::Call: {e!r}") from e
            # MESSAGE, REQUEST, SHUTDOWN, inverse offers, operation calls: accepted, ignored.
        except CallError as e:
            log.info("refused call: %s %s", e.status, e.reason)
            return web.Response(status=e.status, text=e.reason)
        self._notify()
        return web.Response(status=202)

    async def _read_call(self, request: web.Request) -> dict[str, Any]:
        if "Content-Type" not in request.headers:
            raise CallError(400, "Expecting 'Content-Type' to be present")
        if request.content_type == "application/x-protobuf":
            raise CallError(415, "This fake master speaks JSON only: send Content-Type: application/json")
        if request.content_type != "application/json":
            raise CallError(415, "Expecting 'Content-Type' of application/json or application/x-protobuf")
        body = await request.read()
        try:
            call = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise CallError(400, f"Failed to parse body into JSON: {e}") from e
        if not isinstance(call, dict):
            raise CallError(400, "Failed to convert JSON into Call protobuf: expecting a JSON object")
        call_type = call.get("type")
        if call_type is None:
            raise CallError(400, "Failed to validate scheduler::Call: Expecting 'type' to be present")
        if call_type not in CALL_FIELDS:
            raise CallError(
                400,
                f"Failed to convert JSON into Call protobuf: unknown value {call_type!r} for field 'type'",
            )
        self.calls.append((call_type, call))
        needed = CALL_FIELDS[call_type]
        if needed is not None and not isinstance(call.get(needed), dict):
            raise CallError(400, f"Failed to validate scheduler::Call: Expecting '{needed}' to be present")
        return call

    def _calling_framework(self, request: web.Request, call: dict[str, Any]) -> FakeFramework:
        framework_id = _value(call, "framework_id")
        if framework_id is None:
            raise CallError(400, "Failed to validate scheduler::Call: Expecting 'framework_id' to be present")
        fw = self.frameworks.get(framework_id)
        if fw is None or fw.removed:
            raise CallError(400, "Framework cannot be found")
        if fw.stream is None:
            raise CallError(403, "Framework is not subscribed")
        stream_id = request.headers.get("Mesos-Stream-Id")
        if stream_id is None:
            raise CallError(400, "All non-subscribe calls should include the 'Mesos-Stream-Id' header")
        if stream_id != fw.stream.id:
            raise CallError(
                400,
                f"The stream ID '{stream_id}' included in this request didn't match the stream ID "
                f"currently associated with framework ID {fw.id}",
            )
        return fw

    # ---- subscription ----------------------------------------------------------------

    async def _subscribe(self, request: web.Request, call: dict[str, Any]) -> web.StreamResponse:
        info = call["subscribe"].get("framework_info")
        if not isinstance(info, dict):
            raise CallError(
                400, "Failed to validate scheduler::Call: Expecting 'framework_info' to be present"
            )
        for required in ("user", "name"):
            if not isinstance(info.get(required), str):
                raise CallError(
                    400,
                    "Failed to convert JSON into Call protobuf: Missing required fields: "
                    f"subscribe.framework_info.{required}",
                )
        if "Mesos-Stream-Id" in request.headers:
            raise CallError(400, "Subscribe calls should not include the 'Mesos-Stream-Id' header")
        accept = request.headers.get("Accept", "*/*")
        if not any(a in accept for a in ("application/json", "*/*", "application/*")):
            raise CallError(406, "Expecting 'Accept' to allow application/json")
        requested = _value(info, "id")
        if "framework_id" in call and _value(call, "framework_id") != requested:
            raise CallError(400, "'framework_id' differs from 'subscribe.framework_info.id'")

        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        stream = _Stream()
        stream.transport = request.transport
        response.headers["Mesos-Stream-Id"] = stream.id

        previous = self.frameworks.get(requested) if requested else None
        if previous is not None and previous.removed:
            # A torn-down framework cannot come back; a real master says so on the stream.
            await response.prepare(request)
            await response.write(
                encode_record({"type": "ERROR", "error": {"message": "Framework has been removed"}})
            )
            await response.write_eof()
            return response

        if previous is None:
            fid = requested or f"{self.id}-{next(self._framework_seq):04d}"
            fw = FakeFramework(id=fid, info={**info, "id": {"value": fid}})
            self.frameworks[fid] = fw
        else:
            fw = previous
            fw.info = {**info, "id": {"value": fw.id}}
            if fw.failover_handle is not None:
                fw.failover_handle.cancel()
                fw.failover_handle = None
            if fw.stream is not None:  # the framework failed over to a new scheduler
                old = fw.stream
                fw.send({"type": "ERROR", "error": {"message": "Framework failed over"}})
                old.end()
                for oid in [o.id for o in self.offers.values() if o.framework_id == fw.id]:
                    del self.offers[oid]
        fw.suppressed = fw.role in call["subscribe"].get("suppressed_roles", [])
        fw.stream = stream

        await response.prepare(request)
        fw.send(
            {
                "type": "SUBSCRIBED",
                "subscribed": {
                    "framework_id": {"value": fw.id},
                    "heartbeat_interval_seconds": self.heartbeat_interval_s,
                    "master_info": self._master_info(),
                },
            }
        )
        for task in fw.tasks.values():  # what the agents would retry now
            self._send_head(task)
        self._wake.set()
        self._notify()
        log.info("framework %s subscribed on stream %s", fw.id, stream.id)
        try:
            await self._write_stream(response, stream)
        except ConnectionError:
            log.info("framework %s: stream %s broke", fw.id, stream.id)
        finally:
            # The client hung up (the handler is cancelled), the stream broke or was aborted,
            # or it ended (TEARDOWN, failover): the framework is disconnected from it.
            self._stream_closed(fw, stream)
        return response

    async def _write_stream(self, response: web.StreamResponse, stream: _Stream) -> None:
        while True:
            try:
                async with asyncio.timeout(self.heartbeat_interval_s):
                    event = await stream.queue.get()
            except TimeoutError:
                event = HEARTBEAT_EVENT
            if event is None:
                if not (stream.transport is not None and stream.transport.is_closing()):
                    await response.write_eof()
                return
            await response.write(encode_record(event))
            if event["type"] != "HEARTBEAT":
                # Line-reading clients see a record only when the next newline arrives.
                await response.write(encode_record(HEARTBEAT_EVENT))

    def _stream_closed(self, fw: FakeFramework, stream: _Stream) -> None:
        stream.closed = True
        if fw.stream is not stream:
            return  # already replaced by a resubscription, or handled
        fw.stream = None
        for oid in [o.id for o in self.offers.values() if o.framework_id == fw.id]:
            del self.offers[oid]
        if not fw.removed and not self._stopping:
            timeout = float(fw.info.get("failover_timeout", 0.0) or 0.0)
            log.info("framework %s disconnected; failover timeout %s s", fw.id, timeout)
            loop = asyncio.get_running_loop()
            fw.failover_handle = loop.call_later(max(timeout, 0.0), self._failover_expired, fw)
        self._wake.set()
        self._notify()

    def _failover_expired(self, fw: FakeFramework) -> None:
        fw.failover_handle = None
        if fw.stream is None and not fw.removed:
            log.info("framework %s did not resubscribe in time: tearing it down", fw.id)
            self._remove_framework(fw)

    def _master_info(self) -> dict[str, Any]:
        host = self._advertised_host
        try:
            packed = socket.inet_aton(host)
        except OSError:
            packed = socket.inet_aton("127.0.0.1")
        ip_str = socket.inet_ntoa(packed)
        return {
            "id": self.id,
            # MasterInfo.ip is the IPv4 address in network byte order read as a host uint32.
            "ip": struct.unpack("<I", packed)[0],
            "port": self.port,
            "pid": f"master@{ip_str}:{self.port}",
            "hostname": host,
            "version": self.version,
            "address": {"hostname": host, "ip": ip_str, "port": self.port},
        }

    # ---- calls -----------------------------------------------------------------------

    def _on_teardown(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        self._remove_framework(fw)

    def _remove_framework(self, fw: FakeFramework) -> None:
        fw.removed = True
        if fw.failover_handle is not None:
            fw.failover_handle.cancel()
            fw.failover_handle = None
        for oid in [o.id for o in self.offers.values() if o.framework_id == fw.id]:
            del self.offers[oid]
        for task in fw.tasks.values():
            task.pending.clear()
            if not task.terminal:
                task.kill_requested = True
                task.state = "TASK_KILLED"
                self._terminate(task, self.kill_grace_s)
        if fw.stream is not None:
            fw.stream.end()
            fw.stream = None
        self._wake.set()
        self._notify()

    def _on_accept(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        accept = call["accept"]
        offer_ids = [o["value"] for o in accept.get("offer_ids", [])]
        # Missing required fields fail the JSON-to-protobuf conversion: the whole call is a 400.
        launches = _launched_task_infos(accept.get("operations", []))
        error = None
        offers: list[Offer] = []
        for oid in offer_ids:
            offer = self.offers.get(oid)
            if offer is None:
                error = f"Offer {oid} is no longer valid"
            elif offer.framework_id != fw.id:
                error = f"Offer {oid} has invalid framework {offer.framework_id} while framework {fw.id} is expected"
            else:
                offers.append(offer)
        if not offer_ids:
            error = "No offers specified"
        elif len(set(offer_ids)) != len(offer_ids):
            error = "Duplicate offer IDs"
        elif len({o.agent_id for o in offers}) > 1:
            error = "Aggregated offers must belong to one single agent"
        for offer in offers:
            del self.offers[offer.id]  # used or not, an accepted offer is gone
        self._wake.set()
        if error is not None:
            state = "TASK_DROPPED" if fw.partition_aware else "TASK_LOST"
            for info, _ in launches:
                self._reject(
                    fw,
                    info,
                    None,
                    state,
                    f"Task launched with invalid offers: {error}",
                    "REASON_INVALID_OFFERS",
                )
            return
        agent = self._agent(offers[0].agent_id)
        available = Resources()
        for offer in offers:
            available = available + offer.resources
        for info, in_group in launches:
            if in_group:
                self._reject(
                    fw, info, agent, "TASK_ERROR", "LAUNCH_GROUP is not supported by the fake master"
                )
                continue
            problem, resources = self._validate_task(fw, agent, info, available)
            if problem is not None:
                self._reject(fw, info, agent, "TASK_ERROR", problem)
                continue
            available = available - resources
            self._launch(fw, agent, info, resources)
        refuse_s = _refuse_seconds(accept.get("filters"))
        if available and refuse_s > 0:
            fw.filters.append(_Filter(agent.id, available, time.monotonic() + refuse_s))

    def _validate_task(
        self, fw: FakeFramework, agent: Agent, info: dict[str, Any], available: Resources
    ) -> tuple[str | None, Resources]:
        task_id = _value(info, "task_id")
        if not task_id:
            return "Task ID must not be empty", Resources()
        existing = fw.tasks.get(task_id)
        if existing is not None and not existing.completed:
            return f"Task has duplicate ID: {task_id}", Resources()
        if _value(info, "agent_id") != agent.id:
            return (
                f"Task uses agent ID {_value(info, 'agent_id')} but its offer is for {agent.id}",
                Resources(),
            )
        if ("command" in info) == ("executor" in info):
            return (
                "Task should have at least one (but not both) of CommandInfo or ExecutorInfo present",
                Resources(),
            )
        if "executor" in info:
            return "The fake master runs command tasks only; custom executors are not supported", Resources()
        command = info["command"]
        if not isinstance(command, dict) or (command.get("shell", True) and not command.get("value")):
            return "Task's CommandInfo must have a 'value' when 'shell' is true", Resources()
        if not command.get("shell", True) and not command.get("value"):
            return (
                "The fake master cannot run a container image's entrypoint: give 'command.value'",
                Resources(),
            )
        problem = _secret_problem(command, self.version)
        if problem is not None:
            return problem, Resources()
        try:
            resources = Resources.from_json(info.get("resources", []))
        except ValueError as e:
            return f"Task uses invalid resources: {e}", Resources()
        if not resources:
            return "Task uses no resources", Resources()
        if not available.contains(resources):
            return (
                f"Task uses more resources {resources.describe()} than available {available.describe()}",
                resources,
            )
        return None, resources

    def _reject(
        self,
        fw: FakeFramework,
        info: dict[str, Any],
        agent: Agent | None,
        state: str,
        message: str,
        reason: str = "REASON_TASK_INVALID",
    ) -> None:
        """A master-generated update for a task that never launched (no uuid, no ack)."""
        task_id = _value(info, "task_id") or ""
        agent_id = agent.id if agent is not None else (_value(info, "agent_id") or "")
        task = FakeTask(task_id, fw.id, agent_id, info, Resources(), state=state)
        status = self._status(task, state, message=message, reason=reason, reliable=False)
        task.statuses.append(status)
        existing = fw.tasks.get(task_id)
        if existing is None or existing.completed:
            self._store_task(fw, task)
        self._send_update(fw, status)
        log.info("task %s rejected: %s %s", task_id, state, message)

    def _store_task(self, fw: FakeFramework, task: FakeTask) -> None:
        old = fw.tasks.get(task.task_id)
        if old is not None:
            self.task_history.append(old)
        fw.tasks[task.task_id] = task

    def _on_decline(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        decline = call["decline"]
        refuse_s = _refuse_seconds(decline.get("filters"))
        for item in decline.get("offer_ids", []):
            offer = self.offers.get(item["value"])
            if offer is None or offer.framework_id != fw.id:
                continue  # a real master ignores declines of offers no longer valid
            del self.offers[offer.id]
            if refuse_s > 0:
                fw.filters.append(_Filter(offer.agent_id, offer.resources, time.monotonic() + refuse_s))
        self._wake.set()

    def _applies_to(self, fw: FakeFramework, body: Any) -> bool:
        roles = body.get("roles") if isinstance(body, dict) else None
        return not roles or fw.role in roles

    def _on_revive(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        if self._applies_to(fw, call.get("revive")):
            fw.suppressed = False
            fw.filters.clear()
            self._wake.set()

    def _on_suppress(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        if self._applies_to(fw, call.get("suppress")):
            fw.suppressed = True  # outstanding offers stay valid, as in Mesos

    def _on_update_framework(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        update = call["update_framework"]
        info = update.get("framework_info")
        if not isinstance(info, dict) or _value(info, "id") != fw.id:
            raise ValueError("'update_framework.framework_info.id' must be the calling framework's id")
        fw.info = dict(info)
        fw.suppressed = fw.role in update.get("suppressed_roles", [])
        self._wake.set()

    def _on_kill(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        kill = call["kill"]
        task_id = _value(kill, "task_id")
        if not task_id:
            raise ValueError("Expecting 'kill.task_id' to be present")
        task = fw.tasks.get(task_id)
        if task is None or task.completed:
            # Unknown to the master: it answers with what reconciliation would say.
            self._send_update(fw, self._unknown_task_status(fw, task_id, _value(kill, "agent_id")))
            return
        if task.terminal:
            return
        grace_s = self.kill_grace_s
        policy = kill.get("kill_policy") or task.task_info.get("kill_policy")
        if isinstance(policy, dict) and "grace_period" in policy:
            grace_s = int(policy["grace_period"].get("nanoseconds", 0)) / 1e9
        self._kill(fw, task, grace_s)

    def _on_acknowledge(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        ack = call["acknowledge"]
        agent_id, task_id, ack_uuid = _value(ack, "agent_id"), _value(ack, "task_id"), ack.get("uuid")
        if not agent_id or not task_id or not isinstance(ack_uuid, str):
            raise ValueError("Expecting 'agent_id', 'task_id' and 'uuid' in 'acknowledge'")
        try:
            raw = base64.b64decode(ack_uuid, validate=True)
        except binascii.Error as e:
            raise ValueError(f"'uuid' is not base64: {ack_uuid!r}") from e
        if len(raw) != 16:
            raise ValueError(f"'uuid' is not a UUID (16 bytes): {ack_uuid!r}")
        self.acks.append(Ack(fw.id, agent_id, task_id, ack_uuid))
        task = fw.tasks.get(task_id)
        if task is None or not task.pending or task.pending[0].get("uuid") != ack_uuid:
            log.info("ignoring unexpected acknowledgement for task %s", task_id)
            return
        task.pending.popleft()
        task.head_sent_at = None
        self._send_head(task)

    def _on_reconcile(self, fw: FakeFramework, call: dict[str, Any]) -> None:
        wanted = call["reconcile"].get("tasks", [])
        if not wanted:  # implicit: every task the master still knows
            for task in fw.tasks.values():
                if not task.completed:
                    self._send_update(fw, self._reconciled(task))
            return
        for item in wanted:
            task_id = _value(item, "task_id")
            if not task_id:
                raise ValueError("Expecting 'task_id' in every 'reconcile.tasks' entry")
            task = fw.tasks.get(task_id)
            if task is not None and not task.completed:
                self._send_update(fw, self._reconciled(task))
            else:
                self._send_update(fw, self._unknown_task_status(fw, task_id, _value(item, "agent_id")))

    def _reconciled(self, task: FakeTask) -> dict[str, Any]:
        status = dict(task.latest_status or {})
        status.pop("uuid", None)
        status.update(
            state=task.state,
            source="SOURCE_MASTER",
            reason="REASON_RECONCILIATION",
            message="Reconciliation: Latest task state",
            timestamp=time.time(),
        )
        status.setdefault("task_id", {"value": task.task_id})
        status.setdefault("agent_id", {"value": task.agent_id})
        return status

    def _unknown_task_status(self, fw: FakeFramework, task_id: str, agent_id: str | None) -> dict[str, Any]:
        known_agent = agent_id is not None and any(a.id == agent_id for a in self.agents)
        # What reconciliation says of a task the master does not know (Mesos reconciliation docs).
        state = ("TASK_GONE" if known_agent else "TASK_UNKNOWN") if fw.partition_aware else "TASK_LOST"
        status: dict[str, Any] = {
            "task_id": {"value": task_id},
            "state": state,
            "source": "SOURCE_MASTER",
            "reason": "REASON_RECONCILIATION",
            "message": "Reconciliation: Task is unknown" + (" to the agent" if known_agent else ""),
            "timestamp": time.time(),
        }
        if agent_id is not None:
            status["agent_id"] = {"value": agent_id}
        return status

    # ---- allocation ------------------------------------------------------------------

    async def _allocator(self) -> None:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that
        # races the wake-up, and stop() both wakes and cancels this loop.
        while not self._stopping:
            self._wake.clear()
            next_expiry = self._allocate(time.monotonic())
            timeout = None if next_expiry is None else max(0.0, next_expiry - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    def _allocate(self, now: float) -> float | None:
        """Offer every agent's unallocated resources; returns when the next filter expires."""
        self.allocation_rounds += 1
        next_expiry = None
        for fw in self.frameworks.values():
            fw.filters = [f for f in fw.filters if f.expires > now]
            for f in fw.filters:
                next_expiry = f.expires if next_expiry is None else min(next_expiry, f.expires)
        if self._leader is not None:
            return next_expiry
        batches: dict[str, list[Offer]] = {}
        for agent in self.agents:
            available = self.unallocated(agent.id)
            if not available.allocatable():
                continue
            eligible = [fw for fw in self.frameworks.values() if self._may_offer(fw, agent, available)]
            if not eligible:
                continue
            fw = min(eligible, key=self._allocation_weight)
            offer = Offer(f"{self.id}-O{next(self._offer_seq)}", fw.id, agent.id, available)
            self.offers[offer.id] = offer
            batches.setdefault(fw.id, []).append(offer)
        for fid, offers in batches.items():
            fw = self.frameworks[fid]
            fw.send({"type": "OFFERS", "offers": {"offers": [self._offer_json(fw, o) for o in offers]}})
        self._notify()
        return next_expiry

    def _may_offer(self, fw: FakeFramework, agent: Agent, available: Resources) -> bool:
        if fw.removed or fw.stream is None or fw.suppressed:
            return False
        if (
            self.filter_gpu_resources
            and "gpus" in agent.total.values
            and "GPU_RESOURCES" not in fw.capabilities
        ):
            return False
        return not any(f.agent_id == agent.id and f.resources.contains(available) for f in fw.filters)

    def _allocation_weight(self, fw: FakeFramework) -> int:
        live = sum(1 for t in fw.tasks.values() if not t.terminal)
        return live + sum(1 for o in self.offers.values() if o.framework_id == fw.id)

    def _offer_json(self, fw: FakeFramework, offer: Offer) -> dict[str, Any]:
        agent = self._agent(offer.agent_id)
        return {
            "id": {"value": offer.id},
            "framework_id": {"value": fw.id},
            "agent_id": {"value": agent.id},
            "hostname": agent.hostname,
            "url": {
                "scheme": "http",
                "address": {"hostname": agent.hostname, "ip": "127.0.0.1", "port": 5051},
                "path": "/slave(1)",
            },
            "resources": offer.resources.to_json(fw.role),
            "attributes": agent.spec.attributes_json(),
            "allocation_info": {"role": fw.role},
        }

    def _agent(self, agent_id: str) -> Agent:
        for agent in self.agents:
            if agent.id == agent_id:
                return agent
        raise KeyError(f"unknown agent {agent_id}")

    # ---- tasks -----------------------------------------------------------------------

    def _launch(self, fw: FakeFramework, agent: Agent, info: dict[str, Any], resources: Resources) -> None:
        task = FakeTask(_value(info, "task_id") or "", fw.id, agent.id, info, resources)
        assert self.sandbox_root is not None
        task.sandbox = Path(tempfile.mkdtemp(prefix=f"{_safe(task.task_id)}-", dir=self.sandbox_root))
        self._store_task(fw, task)
        self._spawn_background(self._run_task(fw, agent, task))
        log.info("launching task %s on agent %s", task.task_id, agent.id)

    def _spawn_background(self, coro: Awaitable[Any]) -> None:
        t = asyncio.ensure_future(coro)
        self._owner()._background.add(t)
        t.add_done_callback(lambda done: self._owner()._background.discard(done))

    async def _run_task(self, fw: FakeFramework, agent: Agent, task: FakeTask) -> None:
        try:
            await self._run_task_process(fw, agent, task)
        finally:
            task.gone = True
            self._notify()

    async def _run_task_process(self, fw: FakeFramework, agent: Agent, task: FakeTask) -> None:
        if task.kill_requested:  # killed before it started
            self._push_update(
                task, self._status(task, "TASK_KILLED", message="Task killed before it started")
            )
            return
        command = task.task_info["command"]
        assert task.sandbox is not None
        failure = await self._prepare_container(task)
        if failure is not None:
            if not task.terminal:
                failed = self._status(task, "TASK_FAILED", message=failure)
                failed["reason"] = "REASON_CONTAINER_LAUNCH_FAILED"
                self._push_update(task, failed)
            return
        self._push_update(task, self._status(task, "TASK_STARTING"))
        try:
            with open(task.sandbox / "stdout", "wb") as out, open(task.sandbox / "stderr", "wb") as err:
                if command.get("shell", True):
                    argv, executable = ["/bin/sh", "-c", str(command["value"])], None
                else:
                    # Mesos: execvp(value, arguments); 'arguments' is argv, argv[0] included.
                    argv = [str(a) for a in command.get("arguments", [])] or [str(command["value"])]
                    executable = str(command["value"])
                task.proc = await asyncio.create_subprocess_exec(
                    *argv,
                    executable=executable,
                    cwd=task.sandbox,
                    env=self._task_env(fw, agent, task),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own process group: a kill reaches its children
                )
        except OSError as e:
            if not task.terminal:
                self._push_update(task, self._status(task, "TASK_FAILED", message=f"Failed to launch: {e}"))
            return
        task.pid = task.proc.pid
        if task.terminal or self._stopping:  # torn down, failed or stopped while starting
            _signal_group(task, signal.SIGKILL)
        elif task.kill_requested:
            self._terminate(task, self.kill_grace_s)
        else:
            running = self._status(task, "TASK_RUNNING")
            running["container_status"] = {
                "container_id": {"value": task.container_id},
                "network_infos": [{"ip_addresses": [{"protocol": "IPv4", "ip_address": "127.0.0.1"}]}],
                "executor_pid": task.pid,
            }
            self._push_update(task, running)
        returncode = await task.proc.wait()
        task.returncode = returncode
        self._notify()
        if task.terminal:
            return
        message = f"Command {_describe_exit(returncode)}"
        if task.kill_requested:
            state = "TASK_KILLED"
        elif returncode == 0:
            state = "TASK_FINISHED"
        else:
            state = "TASK_FAILED"
        self._push_update(task, self._status(task, state, message=message))

    async def _prepare_container(self, task: FakeTask) -> str | None:
        """What the agent does before the command: refuse what its containerizer cannot do,
        fetch the URIs. Returns why the container could not launch, or None."""
        assert task.sandbox is not None
        container = task.container or {}
        command = task.task_info["command"]
        secrets = [
            v.get("name")
            for v in command.get("environment", {}).get("variables", [])
            if v.get("type") == "SECRET"
        ]
        if secrets and container.get("type") == "DOCKER":
            return (
                "Failed to launch container: the Docker containerizer does not support environment "
                f"secrets ({', '.join(map(str, secrets))})"
            )
        uris = command.get("uris") or []
        if not uris:
            return None
        try:
            task.fetched = await asyncio.to_thread(
                fetch_uris, uris, task.sandbox, ca_file=self.fetcher_ca_file
            )
        except FetchError as e:
            log.info("task %s: fetching its URIs failed: %s", task.task_id, e)
            return f"Failed to launch container: Failed to fetch all URIs for container '{task.container_id}': {e}"
        return None

    def _task_env(self, fw: FakeFramework, agent: Agent, task: FakeTask) -> dict[str, str]:
        env = dict(os.environ) if self._inherit_env else {"PATH": os.environ.get("PATH", os.defpath)}
        env.update(
            MESOS_TASK_ID=task.task_id,
            MESOS_EXECUTOR_ID=task.task_id,
            MESOS_AGENT_ID=agent.id,
            MESOS_SLAVE_ID=agent.id,
            MESOS_FRAMEWORK_ID=fw.id,
            MESOS_SANDBOX=str(task.sandbox),
            MESOS_DIRECTORY=str(task.sandbox),
            MESOS_CONTAINER_IP="127.0.0.1",
            HOST=agent.hostname,
        )
        for var in task.task_info["command"].get("environment", {}).get("variables", []):
            if var.get("type", "VALUE") == "VALUE":
                env[str(var["name"])] = str(var.get("value", ""))
            elif isinstance(var.get("secret", {}).get("value"), dict):
                env[str(var["name"])] = base64.b64decode(var["secret"]["value"].get("data", "")).decode()
        return env

    def _kill(self, fw: FakeFramework, task: FakeTask, grace_s: float) -> None:
        if task.kill_requested:
            return
        task.kill_requested = True
        if "TASK_KILLING_STATE" in fw.capabilities and task.state in ("TASK_STARTING", "TASK_RUNNING"):
            self._push_update(task, self._status(task, "TASK_KILLING"))
        if task.proc is not None:
            self._terminate(task, grace_s)

    def _terminate(self, task: FakeTask, grace_s: float) -> None:
        """SIGTERM the task's process group, SIGKILL it after ``grace_s``."""
        proc = task.proc
        if proc is None or proc.returncode is not None:
            return

        async def terminate() -> None:
            _signal_group(task, signal.SIGTERM)
            try:
                async with asyncio.timeout(grace_s):
                    await proc.wait()
            except TimeoutError:
                _signal_group(task, signal.SIGKILL)

        self._spawn_background(terminate())

    def _status(
        self,
        task: FakeTask,
        state: str,
        *,
        message: str | None = None,
        reason: str | None = None,
        reliable: bool = True,
    ) -> dict[str, Any]:
        status: dict[str, Any] = {
            "task_id": {"value": task.task_id},
            "state": state,
            "source": "SOURCE_EXECUTOR" if reliable else "SOURCE_MASTER",
            "agent_id": {"value": task.agent_id},
            "timestamp": time.time(),
        }
        if reliable:
            status["executor_id"] = {"value": task.task_id}  # the command executor's id
            status["uuid"] = new_uuid_b64()
        if message is not None:
            status["message"] = message
        if reason is not None:
            status["reason"] = reason
        return status

    def _record(self, task: FakeTask, status: dict[str, Any]) -> None:
        if self._successor is not None:
            return self._owner()._record(task, status)
        task.statuses.append(status)
        task.state = status["state"]
        if task.terminal:
            self._wake.set()  # its resources are free again
        self._notify()

    def _push_update(self, task: FakeTask, status: dict[str, Any]) -> None:
        """Queue a reliable update; the framework sees it once the ones before are acked."""
        if self._successor is not None:
            return self._owner()._push_update(task, status)
        self._record(task, status)
        task.pending.append(status)
        if len(task.pending) == 1:
            self._send_head(task)

    def _send_head(self, task: FakeTask) -> None:
        if self._successor is not None:
            return self._owner()._send_head(task)
        fw = self.frameworks[task.framework_id]
        if (
            task.pending
            and not fw.removed
            and fw.send({"type": "UPDATE", "update": {"status": task.pending[0]}})
        ):
            task.head_sent_at = time.monotonic()

    def _send_update(self, fw: FakeFramework, status: dict[str, Any]) -> None:
        fw.send({"type": "UPDATE", "update": {"status": status}})

    async def _retry_updates(self, retry_s: float) -> None:
        while True:
            await asyncio.sleep(retry_s)
            now = time.monotonic()
            for fw in self.frameworks.values():
                for task in fw.tasks.values():
                    if task.pending and task.head_sent_at is not None and now - task.head_sent_at >= retry_s:
                        self._send_head(task)


async def fail_over(old: FakeMaster, new: FakeMaster) -> None:
    """A Mesos master failover in the order it happens: ``new`` (a standby, registered in
    ZooKeeper after ``old``) leads with what the agents report to it and ``old`` redirects
    to it, then ``old``'s ZooKeeper session ends, so ZooKeeper names ``new`` the leader."""
    await new.take_over(old)
    await old.leave_zookeeper()


def _launched_task_infos(operations: Any) -> list[tuple[dict[str, Any], bool]]:
    """Every TaskInfo of the LAUNCH and LAUNCH_GROUP operations, in order, with whether it
    came in a group. Other operations (RESERVE, CREATE...) are accepted and ignored."""
    out: list[tuple[dict[str, Any], bool]] = []
    for op in operations:
        if op.get("type") == "LAUNCH":
            out.extend((info, False) for info in op.get("launch", {}).get("task_infos", []))
        elif op.get("type") == "LAUNCH_GROUP":
            group = op.get("launch_group", {}).get("task_group", {})
            out.extend((info, True) for info in group.get("tasks", []))
        else:
            log.info("ignoring offer operation %s", op.get("type"))
    for info, _ in out:
        missing = [
            f
            for f in ("name", "task_id", "agent_id")
            if not isinstance(info.get(f), str if f == "name" else dict)
        ]
        if missing:
            raise ValueError(f"Missing required fields in TaskInfo: {', '.join(missing)}")
    return out


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:3])


def _secret_problem(command: dict[str, Any], version: str) -> str | None:
    """Why a master of ``version`` refuses the command's environment secrets, if it does."""
    for var in command.get("environment", {}).get("variables", []):
        if not isinstance(var, dict) or var.get("type") != "SECRET":
            continue
        name = var.get("name")
        if _version_tuple(version) < SECRETS_SINCE:
            return f"Environment variable '{name}' of type 'SECRET' is not supported by Mesos {version}"
        secret = var.get("secret")
        if not isinstance(secret, dict) or secret.get("type") not in ("VALUE", "REFERENCE"):
            return f"Environment variable '{name}' of type 'SECRET' must have a secret set"
        if secret["type"] == "REFERENCE":
            return f"Environment variable '{name}': the fake agent resolves VALUE secrets only"
        value = secret.get("value")
        if not isinstance(value, dict) or not isinstance(value.get("data"), str):
            return f"Environment variable '{name}': a VALUE secret must have 'value.data'"
        try:
            base64.b64decode(value["data"], validate=True)
        except (binascii.Error, ValueError):
            return f"Environment variable '{name}': the secret's data is not base64"
    return None


def _refuse_seconds(filters: Any) -> float:
    if not isinstance(filters, dict) or "refuse_seconds" not in filters:
        return DEFAULT_REFUSE_SECONDS
    value = float(filters["refuse_seconds"])
    if value < 0:
        return DEFAULT_REFUSE_SECONDS  # Mesos warns and uses the default
    return min(value, MAX_REFUSE_SECONDS)


def _value(obj: Any, key: str) -> str | None:
    """``obj[key]["value"]``, the shape of every Mesos id in JSON, or None."""
    inner = obj.get(key) if isinstance(obj, dict) else None
    value = inner.get("value") if isinstance(inner, dict) else None
    return value if isinstance(value, str) else None


def _signal_group(task: FakeTask, sig: signal.Signals, *, force: bool = False) -> None:
    """Signal the task's process group; ``force`` also after its leader exited, to reach
    children it left behind."""
    proc = task.proc
    if proc is not None and (force or proc.returncode is None):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"terminated with signal {signal.strsignal(-returncode) or -returncode}"
    return f"exited with status {returncode}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "task"


def _state_resources(resources: Resources) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in resources.values.items():
        if isinstance(value, float):
            out[name] = value
        elif isinstance(value, frozenset):
            out[name] = "{" + ",".join(sorted(value, key=_natural)) + "}"
        else:
            out[name] = "[" + ",".join(f"{b}-{e}" for b, e in value) + "]"
    return out


# --------------------------------------------------------------------------------------
# Running it elsewhere: in a thread for blocking tests, or as a process.
# --------------------------------------------------------------------------------------

#: Starting the loop and binding a socket takes milliseconds; this only guards a hang.
THREAD_START_TIMEOUT_S = 30.0


class ThreadedFakeMaster:
    """A :class:`FakeMaster` on its own event loop in a background thread, for tests whose
    framework or clients block. ``with ThreadedFakeMaster(agents=...) as m: m.url``;
    ``m.call(m.master.fail_task("t1"))`` runs a coroutine on the master's loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self.master: FakeMaster | None = None

    @property
    def url(self) -> str:
        assert self.master is not None
        return self.master.url

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 30.0) -> Any:
        """Run a coroutine on the master's loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def __enter__(self) -> ThreadedFakeMaster:
        started: Future[None] = Future()

        async def main() -> None:
            self._stopped = asyncio.Event()
            self.master = FakeMaster(*self._args, **self._kwargs)
            try:
                await self.master.start()
            except BaseException as e:
                started.set_exception(e)
                return
            started.set_result(None)
            try:
                await self._stopped.wait()
            finally:
                await self.master.stop()

        def run() -> None:
            with asyncio.Runner() as runner:  # closes what is left (tasks, transports) at the end
                self._loop = runner.get_loop()
                runner.run(main())

        self._thread = threading.Thread(target=run, name="fake-mesos-master", daemon=True)
        self._thread.start()
        started.result(THREAD_START_TIMEOUT_S)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(THREAD_START_TIMEOUT_S)


def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)  # readers never see a half-written file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A fake Mesos master (v1 scheduler API) for tests.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", help="write the bound port here (atomically) once listening")
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--cpus", type=float, default=4.0)
    parser.add_argument("--mem", type=float, default=8192.0)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--gpu-kind", choices=("SCALAR", "SET"), default="SCALAR")
    parser.add_argument("--heartbeat-interval", type=float, default=DEFAULT_HEARTBEAT_INTERVAL_S)
    parser.add_argument("--username")
    parser.add_argument("--password")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if (args.username is None) != (args.password is None):
        parser.error("--username and --password go together")
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    context = None
    if args.tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)

    async def serve() -> None:
        master = FakeMaster.uniform(
            args.agents,
            cpus=args.cpus,
            mem=args.mem,
            gpus=args.gpus,
            gpu_kind=args.gpu_kind,
            host=args.host,
            port=args.port,
            heartbeat_interval_s=args.heartbeat_interval,
            username=args.username,
            password=args.password,
            ssl_context=context,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with master:
            if args.port_file:
                _write_port_file(args.port_file, master.port)
            print(f"fake Mesos master listening on {master.url}", flush=True)
            await stop.wait()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
