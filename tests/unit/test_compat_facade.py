"""The compatibility layers are facades over the core (STYLE "A compatibility layer is a facade").

Read from the source, not imported: no module under ``tfcoord/compat`` imports a name beginning
with ``_`` from another module of tfcoord (nor reaches one through a module it imported), and none
holds a second rendezvous server, node life or feed: no accept loop, no forking, no
``multiprocessing`` manager. Those live in the core; the facade binds at most a socket and hands
it over.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "tfcoord" / "compat"
MODULES = sorted(COMPAT.rglob("*.py"))
#: What only a server, a node life or a feed of their own would use.
FORBIDDEN_MODULES = ("multiprocessing", "socketserver", "asyncio", "selectors")
FORBIDDEN_CALLS = ("accept", "recv", "recv_into", "fork", "listen")


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module an ``from X import ...`` names."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(path: Path, me: str | None = None) -> list[str]:
    """Each private name the module at ``path`` (named ``me``) takes from another tfcoord module."""
    me = me or _module_name(path)
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> the tfcoord module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tfcoord"):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"import {alias.name}")
                    modules[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, me, path.name == "__init__.py")
            if not source.startswith("tfcoord") or source == me:
                continue
            if any(_private(part) for part in source.split(".")):
                found.append(f"from {source} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"from {source} import {alias.name}")
                else:
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _private(node.attr)
        ):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return found


def second_machinery(path: Path) -> list[str]:
    """What in ``path`` looks like a server, node life or feed of its own."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
            found.append(node.module or "")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in FORBIDDEN_CALLS
        ):
            found.append(f"{node.func.attr}() at line {node.lineno}")
    return found


def test_the_compat_modules_are_found() -> None:
    names = {_module_name(p) for p in MODULES}
    assert {
        "tfcoord.compat.tensorflowonspark.reservation",
        "tfcoord.compat.tensorflowonspark.TFSparkNode",
        "tfcoord.compat.tensorflowonspark.TFManager",
        "tfcoord.compat.tfmesos2",
    } <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(COMPAT)))
def test_no_compat_module_takes_a_private_name_from_the_core(path: Path) -> None:
    assert private_imports(path) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(COMPAT)))
def test_no_compat_module_serves_forks_or_feeds_on_its_own(path: Path) -> None:
    assert second_machinery(path) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text(
        "from tfcoord.client.messages import MAX_TEXT_LEN, _any_map\n"
        "from tfcoord.client import messages as m\n"
        "from . import _private_helper\n"
        "import multiprocessing\n"
        "x = m._seconds\n"
        "def serve(s):\n"
        "    return s.accept()\n"
    )
    assert private_imports(bad, "tfcoord.compat.tensorflowonspark.probe") == [
        "from tfcoord.client.messages import _any_map",
        "from tfcoord.compat.tensorflowonspark import _private_helper",
        "tfcoord.client.messages._seconds",
    ]
    assert second_machinery(bad) == ["multiprocessing", "accept() at line 7"]
