"""Output for people: times and aligned tables, with node text made safe for the terminal."""

from __future__ import annotations

import time
from collections.abc import Sequence

from tfcoord.client.terminal import printable


def fmt_time(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def table(rows: Sequence[Sequence[str]]) -> None:
    """Rows as aligned columns; cells (host names, errors, job names) printed safe."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
