"""What every benchmark reports beside tfcoord and its anchor: the floor, the ratio, the machine's load.

The floor is what the same work costs with no coordinator at all, measured in the same
run on the same machine (each benchmark's docstring says what its floor does). A figure
is printed as a ``figure`` row (:func:`figure`): tfcoord, the anchor and the floor in one
unit, ``ratio_to_floor`` (tfcoord / floor for times, tfcoord / floor for rates: a time's
goal is a ceiling, a rate's a minimum), the goal and whether it was met, the cluster's
shape and the load average (``os.getloadavg()``) when the benchmark ran it.
``benchmarks/results.py`` collects these rows from every benchmark's output into one table.
"""

from __future__ import annotations

import os
from typing import Any


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded: other work on the machine shows here."""
    return [round(x, 2) for x in os.getloadavg()]


def ratio(value: float | None, floor: float | None) -> float | None:
    """``value / floor``, or None when either is missing (a failed run) or the floor is 0."""
    if value is None or floor is None or floor <= 0:
        return None
    return round(value / floor, 3)


def figure(
    name: str,
    *,
    unit: str,
    tfcoord: float | None,
    floor: float | None,
    anchor: float | None,
    anchor_name: str,
    goal: float | None,
    shape: str,
    loadavg: list[float],
    higher_is_better: bool = False,
    note: str = "",
    anchor_error: str = "",
) -> dict[str, Any]:
    """One row of the results table.

    ``goal`` bounds ``ratio_to_floor``: at most ``goal`` for a time (``higher_is_better``
    false), at least ``goal`` for a rate; None when this figure has a goal elsewhere (an
    absolute time, given in ``note``) or none. ``anchor_error``: why the anchor gave no
    figure in this run (it failed), shown in its column instead of a bare dash.
    """
    r = ratio(tfcoord, floor)
    met = None if goal is None or r is None else r >= goal if higher_is_better else r <= goal
    return {
        "figure": name,
        "unit": unit,
        "tfcoord": tfcoord,
        "floor": floor,
        "anchor": anchor,
        "anchor_name": anchor_name,
        "anchor_error": anchor_error if anchor is None else "",
        "ratio_to_floor": r,
        "ratio_to_anchor": ratio(tfcoord, anchor),
        "goal_ratio_to_floor": goal,
        "higher_is_better": higher_is_better,
        "goal_met": met,
        "shape": shape,
        "loadavg": loadavg,
        "note": note,
    }
