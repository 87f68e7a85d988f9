"""Big state machines are split by concern, and the rest of the coordinator stays readable:
no class in coordinator/ over 600 lines, no function or method over 80 (issue 24)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

COORDINATOR = Path(__file__).resolve().parents[2] / "coordinator" / "tfcoord" / "coordinator"
MAX_CLASS_LINES = 600
MAX_FUNCTION_LINES = 80


def _too_long() -> list[str]:
    found = []
    for path in sorted(COORDINATOR.rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                most = MAX_CLASS_LINES if isinstance(n, ast.ClassDef) else MAX_FUNCTION_LINES
                lines = (n.end_lineno or n.lineno) - n.lineno + 1
                if lines > most:
                    found.append(
                        f"{path.relative_to(COORDINATOR)}: {n.name} is {lines} lines (at most {most})"
                    )
    return found


def test_no_class_or_function_in_the_coordinator_is_too_long() -> None:
    assert COORDINATOR.is_dir()
    too_long = _too_long()
    if too_long:
        pytest.fail("split these by concern:\n" + "\n".join(too_long))
