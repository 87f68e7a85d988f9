"""The formatter sees the whole code: ``# fmt: skip`` is kept only where a table reads
better aligned, each one named here with why, so a new opt-out is a decision someone
makes in review rather than a way round ``ruff format``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Folders that hold no code of ours (environments, builds, caches).
NOT_OURS = {".venv", "build", "dist", "site", "node_modules", "__pycache__"}

#: file -> (markers it may hold, the table they keep aligned).
ALIGNED_TABLES = {
    "benchmarks/fuzz.py": (1, "the fuzz run's result row, its figures grouped by line"),
    "benchmarks/journal.py": (1, "the journal benchmark's result row"),
    "benchmarks/load.py": (1, "the burst phase's result row"),
    "tests/e2e/test_install.py": (1, "spark-submit's flags, each with its value on one line"),
}
#: The issue that removed 250 of them set the ceiling at 30; far fewer are needed.
MOST = 10


def _ours(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return not any(p in NOT_OURS or p.startswith(".") or p.endswith(".egg-info") for p in parts)


def markers() -> Counter[str]:
    found: Counter[str] = Counter()
    for path in ROOT.rglob("*.py"):
        if _ours(path):
            text = path.read_text(encoding="utf-8")
            count = sum(1 for line in text.splitlines() if line.rstrip().endswith("# fmt: skip"))
            if count:
                found[path.relative_to(ROOT).as_posix()] = count
    return found


def test_fmt_skip_only_on_the_named_tables() -> None:
    found = markers()
    unexpected = {f: n for f, n in found.items() if n > ALIGNED_TABLES.get(f, (0, ""))[0]}
    assert not unexpected, (
        f"# fmt: skip where no aligned table is named: {unexpected}; let ruff format the lines, "
        "or name the table in ALIGNED_TABLES with why it reads better aligned"
    )
    assert sum(found.values()) <= MOST


def test_the_scan_sees_the_markers_it_allows() -> None:
    # Guards the scan itself: were the walk to skip the repository, the test above would pass empty.
    assert markers() == Counter({f: n for f, (n, _) in ALIGNED_TABLES.items()})
