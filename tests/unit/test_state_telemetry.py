"""telemetry.py: what nodes show of their work (metadata, progress, output), bounded."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from tests.unit.statekit import (
    T0,
    Machine,
    heartbeat,
    journaled,
    node_logs,
    progress,
    refusal,
    reply,
    report,
    waiter,
    watch,
)
from tfcoord.client import messages as m
from tfcoord.client.vocab import ErrorCode, NodeState
from tfcoord.coordinator import state as s
from tfcoord.coordinator.state import telemetry


@pytest.fixture
def sm() -> Iterator[Machine]:
    machine = Machine()
    machine.start()
    yield machine
    machine.state.validate()


def test_new_metadata_is_journaled_and_wakes_watchers_the_same_again_does_not(sm: Machine) -> None:
    w = watch(sm.job().version)
    sm(w)
    beat = heartbeat(0, meta={"tensorboard_url": "http://h:6006", "loss": math.nan})
    effects = sm(beat)
    assert journaled(effects) == [s.HeartbeatNode(now=T0, req=beat.req)]
    assert any(isinstance(e, s.Send) and e.msg.id == w.waiter[1] for e in effects)  # type: ignore[union-attr]
    again = heartbeat(0, meta={"tensorboard_url": "http://h:6006", "loss": math.nan})
    assert journaled(sm(again)) == []  # NaN again is no change
    assert sm.node(0).meta["tensorboard_url"] == "http://h:6006"


def test_progress_is_answered_kept_as_a_series_and_never_journaled(sm: Machine) -> None:
    for i in range(3):
        ev = progress(1, figures={"step": i}, usage={"cpu_percent": 50.0}, now=T0 + i)
        assert sm(ev) == [reply(ev)]
    series = sm.state.series("j")
    assert series["nodes"] == [
        {"executor_id": 1, "role": "worker", "index": 1, "points": [[T0 + i, {"step": i}] for i in range(3)]}
    ]
    assert sm.state.series("j", since=T0 + 1)["nodes"][0]["points"] == [[T0 + 2, {"step": 2}]]
    assert sm.job().reports == 6 and sm.state.status("j")["nodes"][1]["usage"] == {"cpu_percent": 50.0}


def test_only_the_node_of_the_slot_may_tell_about_its_work(sm: Machine) -> None:
    impostor = progress(0, figures={"step": 1}, attempt=3)
    assert refusal(impostor, sm(impostor)).code == ErrorCode.NOT_REGISTERED
    logs = node_logs(0, "x", attempt=3)
    assert "only that node may send its output" in refusal(logs, sm(logs)).message


def test_output_lines_are_numbered_bounded_and_read_from_a_line_on(sm: Machine, monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "LOG_LINES_PER_NODE", 60)
    sm(node_logs(0, *(f"a{i}" for i in range(50))))
    sm(node_logs(1, "b0", stream="stderr", now=T0 + 1))
    sm(node_logs(0, *(f"c{i}" for i in range(20)), now=T0 + 2))
    got = sm.state.logs("j", since=49, limit=3)
    assert got["lines"] == [
        [49, T0, 0, "stdout", "a49"],
        [50, T0 + 1, 1, "stderr", "b0"],
        [51, T0 + 2, 0, "stdout", "c0"],
    ]
    assert got["next"] == 52
    assert [n["dropped"] for n in got["nodes"]] == [10, 0]  # node 0 keeps its newest 60
    w = waiter(1)
    ev = s.GetLogsEvent(
        now=T0, req=m.GetLogs(id=w[1], job="j", executor_id=1), waiter=w, viewer=b"not the owner"
    )
    assert refusal(ev, sm(ev)).code == ErrorCode.UNKNOWN_JOB


def test_a_finished_jobs_series_are_thinned(sm: Machine, monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "SERIES_POINTS_FINISHED", 10)
    for i in range(40):
        sm(progress(0, figures={"step": i}, now=T0 + i))
    sm(report(0, state=NodeState.SUCCEEDED))
    sm(report(1, state=NodeState.SUCCEEDED))
    points = sm.state.series("j")["nodes"][0]["points"]
    assert len(points) == 10 and points[0][1] == {"step": 0} and points[-1][1] == {"step": 39}
