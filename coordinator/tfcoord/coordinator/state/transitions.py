"""Life cycles as tables (after h11's ``_state``): a job's and a node's.

Everything that may move a job or a node from one state to the next is a row of these
tables; :func:`next_state` is the only way through them, and a move the tables do not
hold raises :class:`InvalidTransition` (a bug in the state machine, never user input).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from tfcoord.client.vocab import JobEvent, JobState, NodeState

J, N, E = JobState, NodeState, JobEvent

JOB_TRANSITIONS: dict[JobState, dict[JobEvent, JobState]] = {
    J.SUBMITTED: {E.REGISTER: J.RESERVING, E.FAIL: J.FAILED, E.STOP: J.STOPPED},
    J.RESERVING: {E.COMPLETE: J.READY, E.FAIL: J.FAILED, E.STOP: J.STOPPING},
    J.READY: {
        E.RUN: J.RUNNING,
        E.SUCCEED: J.SUCCEEDED,
        E.FAIL: J.FAILED,
        E.STOP: J.STOPPING,
        E.RESTART: J.RESERVING,
    },
    J.RUNNING: {E.SUCCEED: J.SUCCEEDED, E.FAIL: J.FAILED, E.STOP: J.STOPPING, E.RESTART: J.RESERVING},
    J.STOPPING: {E.ALL_STOPPED: J.STOPPED, E.FAIL: J.FAILED},
    J.SUCCEEDED: {},
    J.FAILED: {},
    J.STOPPED: {},
}

#: A node's events are named by the state they lead to (it reports RUNNING, it is found
#: LOST). Its states only move forward along this order, skipping some at will (a node
#: that fails while REGISTERED ends FAILED): each state's row is the states after it.
_NODE_ORDER = (N.REGISTERED, N.READY, N.RUNNING)
_NODE_ENDS = (N.SUCCEEDED, N.FAILED, N.LOST, N.STOPPED)
NODE_TRANSITIONS: dict[NodeState, dict[NodeState, NodeState]] = {
    **{st: {e: e for e in _NODE_ORDER[i + 1 :] + _NODE_ENDS} for i, st in enumerate(_NODE_ORDER)},
    **{st: {} for st in _NODE_ENDS},
}


class InvalidTransition(RuntimeError):
    """A state change the life-cycle tables forbid: a bug in the state machine, never bad input."""


_S = TypeVar("_S", JobState, NodeState)


def next_state(table: Mapping[_S, Mapping[Any, _S]], state: _S, event: JobEvent | NodeState) -> _S:
    """The state ``event`` leads to from ``state`` in ``table``.

    Raises:
        InvalidTransition: the table has no such move.
    """
    try:
        return table[state][event]
    except KeyError:
        raise InvalidTransition(f"'{event}' is not allowed in state {state}") from None
