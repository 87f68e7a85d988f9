"""Every deadline the state machine keeps, in one heap, and what each kind of deadline does.

A deadline is a heap entry ``(when, seq, *key)``: its key ``(kind, ...)`` is flattened into
the entry, not a tuple of its own (at 10,000 nodes, with a cluster wait, a stop wait and
a liveness deadline each, a key tuple per entry was about 120 bytes a node), and ``seq``
keeps entries of one deadline in the order they were armed. ``key[0]`` is its :class:`TimerKind`, and
the part that owns that kind registers (with :meth:`Timers.on`) what happens when it passes
and, for entries that may go stale, how to tell a live one. A :class:`Tick` pops every
entry at or before its ``now`` and hands each to its kind's callback.

Entries are deleted lazily: a wait answered early, or a node deadline moved later, leaves
its entry in the heap, and the callback checks that the entry is still the authoritative
one. Stale entries are counted (:meth:`Timers.dropped`) and the heap is rebuilt without
them once they are half of it.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable
from typing import Any

from .events import Tick, handles

#: Stale timer entries tolerated before the heap is compacted (see ``Timers.compact``).
STALE_TIMER_SLACK = 256


class TimerKind(enum.Enum):
    """What a deadline is for; the rest of its key says whose it is."""

    #: A pending request's deadline: ``(WAIT, waiter)``.
    WAIT = enum.auto()
    #: A live node's liveness deadline: ``(NODE, job, executor_id, attempt)``.
    NODE = enum.auto()
    #: A job's reservation deadline: ``(RESERVE, job)``.
    RESERVE = enum.auto()
    #: Finished jobs may be due to be forgotten: ``(FORGET,)``.
    FORGET = enum.auto()
    #: A job's serving nodes' grace has passed: ``(SERVING, job)``.
    SERVING = enum.auto()
    #: A job's deadline for its whole run (``JobSpec.deadline_s``): ``(DEADLINE, job)``.
    DEADLINE = enum.auto()


TimerKey = tuple[Any, ...]
#: ``(when, seq, *key)`` (see the module's docstring).
Entry = tuple[Any, ...]
#: What a passed deadline does: ``(when, key, now)``.
Fire = Callable[[float, TimerKey, float], None]
#: Is an entry ``(when, key)`` still authoritative (not left behind by a removed wait)?
Live = Callable[[float, TimerKey], bool]


class Timers:
    """The deadline heap (see the module's docstring)."""

    def __init__(self) -> None:
        self.heap: list[Entry] = []
        #: Entries whose timer was removed before its deadline (see :meth:`dropped`).
        self.stale = 0
        self._seq = itertools.count()
        self._fire: dict[TimerKind, Fire] = {}
        self._live: dict[TimerKind, Live] = {}

    def __len__(self) -> int:
        return len(self.heap)

    def on(self, kind: TimerKind, fire: Fire, live: Live | None = None) -> None:
        """Register what a passed deadline of ``kind`` does, and how to tell a live entry."""
        self._fire[kind] = fire
        if live is not None:
            self._live[kind] = live

    def push(self, when: float, key: TimerKey) -> None:
        heapq.heappush(self.heap, (when, next(self._seq), *key))

    def next_deadline(self) -> float | None:
        """The earliest time at which a :class:`Tick` may change something."""
        return self.heap[0][0] if self.heap else None

    def dropped(self, count: int = 1) -> None:
        """``count`` entries were left behind by timers removed before their deadline."""
        self.stale += count
        if self.stale > max(STALE_TIMER_SLACK, len(self.heap) // 2):
            self.compact()

    def compact(self) -> None:
        """Rebuild the heap without the entries of waits removed before their deadline.

        Waits that end early (their connection closed, their answer came) leave their heap
        entry behind until its deadline, up to 7 days for an await_stop: without this a
        client connecting, waiting and disconnecting in a loop grows the heap for ever. A
        rebuild costs O(heap) and happens only once half the heap is stale, so O(1) per wait.
        """
        live = self._live

        def kept(entry: Entry) -> bool:
            check = live.get(entry[2])
            return check is None or check(entry[0], entry[2:])

        self.heap = [e for e in self.heap if kept(e)]
        heapq.heapify(self.heap)
        self.stale = 0

    @handles(Tick)
    def tick(self, ev: Tick) -> None:
        # ``self.heap`` is read again each turn: a callback may compact (rebind) it.
        while self.heap and self.heap[0][0] <= ev.now:
            entry = heapq.heappop(self.heap)
            self._fire[entry[2]](entry[0], entry[2:], ev.now)

    def validate(self, bound: int) -> None:
        """``bound``: how many entries the waits, live nodes and jobs may account for."""
        assert len(self.heap) <= 2 * bound + 2 * STALE_TIMER_SLACK, (
            "timer heap holds far more entries than there are waits, nodes and jobs"
        )
