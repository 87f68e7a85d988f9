"""One markdown table from every benchmark's output: anchor, floor, tfcoord, ratios, goal, met, shape, load.

    python benchmarks/results.py benchmarks/out/*.json --out benchmarks/results.md

Reads the ``figure`` rows (``floor.figure``) that each benchmark prints with ``--json``:
JSON lines, or one JSON document holding a ``figure`` (``mesos_ready.py``). A file without
any is named in the table's notes, so a benchmark that failed to run shows as missing
rather than vanishing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def figures(text: str) -> list[dict[str, Any]]:
    """Every figure row in one benchmark's output."""
    try:
        docs = [json.loads(text)]
    except ValueError:
        docs = []
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    docs.append(json.loads(line))
                except ValueError:
                    continue
    rows = []
    for d in docs:
        if isinstance(d, dict) and "figure" in d:
            rows.append(d["figure"] if isinstance(d["figure"], dict) else d)
    return rows


def _num(x: float | None, unit: str) -> str:
    if x is None:
        return "—"
    if unit == "records/s":
        return f"{x:,.0f} records/s"
    return f"{x:.3g} s" if x >= 0.1 else f"{x * 1000:.3g} ms"


def _ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.3g}x"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| figure | anchor | floor | tfcoord | tfcoord / floor | goal | met? | tfcoord / anchor | shape | load average |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    out = []
    for r in rows:
        unit = r["unit"]
        if r.get("goal_ratio_to_floor") is not None:
            goal = ("≥ " if r["higher_is_better"] else "≤ ") + f"{r['goal_ratio_to_floor']:g}x floor"
            if r.get("note"):
                goal += f"; {r['note']}"
        else:
            goal = r.get("note") or "—"
        met = {True: "yes", False: "**no**", None: "—"}[r.get("goal_met")]
        anchor = _num(r.get("anchor"), unit) + (f" ({r['anchor_name']})" if r.get("anchor_name") else "")
        if r.get("anchor") is None:
            anchor = "—"
            if r.get("anchor_error"):  # it ran and failed: say so, and how
                anchor = f"failed: {r['anchor_error']} ({r['anchor_name']})"
        load = " / ".join(f"{x:g}" for x in r.get("loadavg") or [])
        out.append(
            f"| {r['figure']} | {anchor} | {_num(r.get('floor'), unit)} | {_num(r.get('tfcoord'), unit)} "
            f"| {_ratio(r.get('ratio_to_floor'))} | {goal} | {met} | {_ratio(r.get('ratio_to_anchor'))} "
            f"| {r['shape']} | {load} |"
        )
    return head + "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outputs", nargs="+", type=Path, help="benchmark outputs (--json)")
    ap.add_argument("--out", type=Path, help="write the table here (default: stdout)")
    args = ap.parse_args()
    rows, empty = [], []
    for path in args.outputs:
        if not path.is_file():
            print(f"results.py: no such file: {path}", file=sys.stderr)
            return 2
        found = figures(path.read_text())
        rows += found
        if not found:
            empty.append(path.name)
    text = (
        f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} by `make bench`; the load average (1, 5, 15 min) "
        "is the machine's when each benchmark summarised.\n\n" + table(rows)
    )
    if empty:
        text += "\nNo figure in: " + ", ".join(empty) + " (the benchmark failed; see its output).\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
