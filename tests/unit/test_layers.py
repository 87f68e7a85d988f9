"""The layers hold: the import contracts pass, and each distribution declares what it imports.

``lint-imports`` (run by ``make lint``) checks the direction of imports between tfcoord's
parts; this test runs the same contracts inside the suite, and checks the packaging half of
the rule: a distribution's declared dependencies (its requirements and extras) cover every
third-party package its modules import, and the tfcoord distributions it requires are exactly
the parts it imports. A node image built from ``tfcoord-client`` and ``tfcoord-node`` then
has everything the node imports, and nothing of the service or the command line.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Each distribution: its pyproject.toml and the parts of the tfcoord namespace it holds.
DISTRIBUTIONS: dict[str, tuple[Path, tuple[str, ...]]] = {
    "tfcoord-client": (ROOT / "client" / "pyproject.toml", ("tfcoord.client",)),
    "tfcoord-node": (ROOT / "node" / "pyproject.toml", ("tfcoord.node",)),
    "tfcoord-coordinator": (ROOT / "coordinator" / "pyproject.toml", ("tfcoord.coordinator",)),
    "tfcoord": (
        ROOT / "pyproject.toml",
        (
            "tfcoord.driver",
            "tfcoord.cli",
            "tfcoord.compat",
            "tfcoord.aliases",
            "tfcoord.envcheck",
            "tfcoord.completion",
            "tfcoord.__main__",
        ),
    ),
}
#: Imports a distribution need not declare, and why.
UNDECLARED_OK = {
    # ndcodec encodes a numpy array it is handed: whoever hands one has numpy.
    ("tfcoord-client", "numpy"): "the caller's",
}


def _requirement_names(pyproject: Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return {re.split(r"[\s\[<>=~!;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("tfcoord", include_external_packages=True)


def _imports_of(graph: grimp.ImportGraph, parts: tuple[str, ...]) -> set[str]:
    found: set[str] = set()
    for module in graph.modules:
        if any(module == p or module.startswith(p + ".") for p in parts):
            found |= graph.find_modules_directly_imported_by(module)
    return found


def _part(module: str) -> str:
    return next(
        (
            dist
            for dist, (_, parts) in DISTRIBUTIONS.items()
            for p in parts
            if module == p or module.startswith(p + ".")
        ),
        "",
    )


@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
def test_a_distribution_declares_every_package_it_imports(graph: grimp.ImportGraph, dist: str) -> None:
    pyproject, parts = DISTRIBUTIONS[dist]
    declared = _requirement_names(pyproject)
    providers = packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    missing = []
    for target in sorted(_imports_of(graph, parts)):
        top = target.split(".")[0]
        if top == "tfcoord" or top in stdlib or (dist, top) in UNDECLARED_OK:
            continue
        names = {n.lower().replace("_", "-") for n in providers.get(top, [top])}
        if not names & declared and not any(n.startswith(top.replace("_", "-")) for n in declared):
            missing.append(f"{top} (from {sorted(names)})")
    assert not missing, (
        f"{dist} imports packages it does not declare in {pyproject.relative_to(ROOT)}: {missing}"
    )


@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
def test_a_distribution_requires_exactly_the_tfcoord_parts_it_imports(
    graph: grimp.ImportGraph, dist: str
) -> None:
    pyproject, parts = DISTRIBUTIONS[dist]
    required = {n for n in _requirement_names(pyproject) if n.startswith("tfcoord")}
    imported = {_part(t) for t in _imports_of(graph, parts) if t.startswith("tfcoord")} - {dist, ""}
    assert imported == required, f"{dist} imports {sorted(imported)} but requires {sorted(required)}"


def test_the_import_contracts_hold() -> None:
    """The layer order (pyproject.toml [tool.importlinter]): no distribution imports one above
    it, the node and the coordinator are independent, the client's modules form no cycle."""
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"Contracts: \d+ kept, 0 broken", out.stdout), out.stdout[-2000:]
