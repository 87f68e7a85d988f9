"""tfmesos2 0.4.0's ``Job`` list semantics on tfcoord: any job name, repeated names, ``start``,
fractional GPUs, and a live ``Cluster`` (``tasks``, ``task_queue``, ``get_task_info``).

The numbering tests are pure. The cluster tests run against the fake master, whose tasks are
real node processes; the expected cluster specs are written out by hand from tfmesos2's rules
(entry ``Job(name, num, start)`` makes indexes ``start .. num - 1``, each raised by the
``worker`` tasks listed before it; ``cluster_def`` lists each name's addresses by index).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.mesos.fake_master import AgentSpec, ThreadedFakeMaster
from tfcoord.client.messages import LaunchSpec
from tfcoord.compat.tfmesos2 import Job, Planned, cluster, plan, runs
from tfcoord.coordinator.mesos.errors import MesosConfigError
from tfcoord.coordinator.mesos.jobs import MesosJob, RoleResources

SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]


def indexes(planned: list[Planned]) -> list[tuple[str, int, int]]:
    return [(p.job_name, p.task_index, p.position) for p in planned]


def test_plain_lists_number_each_name_from_zero() -> None:
    assert indexes(plan([Job("ps", 1), Job("worker", 2)])) == [
        ("ps", 0, 0),
        ("worker", 0, 0),
        ("worker", 1, 1),
    ]


def test_a_repeated_worker_entry_continues_the_numbering() -> None:
    got = plan([Job("worker", 2), Job("worker", 2, cpus=2)])
    assert indexes(got) == [("worker", 0, 0), ("worker", 1, 1), ("worker", 2, 2), ("worker", 3, 3)]
    assert [p.cpus for p in got] == [1.0, 1.0, 2, 2]


def test_entries_after_workers_are_offset_and_start_skips_indexes() -> None:
    # tfmesos2: Job("reader", 3, start=1) makes 1, 2; after two workers they become 3, 4.
    got = plan([Job("worker", 2), Job("reader", 3, start=1), Job("ps", 1)])
    assert indexes(got) == [
        ("worker", 0, 0),
        ("worker", 1, 1),
        ("reader", 3, 0),
        ("reader", 4, 1),
        ("ps", 2, 0),
    ]


def test_a_repeated_name_that_is_not_worker_repeats_its_indexes_in_list_order() -> None:
    got = plan([Job("ps", 2), Job("ps", 1, mem=512)])
    # indexes 0, 1, 0: the spec lists them by index, ties in list order: ps0, ps0', ps1
    assert indexes(got) == [("ps", 0, 0), ("ps", 1, 2), ("ps", 0, 1)]
    # the slots in position order need 1024, 512, 1024 MB: three runs of ps
    assert [(r.role, r.count, r.mem) for r in runs(got)] == [
        ("ps", 1, 1024.0),
        ("ps", 1, 512.0),
        ("ps", 1, 1024.0),
    ]


def test_fractional_gpus_are_rounded_up_for_the_offer_and_kept_as_asked() -> None:
    got = plan([Job("worker", 2, gpus=0.5), Job("worker", 1, gpus=1.2)])
    assert [p.gpus for p in got] == [0.5, 0.5, 1.2]
    assert [(r.count, r.gpus) for r in runs(got)] == [(2, 1), (1, 2)]


def test_bad_entries_are_refused_with_a_clear_message() -> None:
    with pytest.raises(MesosConfigError, match="no task"):
        plan([Job("worker", 1, start=1)])
    with pytest.raises(MesosConfigError, match="num must be a whole number"):
        plan([Job("worker", 1.5)])  # type: ignore[arg-type]
    with pytest.raises(MesosConfigError, match="gpus must be a number"):
        plan([Job("worker", 1, gpus=-1)])
    with pytest.raises(MesosConfigError, match="not a TensorFlow job name"):
        runs(plan([Job("bad name", 1)]))


def test_runs_of_one_role_travel_in_the_job_spec_and_come_back() -> None:
    mj = MesosJob.of(
        runs(plan([Job("reader", 1), Job("ps", 2), Job("ps", 1, mem=512), Job("worker", 1, gpus=0.5)]))
    )
    spec = mj.to_spec(name="t")
    assert spec.roles == (("ps", 3), ("worker", 1), ("reader", 1))  # known roles first, custom after
    assert spec.launch is not None
    assert [(r, n) for r, _, *n in spec.launch.resources] == [
        ("ps", [1]),
        ("ps", [1]),
        ("ps", [1]),
        ("worker", []),
        ("reader", []),
    ]
    assert [dict(a)["mem"] for r, a, *_ in spec.launch.resources if r == "ps"] == [1024.0, 512.0, 1024.0]
    assert LaunchSpec.from_wire(spec.launch.to_wire()) == spec.launch
    back = MesosJob.from_spec(spec)
    assert back == mj
    assert [back.slot(i).mem for i in range(5)] == [1024.0, 512.0, 1024.0, 1024.0, 1024.0]
    assert back.slot(3) == RoleResources("worker", 1, 1.0, 1024.0, 1)


# -- against the fake master --------------------------------------------------------------------


@pytest.fixture
def master() -> Iterator[ThreadedFakeMaster]:
    agents = [AgentSpec(cpus=8, mem=16384, gpus=4, gpu_kind="SET")]
    with ThreadedFakeMaster(agents, heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        yield m


@pytest.mark.slow
def test_custom_repeated_offset_and_fractional_jobs_reach_tfmesos2s_cluster_spec(
    master: ThreadedFakeMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DOCKER_IMAGE", raising=False)
    jobs = [
        {"name": "ps", "num": 1, "cpus": 0.25, "mem": 128},
        Job("worker", 2, cpus=0.25, mem=128),
        Job("worker", 1, cpus=0.25, mem=128, gpus=0.5),
        Job("reader", 3, cpus=0.25, mem=128, start=1),
    ]
    with cluster(jobs, "127.0.0.1", master=master.master.address, python=sys.executable, command=SLEEP) as c:
        tasks = c.tasks
        assert set(tasks) == set(master.master.tasks)
        by_name = {(t.job_name, t.task_index): t for t in tasks.values()}
        # tfmesos2: ps 0 (listed first); workers 0, 1, then 2; reader 1 and 2, raised by the 3 workers
        assert sorted(by_name) == [
            ("ps", 0),
            ("reader", 4),
            ("reader", 5),
            ("worker", 0),
            ("worker", 1),
            ("worker", 2),
        ]
        addr = {k: f"{t.addr}:{t.port}" for k, t in by_name.items()}
        assert c.cluster_def == {
            "ps": [addr["ps", 0]],
            "worker": [addr["worker", 0], addr["worker", 1], addr["worker", 2]],
            "reader": [addr["reader", 4], addr["reader", 5]],
        }
        assert c.targets["/job:reader/task:5"] == f"grpc://{addr['reader', 5]}"
        assert all(t.state == "TASK_RUNNING" and t.initialized for t in tasks.values())
        gpu_task = by_name["worker", 2]
        assert gpu_task.gpus == 0.5  # as asked; the offer gave it a whole GPU
        info = master.master.task(gpu_task.mesos_task_id).task_info
        assert [r for r in info["resources"] if r["name"] == "gpus"] == [
            {
                "name": "gpus",
                "type": "SET",
                "set": {"item": ["0"]},
                "role": "*",
                "allocation_info": {"role": "tensorflow"},
            }
        ]
        assert c.task_queue.empty()
        got = c.get_task_info(gpu_task.mesos_task_id)
        assert [t["id"] for t in got["tasks"]] == [gpu_task.mesos_task_id]
        assert got["tasks"][0]["state"] == "TASK_RUNNING"
        # live: a task killed now shows its new state on the next read
        master.call(master.master.fail_task(by_name["reader", 4].mesos_task_id, "TASK_LOST", "agent lost"))
        c.status()
        lost = c.tasks[by_name["reader", 4].mesos_task_id]
        assert lost.state == "TASK_LOST" or lost.node_state in ("LOST", "FAILED", "STOPPED")
