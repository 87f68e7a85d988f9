"""Journal write rate: how many state changes per second ``tfcoord serve --state-dir`` can commit.

    python benchmarks/journal.py [--records 20000] [--batch 1,100,1000] [--json]

Appends ``--records`` registrations (the record a node's ``register`` journals) to a
fresh SQLite journal in a temporary directory, committing every ``--batch`` records as the
server's group commit does (one commit per event-loop turn, however many requests that
turn carried), and prints per batch size: records per second, commits per second and the
median and maximum commit time (each commit fsyncs: ``synchronous=FULL``). This bounds
how fast one coordinator can take registrations and reports on this disk; see the capacity
model in docs/src/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

from tfcoord.client import messages as m
from tfcoord.coordinator import state as s
from tfcoord.coordinator.journal import SqliteJournal


def run(records: int, batch: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        journal = SqliteJournal(tmp)
        events = [
            s.RegisterNode(
                now=1.0e9 + i,
                req=m.Register(
                    id=1,
                    job="job-1",
                    executor_id=i,
                    attempt=0,
                    host=f"10.0.{i // 250 % 250}.{i % 250 + 1}",
                    port=20000 + i % 40000,
                ),
            )
            for i in range(records)
        ]
        commits: list[float] = []
        t0 = time.perf_counter()
        for start in range(0, records, batch):
            for ev in events[start : start + batch]:
                journal.append(ev)
            took = journal.write(journal.take() or [])
            commits.append(took)
        wall = time.perf_counter() - t0
        journal.close()
    return {
        "bench": "journal", "records": records, "batch": batch, "seconds": round(wall, 3),
        "records_per_s": round(records / wall), "commits_per_s": round(len(commits) / wall, 1),
        "commit_ms_median": round(statistics.median(commits) * 1e3, 2),
        "commit_ms_max": round(max(commits) * 1e3, 2),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--batch", default="1,100,1000", help="comma list of records per commit")
    ap.add_argument("--json", action="store_true", help="print JSON lines only (the default output too)")
    args = ap.parse_args()
    for b in (int(x) for x in args.batch.split(",") if x):
        if b < 1:
            ap.error("--batch sizes must be at least 1")
        # One record per commit costs an fsync each: keep that run short.
        print(json.dumps(run(min(args.records, 2000) if b == 1 else args.records, b)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
