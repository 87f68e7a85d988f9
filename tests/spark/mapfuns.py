"""Map functions the Spark tests run on executors (shipped by value with cloudpickle).

Each writes what it saw to ``args.out/<executor_id>.json`` (executors share this
machine's filesystem), so tests assert on what really happened inside the nodes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _record(args: Any, ctx: Any, **extra: Any) -> None:
    data = {
        "executor_id": ctx.executor_id,
        "worker_num": ctx.worker_num,
        "job_name": ctx.job_name,
        "task_index": ctx.task_index,
        "cluster_spec": ctx.cluster_spec,
        "num_workers": ctx.num_workers,
        "tf_config": json.loads(os.environ["TF_CONFIG"]) if "TF_CONFIG" in os.environ else None,
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "defaultFS": ctx.defaultFS,
        "absolute": ctx.absolute_path("model"),
        "pid": os.getpid(),
        **extra,
    }
    tmp = Path(args.out, f".{ctx.executor_id}.json")
    tmp.write_text(json.dumps(data))
    tmp.replace(Path(args.out, f"{ctx.executor_id}.json"))


def report_context(args: Any, ctx: Any) -> None:
    _record(args, ctx)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def check_port(args: Any, ctx: Any) -> None:
    """Record whether the node's TensorFlow port is bindable before and after release_port()."""
    before = _port_free(ctx.port)
    ctx.release_port()
    _record(args, ctx, free_before_release=before, free_after_release=_port_free(ctx.port))


def raise_on_worker_1(args: Any, ctx: Any) -> None:
    if ctx.job_name == "worker" and ctx.task_index == 1:
        raise ValueError("injected failure in map_fun on worker 1")
    time.sleep(600)  # the other node would train on; it must be stopped, not waited for


def wait_for_flag(args: Any, ctx: Any) -> None:
    """Stay up (TensorBoard beside us) until the test has looked at it."""
    _record(args, ctx)
    deadline = time.monotonic() + 120
    while not Path(args.out, "done").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def wait_for_peer(args: Any, ctx: Any) -> None:
    """Record, then stay up until the other node has recorded too: both hold their GPUs at once."""
    _record(args, ctx)
    peer = Path(args.out, f"{1 - ctx.executor_id}.json")
    deadline = time.monotonic() + 120
    while not peer.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def mwms_train(args: Any, ctx: Any) -> None:
    """MultiWorkerMirroredStrategy with a custom training loop; records the final weights."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(256, 1)).astype("float32")
    y = 3 * x + 2
    with strategy.scope():
        w = tf.Variable(0.0)
        b = tf.Variable(0.0)
        opt = tf.keras.optimizers.SGD(0.3)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
    it = iter(strategy.experimental_distribute_dataset(ds))

    @tf.function
    def step(batch):
        def fn(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((w * xb + b - yb) ** 2) / strategy.num_replicas_in_sync
            opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b], strict=True))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(fn, args=batch), axis=None)

    for _ in range(args.steps):
        loss = step(next(it))
    _record(
        args,
        ctx,
        loss=float(loss),
        w=float(w.numpy()),
        b=float(b.numpy()),
        replicas=strategy.num_replicas_in_sync,
    )


def ps_and_worker(args: Any, ctx: Any) -> None:
    """A ps serves a variable; the worker updates it remotely, then finishes (the ps is stopped).

    Between-graph replication, the classic ps/worker pattern: each task runs its own
    tf.distribute.Server from the cluster spec tfcoord handed out.
    """
    import tensorflow as tf

    if ctx.job_name == "ps":
        # Recorded before its server starts: the worker cannot end (which has the ps stopped)
        # before it has reached the ps.
        _record(args, ctx)
    cluster = tf.train.ClusterSpec(ctx.cluster_spec)
    server = tf.distribute.Server(cluster, job_name=ctx.job_name, task_index=ctx.task_index)
    if ctx.job_name == "ps":
        server.join()
        return
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            v = tf.compat.v1.Variable(1.0)
        add = v.assign_add(41.0)
        with tf.compat.v1.Session(server.target) as sess:
            sess.run(v.initializer)
            value = sess.run(add)
    _record(args, ctx, value=float(value), device=v.device)


def independent(args: Any, ctx: Any) -> None:
    _record(args, ctx)


def raise_on_task_1(args: Any, ctx: Any) -> None:
    if ctx.executor_id == 1:
        raise ValueError("injected failure in parallel task 1")
    _record(args, ctx)


def train_until_stopped(args: Any, ctx: Any) -> None:
    """A real TensorFlow training loop that never finishes on its own: the faults tests kill it.

    Each node trains its own small model (no collectives, so a dead peer cannot hang the
    others inside TensorFlow: only the coordinator can stop them) and writes
    ``training-<executor_id>`` once the first steps are done, so the test kills it
    mid-training rather than during the TensorFlow import.
    """
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(ctx.executor_id)
    x = tf.constant(rng.normal(size=(64, 4)).astype("float32"))
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    w = tf.Variable(tf.zeros((4, 1)))
    opt = tf.keras.optimizers.SGD(0.05)
    marker = Path(args.out, f"training-{ctx.executor_id}")
    deadline = time.monotonic() + 300
    step = 0
    while time.monotonic() < deadline:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - y) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        step += 1
        if step == 20:
            marker.write_text(str(float(loss)))
        time.sleep(0.01)


def checkpointed_training(args: Any, ctx: Any) -> dict[str, Any]:
    """Ten TensorFlow steps, checkpointed after each with a CheckpointManager and resumed from it
    (the restart tests). Worker 1 of the first generation holds at step ``args.hold_at``: it
    writes its pid into the FIFO ``hold`` (the test reads it and kills the process), then waits
    on a FIFO no one writes."""
    import tensorflow as tf

    step = tf.Variable(0, dtype=tf.int64)
    w = tf.Variable(tf.zeros((4, 1)))
    ckpt = tf.train.Checkpoint(step=step, w=w)
    manager = tf.train.CheckpointManager(ckpt, str(Path(args.out, f"ckpt-{ctx.executor_id}")), max_to_keep=2)
    manager.restore_or_initialize()
    resumed_at = int(step.numpy())
    x = tf.ones((8, 4))
    while int(step.numpy()) < 10:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - 1.0) ** 2)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        step.assign_add(1)
        manager.save(checkpoint_number=int(step.numpy()))
        if int(step.numpy()) == args.hold_at and ctx.restart_count == 0 and ctx.executor_id == 1:
            with open(Path(args.out, "hold"), "w") as fifo:
                fifo.write(str(os.getpid()))
            os.read(os.open(Path(args.out, "never"), os.O_RDONLY), 1)
    return {"resumed_at": resumed_at, "generation": ctx.restart_count, "steps": int(step.numpy())}


def args_for(out: Path, **kw: Any) -> SimpleNamespace:
    return SimpleNamespace(out=str(out), **kw)


def alive(pid: int) -> bool:
    """Is process ``pid`` still there (for the tests' checks that nothing was left behind)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- InputMode.SPARK (tests/spark/test_feed.py) ------------------------------------------------


def infer_squares(args: Any, ctx: Any) -> None:
    """TensorFlowOnSpark's own inference test: square each record with TensorFlow."""
    import tensorflow as tf

    from tfcoord.compat.tensorflowonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr, False, qname_out=getattr(args, "qname_out", "output"))
    while not feed.should_stop():
        batch = feed.next_batch(10)
        if batch:
            feed.batch_results(tf.square(tf.constant(batch, dtype=tf.int64)).numpy().tolist())


def tfos_square_numpy(args: Any, ctx: Any) -> None:
    """TensorFlowOnSpark's test_inputmode_spark map function as it is written: numpy results."""
    import tensorflow as tf
    from tensorflowonspark import TFNode

    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(batch_size=10)
        if len(batch) > 0:
            squares = tf.math.square(batch)
            tf_feed.batch_results(squares.numpy())


def train_counting(args: Any, ctx: Any) -> dict[str, Any]:
    """Fit y = 3x + 1 from the fed (x, y) records through tf.data; record how often each x came."""
    import tensorflow as tf

    feed = ctx.get_data_feed(train_mode=True)
    ds = feed.dataset((tf.TensorSpec((), tf.float32), tf.TensorSpec((), tf.float32)), batch_size=256)
    w, b = tf.Variable(0.0), tf.Variable(0.0)
    opt = tf.keras.optimizers.SGD(0.5)
    counts: dict[int, int] = {}
    losses = []
    for xb, yb in ds.batch(64):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((w * xb + b - yb) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b], strict=True))
        losses.append(float(loss))
        for x in xb.numpy().tolist():
            counts[round(x * 1000)] = counts.get(round(x * 1000), 0) + 1
    _record(args, ctx, counts=counts, first_loss=losses[0], loss=losses[-1])
    return {"records": sum(counts.values())}


def raise_at_once(args: Any, ctx: Any) -> None:
    raise ValueError("injected failure in a fed map_fun")


def raise_after_feed(args: Any, ctx: Any) -> None:
    """Consume the whole feed, then fail ``args.delay_s`` later: the error comes only after the
    driver's shutdown() has ended the feed."""
    feed = ctx.get_data_feed()
    n = 0
    while not feed.should_stop():
        n += len(feed.next_batch(100))
    _record(args, ctx, consumed=n)
    time.sleep(getattr(args, "delay_s", 0))
    raise RuntimeError(f"late failure after consuming {n} records")


def never_read(args: Any, ctx: Any) -> None:
    """Take the feed and never read it: feeders must time out, naming this node and queue."""
    ctx.get_data_feed()
    deadline = time.monotonic() + 120
    while not Path(args.out, "done").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def stream_consumer(args: Any, ctx: Any) -> None:
    """Read a streaming feed until it ends; log each batch with the time it was taken."""
    feed = ctx.get_data_feed()
    log = Path(args.out, "consumed.jsonl")
    with log.open("a") as f:
        while not feed.should_stop():
            batch = feed.next_batch(50)
            if batch:
                f.write(json.dumps({"t": time.time(), "records": batch}) + "\n")
                f.flush()
    _record(args, ctx)


def terminate_early(args: Any, ctx: Any) -> None:
    """Node ``args.terminator`` stops on a record count, as TensorFlowOnSpark's examples stop on
    a step count; the others read to the end of the feed. Each records what it consumed."""
    feed = ctx.get_data_feed()
    records: list[Any] = []
    while not feed.should_stop():
        records += feed.next_batch(100)
        if ctx.executor_id == args.terminator and len(records) >= args.limit:
            feed.terminate()
    _record(args, ctx, consumed=len(records), records=records)


def tfos_style(args: Any, ctx: Any) -> None:
    """A TensorFlowOnSpark map function, written against the compat names only."""
    import tensorflow as tf

    from tfcoord.compat.tensorflowonspark import TFNode

    cluster, server = TFNode.start_cluster_server(ctx, num_gpus=0)

    class Affine(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(2.0)
            self.b = tf.Variable(1.0)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x: Any) -> Any:
            return self.w * x + self.b

    model = Affine()
    n = 0
    while True:  # TensorFlowOnSpark 1.x's function-style inference loop
        batch = TFNode.next_batch(ctx.mgr, 16)
        if not batch:
            break
        TFNode.batch_results(ctx.mgr, model(tf.constant(batch, tf.float32)).numpy().tolist())
        n += len(batch)
    TFNode.export_saved_model(model, TFNode.hdfs_path(ctx, args.export), is_chief=ctx.job_name == "chief")
    ctx.export_saved_model(model, TFNode.hdfs_path(ctx, args.export + "-ctx"))  # is_chief from the role
    data = {
        "worker_num": ctx.worker_num,
        "job_name": ctx.job_name,
        "task_index": ctx.task_index,
        "cluster": cluster.as_dict(),
        "target": server.target,
        "records": n,
    }
    Path(args.out, "tfos.json").write_text(json.dumps(data))


def raise_after_first_batch(args: Any, ctx: Any) -> None:
    """TensorFlowOnSpark's test_inputmode_spark_exception: answer one batch, then raise."""
    import tensorflow as tf

    from tfcoord.compat.tensorflowonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr, False, qname_out=getattr(args, "qname_out", "output"))
    while not feed.should_stop():
        batch = feed.next_batch(10)
        if batch:
            feed.batch_results(tf.square(tf.constant(batch, dtype=tf.int64)).numpy().tolist())
            raise Exception("FAKE exception during feeding")


def train_and_record_pid(args: Any, ctx: Any) -> dict[str, Any]:
    """Consume the training feed; say which process did (the background node's map_fun)."""
    feed = ctx.get_data_feed()
    n = 0
    Path(args.out, f"pid-{ctx.executor_id}").write_text(str(os.getpid()))
    while not feed.should_stop():
        n += len(feed.next_batch(100))
    _record(args, ctx, consumed=n)
    return {"records": n}


def tfos_imports(args: Any, ctx: Any) -> None:
    """TensorFlowOnSpark's examples import it inside map_fun: which module does that give?"""
    import tensorflowonspark
    from tensorflowonspark import TFNode

    import tfcoord.compat.tensorflowonspark as compat

    _record(
        args,
        ctx,
        same=tensorflowonspark is compat and TFNode is compat.TFNode,
        name=tensorflowonspark.__name__,
    )


def keras_fit(args: Any, ctx: Any) -> None:
    """TensorFlowOnSpark's Keras examples: tf.keras model.fit under MultiWorkerMirroredStrategy."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(256, 2)).astype("float32")
    y = x @ np.array([[2.0], [-1.0]], dtype="float32") + 0.5
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
        model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    history = model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32), epochs=2, steps_per_epoch=10, verbose=0
    )
    _record(
        args,
        ctx,
        keras=tf.keras.__name__,
        adam_lr=float(tf.keras.optimizers.Adam(lr=0.2).learning_rate),  # TensorFlowOnSpark's tests' spelling
        loss=history.history["loss"][-1],
        weights=[w.tolist() for w in model.get_weights()],
    )


def record_argv(args: Any, ctx: Any) -> None:
    """tf_args given as a list: TensorFlowOnSpark sets sys.argv to it, so argparse in map_fun sees it."""
    import sys

    Path(args[-1], f"argv-{ctx.executor_id}.json").write_text(json.dumps(sys.argv))


# -- shutdown(grace_secs=...) (tests/spark/test_feed.py) ---------------------------------------


def export_then_evaluate(args: Any, ctx: Any) -> None:
    """The chief trains (reading the feed to its end when ``args.fed``), then exports its model
    for ``args.export_s`` (longer than any stop grace); the evaluator's final evaluation starts
    once the chief has exported and takes ``args.eval_s``. Each leaves a file when done."""
    out = Path(args.out)
    if ctx.job_name == "evaluator":
        deadline = time.monotonic() + 120
        while not (out / "exported").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(args.eval_s)
        (out / "evaluated").write_text("final")
        return
    n = 0
    if args.fed:
        feed = ctx.get_data_feed()
        while not feed.should_stop():
            n += len(feed.next_batch(100))
    time.sleep(args.export_s)  # writing a SavedModel that takes a while
    (out / "exported").write_text(str(n))


def tfos_infer_then_terminate(args: Any, ctx: Any) -> None:
    """TensorFlowOnSpark's inference loop that ends its feed early: answer each batch, and once
    ``args.limit`` records are answered call ``terminate()`` and return while Spark still feeds."""
    from tfcoord.compat.tensorflowonspark import TFNode

    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    answered: list[Any] = []
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(10)
        if batch:
            tf_feed.batch_results([x * x for x in batch])
            answered += batch
            if len(answered) >= args.limit:
                tf_feed.terminate()
    _record(args, ctx, consumed=len(answered), records=answered)


def hold_slot(host: str, port: int) -> None:
    """A Spark task that keeps its slot while the test holds the connection it opens to
    ``host:port`` (its accept says the task runs; closing it lets the task end)."""
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.settimeout(120)
        while conn.recv(1):
            pass


def print_then_wait_for_gate(args: Any, ctx: Any) -> None:
    """Print a few lines on stdout and stderr, then stay up until the test closes its gate (a
    listening socket: its connection is reset; none with ``args.gate`` None), then print once more."""
    name = f"{ctx.job_name}:{ctx.task_index}"
    for i in range(3):
        print(f"line {i} of {name}", flush=True)
    print(f"a warning from {name}", file=sys.stderr, flush=True)
    if args.gate is not None:
        with socket.create_connection(("127.0.0.1", args.gate), timeout=120) as gate:
            try:
                gate.recv(1)
            except OSError:
                pass  # reset: the gate was closed
    print(f"released {name}", flush=True)


def infer_or_raise_on_worker_1(args: Any, ctx: Any) -> None:
    """Worker 1 answers its first batch, then raises; worker 0 answers every batch."""
    from tfcoord.compat.tensorflowonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr, False)
    while not feed.should_stop():
        batch = feed.next_batch(10)
        if batch:
            feed.batch_results([x * x for x in batch])
            if ctx.task_index == 1:
                raise Exception("FAKE exception on worker 1 during feeding")
