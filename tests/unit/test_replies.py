"""replies.py and jobreplies.py: one class per answer, the same on both sides; malformed answers are protocol errors."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest

from tests.unit.statekit import T0, Machine, register, report, stop, submit
from tfcoord.client import jobreplies as jr
from tfcoord.client import messages as m
from tfcoord.client import replies as r
from tfcoord.client.errors import RemoteProtocolError
from tfcoord.client.vocab import FailureReason, JobState, NodeState
from tfcoord.coordinator import state as s
from tfcoord.coordinator.state import telemetry, views


def test_every_request_that_gets_a_map_has_its_answer_class() -> None:
    requests = {op for op in m.DRIVER_OPS | m.NODE_OPS | m.ADMIN_OPS}
    assert set(jr.ANSWERS) == {c.op for c in requests} - {m.AwaitCluster.op}  # a ClusterReply of its own


def test_what_the_coordinator_sends_decodes_as_the_same_answer_and_encodes_to_the_same_bytes() -> None:
    """Every answer a running job's status, list and stop produce survives a trip over the wire."""
    sm = Machine()
    sm.run(
        submit(),
        register(0, gpus=["g0"]),
        register(1),
        report(0),
        report(1, state=NodeState.FAILED, error="boom"),
    )
    sm(s.StopJobEvent(now=T0, job="j", reason="enough", waiter=(1, 999)))
    for answer in (
        views.status(sm.job()),
        views.brief(sm.job()),
        views.summary(sm.state.jobs.values()),
        telemetry.logs(sm.job()),
    ):
        wire = answer.to_wire()
        back = type(answer).from_wire(msgpack.unpackb(msgpack.packb(wire)))
        assert back == wire and back.to_wire() == wire
        assert msgpack.packb(back.to_wire()) == msgpack.packb(wire)
    status = jr.JobStatus.from_wire(sm.state.status("j"))
    assert (status.state, status.reason, status.running, status.missing_count) == (
        JobState.FAILED,
        FailureReason.NODE_FAILED,
        1,
        0,
    )
    assert status.nodes[0].gpus == ("g0",) and status.nodes[0].figures == {}
    brief = jr.JobStatus.from_wire(sm.state.brief("j"))
    assert brief.brief and brief.nodes == () and brief.running == 1


def test_a_node_of_history_carries_no_figures_and_is_sent_without_them() -> None:
    node = jr.NodeStatus(
        executor_id=0,
        attempt=0,
        role="worker",
        index=0,
        state=NodeState.LOST,
        host="h",
        port=1,
        gpus=(),
        task_id="",
        meta={},
        registered_at=1.0,
        last_seen=2.0,
        ended_at=3.0,
        error="gone",
        connected=False,
    )
    assert "figures" not in node.to_wire() and node.figures is None
    assert jr.NodeStatus.from_wire(node.to_wire()).to_wire() == node.to_wire()


def test_a_stop_answer_names_a_restart_only_when_there_is_one() -> None:
    plain = r.StopAnswer(stop=True, reason="enough", job_state=JobState.STOPPING)
    assert plain.to_wire() == {"stop": True, "reason": "enough", "job_state": "STOPPING"}
    restart = r.StopAnswer(stop=True, reason="x", job_state=JobState.RUNNING, restart=1, backoff_s=0.0)
    assert restart.to_wire() == {
        "stop": True,
        "reason": "x",
        "job_state": "RUNNING",
        "restart": 1,
        "backoff_s": 0.0,
    }
    assert r.StopAnswer.from_wire(plain.to_wire()).restart == -1


@pytest.mark.parametrize(
    ("answer", "wire", "says"),
    [
        (r.StopAnswer, ["stop"], "must be a map"),
        (r.StopAnswer, {"stop": True, "reason": "x"}, "no field 'job_state'"),
        (r.StopAnswer, {"stop": 1, "reason": "x", "job_state": "RUNNING"}, "field 'stop'"),
        (r.Reported, {"state": "EXPLODED", "job_state": "RUNNING"}, "field 'state'"),
        (
            r.Registration,
            {
                "job": "j",
                "role": "worker",
                "index": True,
                "size": 1,
                "heartbeat_timeout_s": 1.0,
                "state": "READY",
            },
            "field 'index'",
        ),
        (
            jr.Logs,
            {"job": "j", "state": "READY", "nodes": [], "lines": [[0, 1.0, 0, "stdout"]], "next": 1},
            "field 'lines'",
        ),
        (jr.JobList, {"jobs": [{"job": "j"}]}, "malformed JobSummary"),
        (jr.JobStatus, {"job": "j", "state": "RUNNING"}, "malformed JobStatus"),
    ],
)
def test_a_malformed_answer_is_a_protocol_error(answer: type[r.Answer], wire: Any, says: str) -> None:
    with pytest.raises(RemoteProtocolError, match=says):
        answer.from_wire(wire)


def test_fields_a_coordinator_does_not_know_yet_are_ignored_and_kept_in_the_map() -> None:
    wire = {"stop": False, "reason": "", "job_state": "RUNNING", "from_the_future": 1}
    answer = r.StopAnswer.from_wire(wire)
    assert answer.stop is False and answer["from_the_future"] == 1 and dict(answer) == wire


def test_a_number_may_come_as_an_integer_but_never_as_a_bool() -> None:
    finished = jr.Finished.from_wire({"job": "j", "state": "RUNNING", "serving_grace_s": 30})
    assert finished.serving_grace_s == 30.0 and isinstance(finished.serving_grace_s, float)
    with pytest.raises(RemoteProtocolError):
        jr.Finished.from_wire({"job": "j", "state": "RUNNING", "serving_grace_s": True})
    series = jr.Series.from_wire(
        {
            "job": "j",
            "state": "RUNNING",
            "nodes": [{"executor_id": 0, "role": "w", "index": 0, "points": [[1, {"loss": math.inf}]]}],
        }
    )
    assert series.nodes[0].points == ((1.0, {"loss": math.inf}),)


def test_a_stop_result_is_answered_typed() -> None:
    sm = Machine()
    sm.form()
    ev = stop(dry_run=True)
    [sent] = sm(ev)
    assert isinstance(sent, s.Send) and isinstance(sent.msg, m.Reply)
    result = jr.StopResult.from_wire(sent.msg.result)
    assert (result.state, result.dry_run, result.nodes) == (
        JobState.READY,
        True,
        ("worker:0 (executor 0, host host0)", "worker:1 (executor 1, host host1)"),
    )
    assert list(sent.msg.result) == ["state", "job", "nodes", "dry_run"]  # the order it always had
