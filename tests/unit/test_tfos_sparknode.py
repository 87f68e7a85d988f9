"""TensorFlowOnSpark's ``TFSparkNode.run`` over tfcoord's node runtime and its reservation server:
real processes, sockets, feeds."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from typing import Any

import pytest

from tfcoord.client.vocab import JobState
from tfcoord.compat.tensorflowonspark import TFNode, TFSparkNode, gpu_info
from tfcoord.compat.tensorflowonspark.reservation import Server, reservations
from tfcoord.node.executor import NodeFailed


def _fn(args: Any, ctx: Any) -> None:
    """A node's map_fun: records what it sees, and reads one record through its manager's feed."""
    ctx.mgr.get_queue("input").put({"from": ctx.job_name})
    ctx.mgr.get_queue("input").put(None)
    feed = TFNode.DataFeed(ctx.mgr)
    seen = {
        "job": ctx.job_name,
        "index": ctx.task_index,
        "spec": ctx.cluster_spec,
        "workers": ctx.num_workers,
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "cuda": os.environ["CUDA_VISIBLE_DEVICES"],
        "batch": feed.next_batch(5),
        "lr": args.lr,
    }
    with open(os.path.join(args.out, f"{ctx.executor_id}.json"), "w") as f:
        json.dump(seen, f)


def _node(meta: dict[str, Any], out: str, executor_id: int) -> None:
    args = argparse.Namespace(lr=0.5, out=out)
    TFSparkNode.run(_fn, args, meta, False, None, ["input", "output"], False)([executor_id])


def test_two_nodes_meet_on_the_server_and_run_with_tf_config_and_a_feed(tmp_path: Any) -> None:
    server = Server(2)
    meta = {
        "id": 1,
        "cluster_template": {"chief": [0], "worker": [1]},
        "num_executors": 2,
        "default_fs": "file://",
        "working_dir": str(tmp_path),
        "server_addr": server.start(),
    }
    spawn = multiprocessing.get_context("spawn")
    nodes = [spawn.Process(target=_node, args=(meta, str(tmp_path), i)) for i in (0, 1)]
    for p in nodes:
        p.start()
    for p in nodes:
        p.join(120)
    server.stop()
    assert [p.exitcode for p in nodes] == [0, 0]
    chief, worker = (json.loads((tmp_path / f"{i}.json").read_text()) for i in (0, 1))
    spec = chief["spec"]
    assert sorted(spec) == ["chief", "worker"] and len(spec["chief"]) == len(spec["worker"]) == 1
    assert spec["chief"] != spec["worker"] and worker["spec"] == spec
    assert chief["tf_config"] == {"cluster": spec, "task": {"type": "chief", "index": 0}}
    assert worker["tf_config"] == {"cluster": spec, "task": {"type": "worker", "index": 0}}
    assert (chief["workers"], chief["lr"]) == (2, 0.5)
    assert chief["batch"] == [{"from": "chief"}] and worker["batch"] == [{"from": "worker"}]
    if not gpu_info.is_gpu_available():
        assert chief["cuda"] == worker["cuda"] == ""


@pytest.mark.skipif(
    gpu_info.is_gpu_available(), reason="this host has GPUs: the refusal needs a host without"
)
def test_gpus_asked_for_on_a_host_without_any_fail_the_node_with_the_reason() -> None:
    server = Server(1)
    meta = {"cluster_template": {"worker": [0]}, "server_addr": server.start()}
    ran = []
    node = TFSparkNode.run(
        lambda a, c: ran.append(c), argparse.Namespace(num_gpus=2), meta, False, None, ["input"], False
    )
    with pytest.raises(RuntimeError, match=r"2 GPU\(s\) requested \(num_gpus\), but this host has none"):
        node([0])
    assert not ran
    server.stop()


def _record_cuda(args: Any, ctx: Any) -> None:
    with open(args.out, "w") as f:
        f.write(os.environ["CUDA_VISIBLE_DEVICES"])


def test_on_kubernetes_without_spark_gpu_resources_a_node_runs_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("SPARK_EXECUTOR_POD_IP", "10.0.0.7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    server = Server(1)
    meta = {"cluster_template": {"worker": [0]}, "server_addr": server.start()}
    out = tmp_path / "cuda"
    args = argparse.Namespace(out=str(out))
    TFSparkNode.run(_record_cuda, args, meta, False, None, ["input"], False)(iter([0]))
    # map_fun's process, and the task's own (TensorFlowOnSpark sets it there)
    assert out.read_text() == "" and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    server.stop()
    with pytest.raises(
        RuntimeError, match=r"Spark assigned this task none; on Kubernetes set spark\.executor\.resource"
    ):
        TFSparkNode._task_gpus(1, True, lambda: 0)


def test_background_and_unknown_executors_are_refused_with_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"use TFCluster.run\(.*input_mode=TFCluster.InputMode.SPARK\)"):
        TFSparkNode.run(print, [], {"cluster_template": {"worker": [0]}}, False, None, ["input"], True)
    node = TFSparkNode.run(
        print, [], {"cluster_template": {"worker": [0]}, "server_addr": ("h", 1)}, False, None, [], False
    )
    with pytest.raises(ValueError, match=r"executor 3 has no place in cluster_template \{'worker': \[0\]\}"):
        node([3])
    with pytest.raises(ValueError, match=r"must be what reservation.Server.start\(\) returned"):
        node([0])


def _fail(args: Any, ctx: Any) -> None:
    raise ValueError(f"boom in map_fun of {ctx.job_name}:{ctx.task_index}")


def test_a_failing_map_fun_fails_the_task_with_its_traceback_and_the_job_shows_the_node() -> None:
    server = Server(1)
    meta = {"cluster_template": {"chief": [0]}, "server_addr": server.start()}
    with pytest.raises(NodeFailed, match=r"(?s)chief:0 \(executor 0\) failed:.*boom in map_fun of chief:0"):
        TFSparkNode.run(_fail, [], meta, False, None, [], False)([0])
    status = server.status()
    assert status is not None and status.state == JobState.FAILED
    [entry] = reservations(status)
    assert (entry["executor_id"], entry["job_name"], entry["task_index"]) == (0, "chief", 0)
    assert entry["port"] == status.nodes[0].port > 0
    server.stop()


def test_the_cluster_spec_orders_each_role_by_task_index() -> None:
    info = [
        {"executor_id": 0, "job_name": "worker", "task_index": 1, "host": "b", "port": 2},
        {"executor_id": 1, "job_name": "chief", "task_index": 0, "host": "a", "port": 1},
        {"executor_id": 2, "job_name": "worker", "task_index": 0, "host": "c", "port": 3},
    ]
    assert TFSparkNode._get_cluster_spec(info) == {"worker": ["c:3", "b:2"], "chief": ["a:1"]}
