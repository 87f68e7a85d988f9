"""The coordinator's answers, typed once for every side: built by the coordinator, decoded by
the clients, checked against the HTTP API's document.

After h11, whose client and server share one set of event classes, and Kubernetes, whose
OpenAPI document comes from its Go types: each kind of answer is one frozen dataclass here.
The coordinator's state machine builds them and sends :meth:`Answer.to_wire`; the blocking
clients turn a reply's result map back into the same class with :meth:`Answer.from_wire`;
``tests/unit/test_openapi.py`` checks ``coordinator/openapi.json`` against their fields.
Here are the machinery and the answers a node gets (``register``, ``report``, ``heartbeat``,
``await_stop``, ``progress``, ``node_logs``); the answers about jobs, which drivers and
admins ask for, are in :mod:`tfcoord.client.jobreplies`, with :data:`ANSWERS
<tfcoord.client.jobreplies.ANSWERS>` (which class answers which request). Apart because a
node imports this module before it registers, and every answer class built at import costs
the node's start (a Mesos task's readiness waits on it); it never needs a job's status.

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
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .errors import RemoteProtocolError, TfcoordError
from .vocab import FailureReason, JobState, NodeState

if TYPE_CHECKING:
    from .jobreplies import JobStatus

_A = TypeVar("_A", bound="Answer")

#: Node metadata written by the node runtime: the TensorBoard URL (pushed once TensorBoard
#: answers) and what map_fun returned (``result.NAME`` per entry of the dict it returned).
TENSORBOARD_META = "tensorboard_url"
#: ... and TensorBoard's process id, from registration on.
TENSORBOARD_PID_META = "tensorboard_pid"
RESULT_META = "result."


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


def wire_meta(
    *,
    form: str | None = None,
    omit_none: bool = False,
    omit_default: bool = False,
    omit_with: str | None = None,
) -> dict[str, Any]:
    """A field's ``metadata`` saying how it crosses the wire (see :class:`WireField`)."""
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
    # Code made here from field names only, as dataclasses do; compiled first because
    # exec() of a string marks a KeyboardInterrupt that passes through it as unhandled in
    # CPython 3.11, and the process then dies by SIGINT however the program handled it.
    exec(compile("\n".join(lines), f"<{name}.to_wire>", "exec"), env)
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
    restart: int = field(default=-1, metadata=wire_meta(omit_default=True))
    backoff_s: float = field(default=0.0, metadata=wire_meta(omit_with="restart"))


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
