"""Typed answers and the one driver-side watcher, against a real coordinator on port 0."""

from __future__ import annotations

import pytest

from tfcoord.client import DriverClient, JobFailed, JobSpec, NodeClient, make_roles
from tfcoord.client.errors import RemoteProtocolError
from tfcoord.client.jobreplies import JobStatus, NodeStatus, StopResult
from tfcoord.client.progress import ProgressLines, TimelineLines, describe
from tfcoord.client.replies import Registration, Reported, StopAnswer
from tfcoord.client.vocab import FailureReason, JobState, NodeState
from tfcoord.client.watcher import ended, watch_until
from tfcoord.coordinator.embedded import EmbeddedCoordinator

WAIT_S = 30.0


def _two_workers(d: DriverClient) -> str:
    return d.submit(JobSpec(roles=make_roles(2), reservation_timeout_s=60, name="watched"))


def _node(coord: EmbeddedCoordinator, d: DriverClient, job: str, executor_id: int) -> NodeClient:
    return NodeClient(coord.address, d.job_token(job), job, executor_id).connect()


def test_every_answer_is_typed(coordinator: EmbeddedCoordinator) -> None:
    with DriverClient(coordinator.address, coordinator.secret).connect() as d:
        job = _two_workers(d)
        with _node(coordinator, d, job, 0) as a, _node(coordinator, d, job, 1) as b:
            reg = a.register("127.0.0.1", 7000, meta={"result.loss": 0.5})
            assert isinstance(reg, Registration)
            assert (reg.job, reg.role, reg.index, reg.size, reg.state) == (
                job,
                "worker",
                0,
                2,
                JobState.RESERVING,
            )
            b.register("127.0.0.1", 7001)
            a.await_cluster(WAIT_S)
            reported = a.report(NodeState.RUNNING)
            assert isinstance(reported, Reported) and reported.state is NodeState.RUNNING
            beat = b.heartbeat()
            assert isinstance(beat, StopAnswer) and beat.stop is False and beat.job_state is JobState.READY

            st = d.status(job)
            assert (
                isinstance(st, JobStatus) and st.state is JobState.READY and st.reason is FailureReason.NONE
            )
            assert [n.name for n in st.nodes] == ["worker:0", "worker:1"]
            assert all(isinstance(n, NodeStatus) for n in st.nodes)
            assert st.nodes[0].results == {"loss": 0.5} and st.nodes[0].state is NodeState.RUNNING
            assert st.running == 1 and st.cluster == {"worker": ["127.0.0.1:7000", "127.0.0.1:7001"]}
            # The map it came from, for --json and for programs written against the dictionaries.
            assert st["state"] == "READY" and dict(st.wire)["job"] == job
            [summary] = [j for j in d.jobs() if j.job == job]
            assert summary.state is JobState.READY and summary.registered == 2

            stopped = d.stop(job, "enough", dry_run=True)
            assert isinstance(stopped, StopResult) and stopped.dry_run and len(stopped.nodes) == 2
            a.report("failed", error="Traceback ...\nValueError: boom")  # lower case still reads
        with pytest.raises(JobFailed) as failed:
            d.await_job(job, WAIT_S)
        assert failed.value.reason is FailureReason.NODE_FAILED
        assert failed.value.status is not None and failed.value.status.state is JobState.FAILED


def test_the_watcher_sees_each_change_until_the_condition_holds(coordinator: EmbeddedCoordinator) -> None:
    with DriverClient(coordinator.address, coordinator.secret).connect() as d:
        job = _two_workers(d)
        lines: list[str] = []
        timeline: list[str] = []
        seen: list[JobStatus] = []
        progress, events = ProgressLines(lines.append), TimelineLines(timeline.append)

        def on_change(st: JobStatus) -> None:
            seen.append(st)
            progress(st)
            events(st)

        with _node(coordinator, d, job, 0) as a, _node(coordinator, d, job, 1) as b:
            a.register("127.0.0.1", 7000)
            brief = watch_until(d, job, lambda st: True, timeout_s=WAIT_S, brief=True)
            assert brief.brief and brief.nodes == () and brief.events == ()
            assert (brief.registered, brief.missing_count, brief.running) == (1, 1, 0)
            assert describe(brief) == f"job {job} RESERVING: registered 1/2 (waiting for worker:1)"
            # Not there yet: the watch returns at its deadline with the last status seen.
            st = watch_until(
                d, job, lambda st: st.state is JobState.READY, timeout_s=0.2, on_change=on_change
            )
            assert st.state is JobState.RESERVING and st.registered == 1
            b.register("127.0.0.1", 7001)
            st = watch_until(
                d, job, lambda st: st.state.formed, timeout_s=WAIT_S, on_change=on_change, since=st
            )
            assert st.state is JobState.READY
            for n in (a, b):
                n.await_cluster(WAIT_S)
                n.report(NodeState.RUNNING)
                n.report(NodeState.SUCCEEDED)
            final = watch_until(d, job, ended, timeout_s=WAIT_S, on_change=on_change, since=st)
        assert final.state is JobState.SUCCEEDED
        versions = [s.version for s in seen]
        assert versions == sorted(set(versions))  # each version once, in order
        assert lines[0] == f"job {job} RESERVING: registered 1/2 (waiting for worker:1)"
        assert lines[-1] == f"job {job} SUCCEEDED" and describe(final) == lines[-1]
        # Every line of the timeline once, in order, however the changes fell into watches.
        assert timeline == [text for _, text in final.events]
        assert timeline[0] == "submitted: 2 worker" and timeline[-1] == "job RUNNING -> SUCCEEDED"


def test_progress_followed_on_by_another_watcher_does_not_say_its_last_line_again(
    coordinator: EmbeddedCoordinator,
) -> None:
    # run() logs the reservation's progress, then `tfcoord submit` follows the job with lines
    # of its own: the line the first showed last was printed twice ("READY: 0/2" x 2).
    with DriverClient(coordinator.address, coordinator.secret).connect() as d:
        job = _two_workers(d)
        first_lines: list[str] = []
        first = ProgressLines(first_lines.append, final=False)
        with _node(coordinator, d, job, 0) as a, _node(coordinator, d, job, 1) as b:
            a.register("127.0.0.1", 7000)
            b.register("127.0.0.1", 7001)
            st = watch_until(d, job, lambda st: st.state.formed, timeout_s=WAIT_S, on_change=first)
            assert first_lines[-1] == f"job {job} READY: 0/2 nodes running"
            then_lines: list[str] = []
            then = ProgressLines(then_lines.append, final=False, after=first)
            then(st)  # the status the first watcher showed last
            assert then_lines == []
            for n in (a, b):
                n.await_cluster(WAIT_S)
                n.report(NodeState.RUNNING)
            st = watch_until(d, job, lambda st: st.running == 2, timeout_s=WAIT_S, on_change=then, since=st)
        assert then_lines[-1] == f"job {job} RUNNING: 2/2 nodes running"
        assert f"job {job} READY: 0/2 nodes running" not in then_lines


def test_a_malformed_answer_is_a_protocol_error_where_it_arrives() -> None:
    with pytest.raises(RemoteProtocolError, match="malformed JobStatus"):
        JobStatus.decode({"job": "j", "state": "EXPLODED"})
    with pytest.raises(RemoteProtocolError, match="must be a map"):
        StopAnswer.decode(["stop"])
