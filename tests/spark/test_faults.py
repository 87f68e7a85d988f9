"""Fault injection on real Spark: an executor's TensorFlow process dies mid-training.

The node's ``map_fun`` runs in a child of its Spark task (its pid is in the node's
``child_pid`` metadata). SIGKILL it, as the kernel's OOM killer would: the task's
supervisor sees the child die, reports the failure, and the coordinator fails the
job at once, telling the other node to stop. The driver's wait must end within a
few seconds with an error naming the node, its executor and its host.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from pathlib import Path

import pytest

from tfcoord.client import JobFailed
from tfcoord.driver import spark as tfs

from . import mapfuns
from .mapfuns import args_for
from .sparkjobs import active_jobs

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: The issue's bound: a node killed mid-training fails the job within this.
FAIL_WITHIN_S = 5.0
#: TensorFlow takes about 6 s to import per process; two executors, a loaded machine.
TRAINING_START_TIMEOUT_S = 120.0


def _await_files(paths: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, (
            f"training did not start: {[p.name for p in paths if not p.exists()]}"
        )
        time.sleep(0.05)


def test_a_killed_tensorflow_process_fails_the_job_fast_naming_the_node(sc, tmp_path):
    cluster = tfs.run(sc, mapfuns.train_until_stopped, args_for(tmp_path), num_executors=2, num_ps=0)
    try:
        _await_files([tmp_path / f"training-{i}" for i in range(2)], TRAINING_START_TIMEOUT_S)
        victim = next(
            n for n in cluster.driver.status(cluster.job)["nodes"] if (n["role"], n["index"]) == ("worker", 1)
        )
        pid = int(victim["meta"]["child_pid"])
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(JobFailed) as failed:
            cluster.driver.await_job(cluster.job, 60)
        took = time.monotonic() - t0
    finally:
        with pytest.raises(JobFailed):  # shutdown reports the same failure and cleans up
            cluster.shutdown()
    log.info("the job failed %.2f s after its TensorFlow process was killed", took)
    assert took < FAIL_WITHIN_S, f"the job took {took:.1f} s to fail"
    msg = str(failed.value)
    assert f"worker:1 (executor 1, host {victim['host']}" in msg
    assert "killed by signal 9" in msg
    status = failed.value.status
    states = {(n["role"], n["index"]): n["state"] for n in status["nodes"]}
    assert states[("worker", 1)] == "FAILED"
    # the surviving node was told to stop (not left training for 300 s)
    with pytest.raises(ProcessLookupError):
        os.kill(int(next(n for n in status["nodes"] if n["index"] == 0)["meta"]["child_pid"]), 0)


#: A process told to die by the kernel (SIGKILL) is gone within milliseconds; a loaded
#: machine gets ample slack.
ORPHAN_EXIT_TIMEOUT_S = 30.0


def _await_exits(pids: list[int], timeout_s: float) -> list[int]:
    """Wait on pidfds (they turn readable when the process exits); returns those still alive."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass  # gone already
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout_s
    try:
        left = dict(fds)
        while left and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                poller.unregister(fd)
                left.pop(fd, None)
        return list(left.values())
    finally:
        for fd in fds:
            os.close(fd)


def test_a_killed_supervisor_takes_map_fun_and_tensorboard_with_it(sc, tmp_path):
    """Spark SIGKILLs a task's Python worker on cancel or speculation: nothing it started may live on."""
    cluster = tfs.run(
        sc,
        mapfuns.wait_for_flag,
        args_for(tmp_path),
        num_executors=2,
        num_ps=0,
        tensorboard=True,
        log_dir=str(tmp_path / "tb"),
    )
    orphans: list[int] = []
    try:
        version, node = 0, None
        deadline = time.monotonic() + TRAINING_START_TIMEOUT_S
        while node is None:  # RUNNING: map_fun's process is forked and its pid is known
            assert time.monotonic() < deadline, "worker 0 never reported RUNNING"
            st = cluster.driver.watch(cluster.job, version, 10.0)
            version = st["version"]
            node = next((n for n in st["nodes"] if n["index"] == 0 and n["state"] == "RUNNING"), None)
        supervisor = int(node["meta"]["pid"])
        orphans = [int(node["meta"]["child_pid"]), int(node["meta"]["tensorboard_pid"])]
        assert supervisor not in orphans
        assert _await_exits(orphans, 0.0) == orphans, "map_fun and TensorBoard must run before the kill"
        os.kill(supervisor, signal.SIGKILL)
        alive = _await_exits(orphans, ORPHAN_EXIT_TIMEOUT_S)
        assert alive == [], f"left behind after the supervisor died: {alive}"
    finally:
        for pid in orphans:  # without the fix, do not leave them to the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        (tmp_path / "done").touch()
        with pytest.raises(JobFailed):  # the node was lost: the job failed, and says so
            cluster.shutdown()


def _held_at_step_5(sc, tmp_path) -> tuple[tfs.SparkCluster, int]:
    """Two checkpointed trainers with one restart allowed, once worker 1 holds at step 5 of
    generation 0 (it hands its pid through a FIFO); returns the cluster and that pid."""
    for name in ("hold", "never"):
        os.mkfifo(tmp_path / name)
    cluster = tfs.run(
        sc,
        mapfuns.checkpointed_training,
        args_for(tmp_path, hold_at=5),
        num_executors=2,
        num_ps=0,
        max_restarts=1,
        restart_backoff_s=0.2,
    )
    with open(tmp_path / "hold") as fifo:
        return cluster, int(fifo.read())


def test_a_killed_tensorflow_process_restarts_the_cluster_which_resumes_from_its_checkpoint(sc, tmp_path):
    """With ``max_restarts``, the same kill restarts the whole cluster as generation 1: the
    survivor is told by push to stop and rejoin, the killed node's supervisor runs map_fun
    again, both restore their CheckpointManager and finish; the job SUCCEEDS (issue 25)."""
    cluster, pid = _held_at_step_5(sc, tmp_path)
    os.kill(pid, signal.SIGKILL)
    status = cluster.shutdown()
    assert status.state == "SUCCEEDED" and status.generation == 1
    [restart] = status.restarts
    assert restart.cause == "was killed by SIGKILL" and restart.node.startswith("worker:1 (executor 1")
    results = {n.index: n.results for n in status.nodes}
    assert results[1] == {"resumed_at": 5, "generation": 1, "steps": 10}  # from its checkpoint
    assert results[0]["generation"] == 1 and results[0]["steps"] == 10
    assert all(n.generation == 1 for n in status.nodes)


def _executor_jvm(pid: int) -> int:
    """The Spark executor JVM above process ``pid`` (a Python worker it runs)."""
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no executor JVM above the node's process")


def test_a_killed_executor_jvm_restarts_the_cluster_on_a_replacement_executor(sc, tmp_path):
    """The executor JVM of worker 1 SIGKILLed mid-training: Spark's standalone worker starts a
    replacement executor and retries the task there; the retry joins generation 1 as the
    slot's next attempt, the survivor rejoins, and both resume from their checkpoints."""
    cluster, _ = _held_at_step_5(sc, tmp_path)
    victim = next(n for n in cluster.driver.status(cluster.job).nodes if n.index == 1)
    os.kill(_executor_jvm(int(victim.meta["pid"])), signal.SIGKILL)
    status = cluster.shutdown()
    assert status.state == "SUCCEEDED" and status.generation == 1, status.why
    [restart] = status.restarts
    assert restart.node.startswith("worker:1 (executor 1")
    results = {n.index: n.results for n in status.nodes}
    assert results[1]["resumed_at"] == 5 and results[1]["steps"] == 10 and results[1]["generation"] == 1
    assert {n.index: n.attempt for n in status.nodes}[1] >= 1  # a retried task took the slot


def test_restarts_with_inputmode_spark_are_refused_before_anything_starts(sc, tmp_path):
    with pytest.raises(ValueError, match=r"max_restarts needs InputMode\.TENSORFLOW"):
        tfs.run(
            sc,
            mapfuns.report_context,
            args_for(tmp_path),
            2,
            0,
            input_mode=tfs.InputMode.SPARK,
            max_restarts=1,
        )


class _Conf:
    """A SparkContext's configuration as ``restart_policy`` reads it (``sc.getConf()``)."""

    def __init__(self, **settings: str) -> None:
        from pyspark import SparkConf

        self.conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))

    def getConf(self):  # SparkContext's name
        return self.conf


def test_the_restart_policy_comes_from_spark_settings_when_run_leaves_it_unset(sc):
    """``spark-submit --conf spark.tfcoord.maxRestarts=3`` gives a TensorFlowOnSpark program
    restarts unchanged; an argument wins over the setting; a bad value names its key."""
    assert tfs.restart_policy(sc, None, None, None, None) == {
        "max_restarts": 0,
        "restart_on": "exit-code",
        "restart_backoff_s": 1.0,
        "deadline_s": 0.0,
    }
    conf = _Conf(
        **{
            tfs.MAX_RESTARTS_CONF: "3",
            tfs.RESTART_ON_CONF: "any-failure",
            tfs.RESTART_BACKOFF_CONF: "2.5",
            tfs.DEADLINE_CONF: "3600",
        }
    )
    assert tfs.restart_policy(conf, None, None, None, None) == {
        "max_restarts": 3,
        "restart_on": "any-failure",
        "restart_backoff_s": 2.5,
        "deadline_s": 3600.0,
    }
    assert tfs.restart_policy(conf, 1, None, None, None)["max_restarts"] == 1
    with pytest.raises(ValueError, match=r"spark.tfcoord.maxRestarts='three' is not valid: a whole number"):
        tfs.restart_policy(_Conf(**{tfs.MAX_RESTARTS_CONF: "three"}), None, None, None, None)


def test_a_refused_coordinator_address_fails_run_at_once(sc, tmp_path):
    """A driver given a coordinator that refuses (a wrong port) is told in well under 3 s
    (it waited for the 30 s connect deadline), and nothing is left running."""
    import socket

    from tfcoord.client import Unreachable

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: refused
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        before = active_jobs(sc)  # an earlier test's job may still be ending
        t0 = time.monotonic()
        with pytest.raises(Unreachable, match=f"cannot reach the tfcoord coordinator at {address}"):
            tfs.run(
                sc, mapfuns.report_context, args_for(tmp_path), 2, 0, coordinator=address, secret=b"k" * 32
            )
        assert time.monotonic() - t0 < 3.0
    assert active_jobs(sc) <= before  # no Spark job was launched
