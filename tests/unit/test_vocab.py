"""The vocabulary is spelled out in one module: no state, error code or failure kind is
written as a string literal anywhere else in tfcoord's code (it is imported from
``tfcoord.client.vocab``), and no code searches error text for a phrase instead."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfcoord.client.vocab import (
    REPORT_STATES,
    ErrorCode,
    FailureReason,
    JobState,
    NodeState,
)

ROOT = Path(__file__).resolve().parents[2]
#: tfcoord's own code: the three parts and the command line with its compatibility layers.
SOURCES = ("client", "node", "coordinator", "tfcoord")
VOCAB = ROOT / "client" / "tfcoord" / "client" / "vocab.py"

#: Every word of the vocabulary, and what it is.
WORDS: dict[str, str] = {
    **{st.value: "a job state" for st in JobState},
    **{st.value: "a node state" for st in NodeState},
    # Nodes before the vocabulary reported in lower case; the same states.
    **{st.value.lower(): "a node state (lower case)" for st in REPORT_STATES},
    **{c.value: "an error code" for c in ErrorCode},
    **{r.value: "a failure reason" for r in FailureReason if r.value},
}


#: Words that appear as something else: (file, word) -> what it is there.
NOT_VOCABULARY = {
    ("tfcoord/cli/status.py", "SUBMITTED"): "the column of tfcoord status saying when a job was submitted",
    ("tfcoord/cli/status.py", "running"): "the DRIVER column of tfcoord status: the driver process runs",
    ("tfcoord/compat/tensorflowonspark/TFManager.py", "running"): "TensorFlowOnSpark's manager state",
    ("tfcoord/compat/tensorflowonspark/TFManager.py", "stopped"): "TensorFlowOnSpark's manager state",
}
#: Text from other systems, which give no code to decide on: (file, phrase) -> (how many
#: lines of the file may test it, whose text it is). Counted, so a new test of the same
#: phrase is a decision someone makes here, not one that slips in.
FOREIGN_TEXT = {
    ("tfcoord/driver/spark.py", "Traceback (most recent call last)"): (
        1,
        "Spark's Java exception, "
        "which carries the task's Python traceback only as text (shown to people, not decided on)",
    ),
    ("coordinator/tfcoord/coordinator/mesos/scheduler.py", "removed"): (1, "a Mesos master's ERROR event"),
    ("coordinator/tfcoord/coordinator/mesos/scheduler.py", "failed over"): (
        1,
        "a Mesos master's ERROR event",
    ),
    ("coordinator/tfcoord/coordinator/mesos/scheduler.py", "stream id"): (1, "a Mesos master's 400 body"),
    ("coordinator/tfcoord/coordinator/server.py", "accept"): (
        1,
        "asyncio's exception-handler context, which says what failed only in its message",
    ),
}


def _sources() -> Iterator[Path]:
    for part in SOURCES:
        for path in sorted((ROOT / part).rglob("*.py")):
            if path != VOCAB and ".venv" not in path.parts and "build" not in path.parts:
                yield path


def _names(node: ast.AST) -> set[int]:
    """ids of string constants that name a field rather than say a word: dict keys,
    subscripts and ``.get``/``.pop`` keys (``status["running"]`` is a count, not a state)."""
    skip: set[int] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Dict):
            skip.update(id(k) for k in n.keys if k is not None)
        elif isinstance(n, ast.Subscript):
            skip.add(id(n.slice))
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("get", "pop", "setdefault")
            and n.args
        ):
            skip.add(id(n.args[0]))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = n.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))  # a docstring
    return skip


def literals() -> Iterator[tuple[str, int, str, str]]:
    """(file, line, word, what) for every vocabulary word written as a literal."""
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        skip = _names(tree)
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip:
                what = WORDS.get(n.value)
                file = str(path.relative_to(ROOT))
                if what is not None and (file, n.value) not in NOT_VOCABULARY:
                    yield file, n.lineno, n.value, what


def test_the_scans_see_the_code_and_find_what_they_look_for() -> None:
    assert sum(1 for _ in _sources()) > 50
    tree = ast.parse('if status.state == "FAILED": raise JobFailed("x")\nd = {"running": 1}\n')
    skip = _names(tree)
    found = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in skip]
    assert [w for w in found if w in WORDS] == ["FAILED"]  # "running" is a key, not a state
    assert _PROSE.search('if "reservation timed out" in st["error"]:')
    assert _PROSE.search('if "Spark job" in (st.stop_reason or ""):')
    assert not _PROSE.search("if st.reason == FailureReason.RESERVATION_TIMEOUT:")


def test_no_state_error_code_or_failure_kind_is_written_outside_the_vocabulary() -> None:
    found = [f"{file}:{line}: {word!r} is {what}" for file, line, word, what in literals()]
    assert not found, "import these from tfcoord.client.vocab instead:\n" + "\n".join(found)


#: Deciding on an error's text: ``"phrase" in error``, ``error.startswith(...)``.
_PROSE = re.compile(
    r"""["'][^"'\n]{3,}["']\s+(not\s+)?in\s+[\w.\[\]"'()]*(error|reason|message|summary|text|stop_reason)\b"""
)


def _prose(part: str) -> Iterator[tuple[str, int, str, str]]:
    """(file, line number, phrase, line) for each line of ``part`` that tests text for a phrase."""
    for path in _sources():
        if path.is_relative_to(ROOT / part):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if hit := _PROSE.search(line):
                    quote = hit.group(0)[0]
                    yield str(path.relative_to(ROOT)), i, hit.group(0).split(quote)[1], line.strip()


@pytest.mark.parametrize("part", SOURCES)
def test_no_code_searches_error_text_for_a_phrase(part: str) -> None:
    hits = list(_prose(part))
    counts = Counter((file, phrase) for file, _, phrase, _ in hits)
    found = [
        f"{file}:{i}: {line}"
        for file, i, phrase, line in hits
        if counts[(file, phrase)] > FOREIGN_TEXT.get((file, phrase), (0, ""))[0]
    ]
    assert not found, "decide on codes and reasons, not on what a message says:\n" + "\n".join(found)


def test_every_word_has_one_meaning() -> None:
    """A word that is both an error code and a failure reason means the same failure."""
    codes, reasons = {c.value for c in ErrorCode}, {r.value for r in FailureReason}
    assert codes & reasons == {"node_failed", "node_lost", "feed_timeout"}
    assert {s.value for s in JobState} >= {s.value for s in NodeState} - {"REGISTERED", "LOST"}
