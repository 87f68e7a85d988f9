"""Time every event-loop turn and callback of a Python program (``tfcoord serve`` in the load benchmark).

    python benchmarks/looptrace.py OUT.json -m tfcoord serve ...

A heartbeat waits for the loop turn it arrives in to end, so its p99 is about the longest
turns. This runs the program with asyncio's callbacks (``Handle._run``) and the selector's
``select`` wrapped: a turn is the time from one ``select`` returning to the next call, and
for each turn and each callback it takes two clocks, the wall clock and this thread's CPU
clock. Their difference is time the thread was runnable or blocked but not running: on a
machine whose cores are all busy, waiting for a CPU (scheduling), not the coordinator's
own work. When the program exits (``tfcoord serve`` does on SIGTERM) it writes OUT.json:

- ``turns``: how many, and how many took more than 1, 2, 5, 10, 20, 50 ms of wall time;
- ``longest``: the 40 longest turns, each with its start (on the clock of ``timeline``),
  wall and CPU milliseconds, and its callbacks by name (name, calls, wall ms, CPU ms);
- ``by_callback``: per callback name, calls, total and max wall milliseconds, total CPU;
- ``timeline``: every turn of 1 ms or more as [start, wall ms, CPU ms], the start on
  ``time.perf_counter()`` (CLOCK_MONOTONIC, the clock of ``load.py``'s ``window_monotonic_s``).

The wrapping costs about a microsecond per callback; the figures it gives are for finding
the long turns, not for the benchmark's table.
"""

from __future__ import annotations

import asyncio.events
import atexit
import heapq
import json
import runpy
import selectors
import sys
import time
from typing import Any

#: Turns at least this long are kept in ``timeline``.
TIMELINE_S = 0.001
#: How many of the longest turns are kept.
KEEP_TURNS = 40
THRESHOLDS_MS = (1, 2, 5, 10, 20, 50)


def _name(handle: asyncio.events.Handle) -> str:
    cb: Any = handle._callback
    owner = getattr(cb, "__self__", None)
    if owner is not None and hasattr(cb, "__name__"):
        return f"{type(owner).__name__}.{cb.__name__}"
    return getattr(cb, "__qualname__", None) or repr(cb)[:80]


class Tracer:
    def __init__(self, out: str) -> None:
        self.out = out
        self.turn_wall0 = 0.0
        self.turn_cpu0 = 0.0
        self.in_turn = False
        #: This turn's callbacks by name: [calls, wall s, CPU s].
        self.turn_by: dict[str, list[float]] = {}
        self.longest: list[tuple[float, int, dict[str, Any]]] = []  # a min-heap of the longest
        self.seq = 0
        self.turns = 0
        self.over = dict.fromkeys(THRESHOLDS_MS, 0)
        self.by_callback: dict[str, list[float]] = {}
        self.timeline: list[tuple[float, float, float]] = []

    def install(self) -> None:
        tracer = self
        run = asyncio.events.Handle._run

        def timed_run(handle: asyncio.events.Handle) -> None:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                run(handle)
            finally:
                w, c = time.perf_counter() - w0, time.thread_time() - c0
                name = _name(handle)
                agg = tracer.by_callback.get(name)
                if agg is None:
                    agg = tracer.by_callback[name] = [0, 0.0, 0.0, 0.0]
                agg[0] += 1
                agg[1] += w
                agg[2] = max(agg[2], w)
                agg[3] += c
                mine = tracer.turn_by.get(name)
                if mine is None:
                    mine = tracer.turn_by[name] = [0, 0.0, 0.0]
                mine[0] += 1
                mine[1] += w
                mine[2] += c

        asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
        select = selectors.EpollSelector.select

        def timed_select(sel: selectors.EpollSelector, timeout: float | None = None) -> Any:
            tracer.end_turn()
            try:
                return select(sel, timeout)
            finally:
                tracer.turn_wall0, tracer.turn_cpu0 = time.perf_counter(), time.thread_time()
                tracer.in_turn = True

        selectors.EpollSelector.select = timed_select  # type: ignore[method-assign]
        atexit.register(self.write)

    def end_turn(self) -> None:
        if not self.in_turn:
            return
        self.in_turn = False
        wall = time.perf_counter() - self.turn_wall0
        cpu = time.thread_time() - self.turn_cpu0
        self.turns += 1
        for t in THRESHOLDS_MS:
            if wall * 1e3 > t:
                self.over[t] += 1
        by, self.turn_by = self.turn_by, {}
        if wall >= TIMELINE_S:
            self.timeline.append((round(self.turn_wall0, 4), round(wall * 1e3, 2), round(cpu * 1e3, 2)))
        if len(self.longest) < KEEP_TURNS or wall > self.longest[0][0]:
            self.seq += 1
            turn = {
                "at_s": round(self.turn_wall0, 3),
                "wall_ms": round(wall * 1e3, 2),
                "cpu_ms": round(cpu * 1e3, 2),
                "callbacks": sorted(
                    ((n, int(a[0]), round(a[1] * 1e3, 2), round(a[2] * 1e3, 2)) for n, a in by.items()),
                    key=lambda x: -x[3],
                ),
            }
            entry = (wall, self.seq, turn)
            if len(self.longest) < KEEP_TURNS:
                heapq.heappush(self.longest, entry)
            else:
                heapq.heapreplace(self.longest, entry)

    def write(self) -> None:
        by = sorted(self.by_callback.items(), key=lambda kv: -kv[1][1])
        report = {
            "turns": self.turns,
            "turns_over_ms": self.over,
            "longest": [t for _, _, t in sorted(self.longest, reverse=True)],
            "timeline": self.timeline,
            "by_callback": {
                n: {
                    "calls": int(a[0]),
                    "wall_ms": round(a[1] * 1e3, 1),
                    "max_ms": round(a[2] * 1e3, 2),
                    "cpu_ms": round(a[3] * 1e3, 1),
                }
                for n, a in by[:40]
            },
        }
        with open(self.out, "w") as f:
            json.dump(report, f, indent=1)


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        sys.exit("usage: looptrace.py OUT.json -m MODULE [ARGS...]")
    out, module = sys.argv[1], sys.argv[3]
    Tracer(out).install()
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
