"""The garbage collector's settings in ``tfcoord serve``: few, short pauses while the heap grows."""

from __future__ import annotations

import asyncio
import gc

#: Allocations between young-generation collections in ``tfcoord serve`` (CPython: 700).
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Collect less often in the coordinator process, which holds little but long-lived state.

    Jobs, nodes and connections live for a job's lifetime and form almost no cycles, yet
    CPython's defaults (a young collection every 700 allocations, full ones as the heap
    grows) spent a tenth of a 10,000-node rendezvous traversing them. What start-up and
    recovery built is frozen out of collection, and young collections run less often;
    the rare cycle is still collected.
    """
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


#: How often ``tfcoord serve`` moves what survived its young collections out of the
#: collector's sight (``gc.freeze``), and how often it thaws everything for one full
#: collection that reclaims any cycle among frozen objects. Each freeze is preceded by a
#: middle-generation pass over what survived since the last one: once a second, during a
#: 10,000-node registration burst, that pass took 15-25 ms (a turn every heartbeat waited
#: behind); ten times a second it walks a tenth as much.
GC_FREEZE_INTERVAL_S = 0.1
GC_FULL_INTERVAL_S = 3600.0


async def gc_housekeeping() -> None:
    """Keep the collector's pauses short while the heap grows.

    A full collection walks every object it tracks: at 20,000 nodes (two jobs of 10,000,
    or a 10,000-node burst beside 100 steady jobs) one took 80-250 ms on this machine,
    which stalled every heartbeat behind it. Freezing survivors every tenth of a second
    leaves a collection only the objects made since to walk. Jobs, nodes and connections form
    no cycles (they are freed by reference counting, frozen or not); whatever cycle hides
    among frozen objects is reclaimed by the hourly thaw-and-collect, one longer pause.
    """
    loop = asyncio.get_running_loop()
    last_full = loop.time()
    while True:
        await asyncio.sleep(GC_FREEZE_INTERVAL_S)
        if loop.time() - last_full >= GC_FULL_INTERVAL_S:
            gc.unfreeze()
            gc.collect()
            last_full = loop.time()
        else:
            gc.collect(1)  # young cycles go first, not into the frozen set
        gc.freeze()
