"""The coordinator's answers, typed once for every side: built by the coordinator, decoded by
the clients, checked against the HTTP API's document.

After h11, whose client and server share one set of event classes, and Kubernetes, whose
OpenAPI document comes from its Go types: each kind of answer is one frozen dataclass here.
The coordinator's state machine builds them and sends :meth:`Answer.to_wire`; the blocking
clients turn a reply's result map back into the same class with :meth:`Answer.from_wire`;
``tests/unit/test_openapi.py`` checks ``coordinator/openapi.json`` against their fields.
:data:`ANSWERS` says which class answers which request.

How a field crosses the wire follows from its type alone, through one table of codecs
(:func:`_codec`): scalars as they are, enums as their values, tuples as lists, nested answers
as maps. Decoding checks every field: a result that is not a map, lacks a field or holds a
value of the wrong type is a :class:`~tfcoord.client.errors.RemoteProtocolError`, raised where
it arrived rather than as a ``KeyError`` somewhere downstream. Fields with a default may be
absent (coordinators before them sent none); keys this version does not know are ignored,
so a newer coordinator's additions do not break an older client.

Each answer is also a read-only mapping over its wire form (``wire``): the form ``tfcoord
status --json`` prints and that programs written against tfcoord 0.1's dictionaries read;
code in tfcoord itself reads the attributes.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from .errors import RemoteProtocolError, TfcoordError
from .vocab import FailureReason, JobState, NodeState

_A = TypeVar("_A", bound="Answer")

#: Node metadata written by the node runtime: the TensorBoard URL (pushed once TensorBoard
#: answers) and what map_fun returned (``result.NAME`` per entry of the dict it returned).
TENSORBOARD_META = "tensorboard_url"
#: ... and TensorBoard's process id, from registration on.
TENSORBOARD_PID_META = "tensorboard_pid"
RESULT_META = "result."

#: A job status's two forms (see :class:`JobStatus`): the fields a field's ``form`` names
#: are on the wire only in that form.
FULL, BRIEF = "full", "brief"


# -- the codecs: how each type of field crosses the wire ---------------------------------


@dataclass(frozen=True)
class _Codec:
    #: None: the value crosses as it is (most fields: no call at all on the hot path).
    encode: Callable[[Any], Any] | None
    decode: Callable[[Any], Any]


def _enum_value(v: Any) -> Any:
    return v.value if isinstance(v, enum.Enum) else v


def _as(kind: type, what: str) -> Callable[[Any], Any]:
    """A check that a value is a ``kind`` (and no bool stands for an integer)."""

    def check(v: Any) -> Any:
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
            raise TypeError(f"expected {what}, got {type(v).__name__}")
        return v

    return check


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"expected a number, got {type(v).__name__}")
    return float(v)


def _same(v: Any) -> Any:
    return v


def _codec(tp: Any) -> _Codec:
    """How a field of type ``tp`` is encoded and checked: the one table every answer uses."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return _Codec(None, _same)
    if tp is bool:
        return _Codec(None, _as(bool, "true or false"))
    if tp is int:
        return _Codec(None, _as(int, "an integer"))
    if tp is float:
        return _Codec(None, _number)
    if tp is str:
        return _Codec(None, _as(str, "a string"))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        enum_type: type[enum.Enum] = tp
        return _Codec(_enum_value, lambda v: enum_type(_as(str, "a string")(v)))
    if isinstance(tp, type) and issubclass(tp, Answer):
        answer_type: type[Answer] = tp
        return _Codec(answer_type.to_wire, answer_type.from_wire)
    if origin in (typing.Union, types.UnionType):
        if set(args) == {int, float}:
            return _Codec(None, lambda v: v if isinstance(v, int) and not isinstance(v, bool) else _number(v))
        inner = _codec(next(a for a in args if a is not type(None)))
        assert len(args) == 2 and type(None) in args, tp
        enc = inner.encode
        return _Codec(
            None if enc is None else (lambda v: None if v is None else enc(v)),
            lambda v: None if v is None else inner.decode(v),
        )
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _codec(args[0])
        return _Codec(_each(item.encode), lambda v: tuple(item.decode(x) for x in _seq(v)))
    if origin is tuple:
        items = [_codec(a) for a in args]

        def fixed(v: Any) -> tuple[Any, ...]:
            v = _seq(v)
            if len(v) != len(items):
                raise ValueError(f"expected {len(items)} items, got {len(v)}")
            return tuple(c.decode(x) for c, x in zip(items, v, strict=True))

        encoders = [c.encode or _same for c in items]
        if all(c.encode is None for c in items):
            return _Codec(list, fixed)
        return _Codec(lambda v: [e(x) for e, x in zip(encoders, v, strict=True)], fixed)
    if origin is list:
        item = _codec(args[0])
        return _Codec(_each(item.encode), lambda v: [item.decode(x) for x in _seq(v)])
    if origin is Mapping:
        value = _codec(args[1])

        def mapping(v: Any) -> dict[str, Any]:
            if not isinstance(v, Mapping):
                raise TypeError(f"expected a map, got {type(v).__name__}")
            return {_as(str, "a string key")(k): value.decode(x) for k, x in v.items()}

        venc = value.encode
        return _Codec(dict if venc is None else (lambda v: {k: venc(x) for k, x in v.items()}), mapping)
    raise TypeError(f"no wire form for {tp!r}")


def _each(encode: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """A list's encoder from its items' (a plain copy when they cross as they are)."""
    if encode is None:
        return list
    return lambda v: [encode(x) for x in v]


def _seq(v: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"expected a list, got {type(v).__name__}")
    return v


@dataclass(frozen=True)
class WireField:
    """One field of an answer as it crosses the wire (see :meth:`Answer.wire_fields`)."""

    name: str
    #: The field's Python type (what its codec follows).
    type: Any
    codec: _Codec
    #: May it be absent (it has a default)?
    optional: bool
    #: The job status form it belongs to (``full`` or ``brief``), or None for every form.
    form: str | None
    #: Left off the wire when None (a field a form of the answer does not carry).
    omit_none: bool
    #: Left off the wire when it is its default (a field only some answers need to carry);
    #: then ``default`` is that value.
    omit_default: bool = False
    default: Any = None
    #: Left off the wire whenever the field of this name is (two fields that go together).
    omit_with: str | None = None


def _wire_meta(
    *,
    form: str | None = None,
    omit_none: bool = False,
    omit_default: bool = False,
    omit_with: str | None = None,
) -> dict[str, Any]:
    return {"form": form, "omit_none": omit_none, "omit_default": omit_default, "omit_with": omit_with}


def _compile(name: str, fields: tuple[WireField, ...]) -> Callable[[Answer], dict[str, Any]]:
    """An encoder for these fields: ``out[name] = value`` per field, with its codec where it
    has one and its rule for being left off (see :class:`WireField`)."""
    env: dict[str, Any] = {}
    lines = ["def encode(self):", "    d = self.__dict__", "    out = {}"]
    for i, f in enumerate(fields):
        value = f"d[{f.name!r}]"
        if f.codec.encode is not None:
            env[f"e{i}"] = f.codec.encode
            value = f"e{i}({value})"
        test = []
        if f.omit_none:
            test.append(f"d[{f.name!r}] is not None")
        if f.omit_default:
            env[f"x{i}"] = f.default
            test.append(f"d[{f.name!r}] != x{i}")
        if f.omit_with is not None:
            test.append(f"{f.omit_with!r} in out")
        if test:
            lines += [f"    if {' and '.join(test)}:", f"        out[{f.name!r}] = {value}"]
        else:
            lines.append(f"    out[{f.name!r}] = {value}")
    lines.append("    return out")
    exec("\n".join(lines), env)  # code made here from field names only, as dataclasses do
    encode: Callable[[Answer], dict[str, Any]] = env["encode"]
    encode.__qualname__ = f"{name}.to_wire"
    return encode


# -- the base ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class Answer(Mapping[str, Any]):
    """A typed answer that also reads as the map it crosses the wire as (equal to it, too)."""

    _fields: ClassVar[tuple[WireField, ...] | None] = None
    _encoders: ClassVar[dict[str | None, Callable[[Answer], dict[str, Any]]] | None] = None

    # -- the wire form --

    @classmethod
    def wire_fields(cls) -> tuple[WireField, ...]:
        """This answer's fields, in wire order, each with its codec."""
        if cls.__dict__.get("_fields") is None:
            hints = typing.get_type_hints(cls)
            cls._fields = tuple(
                WireField(
                    f.name,
                    hints[f.name],
                    _codec(hints[f.name]),
                    f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
                    f.metadata.get("form"),
                    bool(f.metadata.get("omit_none")),
                    bool(f.metadata.get("omit_default")),
                    None if f.default is dataclasses.MISSING else f.default,
                    f.metadata.get("omit_with"),
                )
                for f in dataclasses.fields(cls)
            )
        fields = cls.__dict__["_fields"]
        assert fields is not None
        return fields  # type: ignore[no-any-return]

    def form(self) -> str | None:
        """Which form of the answer this is (only a job status has two)."""
        return None

    @classmethod
    def _encoder(cls, form: str | None) -> Callable[[Answer], dict[str, Any]]:
        """The function that encodes this class's ``form``, made once per class and form
        (as dataclasses make ``__init__``): straight-line code, one dict entry per field,
        since the state machine encodes a status of 10,000 nodes in one event."""
        encoders: dict[str | None, Callable[[Answer], dict[str, Any]]] | None = cls.__dict__.get("_encoders")
        if encoders is None:
            encoders = {}
            cls._encoders = encoders
        encoder = encoders.get(form)
        if encoder is None:
            encoder = encoders[form] = _compile(
                cls.__name__, tuple(f for f in cls.wire_fields() if f.form is None or f.form == form)
            )
        return encoder

    def to_wire(self) -> dict[str, Any]:
        """The map the coordinator sends as the reply's result."""
        return self._encoder(self.form())(self)

    @classmethod
    def from_wire(cls: type[_A], wire: Any) -> _A:
        """Build from a reply's result map.

        Raises:
            RemoteProtocolError: it is not a map, a field is missing or holds a value of the
                wrong type.
        """
        if not isinstance(wire, Mapping):
            raise RemoteProtocolError(f"a {cls.__name__} must be a map, not {type(wire).__name__}")
        kw: dict[str, Any] = {}
        for f in cls.wire_fields():
            if f.name in wire:
                try:
                    kw[f.name] = f.codec.decode(wire[f.name])
                except (TypeError, ValueError) as e:
                    raise RemoteProtocolError(
                        f"the coordinator sent a malformed {cls.__name__}: field {f.name!r}: {e}"
                    ) from None
            elif not f.optional:
                raise RemoteProtocolError(
                    f"the coordinator sent a malformed {cls.__name__}: no field {f.name!r}"
                )
        answer = cls(**cls._derived(wire, kw))
        object.__setattr__(answer, "_wire", wire)
        return answer

    @classmethod
    def _derived(cls, wire: Mapping[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
        """The constructor's arguments from the decoded fields (a form may leave some to work out)."""
        return kw

    @classmethod
    def of(cls: type[_A], /, **values: Any) -> _A:
        """Build from every field's value, without the dataclass's ``__init__``: for the
        coordinator's answers made by the thousand (a status's nodes), where a frozen
        ``__init__`` (one ``object.__setattr__`` per field) doubled the cost of a status."""
        answer = cls.__new__(cls)
        answer.__dict__.update(values)
        return answer

    #: The name ``decode`` of tfcoord 0.1's answers.
    decode = from_wire

    # -- the mapping over the wire form --

    @property
    def wire(self) -> Mapping[str, Any]:
        """The map this answer was decoded from, or that it is sent as."""
        w: Mapping[str, Any] | None = self.__dict__.get("_wire")
        if w is None:
            w = self.to_wire()
            object.__setattr__(self, "_wire", w)
        return w

    def __getitem__(self, key: str) -> Any:
        return self.wire[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.wire)

    def __len__(self) -> int:
        return len(self.wire)


# -- the answers ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class Ack(Answer):
    """The answer to ``progress`` and ``node_logs``: taken, nothing to say."""


@dataclass(frozen=True, eq=False, kw_only=True)
class Submitted(Answer):
    """The answer to ``submit``: ``created`` is False when the same job was submitted before."""

    job: str
    state: JobState
    created: bool


@dataclass(frozen=True, eq=False, kw_only=True)
class NodeStatus(Answer):
    """One node of a job as the coordinator sees it (a job status's ``nodes`` and ``history``)."""

    executor_id: int
    attempt: int
    role: str
    index: int
    state: NodeState
    host: str
    port: int
    gpus: tuple[str, ...]
    task_id: str
    #: What the node says about itself: TensorBoard URL, child pid, feed address, results.
    meta: Mapping[str, Any]
    registered_at: float
    last_seen: float
    ended_at: float | None
    #: Its error text (a traceback), or why it was lost or stopped.
    error: str
    connected: bool
    #: The cluster generation it belongs to (one more each time the job restarted).
    generation: int = 0
    #: How its work ended, as it reported (negative: the signal that ended it).
    exit_code: int = 0
    #: The latest progress figures its work reported (``ctx.report``); None for an earlier
    #: attempt of its slot (``history``), and from a coordinator that does not keep them.
    figures: Mapping[str, int | float] | None = field(default=None, metadata=_wire_meta(omit_none=True))
    #: What its supervisor last measured of its work while it ran: ``cpu_percent`` (100 is
    #: one core), ``rss_bytes``, ``processes``; empty before the first and once it ended.
    usage: Mapping[str, int | float] | None = field(default=None, metadata=_wire_meta(omit_none=True))

    @property
    def name(self) -> str:
        """``role:index``, the slot's name in the cluster spec."""
        return f"{self.role}:{self.index}"

    @property
    def live(self) -> bool:
        return not self.state.terminal

    @property
    def results(self) -> dict[str, Any]:
        """What the node's function returned (its ``result.*`` metadata), by name."""
        return {k.removeprefix(RESULT_META): v for k, v in self.meta.items() if k.startswith(RESULT_META)}

    @property
    def tensorboard_url(self) -> str | None:
        url = self.meta.get(TENSORBOARD_META)
        return str(url) if url else None


@dataclass(frozen=True, eq=False, kw_only=True)
class Restart(Answer):
    """One restart of a job's cluster (``JobSpec.max_restarts``): what failed, and how."""

    #: The generation the restart started.
    generation: int
    #: When (unix time).
    at: float
    #: The node whose failure restarted it: ``role:index (executor N, host H, ...)``.
    node: str
    executor_id: int
    #: What happened to it, for people: "was killed by SIGKILL", "was lost (...)".
    cause: str
    #: Its work's exit status (negative: the signal that ended it); 0 when it was lost.
    exit_code: int
    #: Whether it was lost (heartbeats or connection gone) rather than reporting a failure.
    lost: bool


def _full(**kw: Any) -> Any:
    return field(**kw, metadata=_wire_meta(form=FULL))


def _brief(**kw: Any) -> Any:
    return field(**kw, metadata=_wire_meta(form=BRIEF))


@dataclass(frozen=True, eq=False, kw_only=True)
class JobStatus(Answer):
    """A job's status: full (``status``, ``await_job``, a full ``watch``) or ``brief``.

    A brief status has no nodes, history, timeline or cluster, and names only the first
    missing slots; its size does not grow with the job. ``running`` and ``missing_count``
    count for both forms (on the wire only in the brief one; worked out from the full one).
    """

    job: str
    name: str
    engine: str
    state: JobState
    #: Bumped on every change a watcher could see.
    version: int
    #: Progress reports (figures, usage) taken so far: they change status, not ``version``.
    reports: int = _full(default=0)
    size: int
    #: [role, count] pairs in assignment order.
    roles: tuple[tuple[str, int], ...] = _full(default=())
    labels: Mapping[str, Any] = _full(default_factory=dict)
    #: How the coordinator's engine launches each node (``messages.LaunchSpec``'s wire form),
    #: or None for engines that launch their own.
    launch: Mapping[str, Any] | None = _full(default=None)
    submitted_at: float
    ended_at: float | None
    #: Why it failed, for people (names the node and carries its traceback).
    error: str
    #: Why it was stopped, for people.
    stop_reason: str
    #: Why it failed or stopped, for programs (coordinators before failure reasons sent none).
    reason: FailureReason = FailureReason.NONE
    registered: int
    #: Nodes now RUNNING.
    running: int = _brief(default=0)
    #: Missing slots, each with the last thing seen of it (brief: the first few).
    missing: tuple[str, ...]
    missing_count: int = _brief(default=0)
    nodes: tuple[NodeStatus, ...] = _full(default=())
    #: Earlier attempts of slots (superseded, or lost while reserving).
    history: tuple[NodeStatus, ...] = _full(default=())
    #: The timeline: (unix time, text), oldest first.
    events: tuple[tuple[float, str], ...] = _full(default=())
    #: Timeline lines dropped from its front (it is bounded).
    events_dropped: int = _full(default=0)
    #: Role → addresses once the cluster formed, else None.
    cluster: Mapping[str, list[str]] | None = _full(default=None)
    brief: bool = _brief(default=False)
    #: The cluster's generation: 0, one more each restart.
    generation: int = 0
    #: The restarts the job may make (``JobSpec.max_restarts``).
    max_restarts: int = 0
    #: Each restart, oldest first (brief: only the newest).
    restarts: tuple[Restart, ...] = ()
    #: How many restarts there were (on the wire only in the brief form).
    restart_count: int = _brief(default=0)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def why(self) -> str:
        """What ended it, for people: the error, else the stop reason."""
        return self.error or self.stop_reason

    def form(self) -> str:
        return BRIEF if self.brief else FULL

    @classmethod
    def _derived(cls, wire: Mapping[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
        if not kw.get("brief", False):
            kw["running"] = sum(1 for n in kw.get("nodes", ()) if n.state == NodeState.RUNNING)
            kw["missing_count"] = len(kw["missing"])
            kw["restart_count"] = len(kw.get("restarts", ()))
        elif kw.get("running") is None or kw.get("missing_count") is None:
            raise RemoteProtocolError(
                "the coordinator sent a malformed JobStatus: a brief one without its counts"
            )
        return kw


@dataclass(frozen=True, eq=False, kw_only=True)
class JobSummary(Answer):
    """One line of ``status`` without a job: every job the caller may see."""

    job: str
    name: str
    engine: str
    state: JobState
    size: int
    registered: int
    submitted_at: float
    ended_at: float | None
    error: str


@dataclass(frozen=True, eq=False, kw_only=True)
class JobList(Answer):
    """``status`` without a job."""

    jobs: tuple[JobSummary, ...]


@dataclass(frozen=True, eq=False, kw_only=True)
class StopResult(Answer):
    """The answer to a driver's ``stop``: the job's state after it, and its live nodes."""

    state: JobState
    job: str
    #: The nodes told to stop (or that would be, with ``dry_run``), described for people.
    nodes: tuple[str, ...]
    dry_run: bool


@dataclass(frozen=True, eq=False, kw_only=True)
class Finished(Answer):
    """The answer to a driver's ``finish``: the job's state and its serving nodes' grace."""

    job: str
    state: JobState
    serving_grace_s: float


@dataclass(frozen=True, eq=False, kw_only=True)
class Registration(Answer):
    """The answer to ``register``: the slot this node holds."""

    job: str
    role: str
    index: int
    size: int
    heartbeat_timeout_s: float
    #: The job's state.
    state: JobState
    #: The cluster generation the node joined, the restarts the job made before it, and the
    #: most it may make (a node whose work succeeded stays until the job ends while it may).
    generation: int = 0
    restarts: int = 0
    max_restarts: int = 0
    #: This node's credential for its slot (hex): it proves the node is the slot's holder
    #: when it speaks from another connection (after a reconnect). Never shown anywhere.
    credential: str = field(default="", repr=False)


@dataclass(frozen=True, eq=False, kw_only=True)
class Reported(Answer):
    """The answer to ``report``: the node's state and its job's after it."""

    state: NodeState
    job_state: JobState


@dataclass(frozen=True, eq=False, kw_only=True)
class StopAnswer(Answer):
    """The answer to ``heartbeat`` and ``await_stop``: must this node stop, and why."""

    stop: bool
    reason: str
    job_state: JobState
    #: Told to stop because the job restarted its cluster: the generation to rejoin (-1: no
    #: restart, a plain stop), after ``backoff_s``.
    restart: int = field(default=-1, metadata=_wire_meta(omit_default=True))
    backoff_s: float = field(default=0.0, metadata=_wire_meta(omit_with="restart"))


@dataclass(frozen=True, eq=False, kw_only=True)
class LogSource(Answer):
    """A node whose output a :class:`Logs` answer holds lines of."""

    executor_id: int
    role: str
    index: int
    #: Its lines no longer kept (the oldest go first), or dropped by the node itself.
    dropped: int


@dataclass(frozen=True, eq=False, kw_only=True)
class Logs(Answer):
    """The answer to ``get_logs`` (and the HTTP API's ``/logs``): lines from ``since`` on."""

    job: str
    state: JobState
    nodes: tuple[LogSource, ...]
    #: (line number, unix time, executor id, stream, text), oldest first.
    lines: tuple[tuple[int, float, int, str, str], ...]
    #: The ``since`` of the next call.
    next: int


@dataclass(frozen=True, eq=False, kw_only=True)
class NodeSeries(Answer):
    """One node's progress points in a :class:`Series`."""

    executor_id: int
    role: str
    index: int
    #: (unix time, figures), oldest first.
    points: tuple[tuple[float, Mapping[str, int | float]], ...]


@dataclass(frozen=True, eq=False, kw_only=True)
class Series(Answer):
    """A job's progress points per node (the HTTP API's ``/progress``)."""

    job: str
    state: JobState
    nodes: tuple[NodeSeries, ...]


#: Which answer each request op gets (``status`` without a job: a :class:`JobList`;
#: ``await_cluster``: a ``ClusterReply`` message of its own, not a map).
ANSWERS: Mapping[str, type[Answer]] = {
    "submit": Submitted,
    "status": JobStatus,
    "await_job": JobStatus,
    "watch_job": JobStatus,
    "stop_job": StopResult,
    "finish": Finished,
    "register": Registration,
    "report": Reported,
    "heartbeat": StopAnswer,
    "await_stop": StopAnswer,
    "progress": Ack,
    "node_logs": Ack,
    "get_logs": Logs,
}


# -- outcomes ------------------------------------------------------------------------------


class JobEnded(TfcoordError):
    """A job ended other than SUCCEEDED (or will not get where the caller waited for it).

    ``status`` is its last status (None when there was none); ``reason`` says why as data,
    so callers never search the message. (Here rather than in ``errors``, which every module
    of the wire layer imports: the error carries an answer.)
    """

    def __init__(
        self,
        job: str,
        message: str,
        status: JobStatus | None = None,
        reason: FailureReason | None = None,
    ) -> None:
        super().__init__(message)
        self.job = job
        self.status = status
        if reason is None:
            reason = status.reason if status is not None else FailureReason.NONE
        self.reason = reason


class JobFailed(JobEnded):
    """A job ended FAILED; the message names the node, its role, host and error text."""


class JobStopped(JobEnded):
    """A job ended STOPPED (a stop was requested) while the caller waited for success."""
