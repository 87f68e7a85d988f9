"""Protocol messages: one small frozen dataclass per op, validated when built.

On the wire every message is a msgpack map with an ``op`` key naming its class
(see ``OPS``). ``decode`` turns a map from the peer into a message, raising
:class:`RemoteProtocolError` for an unknown op, a missing or unexpected key, or a
field of the wrong type or size; building a bad message locally raises
:class:`LocalProtocolError`. Nothing here touches sockets, clocks or logs.

Requests carry an ``id`` chosen by the client; the coordinator answers each with a
:class:`Reply` (or :class:`ClusterReply` for ``await_cluster``) or an
:class:`Error` carrying the same id. Waits (``await_*``, ``watch_job``) stay
pending on the server until their condition holds or their ``timeout_s`` passes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from .vocab import REPORT_STATES, STOP_CAUSES, FailureReason, NodeState, RestartOn

#: Bumped on any incompatible change; the handshake refuses a mismatch.
PROTOCOL_VERSION = 1

# Limits on individual fields. Each bounds what one peer can make the other store.
#: Job ids appear in logs, URLs and SQL rows; 128 characters is plenty for a UUID plus a name.
MAX_ID_LEN = 128
#: Hosts are DNS names or IP literals (RFC 1035 caps names at 253 octets).
MAX_HOST_LEN = 255
#: Tracebacks are kept for the driver and dashboard; the tail is what matters, 64 KiB of it.
MAX_ERROR_LEN = 64 * 1024
#: Short free-text fields: reasons, names, task ids, metadata values.
MAX_TEXT_LEN = 1024
#: A TensorFlow cluster is bounded by what one coordinator can hand a spec to (see DESIGN.md).
MAX_NODES_PER_JOB = 100_000
#: A job restarts its cluster at most this often (``JobSpec.max_restarts``): generations are
#: kept in each slot's history and the job's timeline, both bounded.
MAX_RESTARTS = 100
#: A node's credential for its slot (see ``Register``): 32 bytes, as hex.
CREDENTIAL_HEX = 64
#: GPUs a single node may claim (a DGX has 8-16; leave room).
MAX_GPUS_PER_NODE = 64
#: Metadata entries per node (TensorBoard URL, pid, Spark task attempt, ...).
MAX_META_ENTRIES = 32
#: Figures one progress report carries (step, loss, examples/s, ...).
MAX_FIGURES = 16
#: Resource figures one progress report carries: what the node measured of its own work
#: (``cpu_percent``, ``rss_bytes``, ``processes``), a few, never the user's.
MAX_USAGE = 8
#: A figure's name: short, plain (it becomes a chart's label and a JSON key).
FIGURE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,31}")
#: Log lines one message carries, and how long each may be (the node cuts longer ones).
MAX_LOG_LINES = 256
MAX_LOG_LINE = MAX_TEXT_LEN
#: Log lines one answer to ``get_logs`` carries at most (a frame, not a flood).
MAX_LOGS_REPLY = 2000
LOG_STREAMS = ("stdout", "stderr")
#: Control characters a log line may not hold (tabs may): the node escapes them, so a
#: line can neither forge another line nor drive the terminal that shows it.
LOG_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: No single wait may outlive a week; longer is a bug in the caller, not a plan.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: Request ids are unsigned 32-bit so they fit msgpack's compact int forms.
MAX_REQUEST_ID = 2**32 - 1

ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: Roles in TensorFlowOnSpark's assignment order: ps, then chief/master, evaluator, workers.
ROLE_ORDER = ("ps", "chief", "master", "evaluator", "worker")
#: Any other TensorFlow job name (tfmesos2 takes whatever its ``Job(name=...)`` says) is a
#: custom role: what TensorFlow accepts in a device name (``/job:NAME/task:0``). Custom roles
#: come after the known ones in a job spec, in any order among themselves.
ROLE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
MAX_ROLE_LEN = 64
#: Roles of which a cluster holds at most one task.
SINGLETON_ROLES = frozenset({"chief", "master", "evaluator"})
CLIENT_ROLES = ("node", "driver", "admin")
#: Who may say hello: a coordinator's clients, and a Spark task feeding a node's feed port.
FEEDER_ROLE = "feeder"
HELLO_ROLES = (*CLIENT_ROLES, FEEDER_ROLE)
NODE_REPORT_STATES = REPORT_STATES


# -- field checks ------------------------------------------------------------------------
# Each returns None or raises ValueError with a message naming what is wrong.


def _text(max_len: int, *, empty: bool = True) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not isinstance(v, str):
            raise ValueError(f"must be a string, not {type(v).__name__}")
        if len(v) > max_len:
            raise ValueError(f"is {len(v)} characters long; the limit is {max_len}")
        if not empty and not v:
            raise ValueError("must not be empty")

    return check


# Built once: these run for every field of every frame, on both sides of the wire.
_id_text = _text(MAX_ID_LEN, empty=False)
_host_text = _text(MAX_HOST_LEN, empty=False)
_gpu_text = _text(MAX_TEXT_LEN, empty=False)
_meta_key = _text(64, empty=False)
_meta_text = _text(MAX_TEXT_LEN)


def _ident(v: Any) -> None:
    if type(v) is str and v in _GOOD_IDS:
        return
    _id_text(v)
    if not ID_RE.fullmatch(v):
        raise ValueError(f"{v!r} must be letters, digits, '.', '_' or '-', starting with a letter or digit")
    if len(_GOOD_IDS) >= MAX_GOOD_IDS:
        _GOOD_IDS.clear()
    _GOOD_IDS.add(v)


#: Identifiers already found valid: nearly every frame names its job, the same few ids over
#: and over. Bounded (emptied when full), so a peer naming ever new ids costs only the check.
_GOOD_IDS: set[str] = set()
MAX_GOOD_IDS = 4096


_HOST_BAD = re.compile(r"[ /\[\]@]")


def _host(v: Any) -> None:
    """A host name or address as it goes into the cluster spec (``host:port``)."""
    _host_text(v)
    # isprintable() is False for every whitespace character but the space itself.
    if not v.isprintable() or _HOST_BAD.search(v):
        raise ValueError(
            f"{v!r} is not a host name or address (no spaces, control characters, '/', '[', ']' or '@')"
        )


def _role(v: Any) -> None:
    """A TensorFlow job name: one of :data:`ROLE_ORDER` or a custom one (:data:`ROLE_RE`)."""
    if not isinstance(v, str) or len(v) > MAX_ROLE_LEN or not ROLE_RE.fullmatch(v):
        raise ValueError(
            f"{v!r} is not a TensorFlow job name (a letter, then letters, digits or '_', "
            f"at most {MAX_ROLE_LEN} characters)"
        )


def role_rank(role: str) -> int:
    """Where a role goes in a job spec: :data:`ROLE_ORDER`, then every custom role."""
    return ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER)


def _opt_ident(v: Any) -> None:
    if v is not None:
        _ident(v)


def _int(lo: int, hi: int) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"must be an integer, not {type(v).__name__}")
        if not lo <= v <= hi:
            raise ValueError(f"is {v}; it must be between {lo} and {hi}")

    _INT_BOUNDS[check] = (lo, hi)
    return check


#: The bounds of each check :func:`_int` made: a message's validator tests a plain int in
#: line (the check itself runs only to word a refusal).
_INT_BOUNDS: dict[Callable[[Any], None], tuple[int, int]] = {}


_request_id = _int(0, MAX_REQUEST_ID)


def _opt_request_id(v: Any) -> None:
    if v is not None:
        _request_id(v)


def _seconds(lo: float = 0.0, hi: float = MAX_TIMEOUT_S) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ValueError(f"must be a number of seconds, not {type(v).__name__}")
        if not (isinstance(v, int) or math.isfinite(v)) or not lo <= v <= hi:
            raise ValueError(f"is {v}; it must be between {lo} and {hi} seconds")

    return check


_HEX_RE = re.compile(r"[0-9a-f]*")


def _credential(v: Any) -> None:
    if not isinstance(v, str) or len(v) not in (0, CREDENTIAL_HEX) or not _HEX_RE.fullmatch(v):
        raise ValueError(f"must be empty or {CREDENTIAL_HEX} lower-case hex digits")


def _bytes(exact: int) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not isinstance(v, bytes) or len(v) != exact:
            raise ValueError(f"must be {exact} bytes")

    return check


_key32 = _bytes(32)


def _owner_key(v: Any) -> None:
    if v != b"":
        _key32(v)


def _blob(v: Any) -> None:
    if not isinstance(v, bytes):
        raise ValueError("must be bytes")


def _choice(options: tuple[str, ...] | frozenset[str]) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if v not in options:
            raise ValueError(f"is {v!r}; expected one of {', '.join(options)}")

    return check


def _bool(v: Any) -> None:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, not {type(v).__name__}")


def _gpus(v: Any) -> None:
    if not isinstance(v, tuple) or len(v) > MAX_GPUS_PER_NODE:
        raise ValueError(f"must be a list of at most {MAX_GPUS_PER_NODE} GPU ids")
    for g in v:
        _gpu_text(g)


def _meta(v: Any) -> None:
    if not isinstance(v, Mapping) or len(v) > MAX_META_ENTRIES:
        raise ValueError(f"must be a map of at most {MAX_META_ENTRIES} entries")
    for k, x in v.items():
        _meta_key(k)
        if isinstance(x, bool) or not isinstance(x, (str, int, float)) or x is None:
            raise ValueError(f"entry {k!r} must be a string or a number")
        if isinstance(x, str):
            _meta_text(x)


def _figures(v: Any, most: int = MAX_FIGURES) -> None:
    if not isinstance(v, Mapping) or not 0 <= len(v) <= most:
        raise ValueError(f"must be a map of at most {most} named numbers")
    for k, x in v.items():
        if not isinstance(k, str) or not FIGURE_RE.fullmatch(k):
            raise ValueError(f"name {k!r} must be a letter then up to 31 letters, digits, '_' or '.'")
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"{k} must be a number, not {type(x).__name__}")
        if isinstance(x, float) and not math.isfinite(x):
            raise ValueError(f"{k} must be a finite number, not {x}")
        if isinstance(x, int) and not -(2**63) <= x < 2**63:
            raise ValueError(f"{k} is out of the 64-bit range")


def _usage(v: Any) -> None:
    _figures(v, MAX_USAGE)


def _log_lines(v: Any) -> None:
    if not isinstance(v, tuple) or not 0 < len(v) <= MAX_LOG_LINES:
        raise ValueError(f"must be a list of 1 to {MAX_LOG_LINES} lines")
    for x in v:
        if not isinstance(x, str) or len(x) > MAX_LOG_LINE:
            raise ValueError(f"must hold strings of at most {MAX_LOG_LINE} characters")
        if LOG_CONTROL_RE.search(x):
            raise ValueError("must not hold line breaks or control characters (escape them)")


def _job_spec(v: Any) -> None:
    if not isinstance(v, JobSpec):
        raise ValueError("must be a job spec")


def _any_map(v: Any) -> None:
    if not isinstance(v, Mapping):
        raise ValueError(f"must be a map, not {type(v).__name__}")


def _f(check: Callable[[Any], None], *, omit_default: bool = False, **kw: Any) -> Any:
    return field(metadata={"check": check, "omit_default": omit_default}, **kw)


# -- the job spec -------------------------------------------------------------------------


#: The encoding of :class:`LaunchSpec` this side writes; it reads no other (a newer driver
#: against an older coordinator gets a clear refusal, not a misread job).
LAUNCH_SPEC_VERSION = 1
#: A task's command: arguments and characters. Generous (a command line, not a script),
#: and small beside the frame limit, since every node's status carries the job spec.
MAX_COMMAND_ARGS = 256
MAX_COMMAND_CHARS = 32 * 1024
#: Resource names a launch spec may ask for, per task.
LAUNCH_RESOURCES = ("cpus", "mem", "gpus")


@dataclass(frozen=True)
class LaunchSpec:
    """How the coordinator's engine launches each node of a job (today: Mesos tasks).

    Travels in :attr:`JobSpec.launch`, typed and versioned, beside the job's roles.

    Attributes:
        resources: per role, in the job's role order, what each task needs:
            ``(("worker", (("cpus", 2.0), ("mem", 4096.0), ("gpus", 1.0))), ...)``. A role
            whose tasks need different amounts is listed once per run of equal tasks, the
            runs one after the other, each with its task count as a third item:
            ``(("ps", ((cpus, 1.0),), 2), ("ps", ((cpus, 4.0),), 1))``.
        command: what each task runs; empty: server mode (a ``tf.distribute.Server``).
        image: the container image; empty: the engine's default.
        attributes: placement constraints (``key:value;key:value``).
    """

    resources: tuple[
        tuple[str, tuple[tuple[str, float], ...]] | tuple[str, tuple[tuple[str, float], ...], int], ...
    ]
    command: tuple[str, ...] = ()
    image: str = ""
    attributes: str = ""
    version: int = LAUNCH_SPEC_VERSION

    def __post_init__(self) -> None:
        try:
            self._validate()
        except ValueError as e:
            raise LocalProtocolError(f"invalid launch spec: {e}") from None

    def _validate(self) -> None:
        if self.version != LAUNCH_SPEC_VERSION:
            raise ValueError(
                f"version {self.version!r} is not {LAUNCH_SPEC_VERSION}; install matching "
                "tfcoord versions on the driver and the coordinator"
            )
        if not isinstance(self.resources, tuple):
            raise ValueError("resources must be a list of [role, [[name, amount], ...]] pairs")
        for item in self.resources:
            if not (isinstance(item, tuple) and len(item) in (2, 3) and isinstance(item[0], str)):
                raise ValueError(f"resources must pair a role with amounts (and a count), not {item!r}")
            role, amounts = item[0], item[1]
            _role(role)
            if len(item) == 3:
                _int(1, MAX_NODES_PER_JOB)(item[2])
            if not isinstance(amounts, tuple) or not all(
                isinstance(a, tuple) and len(a) == 2 and a[0] in LAUNCH_RESOURCES for a in amounts
            ):
                raise ValueError(
                    f"the resources of {role} must be [name, amount] pairs, names "
                    f"{', '.join(LAUNCH_RESOURCES)}"
                )
            for name, amount in amounts:
                if (
                    isinstance(amount, bool)
                    or not isinstance(amount, (int, float))
                    or not 0 <= amount < 2**40
                ):
                    raise ValueError(f"{role} {name} must be a number >= 0, not {amount!r}")
        roles = [item[0] for item in self.resources]
        for i, item in enumerate(self.resources):
            if roles.count(item[0]) > 1 and (
                len(item) != 3 or (item[0] in roles[:i] and roles[i - 1] != item[0])
            ):
                raise ValueError(
                    f"a role listed more than once needs a count in each of its runs, one after the other: {', '.join(roles)}"
                )
        if not isinstance(self.command, tuple) or not all(isinstance(a, str) for a in self.command):
            raise ValueError("command must be a list of strings")
        if len(self.command) > MAX_COMMAND_ARGS or sum(map(len, self.command)) > MAX_COMMAND_CHARS:
            raise ValueError(
                f"command is over {MAX_COMMAND_ARGS} arguments or {MAX_COMMAND_CHARS} characters: "
                "put it in a script (in the image, or fetched with the task) and run that"
            )
        for name in ("image", "attributes"):
            try:
                _text(MAX_TEXT_LEN)(getattr(self, name))
            except ValueError as e:
                raise ValueError(f"{name} {e}") from None

    def needs(self, role: str) -> dict[str, float]:
        """What each task of ``role`` asks for (empty when the spec names no amounts for it);
        the first run's, for a role listed in runs."""
        return dict(next((item[1] for item in self.resources if item[0] == role), ()))

    def runs(self, role: str) -> list[tuple[int | None, dict[str, float]]]:
        """``role``'s runs: (task count, or None for all of the role's tasks; amounts)."""
        return [
            (item[2] if len(item) == 3 else None, dict(item[1])) for item in self.resources if item[0] == role
        ]

    def to_wire(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "resources": [[x[0], [[n, v] for n, v in x[1]], *x[2:]] for x in self.resources],
            "command": list(self.command),
            "image": self.image,
            "attributes": self.attributes,
        }

    @classmethod
    def from_wire(cls, m: Any) -> LaunchSpec:
        if not isinstance(m, Mapping):
            raise LocalProtocolError("invalid launch spec: must be a map")
        extra = set(m) - {f.name for f in dataclasses.fields(cls)}
        if extra:
            raise LocalProtocolError(f"invalid launch spec: unexpected keys {sorted(map(str, extra))}")
        kw = dict(m)
        if isinstance(kw.get("resources"), (list, tuple)):
            kw["resources"] = tuple(
                (x[0], tuple(tuple(a) if isinstance(a, (list, tuple)) else a for a in x[1]), *x[2:])
                if isinstance(x, (list, tuple)) and len(x) in (2, 3) and isinstance(x[1], (list, tuple))
                else x
                for x in kw["resources"]
            )
        if isinstance(kw.get("command"), list):
            kw["command"] = tuple(kw["command"])
        try:
            return cls(**kw)
        except TypeError as e:
            raise LocalProtocolError(f"invalid launch spec: {e}") from None


#: Engines whose nodes the coordinator itself launches: a job of one of them is refused
#: by a coordinator that does not run that engine, rather than left waiting for nodes
#: nobody starts. Every other engine's nodes are started by the submitting side.
COORDINATOR_ENGINES = frozenset({"mesos"})


@dataclass(frozen=True)
class JobSpec:
    """What a driver submits: the cluster template and the job's timing policy.

    ``roles`` pairs each role with its task count, in assignment order (see
    :data:`ROLE_ORDER`); node ``executor_id`` *i* takes the *i*-th slot of that
    template, exactly as TensorFlowOnSpark assigns executors.
    """

    roles: tuple[tuple[str, int], ...]
    #: From submission until every slot has registered (TensorFlowOnSpark's reservation_timeout).
    reservation_timeout_s: float = 600.0
    #: A connected node silent for this long is LOST.
    heartbeat_timeout_s: float = 30.0
    #: A node whose connection dropped and did not come back within this is LOST.
    reconnect_grace_s: float = 3.0
    #: Roles whose failure or loss does not fail the job (e.g. "evaluator").
    tolerate_failure: tuple[str, ...] = ()
    name: str = ""
    #: Who launches the nodes. ``spark``, ``local`` or ``external``: the submitting side
    #: does. An engine in :data:`COORDINATOR_ENGINES` (``mesos``): the coordinator does, and
    #: refuses the job (``no_engine``) unless it runs that engine.
    engine: str = "external"
    #: Free-form labels shown in status (Spark application id, user, ...).
    labels: Mapping[str, str | int | float] = dataclasses.field(default_factory=dict)
    #: How the coordinator's engine launches the nodes; only for a coordinator engine.
    launch: LaunchSpec | None = None
    #: How many times a failed cluster may restart as a new generation (0: never, the job
    #: fails with its first failed or lost node). See :class:`~tfcoord.client.vocab.RestartOn`.
    max_restarts: int = 0
    #: Which failures restart it (``exit-code``: lost nodes and processes ended by a signal).
    restart_on: RestartOn = RestartOn.EXIT_CODE
    #: Each node waits this long after its work stopped before it rejoins the new generation.
    restart_backoff_s: float = 1.0
    #: The job fails once it has run this long since submission, restarts or not (0: no deadline;
    #: Kubeflow TFJob's activeDeadlineSeconds).
    deadline_s: float = 0.0

    def __post_init__(self) -> None:
        if type(self.restart_on) is str and self.restart_on in {r.value for r in RestartOn}:
            object.__setattr__(self, "restart_on", RestartOn(self.restart_on))
        try:
            self._validate()
        except ValueError as e:
            raise LocalProtocolError(f"invalid job spec: {e}") from None

    def _validate(self) -> None:
        if not isinstance(self.roles, tuple) or not self.roles:
            raise ValueError("roles must name at least one role with a count")
        seen: set[str] = set()
        total = 0
        for item in self.roles:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError("each role must be a [name, count] pair")
            role, count = item
            try:
                _role(role)
            except ValueError as e:
                raise ValueError(f"role {e}; roles are {', '.join(ROLE_ORDER)} or custom job names") from None
            if role in seen:
                raise ValueError(f"role {role!r} is listed twice")
            seen.add(role)
            try:
                _int(0, MAX_NODES_PER_JOB)(count)
            except ValueError as e:
                raise ValueError(f"the count of role {role!r} {e}") from None
            if role in SINGLETON_ROLES and count > 1:
                raise ValueError(f"a cluster has at most one {role}, not {count}")
            total += count
        if "chief" in seen and "master" in seen:
            raise ValueError("use either chief or master, not both")
        if total == 0:
            raise ValueError("the cluster has no tasks; give at least one role a count above 0")
        if total > MAX_NODES_PER_JOB:
            raise ValueError(f"{total} tasks is over the limit of {MAX_NODES_PER_JOB}")
        order = [role_rank(r) for r, _ in self.roles]
        if order != sorted(order):
            raise ValueError(
                f"roles must be listed in the order {', '.join(ROLE_ORDER)}, then custom job names"
            )
        for name, check in (
            ("reservation_timeout_s", _seconds(0.001)),
            ("heartbeat_timeout_s", _seconds(0.001)),
            ("reconnect_grace_s", _seconds(0.0)),
            ("name", _text(MAX_TEXT_LEN)),
            ("engine", _text(32)),
            ("labels", _meta),
            ("max_restarts", _int(0, MAX_RESTARTS)),
            ("restart_on", _choice(tuple(r.value for r in RestartOn))),
            ("restart_backoff_s", _seconds(0.0)),
            ("deadline_s", _seconds(0.0)),
        ):
            try:
                check(getattr(self, name))
            except ValueError as e:
                raise ValueError(f"{name} {e}") from None
        for r in self.tolerate_failure:
            if r not in ROLE_ORDER and r not in seen:
                raise ValueError(f"tolerate_failure names unknown role {r!r}")
        if self.launch is not None:
            if not isinstance(self.launch, LaunchSpec):
                raise ValueError("launch must be a LaunchSpec")
            if self.engine not in COORDINATOR_ENGINES:
                raise ValueError(
                    f"launch is for engines the coordinator runs ({', '.join(sorted(COORDINATOR_ENGINES))}), "
                    f"not {self.engine!r}, whose nodes the submitting side starts"
                )
            unknown = {x[0] for x in self.launch.resources} - seen
            if unknown:
                raise ValueError(
                    f"launch gives resources for roles the job does not have: {', '.join(sorted(unknown))}"
                )

    @functools.cached_property
    def size(self) -> int:
        """The number of tasks (computed once: the state machine asks on every registration)."""
        return sum(c for _, c in self.roles)

    def slots(self) -> list[tuple[str, int]]:
        """(role, task index) for each executor id, in executor id order."""
        return [(role, i) for role, count in self.roles for i in range(count)]

    def to_wire(self) -> dict[str, Any]:
        return {
            "roles": [[r, c] for r, c in self.roles],
            "reservation_timeout_s": self.reservation_timeout_s,
            "heartbeat_timeout_s": self.heartbeat_timeout_s,
            "reconnect_grace_s": self.reconnect_grace_s,
            "tolerate_failure": list(self.tolerate_failure),
            "name": self.name,
            "engine": self.engine,
            "labels": dict(self.labels),
            **({"launch": self.launch.to_wire()} if self.launch is not None else {}),
            # Only when set: a spec without restarts is the same bytes as before generations.
            **(
                {
                    "max_restarts": self.max_restarts,
                    "restart_on": self.restart_on.value,
                    "restart_backoff_s": self.restart_backoff_s,
                }
                if self.max_restarts
                else {}
            ),
            **({"deadline_s": self.deadline_s} if self.deadline_s else {}),
        }

    @classmethod
    def from_wire(cls, m: Any) -> JobSpec:
        if not isinstance(m, Mapping):
            raise LocalProtocolError("invalid job spec: must be a map")
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(m) - known
        if extra:
            raise LocalProtocolError(f"invalid job spec: unexpected keys {sorted(map(str, extra))}")
        kw = dict(m)
        if "roles" in kw:
            if not isinstance(kw["roles"], (list, tuple)):
                raise LocalProtocolError("invalid job spec: roles must be a list of [name, count] pairs")
            kw["roles"] = tuple(tuple(x) if isinstance(x, (list, tuple)) else x for x in kw["roles"])
        if "tolerate_failure" in kw:
            if not isinstance(kw["tolerate_failure"], (list, tuple)):
                raise LocalProtocolError("invalid job spec: tolerate_failure must be a list of roles")
            kw["tolerate_failure"] = tuple(kw["tolerate_failure"])
        if kw.get("launch") is not None:
            kw["launch"] = LaunchSpec.from_wire(kw["launch"])
        try:
            return cls(**kw)
        except TypeError as e:
            raise LocalProtocolError(f"invalid job spec: {e}") from None


def make_roles(
    num_workers: int, num_ps: int = 0, *, chief: str | None = None, evaluator: bool = False
) -> tuple[tuple[str, int], ...]:
    """The role template TensorFlowOnSpark builds: ps, chief/master, evaluator, workers."""
    roles: list[tuple[str, int]] = []
    if num_ps:
        roles.append(("ps", num_ps))
    if chief:
        if chief not in ("chief", "master"):
            raise ValueError(f"chief role must be 'chief' or 'master', not {chief!r}")
        roles.append((chief, 1))
    if evaluator:
        roles.append(("evaluator", 1))
    if num_workers:
        roles.append(("worker", num_workers))
    return tuple(roles)


# -- messages -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    op: ClassVar[str] = ""

    def __post_init__(self) -> None:
        validate = _VALIDATORS.get(type(self))
        if validate is None:
            validate = _VALIDATORS[type(self)] = _validator(type(self))
        validate(self.__dict__)

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"op": self.op}
        omit = _omitted(type(self))
        for name, _ in _checks(type(self), every=True):
            v = getattr(self, name)
            if name in omit and v == omit[name]:
                continue  # left off while it is its default (the decoder fills it in again)
            m[name] = v if type(v) in _WIRE_AS_IS else _to_wire_value(v)
        return m


#: Field values msgpack takes as they are (the common case: skip the conversions).
_WIRE_AS_IS = frozenset({str, int, float, bool, bytes, type(None)})


def _to_wire_value(v: Any) -> Any:
    if isinstance(v, str):  # an enum of the vocabulary: its value, a plain string
        return str.__str__(v)
    if isinstance(v, JobSpec):
        return v.to_wire()
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, Mapping):
        return dict(v)
    return v


#: Per message class: the fields left off the wire while they hold their default (name ->
#: default), so what most messages carry stays as small as before those fields existed.
_OMITTED: dict[type, dict[str, Any]] = {}


def _omitted(cls: type) -> dict[str, Any]:
    found = _OMITTED.get(cls)
    if found is None:
        found = {f.name: f.default for f in dataclasses.fields(cls) if f.metadata.get("omit_default")}
        _OMITTED[cls] = found
    return found


#: With ``every``, fields without a check too (their check is None): the names to_wire sends.
_CHECKS: dict[tuple[type, bool], list[tuple[str, Any]]] = {}


#: Per message class, its fields' checks as one generated function (:func:`_validator`).
_VALIDATORS: dict[type, Callable[[dict[str, Any]], None]] = {}


def _validator(cls: type) -> Callable[[dict[str, Any]], None]:
    """Every check of ``cls``'s fields in straight-line code, made once per class.

    Every frame is validated on both sides of the wire, and a loop over the fields (a
    ``getattr`` each) cost about as much as the checks themselves: a plain int within its
    bounds is tested in line, every other field calls its check. A value some check refuses
    is checked again field by field, so the error names the field.
    """
    checks = _checks(cls)
    ns: dict[str, Any] = {"_refuse": _refuse, "cls": cls}
    body = []
    for i, (name, check) in enumerate(checks):
        ns[f"c{i}"] = check
        bounds = _INT_BOUNDS.get(check)
        if bounds is None:
            body.append(f"c{i}(d[{name!r}])")
        else:
            ns[f"lo{i}"], ns[f"hi{i}"] = bounds
            body += [f"v = d[{name!r}]", f"if type(v) is not int or not lo{i} <= v <= hi{i}: c{i}(v)"]
    src = "def validate(d):\n try:\n" + "".join(f"  {line}\n" for line in body or ["pass"])
    src += " except ValueError:\n  _refuse(cls, d)\n  raise\n"
    # Made here from field names only: no outside input reaches it. Compiled first: see
    # replies._compile (exec() of a string and a Ctrl-C that passes through it).
    exec(compile(src, f"<{cls.__name__} validator>", "exec"), ns)
    validate: Callable[[dict[str, Any]], None] = ns["validate"]
    return validate


def _refuse(cls: type, d: dict[str, Any]) -> None:
    """Raise the refusal of the first field of ``d`` its check refuses, naming the field."""
    for name, check in _checks(cls):
        try:
            check(d[name])
        except ValueError as e:
            raise LocalProtocolError(f"{getattr(cls, 'op', '')}.{name} {e}") from None


def _checks(cls: type, every: bool = False) -> list[tuple[str, Any]]:
    """(field name, check) per field of a message class, computed once per class.

    ``dataclasses.fields`` is slow enough to show in a 10,000-node profile.
    """
    key = (cls, every)
    found = _CHECKS.get(key)
    if found is None:
        fields = dataclasses.fields(cls)
        found = [(f.name, f.metadata.get("check")) for f in fields if every or f.metadata.get("check")]
        _CHECKS[key] = found
    return found


@dataclass(frozen=True)
class Request(Message):
    id: int = _f(_request_id)


# Handshake.


@dataclass(frozen=True)
class Challenge(Message):
    """Server → client, first frame on every connection."""

    op: ClassVar[str] = "challenge"
    version: int = _f(_int(0, 2**16))
    nonce: bytes = _f(_bytes(32))


@dataclass(frozen=True)
class Hello(Message):
    """Client → server: who I am and proof that I hold the key for it.

    ``proof`` is HMAC-SHA256 over the server's nonce, keyed with the coordinator
    secret (driver), the admin secret (admin) or the job's token (node). ``cnonce`` lets
    the client check the server's proof in :class:`Welcome` in turn. A driver sends its
    ``owner`` key (see ``auth``): the jobs it submits are its own, seen and stopped by it
    (and admins) only.
    """

    op: ClassVar[str] = "hello"
    version: int = _f(_int(0, 2**16))
    role: str = _f(_choice(HELLO_ROLES))
    job: str | None = _f(_opt_ident)
    proof: bytes = _f(_bytes(32))
    cnonce: bytes = _f(_bytes(32))
    owner: bytes = _f(_owner_key, default=b"")


@dataclass(frozen=True)
class Welcome(Message):
    op: ClassVar[str] = "welcome"
    proof: bytes = _f(_bytes(32))


# Driver requests.


@dataclass(frozen=True)
class Submit(Request):
    op: ClassVar[str] = "submit"
    job: str = _f(_ident)
    # Like every _f field, job has no default; mypy takes any call for one.
    spec: JobSpec = field(metadata={"check": _job_spec})  # type: ignore[misc]


@dataclass(frozen=True)
class AwaitJob(Request):
    """Answered with the status once the job reaches a terminal state, or a ``timeout`` error at the deadline."""

    op: ClassVar[str] = "await_job"
    job: str = _f(_ident)
    timeout_s: float = _f(_seconds())


@dataclass(frozen=True)
class WatchJob(Request):
    """Answered as soon as the job's version is above ``version`` (any change), or at the deadline.

    With ``reports``, also as soon as a node reported progress figures or usage after the
    status that counted ``reports`` of them (a dashboard's chart, a test awaiting a figure).

    With ``brief`` the answer is the job's summary (counts, the first missing slots) rather
    than its full status: what progress lines need, at a size that does not grow with the job.
    """

    op: ClassVar[str] = "watch_job"
    job: str = _f(_ident)
    version: int = _f(_int(0, 2**62))
    timeout_s: float = _f(_seconds())
    brief: bool = _f(_bool, default=False)
    #: With a status's ``reports`` count (0 or more), progress reports after it answer too:
    #: figures and usage change status without changing ``version``. -1: changes only.
    reports: int = _f(_int(-1, 2**62), default=-1)


@dataclass(frozen=True)
class StopJob(Request):
    op: ClassVar[str] = "stop_job"
    job: str = _f(_ident)
    #: For people: why the job stops (shown as its ``stop_reason``).
    reason: str = _f(_text(MAX_TEXT_LEN))
    dry_run: bool = _f(_bool, default=False)
    #: For programs: a stop requested by someone (``stopped``), forced by the engine
    #: running the nodes giving up (``engine_failed``) or by a fed node whose consumer
    #: stalled (``feed_timeout``); the job's ``reason`` once stopped.
    cause: FailureReason = field(default=FailureReason.STOPPED, metadata={"check": _choice(STOP_CAUSES)})

    def __post_init__(self) -> None:
        if type(self.cause) is str and self.cause in STOP_CAUSES:
            object.__setattr__(self, "cause", FailureReason(self.cause))
        super().__post_init__()


@dataclass(frozen=True)
class Finish(Request):
    """A driver winding its job down (``shutdown(grace_secs=...)``): once every chief, master
    and worker node has succeeded, the job's ps and evaluator nodes get ``serving_grace_s``
    more to end on their own (a final evaluation) before they are told to stop. Without it
    they are told at once. Answered at once with the job's state."""

    op: ClassVar[str] = "finish"
    job: str = _f(_ident)
    serving_grace_s: float = _f(_seconds())


@dataclass(frozen=True)
class Status(Request):
    """One job's status, or a summary of every job when ``job`` is None."""

    op: ClassVar[str] = "status"
    job: str | None = _f(_opt_ident, default=None)


# Node requests. A node acts only within the job its hello named.


@dataclass(frozen=True)
class Register(Request):
    op: ClassVar[str] = "register"
    job: str = _f(_ident)
    executor_id: int = _f(_int(0, MAX_NODES_PER_JOB - 1))
    #: Spark task attempt / Mesos relaunch count; a higher attempt supersedes a lower one.
    attempt: int = _f(_int(0, 2**31))
    #: The address other nodes dial: a name, an IPv4 address or a bare IPv6 one (the
    #: cluster spec brackets it).
    host: str = _f(_host)
    port: int = _f(_int(1, 65535))
    gpus: tuple[str, ...] = _f(_gpus, default=())
    #: Engine-specific identity: Spark "stage.partition.attempt", a Mesos task id, a pid.
    task_id: str = _f(_text(MAX_TEXT_LEN), default="")
    meta: Mapping[str, str | int | float] = _f(_meta, default_factory=dict)
    #: The cluster generation this node joins: -1, the job's current one (a node started
    #: afresh: a first launch, a Spark task retry, a relaunched process); N, a node that
    #: was told to rejoin generation N after a restart. The answer says which it got.
    generation: int = _f(_int(-1, MAX_RESTARTS), default=-1, omit_default=True)
    #: The credential a previous answer to this registration handed the node (a node resending
    #: its registration from a new connection proves it is the same node); "" the first time.
    credential: str = _f(_credential, default="", omit_default=True)


@dataclass(frozen=True)
class NodeRequest(Request):
    job: str = _f(_ident)
    executor_id: int = _f(_int(0, MAX_NODES_PER_JOB - 1))
    attempt: int = _f(_int(0, 2**31))
    #: The generation the node registered in: a message of an older one is refused.
    #: (Keyword-only: the requests below add fields without defaults.)
    generation: int = _f(_int(0, MAX_RESTARTS), default=0, kw_only=True, omit_default=True)
    #: The credential the node's registration answered with: a node speaking from another
    #: connection than the one it registered on (it reconnected) proves with it that it is
    #: the slot's node. "" from the registering connection itself.
    credential: str = _f(_credential, default="", kw_only=True, omit_default=True)


@dataclass(frozen=True)
class AwaitCluster(NodeRequest):
    """Answered with a :class:`ClusterReply` once every slot of the job has registered."""

    op: ClassVar[str] = "await_cluster"
    timeout_s: float = _f(_seconds(), default=600.0)


@dataclass(frozen=True)
class Report(NodeRequest):
    op: ClassVar[str] = "report"
    state: NodeState = field(default=NodeState.RUNNING, metadata={"check": _choice(REPORT_STATES)})
    error: str = _f(_text(MAX_ERROR_LEN), default="")
    meta: Mapping[str, str | int | float] = _f(_meta, default_factory=dict)
    #: How the node's work ended, for FAILED: its exit status (negative: the signal that
    #: ended it), which decides whether the failure restarts the cluster (RestartOn).
    exit_code: int = _f(_int(-255, 255), default=0, omit_default=True)

    def __post_init__(self) -> None:
        if type(self.state) is str:
            # Nodes before the vocabulary reported in lower case ("running"): the same states.
            upper = self.state.upper()
            if upper in REPORT_STATES:
                object.__setattr__(self, "state", NodeState(upper))
        super().__post_init__()


@dataclass(frozen=True)
class Heartbeat(NodeRequest):
    """Answered at once with ``{"stop": bool, "reason": str}``.

    ``meta`` updates what the node shows about itself (its TensorBoard URL once
    TensorBoard answers, progress figures); most heartbeats carry none.
    """

    op: ClassVar[str] = "heartbeat"
    meta: Mapping[str, str | int | float] = _f(_meta, default_factory=dict)


@dataclass(frozen=True)
class Progress(NodeRequest):
    """What a node's work reports about itself (``ctx.report(step=..., loss=...)``), answered at once.

    Not journaled: figures are for watching a run, and a restarted coordinator simply
    shows the next ones. The node coalesces them (see ``tfcoord.node.reporting``); the
    coordinator keeps a bounded series per node.
    """

    op: ClassVar[str] = "progress"
    figures: Mapping[str, int | float] = _f(_figures)
    #: What the node's supervisor measured of its work (``cpu_percent``, ``rss_bytes``, ...),
    #: kept apart from the work's own figures; a report carries figures, usage or both.
    usage: Mapping[str, int | float] = _f(_usage, default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.figures and not self.usage:
            raise LocalProtocolError("progress carries no figures and no usage: send at least one number")


@dataclass(frozen=True)
class NodeLogs(NodeRequest):
    """Lines of output of a node's work, answered at once; never journaled.

    ``dropped`` counts lines the node itself dropped since its last message (it buffers a
    bounded number while the coordinator is slow or away).
    """

    op: ClassVar[str] = "node_logs"
    stream: str = _f(_choice(LOG_STREAMS))
    lines: tuple[str, ...] = _f(_log_lines)
    dropped: int = _f(_int(0, 2**31), default=0)


@dataclass(frozen=True)
class GetLogs(Request):
    """A job's node output: lines numbered ``since`` and later, oldest first, at most ``limit``.

    ``executor_id`` -1: every node's. The answer's ``next`` is the ``since`` of the next call.
    """

    op: ClassVar[str] = "get_logs"
    job: str = _f(_ident)
    executor_id: int = _f(_int(-1, MAX_NODES_PER_JOB - 1), default=-1)
    since: int = _f(_int(0, 2**62), default=0)
    limit: int = _f(_int(1, MAX_LOGS_REPLY), default=MAX_LOGS_REPLY)


@dataclass(frozen=True)
class AwaitStop(NodeRequest):
    """Answered when this node must stop (stop requested, job failed or done), or at the deadline."""

    op: ClassVar[str] = "await_stop"
    timeout_s: float = _f(_seconds(), default=MAX_TIMEOUT_S)


# Replies.


@dataclass(frozen=True)
class Reply(Message):
    op: ClassVar[str] = "reply"
    id: int = _f(_request_id)
    result: Mapping[str, Any] = _f(_any_map, default_factory=dict)


@dataclass(frozen=True)
class ClusterReply(Message):
    """The answer to ``await_cluster``.

    ``spec`` holds the job's cluster spec (``protocol.encode_spec``: msgpack, then
    zlib), encoded once per job: every node of the job receives the very same bytes.
    """

    op: ClassVar[str] = "cluster"
    id: int = _f(_request_id)
    role: str = _f(_role)
    index: int = _f(_int(0, MAX_NODES_PER_JOB - 1))
    spec: bytes = _f(_blob)


@dataclass(frozen=True)
class Error(Message):
    """A refused request (``id`` set) or a connection-level error (``id`` None, then close)."""

    op: ClassVar[str] = "error"
    id: int | None = _f(_opt_request_id)
    code: str = _f(_text(64, empty=False))
    message: str = _f(_text(MAX_ERROR_LEN + MAX_TEXT_LEN))


OPS: dict[str, type[Message]] = {
    cls.op: cls
    for cls in (
        Challenge,
        Hello,
        Welcome,
        Submit,
        AwaitJob,
        WatchJob,
        StopJob,
        Finish,
        Status,
        Register,
        AwaitCluster,
        Report,
        Heartbeat,
        Progress,
        NodeLogs,
        GetLogs,
        AwaitStop,
        Reply,
        ClusterReply,
        Error,
    )
}

#: Which requests each authenticated role may send.
DRIVER_OPS = frozenset({Submit, AwaitJob, WatchJob, StopJob, Finish, Status, GetLogs})
# A node may stop its own job (a fed node whose consumer stalled); the server
# refuses any op of a node connection that names another job.
NODE_OPS = frozenset({Register, AwaitCluster, Report, Heartbeat, Progress, NodeLogs, AwaitStop, StopJob})
ADMIN_OPS = frozenset({AwaitJob, WatchJob, StopJob, Status, GetLogs})  # read and stop, never submit
ALLOWED_OPS = {"driver": DRIVER_OPS, "node": NODE_OPS, "admin": ADMIN_OPS}

_FIELDS = {cls: {f.name: f for f in dataclasses.fields(cls)} for cls in OPS.values()}


def _defaults(cls: type[Message]) -> tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]:
    """A message class's field defaults: (plain values, (name, factory) pairs)."""
    plain = {n: f.default for n, f in _FIELDS[cls].items() if f.default is not dataclasses.MISSING}
    factories = tuple(
        (n, f.default_factory)
        for n, f in _FIELDS[cls].items()
        if f.default_factory is not dataclasses.MISSING
    )
    return plain, factories


#: Per op: (class, field names, plain defaults, default factories, fields sent as lists
#: that are tuples here).
_DECODERS = {
    op: (
        cls,
        frozenset(_FIELDS[cls]),
        *_defaults(cls),
        tuple(n for n in ("gpus", "lines") if n in _FIELDS[cls]),
    )
    for op, cls in OPS.items()
}


def decoder(ops: Mapping[str, type[Message]], wire: str) -> Callable[[Any], Message]:
    """A ``decode`` for another wire on this framing (the data feed, TensorFlowOnSpark's
    reservations): its op table, its name in errors. Fields are checked as when built.

    The returned function raises RemoteProtocolError for a frame that is not a map, an
    unknown op, unexpected or missing keys and bad field values.
    """
    fields = {cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in ops.values()}

    def decode(obj: Any) -> Message:
        if not isinstance(obj, dict):
            raise RemoteProtocolError(f"a {wire} frame must hold a map, not {type(obj).__name__}")
        op = obj.get("op")
        cls = ops.get(op) if isinstance(op, str) else None
        if cls is None:
            raise RemoteProtocolError(f"unknown {wire} op {op!r}")
        kw = {k: v for k, v in obj.items() if k != "op"}
        extra = set(kw) - fields[cls]
        if extra:
            raise RemoteProtocolError(f"{op} has no field {sorted(map(str, extra))[0]!r}")
        try:
            return cls(**kw)
        except LocalProtocolError as e:
            raise RemoteProtocolError(str(e)) from None
        except TypeError:
            raise RemoteProtocolError(f"{op} is missing fields") from None

    return decode


def decode(m: Any) -> Message:
    """Build a message from a map received from the peer.

    Every field is checked exactly as when a message is built (``__post_init__``); only
    the generated ``__init__`` is skipped. A frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``, which cost more than all of a frame's checks:
    here the fields go into the new message's ``__dict__`` at once, then it is validated.

    Raises:
        RemoteProtocolError: unknown op, missing or unexpected keys, bad field values.
    """
    if not isinstance(m, dict):
        raise RemoteProtocolError(f"a frame must hold a map, not {type(m).__name__}")
    op = m.get("op")
    found = _DECODERS.get(op) if isinstance(op, str) else None
    if found is None:
        raise RemoteProtocolError(f"unknown op {op!r}")
    cls, names, plain, factories, sequences = found
    kw = {**plain, **m}
    del kw["op"]
    if not names.issuperset(kw):
        unknown = next(k for k in m if k != "op" and (not isinstance(k, str) or k not in names))
        raise RemoteProtocolError(f"{op} has no field {unknown!r}")
    for name, factory in factories:
        if name not in kw:
            kw[name] = factory()
    if len(kw) != len(names):  # every key is a field: some field is missing
        raise RemoteProtocolError(f"{op} is missing {', '.join(n for n in _FIELDS[cls] if n not in kw)}")
    if cls is Submit:
        try:
            kw["spec"] = JobSpec.from_wire(kw["spec"])
        except ProtocolError as e:
            raise RemoteProtocolError(str(e)) from None
    for k in sequences:
        if type(kw[k]) is list:
            kw[k] = tuple(kw[k])
    msg = object.__new__(cls)
    msg.__dict__.update(kw)
    try:
        msg.__post_init__()
    except LocalProtocolError as e:
        raise RemoteProtocolError(str(e)) from None
    except TypeError:  # an unhashable value where a choice was expected
        raise RemoteProtocolError(f"{op} has a field of the wrong type") from None
    return msg
