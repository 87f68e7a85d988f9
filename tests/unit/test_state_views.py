"""views.py: a job's status, full and brief, the list of jobs, and what is missing."""

from __future__ import annotations

from tests.unit.statekit import DRIVER, T0, Machine, refusal, register, result, submit, waiter
from tfcoord.client import messages as m
from tfcoord.client.vocab import ErrorCode
from tfcoord.coordinator import state as s
from tfcoord.coordinator.state import views

BIG = m.JobSpec(roles=(("ps", 2), ("worker", 300)))


def status_event(job: str | None, viewer: bytes | None = None) -> s.StatusEvent:
    return s.StatusEvent(now=T0, job=job, waiter=waiter(DRIVER), viewer=viewer)


def test_the_brief_status_keeps_its_size_whatever_the_job() -> None:
    sm = Machine()
    sm(submit(spec=BIG))
    for eid in (0, 1, 2, 5):
        sm(register(eid))
    brief = sm.state.brief("j")
    assert (brief["registered"], brief["missing_count"], brief["running"]) == (4, 298, 0)
    assert len(brief["missing"]) == s.BRIEF_MISSING
    assert brief["missing"][:2] == [
        "worker:1 (executor 3): never registered",
        "worker:2 (executor 4): never registered",
    ]
    full = sm.state.status("j")
    assert len(full["missing"]) == 298 and len(full["nodes"]) == 4
    assert set(brief) - set(full) == {"running", "missing_count", "brief", "restart_count"}


def test_missing_slots_are_named_as_ranges_in_a_message() -> None:
    sm = Machine()
    sm(submit(spec=BIG))
    sm(register(3))
    sm(s.NodeLost(now=T0, job="j", executor_id=3, attempt=0, reason="gone"))
    assert views.missing_lines(sm.job()) == [
        "ps:0-1 (executors 0-1): never registered",
        "worker:0 (executor 2): never registered",
        "worker:1 (executor 3): attempt 0 registered from host host3, then LOST (gone)",
        "worker:2-299 (executors 4-301): never registered",
    ]


def test_the_cluster_spec_lists_addresses_by_task_index_and_brackets_ipv6() -> None:
    sm = Machine()
    sm.form(m.JobSpec(roles=(("ps", 1), ("worker", 2))))
    job = sm.job()
    job.slots[2].node.host = "fe80::1"  # type: ignore[union-attr]
    assert s.CoordinatorState.cluster_spec(job) == {
        "ps": ["host0:2000"],
        "worker": ["host1:2001", "[fe80::1]:2002"],
    }


def test_status_answers_one_job_or_the_list_each_driver_may_see() -> None:
    sm = Machine()
    sm(submit("mine", owner=b"me"))
    sm(submit("theirs", owner=b"them"))
    listing = status_event(None, viewer=b"me")
    assert [j["job"] for j in result(listing, sm(listing))["jobs"]] == ["mine"]
    admin = status_event(None)
    assert [j["job"] for j in result(admin, sm(admin))["jobs"]] == ["mine", "theirs"]
    one = status_event("mine", viewer=b"me")
    assert result(one, sm(one)) == sm.state.status("mine")
    hidden = status_event("theirs", viewer=b"me")
    assert refusal(hidden, sm(hidden)).code == ErrorCode.UNKNOWN_JOB
