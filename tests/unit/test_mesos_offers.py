"""Offer matching (coordinator/mesos/offers.py): tables of tasks, offers and expected placements.

Pure: offers are built as the v1 API's JSON and parsed, tasks are :class:`TaskNeeds`.
"""

from __future__ import annotations

from typing import Any

import pytest

from tfcoord.coordinator.mesos.errors import MesosConfigError
from tfcoord.coordinator.mesos.offers import (
    AgentSize,
    Constraint,
    Offer,
    TaskNeeds,
    explain_unfit,
    match,
    parse_constraints,
)


def offer(
    oid: str,
    *,
    cpus: float = 4,
    mem: float = 8192,
    gpus: int | list[str] = 0,
    ports: list[tuple[int, int]] | None = None,
    attributes: dict[str, str | float] | None = None,
    role: str | None = None,
) -> Offer:
    """An offer as a master sends it (one agent per offer id), parsed."""

    def extra() -> dict[str, Any]:
        return {"role": "*", **({"allocation_info": {"role": role}} if role else {})}

    res: list[dict[str, Any]] = [
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}, **extra()},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}, **extra()},
    ]
    if isinstance(gpus, list):
        res.append({"name": "gpus", "type": "SET", "set": {"item": gpus}, **extra()})
    elif gpus:
        res.append({"name": "gpus", "type": "SCALAR", "scalar": {"value": gpus}, **extra()})
    for b, e in ports if ports is not None else [(31000, 31009)]:
        res.append(
            {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": b, "end": e}]}, **extra()}
        )
    attrs = [
        {"name": k, "type": "TEXT", "text": {"value": v}}
        if isinstance(v, str)
        else {"name": k, "type": "SCALAR", "scalar": {"value": v}}
        for k, v in (attributes or {}).items()
    ]
    return Offer.from_json(
        {
            "id": {"value": oid},
            "agent_id": {"value": f"agent-{oid}"},
            "hostname": f"host-{oid}",
            "resources": res,
            "attributes": attrs,
        }
    )


def task(key: str, cpus: float = 1, mem: float = 1024, gpus: int = 0, constraints: str = "") -> TaskNeeds:
    return TaskNeeds(key, key, cpus, mem, gpus, 1, parse_constraints(constraints))


# Each case: tasks, offers, {task key: offer id} expected, declined offers.
CASES: dict[str, tuple[list[TaskNeeds], list[Offer], dict[str, str], list[str]]] = {
    "three tasks pack into one offer": (
        [task("ps"), task("w0", cpus=2), task("w1")],
        [offer("a", cpus=4)],
        {"ps": "a", "w0": "a", "w1": "a"},
        [],
    ),
    "the unused offer is declined": (
        [task("ps")],
        [offer("a"), offer("b")],
        {"ps": "a"},
        ["b"],
    ),
    "a task too big for the first offer goes to the second": (
        [task("w0", cpus=3), task("w1", cpus=3)],
        [offer("a", cpus=4), offer("b", cpus=4)],
        {"w0": "a", "w1": "b"},
        [],
    ),
    "memory decides too": (
        [task("w0", mem=6000), task("w1", mem=6000)],
        [offer("a", mem=8192), offer("b", mem=4096)],
        {"w0": "a"},
        ["b"],
    ),
    "no port range, no placement": (
        [task("w0")],
        [offer("a", ports=[]), offer("b")],
        {"w0": "b"},
        ["a"],
    ),
    "larger tasks are placed first (first fit decreasing)": (
        [task("small", cpus=1), task("big", cpus=4)],
        [offer("a", cpus=4), offer("b", cpus=1)],
        {"big": "a", "small": "b"},
        [],
    ),
    "SCALAR GPUs": (
        [task("w0", gpus=2), task("w1", gpus=1)],
        [offer("a", gpus=2), offer("b", gpus=1)],
        {"w0": "a", "w1": "b"},
        [],
    ),
    "SET GPUs": (
        [task("w0", gpus=1), task("w1", gpus=1)],
        [offer("a", gpus=["0", "1"])],
        {"w0": "a", "w1": "a"},
        [],
    ),
    "too few GPUs anywhere": (
        [task("w0", gpus=4)],
        [offer("a", gpus=["0", "1"]), offer("b", gpus=2)],
        {},
        ["a", "b"],
    ),
    "a CPU task leaves the GPU agent alone": (
        [task("ps")],
        [offer("gpu", gpus=2), offer("cpu")],
        {"ps": "cpu"},
        ["gpu"],
    ),
    "a CPU task takes the GPU agent when nothing else fits": (
        [task("ps", cpus=8)],
        [offer("gpu", cpus=8, gpus=2), offer("cpu", cpus=2)],
        {"ps": "gpu"},
        ["cpu"],
    ),
    "TEXT attribute constraint": (
        [task("w0", constraints="rack:r2")],
        [offer("a", attributes={"rack": "r1"}), offer("b", attributes={"rack": "R2"})],
        {"w0": "b"},
        ["a"],
    ),
    "SCALAR attribute constraint": (
        [task("w0", constraints="zone:3")],
        [offer("a", attributes={"zone": 2.0}), offer("b", attributes={"zone": 3.0})],
        {"w0": "b"},
        ["a"],
    ),
    "every constraint must hold": (
        [task("w0", constraints="rack:r1,zone:3")],
        [
            offer("a", attributes={"rack": "r1", "zone": 2.0}),
            offer("b", attributes={"rack": "r1", "zone": 3.0}),
        ],
        {"w0": "b"},
        ["a"],
    ),
    "an agent without the attribute does not match": (
        [task("w0", constraints="rack:r1")],
        [offer("a")],
        {},
        ["a"],
    ),
    "fractional cpus add up exactly": (
        [task("a", cpus=0.1), task("b", cpus=0.2), task("c", cpus=0.7)],
        [offer("x", cpus=1.0)],
        {"a": "x", "b": "x", "c": "x"},
        [],
    ),
    "no offers at all": ([task("w0")], [], {}, []),
}


@pytest.mark.parametrize("name", CASES)
def test_match(name: str) -> None:
    tasks, offers, expected, declined = CASES[name]
    result = match(tasks, offers)
    assert {p.key: p.offer_id for p in result.placements} == expected
    assert list(result.declined) == declined
    assert set(result.unplaced) == {t.key for t in tasks} - set(expected)


def test_each_task_takes_its_own_port_and_gpu_ids() -> None:
    result = match(
        [task("w0", gpus=1), task("w1", gpus=2), task("ps")],
        [offer("a", gpus=["0", "1", "2"], ports=[(31000, 31000), (32000, 32001)])],
    )
    got = {p.key: (p.port, p.gpu_ids, p.gpu_kind) for p in result.placements}
    assert got == {"w1": (31000, ("0", "1"), "SET"), "w0": (32000, ("2",), "SET"), "ps": (32001, (), "")}


def test_placements_carry_the_resource_entries_of_a_task_info() -> None:
    [p] = match([task("w0", cpus=1.5, mem=2048, gpus=1)], [offer("a", gpus=["3"], role="tf")]).placements
    assert p.agent_id == "agent-a" and p.hostname == "host-a"
    assert list(p.resources) == [
        {
            "name": "cpus",
            "type": "SCALAR",
            "scalar": {"value": 1.5},
            "role": "*",
            "allocation_info": {"role": "tf"},
        },
        {
            "name": "mem",
            "type": "SCALAR",
            "scalar": {"value": 2048},
            "role": "*",
            "allocation_info": {"role": "tf"},
        },
        {
            "name": "ports",
            "type": "RANGES",
            "ranges": {"range": [{"begin": 31000, "end": 31000}]},
            "role": "*",
            "allocation_info": {"role": "tf"},
        },
        {
            "name": "gpus",
            "type": "SET",
            "set": {"item": ["3"]},
            "role": "*",
            "allocation_info": {"role": "tf"},
        },
    ]


def test_scalar_gpus_are_a_count() -> None:
    [p] = match([task("w0", gpus=2)], [offer("a", gpus=4)]).placements
    assert (p.gpus, p.gpu_ids, p.gpu_kind) == (2, (), "SCALAR")
    assert {"name": "gpus", "type": "SCALAR", "scalar": {"value": 2.0}, "role": "*"} in p.resources


def test_gpu_ids_are_taken_in_natural_order() -> None:
    [p] = match([task("w0", gpus=2)], [offer("a", gpus=["10", "2", "1"])]).placements
    assert p.gpu_ids == ("1", "2")


def test_resources_split_over_several_entries_of_one_name() -> None:
    raw = {
        "id": {"value": "o"},
        "agent_id": {"value": "ag"},
        "hostname": "h",
        "resources": [
            {
                "name": "cpus",
                "type": "SCALAR",
                "scalar": {"value": 1},
                "role": "tf",
                "reservations": [{"role": "tf"}],
            },
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 2}, "role": "*"},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 512}},
            {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 1, "end": 1}]}},
        ],
    }
    [p] = match([task("w0", cpus=2, mem=256)], [Offer.from_json(raw)]).placements
    cpus = [r for r in p.resources if r["name"] == "cpus"]
    assert cpus == [
        {
            "name": "cpus",
            "type": "SCALAR",
            "scalar": {"value": 1.0},
            "role": "tf",
            "reservations": [{"role": "tf"}],
        },
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 1.0}, "role": "*"},
    ]


def test_a_malformed_offer_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="malformed offer"):
        Offer.from_json({"id": {"value": "x"}, "resources": []})
    with pytest.raises(ValueError, match="malformed offer"):
        Offer.from_json(
            {"id": {"value": "x"}, "agent_id": {"value": "a"}, "resources": [{"name": "c", "type": "?"}]}
        )


# -- constraints ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        ("rack:r1", (Constraint("rack", "r1"),)),
        (" rack : r1 , zone:3 ", (Constraint("rack", "r1"), Constraint("zone", "3"))),
        ("rack:r1;zone:3", (Constraint("rack", "r1"), Constraint("zone", "3"))),  # tfmesos2 allows ';'
        ("rack:r1,rack:R1", (Constraint("rack", "R1"),)),  # the same value twice is harmless
        ("url:http://x", (Constraint("url", "http://x"),)),  # the value may hold ':'
    ],
)
def test_constraints_parse(text: str, expected: tuple[Constraint, ...]) -> None:
    assert parse_constraints(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("rack", "is not key:value"),
        ("rack:", "is not key:value"),
        (":r1", "is not key:value"),
        ("rack:r1,zone", "'zone' is not key:value"),
        ("rack:r1,rack:r2", "asks for rack twice"),
    ],
)
def test_invalid_constraints_are_refused_with_the_syntax(text: str, why: str) -> None:
    with pytest.raises(MesosConfigError, match=why) as info:
        parse_constraints(text)
    assert "key:value[,key:value]" in str(info.value) or "twice" in str(info.value)


# -- what can never fit ---------------------------------------------------------------------


def sizes(*offers: Offer) -> list[AgentSize]:
    return [AgentSize.of(o) for o in offers]


@pytest.mark.parametrize(
    ("needs", "agents", "reason"),
    [
        (
            task("w", gpus=8),
            sizes(offer("a", gpus=2), offer("b", gpus=["0"])),
            "needs 8 GPUs, the largest offer had 2",
        ),
        (task("w", cpus=16), sizes(offer("a", cpus=4)), "needs 16 cpus, the largest offer had 4"),
        (
            task("w", mem=65536),
            sizes(offer("a", mem=8192)),
            "needs 65536 MB of memory, the largest offer had 8192",
        ),
        (task("w", gpus=1), sizes(offer("a")), "needs 1 GPU, the largest offer had 0"),
        (
            task("w", cpus=8, gpus=4),
            sizes(offer("a", cpus=4, gpus=2)),
            "needs 8 cpus, the largest offer had 4; needs 4 GPUs, the largest offer had 2",
        ),
        (
            task("w", cpus=8, mem=16384),
            sizes(offer("a", cpus=8, mem=1024), offer("b", cpus=1, mem=16384)),
            "no agent offered all of it at once (closest: ",
        ),
        (
            task("w", constraints="rack:r9"),
            sizes(offer("a", attributes={"rack": "r1"}), offer("b", attributes={"zone": 2.0})),
            "no offer matched the attribute constraints rack:r9 (offers had rack:r1, zone:2)",
        ),
    ],
)
def test_explain_unfit_says_which_resource_and_how_far_off(
    needs: TaskNeeds, agents: list[AgentSize], reason: str
) -> None:
    got = explain_unfit(needs, agents)
    assert got is not None and reason in got


def test_nothing_is_unfit_when_some_agent_could_hold_it_or_none_was_seen() -> None:
    assert explain_unfit(task("w", gpus=2), sizes(offer("a"), offer("b", gpus=2))) is None
    assert explain_unfit(task("w", gpus=2), []) is None


def test_an_agents_largest_offer_is_remembered() -> None:
    big, small = AgentSize.of(offer("a", cpus=8)), AgentSize.of(offer("a", cpus=1, gpus=1))
    merged = big.merge(small)
    assert (merged.cpus, merged.gpus) == (8, 1)


@pytest.mark.parametrize(
    ("tasks", "offers", "reasons"),
    [
        ([task("w0")], [offer("a"), offer("b")], {"b": "every task is placed"}),
        ([], [offer("a")], {"a": "no task waits"}),
        (
            [task("w0", cpus=8, mem=16384)],
            [offer("a", cpus=2)],
            {"a": "w0 needs 8 cpus (offer has 2), 16384 MB of memory (offer has 8192)"},
        ),
        ([task("w0", gpus=1)], [offer("a")], {"a": "w0 needs 1 GPU (offer has 0)"}),
        (
            [task("w0", constraints="rack:r2")],
            [offer("a", attributes={"rack": "r1", "cores": 8.0})],
            {"a": "w0 attributes rack:r2 not matched (offer has rack:r1,cores:8)"},
        ),
        (
            [task(f"w{i}", cpus=8) for i in range(5)],
            [offer("a")],
            {
                "a": "w0 needs 8 cpus (offer has 4); w1 needs 8 cpus (offer has 4); w2 needs 8 cpus (offer has 4); "
                "and 2 more waiting task(s)"
            },
        ),
    ],
)
def test_each_declined_offer_says_why_it_got_nothing(
    tasks: list[TaskNeeds], offers: list[Offer], reasons: dict[str, str]
) -> None:
    result = match(tasks, offers)
    assert dict(result.decline_reasons) == reasons
    assert set(result.declined) == set(reasons)


def test_a_declined_offer_names_the_gpu_task_it_could_not_take_safely() -> None:
    exclusive = TaskNeeds("w1", "w1", 1, 1024, 1, exclusive_gpus=True)
    result = match([exclusive], [offer("a", gpus=2)], gpu_agents={"agent-a"})
    assert dict(result.decline_reasons) == {
        "a": "w1 the agent's GPUs are a count and it already runs a GPU task of this framework"
    }
