"""An index from a key to a set of values that holds a lone value without a set.

The coordinator keeps indexes with one entry per node or connection (a node's waits of one
kind, the nodes a connection speaks for), and nearly every key of them holds exactly one
value. An empty Python set costs 216 bytes: at 10,000 nodes, a set per key was about a
seventh of the coordinator's memory per node. :class:`OneOrSet` stores a lone value
directly and makes a set only for a key that holds two or more at once, going back to the
lone value when all but one are gone; every operation stays O(1).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
#: Values are tuples (waiters, node keys): never a set, so a set in the index is a group.
V = TypeVar("V", bound=tuple[object, ...])


class OneOrSet(Generic[K, V]):
    """key -> the values it holds, a lone value stored as itself (see the module's docstring)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[K, V | set[V]] = {}

    def add(self, key: K, value: V) -> None:
        held = self._held.get(key)
        if held is None:
            self._held[key] = value
        elif isinstance(held, set):
            held.add(value)
        elif held != value:
            self._held[key] = {held, value}

    def discard(self, key: K, value: V) -> None:
        held = self._held.get(key)
        if isinstance(held, set):
            held.discard(value)
            if len(held) == 1:
                self._held[key] = next(iter(held))
        elif held is not None and held == value:
            del self._held[key]

    def get(self, key: K) -> tuple[V, ...]:
        """The values ``key`` holds (a copy: the index may change while they are handled)."""
        held = self._held.get(key)
        if held is None:
            return ()
        return tuple(held) if isinstance(held, set) else (held,)

    def pop(self, key: K) -> tuple[V, ...]:
        """Remove ``key``; returns the values it held."""
        held = self._held.pop(key, None)
        if held is None:
            return ()
        return tuple(held) if isinstance(held, set) else (held,)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def __len__(self) -> int:
        """The number of keys."""
        return len(self._held)

    def __iter__(self) -> Iterator[K]:
        return iter(self._held)

    def count(self) -> int:
        """The number of values under every key (O(keys): for invariant checks)."""
        return sum(len(h) if isinstance(h, set) else 1 for h in self._held.values())
