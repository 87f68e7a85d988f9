"""tfcoord.driver.capacity: the task slots a Spark configuration gives, and what a cluster needs."""

from __future__ import annotations

import pytest

from tfcoord.driver.capacity import (
    Slots,
    check_application,
    configured_slots,
    executors_asked,
    jvm_size_mib,
    local_standalone_size,
)


def test_standalone_slots_come_from_cores_max_and_executor_cores() -> None:
    conf = {"spark.cores.max": "2", "spark.executor.cores": "1"}
    assert configured_slots(conf.get, "spark://h:7077", 8) == Slots(
        2, "2 executors x 1 core (spark.cores.max=2, spark.executor.cores=1)"
    )
    assert configured_slots(
        {"spark.cores.max": "4", "spark.task.cpus": "2"}.get, "spark://h:7077", 8
    ) == Slots(2, "(spark.cores.max=4, spark.task.cpus=2)")


def test_yarn_and_local_cluster_slots() -> None:
    conf = {"spark.executor.instances": "4", "spark.executor.cores": "2", "spark.task.cpus": "2"}
    assert configured_slots(conf.get, "yarn", 8).count == 4
    assert configured_slots({}.get, "local-cluster[3, 2, 1024]", 8) == Slots(
        6, "3 executors x 2 cores (local-cluster[3, 2, 1024])"
    )


def test_local_masters_have_their_threads() -> None:
    assert configured_slots({}.get, "local", 8) == Slots(1, "local: 1 task thread(s)")
    assert configured_slots({}.get, "local[2]", 8) == Slots(2, "local[2]: 2 task thread(s)")
    assert configured_slots({}.get, "local[*, 3]", 8) == Slots(8, "local[*, 3]: 8 task thread(s)")
    assert configured_slots({"spark.task.cpus": "2"}.get, "local[4,2]", 8) == Slots(
        2, "local[4,2]: 4 task thread(s) (spark.task.cpus=2)"
    )


def test_a_configuration_that_does_not_say_checks_nothing() -> None:
    assert configured_slots({"spark.executor.cores": "1"}.get, "spark://h:7077", 8) is None
    check_application(None, 100)


def test_too_few_slots_are_refused_with_the_numbers() -> None:
    slots = Slots(2, "2 executors x 1 core (spark.cores.max=2, spark.executor.cores=1)")
    check_application(slots, 2)
    with pytest.raises(ValueError) as e:
        check_application(slots, 3)
    msg = str(e.value)
    assert "the application has 2 Spark task slot(s), 2 executors x 1 core" in msg
    assert "needs 3 nodes running at once" in msg and "spark.cores.max=3" in msg
    assert "--num-executors 3" in msg and "ask for 2 nodes" in msg and "\n" not in msg


def test_jvm_sizes() -> None:
    assert [jvm_size_mib(v) for v in ("1g", "512m", "2048", "1G", "1t", "2048k")] == [
        1024,
        512,
        2048,
        1024,
        1024 * 1024,
        2,
    ]
    for bad in ("", "0g", "lots", "1.5g"):
        with pytest.raises(ValueError, match="executor memory must be a size such as 512m or 2g"):
            jvm_size_mib(bad)


def test_local_standalone_is_sized_to_the_job_or_refused_with_the_machines_numbers() -> None:
    assert local_standalone_size(2, 1, "1g", 2, 8000) == (2, 2048)
    with pytest.raises(ValueError, match="3 executors x 1 core need 3 cores, this machine has 2"):
        local_standalone_size(3, 1, "1g", 2, 8000)
    with pytest.raises(ValueError, match="2 executors x 5g need 10240 MiB, this machine has 8000 MiB"):
        local_standalone_size(2, 1, "5g", 2, 8000)


def test_the_executors_a_standalone_application_asks_for() -> None:
    assert executors_asked("4", "2") == 2 and executors_asked("3", "1") == 3
    with pytest.raises(ValueError, match="must be whole numbers > 0, not 'two' and '1'"):
        executors_asked("two", "1")
