"""What a node's work costs its host: CPU and resident memory of its process tree, from /proc.

The supervisor samples its child (the forked ``map_fun`` or the command) and the child's
descendants every few seconds and sends the figures beside the work's own progress
reports, so the dashboard shows CPU and memory per node without an agent on the host.

CPU is the time the tree spent on CPUs between two samples over the wall time between
them (100 is one core busy). Processes that ended between samples take their CPU time with
them (their parent's ``cutime`` counts it only once waited for), so the figure is a lower
bound, which is what a dashboard needs. Without /proc (not Linux) :meth:`sample` returns
nothing and nothing is sent.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: Processes of one tree followed at most: a node whose work forks thousands is measured
#: by its first ones (the walk costs a few /proc reads per process).
MAX_PROCESSES = 256

_PROC = Path("/proc")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in (_PROC / str(pid) / "task").iterdir():
            text = (task / "children").read_text()
            out += [int(c) for c in text.split()]
    except (OSError, ValueError):
        pass
    return out


def _stat(pid: int) -> tuple[float, int] | None:
    """(CPU seconds of the process and its waited-for children, resident bytes), or None if gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
        statm = (_PROC / str(pid) / "statm").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        rss = int(statm.split()[1]) * _PAGE
    except (IndexError, ValueError):
        return None
    return ticks / _CLK_TCK, rss


class ProcessUsage:
    """CPU and memory of one process and its descendants: ``ProcessUsage(pid).sample()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._last: tuple[float, float] | None = None  # (monotonic time, CPU seconds)

    def tree(self) -> list[int]:
        """The process and its descendants (breadth first, at most MAX_PROCESSES)."""
        seen, todo = [self.pid], [self.pid]
        while todo and len(seen) < MAX_PROCESSES:
            for c in _children(todo.pop(0)):
                if c not in seen and len(seen) < MAX_PROCESSES:
                    seen.append(c)
                    todo.append(c)
        return seen

    def sample(self) -> dict[str, int | float]:
        """``{"cpu_percent", "rss_bytes", "processes"}`` now; empty if the process is gone
        or there is no /proc. The first sample has no CPU figure (it needs two)."""
        now = time.monotonic()
        cpu_s, rss, count = 0.0, 0, 0
        for pid in self.tree():
            st = _stat(pid)
            if st is not None:
                cpu_s += st[0]
                rss += st[1]
                count += 1
        if not count:
            return {}
        out: dict[str, int | float] = {"rss_bytes": rss, "processes": count}
        if self._last is not None and now > self._last[0]:
            out["cpu_percent"] = round(max(0.0, cpu_s - self._last[1]) / (now - self._last[0]) * 100, 1)
        self._last = (now, cpu_s)
        return out
