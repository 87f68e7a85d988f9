"""The HTTP API's document (coordinator/openapi.json) says what the reply classes say.

One reply schema serves the coordinator, the clients and the HTTP API: the classes of
``tfcoord.client.replies`` are built by the state machine and decoded by the clients, and
here each schema of the document that shows one of them is compared with it field by field:
the same names, every field the clients need required, a JSON type that holds each field's
values, enums listing the vocabulary's values, nested answers as their own schemas. What the
HTTP API shows differently from the wire is listed below, each with the code that does it.
(``tests/integration/test_http.py`` checks real responses against the same document.)
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tfcoord.client import jobreplies as jr
from tfcoord.client import replies as r
from tfcoord.client.vocab import FailureReason, JobState, NodeState

DOCUMENT = Path(r.__file__).resolve().parents[3] / "coordinator" / "tfcoord" / "coordinator" / "openapi.json"
SCHEMAS: dict[str, Any] = json.loads(DOCUMENT.read_text())["components"]["schemas"]
REF = "#/components/schemas/"

#: Each schema of the document that shows an answer, and the answer (its full form).
SHOWN: dict[str, type[r.Answer]] = {
    "JobSummary": jr.JobSummary,
    "JobList": jr.JobList,
    "JobStatus": jr.JobStatus,
    "Node": jr.NodeStatus,
    "Logs": jr.Logs,
    "Progress": jr.Series,
    "Restart": jr.Restart,
}
#: Answers the document shows inline, in the schema of the answer that holds them.
INLINE: dict[type[r.Answer], tuple[str, str]] = {
    jr.LogSource: ("Logs", "nodes"),
    jr.NodeSeries: ("Progress", "nodes"),
}
#: What the HTTP API adds to an answer (http.py's _node_view): schema -> field -> its type.
HTTP_EXTRAS: dict[str, dict[str, Any]] = {
    "Node": {"last_heartbeat": float, "tensorboard_url": str | None},
}
#: Fields the HTTP API shows in another shape (http.py's job(): timeline lines as objects):
#: (schema, field) -> the schema of each item, whose properties hold the pair's values.
HTTP_ITEMS: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("JobStatus", "events"): ("Event", ("time", "text")),
}
ENUMS: dict[type[enum.Enum], str] = {
    JobState: "JobState",
    NodeState: "NodeState",
    FailureReason: "FailureReason",
}


def resolve(prop: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = prop.get("$ref")
    return SCHEMAS[ref.removeprefix(REF)] if ref else prop


def json_types(prop: Mapping[str, Any]) -> set[str]:
    """The JSON types a property allows (oneOf/anyOf included)."""
    prop = resolve(prop)
    for key in ("oneOf", "anyOf"):
        if key in prop:
            return set().union(*(json_types(p) for p in prop[key]))
    t = prop.get("type")
    if t is None:
        return {"any"}
    return {t} if isinstance(t, str) else set(t)


def check(tp: Any, prop: Mapping[str, Any], where: str) -> None:
    """Does the document's ``prop`` hold every value of Python type ``tp`` as it crosses the wire?"""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        assert "null" in json_types(prop), f"{where}: may be null, the document says {json_types(prop)}"
        rest = [a for a in args if a is not type(None)]
        inner = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
        options = resolve(prop).get("oneOf")
        if options:  # the one that is not null
            prop = next(p for p in options if json_types(p) != {"null"})
        return check(inner, prop, where)
    got = json_types(prop) - {"null"}
    if tp is Any:
        return
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        assert prop.get("$ref") == REF + ENUMS[tp], f"{where}: not the {tp.__name__} schema"
        return
    if isinstance(tp, type) and issubclass(tp, r.Answer):
        ref = prop.get("$ref")
        if ref is not None:
            assert SHOWN.get(ref.removeprefix(REF)) is tp, f"{where}: {ref} does not show {tp.__name__}"
        else:
            compare(tp, prop, where)
        return
    if tp is bool:
        assert got == {"boolean"}, f"{where}: bool, the document says {got}"
    elif tp is int:
        assert got == {"integer"}, f"{where}: int, the document says {got}"
    elif tp is float:
        assert got <= {"number", "integer"} and "number" in got, f"{where}: float, the document says {got}"
    elif tp is str:
        assert got == {"string"}, f"{where}: str, the document says {got}"
    elif set(args) == {int, float}:
        assert "number" in got, f"{where}: a number, the document says {got}"
    elif origin is tuple or origin is list:
        assert got == {"array"}, f"{where}: a list, the document says {got}"
        prop = resolve(prop)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            items = prop["prefixItems"]
            assert len(items) == len(args) == prop["minItems"] == prop["maxItems"], where
            for i, (a, p) in enumerate(zip(args, items, strict=True)):
                check(a, p, f"{where}[{i}]")
        else:
            check(args[0], prop["items"], f"{where}[]")
    elif origin is Mapping:
        assert got == {"object"}, f"{where}: a map, the document says {got}"
        if args[1] is Any:  # a map of its own (a launch spec's wire form): any object holds it
            return
        values = resolve(prop).get("additionalProperties")
        assert values not in (None, False), f"{where}: a map of any keys"
        if values is not True:
            check(args[1], values, f"{where}{{}}")
    else:
        pytest.fail(f"{where}: no JSON form known for {tp!r}")


def _not_none(tp: Any) -> Any:
    rest = tuple(a for a in typing.get_args(tp) if a is not type(None))
    return rest[0] if len(rest) == 1 else typing.Union[rest]  # noqa: UP007


def compare(answer: type[r.Answer], schema: Mapping[str, Any], name: str) -> None:
    """``schema`` shows ``answer`` (its full form) field by field."""
    schema = resolve(schema)
    fields = {f.name: f for f in answer.wire_fields() if f.form in (None, jr.FULL)}
    extras = HTTP_EXTRAS.get(name, {})
    props: Mapping[str, Any] = schema["properties"]
    assert schema.get("additionalProperties") is False, f"{name}: a closed object"
    assert set(props) == set(fields) | set(extras), (
        f"{name}: the document has {sorted(set(props) - set(fields) - set(extras))} "
        f"that {answer.__name__} lacks, lacks {sorted((set(fields) | set(extras)) - set(props))}"
    )
    required = set(schema.get("required", ()))
    needed = {n for n, f in fields.items() if not f.optional}
    assert needed <= required, f"{name}: the clients need {sorted(needed - required)}, not required"
    sent = {n for n, f in fields.items() if not f.omit_none} | set(extras)
    assert required <= sent, (
        f"{name}: requires {sorted(required - sent)}, which the coordinator may leave out"
    )
    for n, f in fields.items():
        if (name, n) in HTTP_ITEMS:
            item_schema, keys = HTTP_ITEMS[(name, n)]
            assert resolve(props[n]).get("items", {}).get("$ref") == REF + item_schema, f"{name}.{n}"
            item_props = SCHEMAS[item_schema]["properties"]
            assert tuple(item_props) == keys, f"{item_schema}: {tuple(item_props)}"
            for key, tp in zip(keys, typing.get_args(typing.get_args(f.type)[0]), strict=True):
                check(tp, item_props[key], f"{item_schema}.{key}")
            continue
        # A field left out when None is absent, never null: its values are the rest.
        tp = _not_none(f.type) if f.omit_none else f.type
        check(tp, props[n], f"{name}.{n}")
    for n, tp in extras.items():
        check(tp, props[n], f"{name}.{n} (HTTP)")


@pytest.mark.parametrize("name", sorted(SHOWN))
def test_the_documents_schema_shows_the_answer_field_by_field(name: str) -> None:
    compare(SHOWN[name], SCHEMAS[name], name)


@pytest.mark.parametrize("answer", sorted(INLINE, key=lambda a: a.__name__), ids=lambda a: a.__name__)
def test_answers_shown_inline_match_too(answer: type[r.Answer]) -> None:
    holder, field = INLINE[answer]
    compare(answer, resolve(SCHEMAS[holder]["properties"][field])["items"], f"{holder}.{field}[]")


@pytest.mark.parametrize("vocabulary", list(ENUMS), ids=lambda e: e.__name__)
def test_the_documents_enums_are_the_vocabulary(vocabulary: type[enum.Enum]) -> None:
    assert SCHEMAS[ENUMS[vocabulary]]["enum"] == [v.value for v in vocabulary]


def test_a_field_the_document_lacks_is_caught() -> None:
    """The comparison fails where it should: a schema without a field of its answer."""
    schema = json.loads(json.dumps(SCHEMAS["JobSummary"]))
    del schema["properties"]["registered"]
    with pytest.raises(AssertionError, match=r"lacks \['registered'\]"):
        compare(jr.JobSummary, schema, "JobSummary")
    schema = json.loads(json.dumps(SCHEMAS["JobSummary"]))
    schema["properties"]["size"] = {"type": "string"}
    with pytest.raises(AssertionError, match=r"JobSummary\.size: int"):
        compare(jr.JobSummary, schema, "JobSummary")
