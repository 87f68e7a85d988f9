"""oneorset.py: an index that holds a lone value without a set, and a set only for two or more."""

from __future__ import annotations

import sys

from tfcoord.coordinator.state.oneorset import OneOrSet


def test_a_lone_value_is_held_as_itself_and_a_second_makes_a_set() -> None:
    index: OneOrSet[int, tuple[int, int]] = OneOrSet()
    index.add(7, (7, 1))
    index.add(7, (7, 1))  # the same value again: still one
    assert index.get(7) == ((7, 1),)
    index.add(7, (7, 2))
    assert sorted(index.get(7)) == [(7, 1), (7, 2)]
    assert index.count() == 2 and len(index) == 1
    index.discard(7, (7, 1))
    assert index.get(7) == ((7, 2),)
    index.discard(7, (7, 9))  # not held: nothing changes
    index.discard(8, (8, 1))
    assert index.get(7) == ((7, 2),) and 8 not in index
    index.discard(7, (7, 2))
    assert 7 not in index and index.get(7) == () and index.count() == 0


def test_pop_returns_what_a_key_held_and_forgets_it() -> None:
    index: OneOrSet[str, tuple[str, int]] = OneOrSet()
    index.add("a", ("j", 0))
    index.add("b", ("j", 1))
    index.add("b", ("j", 2))
    assert index.pop("a") == (("j", 0),)
    assert sorted(index.pop("b")) == [("j", 1), ("j", 2)]
    assert index.pop("b") == () and len(index) == 0


def test_a_lone_value_costs_no_set() -> None:
    # What the index is for: 10,000 keys of one value each hold no set at all.
    index: OneOrSet[int, tuple[int, int]] = OneOrSet()
    for i in range(10_000):
        index.add(i, (i, 1))
    held = index._held  # the storage itself is what is measured
    assert not any(isinstance(v, set) for v in held.values())
    assert sys.getsizeof(held[0]) < sys.getsizeof(set())
