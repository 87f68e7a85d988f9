"""spark-submit's master URLs and flags as ``tfcoord submit --engine spark`` checks them
before Spark starts (tfcoord/driver/sparksubmit.py)."""

from __future__ import annotations

import shlex
import socket
import time

import pytest

from tfcoord.driver.sparksubmit import (
    MasterUnreachable,
    SubmitError,
    SubmitOptions,
    check_master,
    check_master_reachable,
    submit_args,
)


@pytest.mark.parametrize(
    "master",
    [
        "local",
        "local[4]",
        "local[*]",
        "local[2, 3]",
        "local-cluster[2, 1, 1024]",
        "spark://host:7077",
        "spark://a:7077,b:7077",
        "yarn",
        "k8s://https://api:6443",
        "local-standalone",
    ],
)
def test_the_master_urls_spark_takes_pass(master):
    check_master(master)


@pytest.mark.parametrize(
    ("master", "says"),
    [
        ("spak://h:7077", "did you mean spark://h:7077?"),
        ("sprak://h:7077", "did you mean spark://h:7077?"),
        ("k9s://https://api", "did you mean k8s://https://api?"),
        ("locl[2]", "did you mean local[2]?"),
        ("yran", "did you mean yarn?"),
        ("local-standalon", "did you mean local-standalone?"),
        ("spark://h", "'h' is not HOST:PORT"),
        ("spark://h:99999", "'h:99999' is not HOST:PORT"),
        ("mesos://m:5050", "--engine mesos"),
        ("http://nowhere", "is not a Spark master URL (spark://HOST:PORT"),
    ],
)
def test_a_master_url_spark_would_refuse_names_what_to_give(master, says):
    with pytest.raises(SubmitError) as e:
        check_master(master)
    assert says in str(e.value)


def test_a_standalone_master_that_answers_passes_and_one_that_refuses_is_named_at_once():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_master_reachable(f"spark://127.0.0.1:{listening.getsockname()[1]}")
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))  # bound, never listening: refused
            dead = f"127.0.0.1:{closed.getsockname()[1]}"
            t0 = time.monotonic()
            with pytest.raises(MasterUnreachable, match=f"{dead}: Connection refused"):
                check_master_reachable(f"spark://{dead}")
            assert time.monotonic() - t0 < 1.0
            # A standby master that answers is enough.
            check_master_reachable(f"spark://{dead},127.0.0.1:{listening.getsockname()[1]}")
    check_master_reachable("yarn")  # only standalone masters are dialled


def test_flags_become_spark_submit_arguments_quoted_as_pyspark_splits_them(tmp_path):
    deps = tmp_path / "my deps.zip"
    deps.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    data = tmp_path / "data.txt"
    data.write_text("x")
    options = SubmitOptions.of(
        driver_memory="2g",
        conf=["spark.a=1", "spark.b=x=y"],
        py_files=[str(deps)],
        files=[f"{data},hdfs://nn/other.txt"],
        archives=[f"{deps}#env"],
    )
    assert dict(options.conf) == {"spark.a": "1", "spark.b": "x=y"}
    args = shlex.split(submit_args("spark://h:7077", "app", options, {"spark.c": "3"}))
    assert args == [
        "--master",
        "spark://h:7077",
        "--name",
        "app",
        "--py-files",
        str(deps),
        "--files",
        f"{data},hdfs://nn/other.txt",
        "--archives",
        f"{deps}#env",
        "--driver-memory",
        "2g",
        "--conf",
        "spark.c=3",
        "pyspark-shell",
    ]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"deploy_mode": "cluster"}, "runs in client mode"),
        ({"executor_memory": "lots"}, "--executor-memory 'lots' is not a memory size"),
        ({"driver_memory": "2 g"}, "--driver-memory '2 g'"),
        ({"conf": ["spark.x"]}, "KEY=VALUE"),
        ({"conf": ["=1"]}, "KEY=VALUE"),
        ({"py_files": ["/no/such.zip"]}, "--py-files /no/such.zip: no such file"),
        ({"files": ["file:///no/such.txt"]}, "--files file:///no/such.txt"),
        ({"archives": ["/no/such.zip#env"]}, "--archives /no/such.zip#env"),
    ],
)
def test_a_flag_spark_would_refuse_is_named(flags, says):
    with pytest.raises(SubmitError) as e:
        SubmitOptions.of(**flags)
    assert says in str(e.value)
