"""The state machine's frame: life-cycle tables keyed by enums, one handler per event class,
and no job event or wait kind spelled as a string anywhere in it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from tfcoord.client.vocab import JobEvent, JobState, NodeState, WaitKind
from tfcoord.coordinator import state as s
from tfcoord.coordinator.state import events, transitions

PACKAGE = Path(s.__file__).parent


def test_every_job_event_moves_some_state_and_only_through_the_table() -> None:
    used = {e for row in s.JOB_TRANSITIONS.values() for e in row}
    assert used == set(JobEvent)
    assert all(isinstance(e, JobEvent) for row in s.JOB_TRANSITIONS.values() for e in row)
    assert s.next_state(s.JOB_TRANSITIONS, JobState.RESERVING, JobEvent.COMPLETE) is JobState.READY
    with pytest.raises(s.InvalidTransition, match="'run' is not allowed in state RESERVING"):
        s.next_state(s.JOB_TRANSITIONS, JobState.RESERVING, JobEvent.RUN)


def test_a_nodes_states_only_move_forward() -> None:
    order = list(NodeState)
    for state, row in s.NODE_TRANSITIONS.items():
        for event, new in row.items():
            assert event is new and order.index(new) > order.index(state)
    with pytest.raises(s.InvalidTransition):
        s.next_state(s.NODE_TRANSITIONS, NodeState.RUNNING, NodeState.READY)


def test_every_event_class_has_exactly_one_handler() -> None:
    classes = {
        c
        for _, c in inspect.getmembers(events, inspect.isclass)
        if issubclass(c, events.Event) and c is not events.Event
    }
    state = s.CoordinatorState()
    assert set(state._dispatch) == classes
    for event, handler in state._dispatch.items():
        assert handler.__self__ in vars(state).values(), event  # a part's bound method


def test_two_handlers_for_one_event_are_refused() -> None:
    class A:
        @events.handles(events.Tick)
        def one(self, ev: events.Tick) -> None: ...

    class B:
        @events.handles(events.Tick)
        def two(self, ev: events.Tick) -> None: ...

    assert list(events.handlers_of(A())) == [events.Tick]
    with pytest.raises(ValueError, match="Tick has two handlers"):
        events.handlers_of(A(), B())


def _literals(tree: ast.AST) -> set[str]:
    """String constants that say something: not docstrings, nor dict keys and subscripts
    (``answer["stop"]`` names a reply's field)."""
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        elif isinstance(n, ast.Dict):
            skip.update(id(k) for k in n.keys if k is not None)
        elif isinstance(n, ast.Subscript):
            skip.add(id(n.slice))
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    }


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_job_event_or_wait_kind_is_spelled_as_a_string(path: Path) -> None:
    words = {e.value for e in JobEvent} | {k.value for k in WaitKind}
    assert not _literals(ast.parse(path.read_text())) & words


def test_the_tables_live_in_one_module() -> None:
    assert s.JOB_TRANSITIONS is transitions.JOB_TRANSITIONS
    assert s.NODE_TRANSITIONS is transitions.NODE_TRANSITIONS
