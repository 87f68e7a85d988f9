"""timers.py: one heap of deadlines, each kind's callback, lazy deletion and compaction."""

from __future__ import annotations

from typing import Any

from tfcoord.coordinator.state.events import Tick
from tfcoord.coordinator.state.timers import STALE_TIMER_SLACK, TimerKey, TimerKind, Timers


def recorder(timers: Timers, kind: TimerKind) -> list[tuple[Any, ...]]:
    fired: list[tuple[Any, ...]] = []
    timers.on(kind, lambda when, key, now: fired.append((when, key, now)))
    return fired


def test_a_tick_fires_every_deadline_due_in_order_and_no_later_one() -> None:
    timers = Timers()
    fired = recorder(timers, TimerKind.RESERVE)
    for when, job in ((30.0, "c"), (10.0, "a"), (20.0, "b"), (10.0, "a2")):
        timers.push(when, (TimerKind.RESERVE, job))
    assert timers.next_deadline() == 10.0
    timers.tick(Tick(now=20.0))
    # Same deadline: in the order they were armed.
    assert [k[1] for _, k, _ in fired] == ["a", "a2", "b"]
    assert all(now == 20.0 for _, _, now in fired)
    assert timers.next_deadline() == 30.0 and len(timers) == 1


def test_a_callback_may_arm_a_deadline_that_is_already_due() -> None:
    timers = Timers()
    fired = recorder(timers, TimerKind.FORGET)

    def serving(when: float, key: TimerKey, now: float) -> None:
        timers.push(now, (TimerKind.FORGET,))

    timers.on(TimerKind.SERVING, serving)
    timers.push(5.0, (TimerKind.SERVING, "j"))
    timers.tick(Tick(now=6.0))
    assert fired == [(6.0, (TimerKind.FORGET,), 6.0)]
    assert timers.next_deadline() is None


def test_stale_entries_are_dropped_once_they_are_half_the_heap() -> None:
    timers = Timers()
    live: set[int] = set()
    timers.on(TimerKind.WAIT, lambda when, key, now: None, lambda when, key: key[1] in live)
    timers.push(1.0, (TimerKind.NODE, "j", 0, 0))  # a kind without a liveness check is always kept
    for i in range(4 * STALE_TIMER_SLACK):
        live.add(i)
        timers.push(100.0 + i, (TimerKind.WAIT, i))
    for i in range(2 * STALE_TIMER_SLACK):
        live.discard(i)
        timers.dropped()
    assert len(timers) == 4 * STALE_TIMER_SLACK + 1  # not yet more than half
    live.discard(2 * STALE_TIMER_SLACK)
    timers.dropped()
    assert len(timers) == 2 * STALE_TIMER_SLACK - 1 + 1 and timers.stale == 0
    assert timers.next_deadline() == 1.0
    timers.validate(bound=2 * STALE_TIMER_SLACK)


def test_a_compaction_inside_a_tick_keeps_the_tick_going() -> None:
    timers = Timers()
    live = {i for i in range(3 * STALE_TIMER_SLACK)}
    fired: list[int] = []

    def expire(when: float, key: TimerKey, now: float) -> None:
        fired.append(key[1])
        live.discard(key[1])
        if key[1] == 0:  # the first to fire leaves many others stale: the heap is rebuilt
            for i in range(1, 2 * STALE_TIMER_SLACK):
                live.discard(i)
            timers.dropped(2 * STALE_TIMER_SLACK)

    timers.on(TimerKind.WAIT, expire, lambda when, key: key[1] in live)
    for i in range(3 * STALE_TIMER_SLACK):
        timers.push(float(i), (TimerKind.WAIT, i))
    timers.tick(Tick(now=float(3 * STALE_TIMER_SLACK)))
    assert fired == [0, *range(2 * STALE_TIMER_SLACK, 3 * STALE_TIMER_SLACK)]
    assert len(timers) == 0


def test_a_key_is_flattened_into_its_entry_and_handed_back_whole() -> None:
    timers = Timers()
    fired = recorder(timers, TimerKind.NODE)
    timers.push(1.0, (TimerKind.NODE, "j", 3, 1))
    # No key tuple of its own per entry (memory per node): when, seq, then the key's parts.
    when, _, *parts = timers.heap[0]
    assert (when, parts) == (1.0, [TimerKind.NODE, "j", 3, 1])
    timers.tick(Tick(now=2.0))
    assert fired == [(1.0, (TimerKind.NODE, "j", 3, 1), 2.0)]
