"""The role_resources description: parsing, Spark configuration keys, what each Spark cluster honours."""

from __future__ import annotations

import pytest

from tfcoord.driver.resources import (
    Resources,
    ResourcesError,
    check_spark,
    from_conf,
    memory_mib,
    parse_flag,
    parse_flags,
    role_resources,
    to_conf,
)

STANDALONE = {"spark.executor.cores": "4", "spark.executor.memory": "4g"}


def test_the_dict_the_flag_and_the_spark_keys_describe_the_same_resources() -> None:
    given = role_resources({"ps": {"cpus": 1, "memory": "2g"}, "worker": {"cpus": 4, "gpus": 1}})
    assert given == {"ps": Resources(1, 0, 2048), "worker": Resources(4, 1, None)}
    assert parse_flags(["ps:cpus=1,memory=2g", "worker:cpus=4,gpus=1"]) == given
    conf = to_conf(given)
    assert conf == {
        "spark.tfcoord.resources.ps.cpus": "1",
        "spark.tfcoord.resources.ps.memory": "2048m",
        "spark.tfcoord.resources.worker.cpus": "4",
        "spark.tfcoord.resources.worker.gpus": "1",
    }
    assert from_conf([*conf.items(), ("spark.executor.cores", "4")]) == given


@pytest.mark.parametrize(
    ("value", "mib"),
    [("2g", 2048), ("512m", 512), ("512MiB", 512), (1024, 1024), ("1.5g", 1536), ("1t", 1048576)],
)
def test_memory_sizes(value: object, mib: int) -> None:
    assert memory_mib(value) == mib


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("worker", "is not ROLE:cpus=N"),
        ("worker:cpus", "'cpus' is not KEY=VALUE"),
        ("worker:cpus=2,cpus=3", "cpus is given twice"),
        ("worker:mem=2", "unknown key(s) mem; the keys are cpus, gpus, memory"),
        ("worker:gpus=0.5", "gpus='0.5' must be a whole number"),
        ("worker:cpus=0", "cpus must be a number above 0"),
        ("worker:memory=lots", "memory='lots' is not a size"),
        ("bad-name:cpus=1", "is not a TensorFlow job name"),
    ],
)
def test_bad_flags_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ResourcesError) as e:
        parse_flag(text)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_role_given_twice_and_a_bad_spark_key_are_refused() -> None:
    with pytest.raises(ResourcesError, match="--role-resources for ps is given twice"):
        parse_flags(["ps:cpus=1", "ps:cpus=2"])
    with pytest.raises(
        ResourcesError, match=r"spark.tfcoord.resources.worker.mem is not spark.tfcoord.resources.<role>"
    ):
        from_conf([("spark.tfcoord.resources.worker.mem", "1g")])


def test_task_only_profiles_need_spark_3_4_on_standalone_and_3_5_on_kubernetes() -> None:
    given = {"worker": Resources(cpus=2)}
    assert not check_spark(given, "spark://h:7077", "3.4.1", STANDALONE).dynamic
    with pytest.raises(ResourcesError, match=r"^Spark 3.3.2 on standalone cannot run .* 3.4 or later"):
        check_spark(given, "spark://h:7077", "3.3.2", STANDALONE)
    with pytest.raises(ResourcesError, match=r"^Spark 3.4.1 on kubernetes cannot run .* 3.5 or later"):
        check_spark(given, "k8s://https://h", "3.4.1", STANDALONE)
    with pytest.raises(ResourcesError, match=r"resource profiles need Spark 3.1 or later"):
        check_spark(given, "yarn", "3.0.3", {"spark.dynamicAllocation.enabled": "true"})
    plan = check_spark(
        given, "yarn", "3.0.3".replace("3.0", "3.5"), {"spark.dynamicAllocation.enabled": "true"}
    )
    assert plan.dynamic and plan.manager == "yarn"


def test_without_dynamic_allocation_the_executors_there_are_must_fit_each_task() -> None:
    with pytest.raises(ResourcesError, match=r"^ps asks for 8192 MiB but executors have 4096 MiB"):
        check_spark({"ps": Resources(memory_mb=8192)}, "spark://h:7077", "4.0.0", STANDALONE)
    with pytest.raises(ResourcesError, match=r"^worker: cpus=1.5, but Spark gives tasks whole cores"):
        check_spark({"worker": Resources(cpus=1.5)}, "spark://h:7077", "4.0.0", STANDALONE)
    with pytest.raises(ResourcesError, match=r"^worker asks for 2 GPUs per task but executors have 1"):
        conf = {**STANDALONE, "spark.executor.resource.gpu.amount": "1"}
        check_spark({"worker": Resources(gpus=2)}, "spark://h:7077", "4.0.0", conf)
