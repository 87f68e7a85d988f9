"""A ps/worker job for ``tfcoord submit --role-resources``: ``main_fun(args, ctx)`` with args
``OUT MODE``. Each node records what its Spark task was given (``TaskContext.cpus()``, its GPU
addresses, the executor it runs on: a standalone executor's working directory is named for its
id) into ``OUT/<role>-<index>.json``; in MODE ``train`` the workers then train a linear model
whose variables live on the ps (between-graph replication) and record its loss before and after.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STEPS = 40


def _record(out: Path, ctx: Any, **extra: Any) -> None:
    from pyspark import TaskContext

    tc = TaskContext.get()
    gpu = tc.resources().get("gpu")
    data = {
        "role": ctx.job_name,
        "index": ctx.task_index,
        "task_cpus": tc.cpus(),
        "task_gpus": list(gpu.addresses) if gpu is not None else [],
        "executor": Path.cwd().name,
        "resources": ctx.resources,
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **extra,
    }
    tmp = out / f".{ctx.job_name}-{ctx.task_index}.json"
    tmp.write_text(json.dumps(data))
    tmp.replace(out / f"{ctx.job_name}-{ctx.task_index}.json")


def _wait_for(path: Path, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.03)


def main_fun(args: list[str], ctx: Any) -> None:
    out, mode = Path(args[0]), args[1]
    if mode != "train":
        _record(out, ctx)
        if ctx.job_name == "worker":
            # The ps is stopped as soon as the workers are done: a worker that returned before the
            # ps ran main_fun would leave no ps record (seen once in CI). Wait for it (30 ms polls).
            _wait_for(out / "ps-0.json", timeout=300)
        return
    import numpy as np
    import tensorflow as tf

    if ctx.job_name == "ps":
        # Recorded before its server starts: no worker can end (which has the ps stopped)
        # before it has reached the ps.
        _record(out, ctx)
    cluster = tf.train.ClusterSpec(ctx.cluster_spec)
    server = tf.distribute.Server(cluster, job_name=ctx.job_name, task_index=ctx.task_index)
    if ctx.job_name == "ps":
        server.join()
        return
    rng = np.random.default_rng(ctx.task_index)
    x = rng.normal(size=(128, 1)).astype("float32")
    y = 3 * x + 2
    with tf.Graph().as_default():
        # This worker's model lives on the ps; each worker trains its own, so no one waits on another.
        with tf.device("/job:ps/task:0"):
            w = tf.compat.v1.Variable(0.0, name=f"w{ctx.task_index}")
            b = tf.compat.v1.Variable(0.0, name=f"b{ctx.task_index}")
        with tf.device(f"/job:worker/task:{ctx.task_index}"):
            loss = tf.reduce_mean((w * x + b - y) ** 2)
            step = tf.compat.v1.train.GradientDescentOptimizer(0.2).minimize(loss)
        # Each worker's session sees only the ps and itself: without the filter CreateSession waits
        # for every worker of the cluster, and one that already trained and exited never answers.
        only = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{ctx.task_index}"])
        with tf.compat.v1.Session(server.target, config=only) as sess:
            sess.run(tf.compat.v1.variables_initializer([w, b]))
            first = float(sess.run(loss))
            for _ in range(STEPS):
                sess.run(step)
            last, wv, bv = (float(v) for v in sess.run([loss, w, b]))
    _record(out, ctx, loss_first=first, loss_last=last, w=wv, b=bv, variable=w.device)
