"""The node supervisor against a real coordinator: real sockets, real child processes, no Spark.

Stop and failure semantics are written once, in tfcoord.node.supervisor; these tests hold
them for every child: a command (Mesos tasks, the local engine) and a forked map_fun
(Spark executors).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import sys
import threading
import time
from pathlib import Path

import pytest

from tfcoord.client import AuthenticationFailed, DriverClient, JobSpec, RequestRejected, make_roles
from tfcoord.client.watcher import watch_until
from tfcoord.node.executor import NodeSpec, start_node
from tfcoord.node.runner import Command
from tfcoord.node.supervisor import FAILED, STOPPED, SUCCEEDED, NodeSupervisor, SupervisorConfig

#: Every wait below ends on an event; this only bounds a broken run.
WAIT_S = 60.0


def _config(coord, driver: DriverClient, job: str, executor_id: int, **kw) -> SupervisorConfig:
    return SupervisorConfig(
        address=coord.address,
        token=driver.job_token(job),
        job=job,
        executor_id=executor_id,
        host="127.0.0.1",
        heartbeat_interval_s=0.2,
        **kw,
    )


def _python(code: str, **env: str) -> Command:
    return Command((sys.executable, "-c", code), env)


def _gone(pid: int, timeout_s: float = WAIT_S) -> bool:
    """Whether process ``pid`` ends within the timeout (a pidfd is readable once it has)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def test_two_commands_rendezvous_and_succeed(coordinator, tmp_path: Path):
    code = (
        "import os; e = os.environ\n"
        "open(e['OUT'], 'w').write('|'.join((e['TF_CONFIG'], e['CUDA_VISIBLE_DEVICES'], e['TFCOORD_ROLE'])))"
    )
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2), reservation_timeout_s=30))
        sups = [
            NodeSupervisor(_config(coordinator, d, job, i), _python(code, OUT=str(tmp_path / f"{i}")))
            for i in range(2)
        ]
        for s in sups:
            s.start()
        outcomes = [s.wait(WAIT_S) for s in sups]
        status = d.await_job(job, WAIT_S)
    assert [(o.state, o.role, o.index, o.exit_code) for o in outcomes] == [
        (SUCCEEDED, "worker", 0, 0),
        (SUCCEEDED, "worker", 1, 0),
    ]
    assert status["state"] == "SUCCEEDED"
    tf_config, cuda, role = (tmp_path / "1").read_text().split("|")
    assert json.loads(tf_config)["task"] == {"type": "worker", "index": 1}
    assert len(json.loads(tf_config)["cluster"]["worker"]) == 2
    assert (cuda, role) == ("", "worker")  # CUDA_VISIBLE_DEVICES always set: the CPU here


def test_a_failed_child_fails_the_job_and_stops_the_others(coordinator):
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2), reservation_timeout_s=30))
        waiting = NodeSupervisor(_config(coordinator, d, job, 0), _python("import time; time.sleep(600)"))
        failing = NodeSupervisor(
            _config(coordinator, d, job, 1),
            _python("import sys; sys.stderr.write('ValueError: bad batch\\n'); sys.exit(3)"),
        )
        waiting.start()
        failing.start()
        failed = failing.wait(WAIT_S)
        stopped = waiting.wait(WAIT_S)
        status = d.await_job(job, WAIT_S, raise_on_failure=False)
    assert failed.state == FAILED and failed.exit_code == 3
    assert "exit code 3" in failed.error and "ValueError: bad batch" in failed.error
    assert stopped.state == STOPPED
    assert status["state"] == "FAILED" and "ValueError: bad batch" in status["error"]


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(coordinator, tmp_path: Path):
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    code = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(os.environ['READY'], 'w').write('x')\n"
        "time.sleep(600)\n"
    )
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        sup = NodeSupervisor(
            _config(coordinator, d, job, 0, stop_grace_s=0.5), _python(code, READY=str(ready))
        )
        sup.start()
        assert sup.wait_running(WAIT_S)
        assert ready.read_text() == "x"  # blocks until the child ignores SIGTERM
        pid = int(d.status(job)["nodes"][0]["meta"]["child_pid"])
        started = time.monotonic()
        d.stop(job, "enough")
        outcome = sup.wait(WAIT_S)
        took = time.monotonic() - started
        status = d.await_job(job, WAIT_S, raise_on_failure=False)
    assert outcome.state == STOPPED and status["state"] == "STOPPED"
    assert _gone(pid, 0)
    assert took < 30, f"a child ignoring SIGTERM was not killed after the 0.5 s grace ({took:.1f} s)"


def test_a_node_outlives_the_call_that_started_it_and_stops_on_request(coordinator, tmp_path: Path):
    go = tmp_path / "go"
    os.mkfifo(go)
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1, 1), reservation_timeout_s=30))
        ps = NodeSupervisor(_config(coordinator, d, job, 0), _python("import time; time.sleep(600)")).start()
        # start() returned: registered, the rest of the cluster not there yet.
        assert [n["state"] for n in d.status(job)["nodes"]] == ["REGISTERED"]
        assert not ps.done
        # The worker ends only once the ps runs: a job's ps is stopped as soon as its workers
        # end, and one told to stop before it launched its child never runs at all.
        worker = NodeSupervisor(
            _config(coordinator, d, job, 1), _python("import os; open(os.environ['GO']).read()", GO=str(go))
        ).start()
        assert ps.wait_running(WAIT_S)
        go.write_text("go")
        assert worker.wait(WAIT_S).state == SUCCEEDED
        # The worker is done and the job is over: the coordinator stops the ps.
        assert ps.wait(WAIT_S).state == STOPPED
        assert d.await_job(job, WAIT_S)["state"] == "SUCCEEDED"


def test_stop_from_the_handle_ends_the_node_and_says_why(coordinator):
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        sup = NodeSupervisor(_config(coordinator, d, job, 0), _python("import time; time.sleep(600)")).start()
        assert sup.wait_running(WAIT_S)
        pid = int(d.status(job)["nodes"][0]["meta"]["child_pid"])
        sup.stop("the executor is shutting down")
        assert sup.wait(WAIT_S).state == STOPPED
        assert _gone(pid)
        status = d.await_job(job, WAIT_S, raise_on_failure=False)
    # Nobody asked the job to stop: a cluster that loses a node fails, saying why.
    assert status["state"] == "FAILED"
    assert "stopped unasked: the executor is shutting down" in status["error"]


def test_a_wrong_token_fails_start_and_frees_the_port(coordinator):
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        cfg = SupervisorConfig(address=coordinator.address, token=b"x" * 32, job=job, executor_id=0)
        sup = NodeSupervisor(cfg, _python("pass"))
        with pytest.raises(AuthenticationFailed):
            sup.start()
        assert sup.done


# -- a forked map_fun (the Spark engine's child) -------------------------------------------


def _returns_loss(args, ctx):
    if ctx.job_name == "worker":  # returns once the test says so (the ps has returned first)
        with open(args["go"]) as go:
            go.read()
    return {"loss": 0.25, "role": ctx.job_name}


def _reports(args, ctx):
    for step in range(1, 6):
        if step == 5:  # held until the test saw step 4 arrive: the series has a point before the last
            with open(args["half"]) as half:
                half.read()
        assert ctx.report(step=step, loss=1.0 / step) or step > 1  # the first is always passed on
        time.sleep(0.06)  # past the work's own write limit, so each of these is written
    with open(args["go"]) as go:  # held until the test saw the figures arrive
        go.read()
    return {"loss": 0.2}


def _raises(args, ctx):
    raise ValueError(f"bad input on {ctx.job_name}:{ctx.task_index}")


def _spec(coord, driver: DriverClient, job: str, spec: JobSpec, map_fun, tf_args=None) -> NodeSpec:
    slots = tuple(spec.slots())
    return NodeSpec(
        address=coord.address,
        token=driver.job_token(job),
        job=job,
        map_fun=map_fun,
        tf_args=tf_args or {},
        slots=slots,
        heartbeat_interval_s=0.2,
        wait_timeout_s=30,
    )


def test_forked_map_fun_result_is_shown_and_a_ps_lingers_until_the_job_ends(coordinator, tmp_path: Path):
    go = tmp_path / "go"
    os.mkfifo(go)
    roles = make_roles(1, 1)
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(js := JobSpec(roles=roles, reservation_timeout_s=30))
        spec = _spec(coordinator, d, job, js, _returns_loss, {"go": str(go)})
        ps, worker = start_node(spec, 0), start_node(spec, 1)
        st = d.watch(job, 0, WAIT_S)
        while st["nodes"][0]["state"] != "SUCCEEDED":  # the ps returned; it must stay up
            st = d.watch(job, st["version"], WAIT_S)
        assert not ps.done
        go.write_text("go")  # the worker returns, the job succeeds, the ps is told to stop
        assert worker.wait(WAIT_S).state == SUCCEEDED
        assert ps.wait(WAIT_S).state == SUCCEEDED  # returned early, served on until the job ended
        status = d.await_job(job, WAIT_S)
    nodes = {n["role"]: n for n in status["nodes"]}
    assert (
        nodes["worker"]["meta"]["result.loss"] == 0.25 and nodes["worker"]["meta"]["result.role"] == "worker"
    )


def test_forked_map_fun_traceback_fails_the_job(coordinator):
    roles = make_roles(2)
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(js := JobSpec(roles=roles, reservation_timeout_s=30))
        spec = _spec(coordinator, d, job, js, _raises)
        nodes = [start_node(spec, i) for i in range(2)]
        ends = []
        for n in nodes:
            try:
                ends.append(n.wait(WAIT_S).state)
            except RequestRejected as e:  # the first failure ended the job before this one's cluster came
                ends.append(e.code)
        status = d.await_job(job, WAIT_S, raise_on_failure=False)
    assert FAILED in ends
    assert status["state"] == "FAILED" and "ValueError: bad input on worker:" in status["error"]


def test_ctx_report_reaches_status_and_the_series_and_a_command_reports_too(coordinator, tmp_path: Path):
    go, half = tmp_path / "go", tmp_path / "half"
    os.mkfifo(go)
    os.mkfifo(half)
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(js := JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        spec = _spec(coordinator, d, job, js, _reports, {"go": str(go), "half": str(half)})
        node = start_node(dataclasses.replace(spec, report_interval_s=0.1), 0)
        # Figures change no version (they are no state change): a watch with the status's
        # report count is answered by the next report too.
        deadline = time.monotonic() + WAIT_S
        st = d.status(job)
        for step in (4, 5):
            # The supervisor sends only the newest figures each interval: a sender held past
            # the work's last report would send one point only, so step 5 waits for step 4's.
            while not (st.nodes and st.nodes[0].figures.get("step") == step):
                assert time.monotonic() < deadline, (
                    f"figures at the deadline: {st.nodes and st.nodes[0].figures}"
                )
                st = d.watch(job, st.version, deadline - time.monotonic(), reports=st.reports)
            if step == 4:
                half.write_text("go")
        assert st.nodes[0].figures == {"step": 5, "loss": 0.2}
        go.write_text("go")
        assert node.wait(WAIT_S).state == SUCCEEDED
    points = coordinator.call(lambda: coordinator.server.state.series(job))["nodes"][0]["points"]
    steps = [f["step"] for _, f in points]
    assert steps == sorted(steps) and steps[-1] == 5 and len(points) >= 2  # coalesced, in order

    code = (
        "import time\n"
        "from tfcoord.node.reporting import MIN_WRITE_INTERVAL_S, report\n"
        "t0 = time.monotonic()\n"
        "assert report(step=7, examples_per_s=125.5)\n"
        "written = report(step=8)\n"
        "held = time.monotonic() - t0 >= MIN_WRITE_INTERVAL_S\n"
        "# Within the write limit step 8 is dropped and 7 is what arrives; only a process held\n"
        "# past the limit between the two calls (a loaded machine) may write it.\n"
        "assert held or not written, 'step 8 was written within the write limit'\n"
        "print('step 8', 'written' if written else 'dropped', flush=True)\n"
    )
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        sup = NodeSupervisor(_config(coordinator, d, job, 0, report_interval_s=5.0), _python(code))
        assert sup.run().state == SUCCEEDED  # the last figures are sent as the node ends, not 5 s later
        status = d.await_job(job, WAIT_S)
        [(_, _, _, _, said)] = d.logs(job)["lines"]
    last = {"step": 8} if said == "step 8 written" else {"step": 7, "examples_per_s": 125.5}
    assert said in ("step 8 written", "step 8 dropped") and status["nodes"][0]["figures"] == last


def test_the_supervisor_reports_its_works_cpu_and_memory_while_it_runs(coordinator, tmp_path: Path):
    go = tmp_path / "go"
    os.mkfifo(go)
    code = f"held = bytearray(48 << 20)\nfor i in range(0, len(held), 4096): held[i] = 1\nopen({str(go)!r}).read()\n"
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        sup = NodeSupervisor(_config(coordinator, d, job, 0, report_interval_s=0.1), _python(code)).start()
        deadline = time.monotonic() + WAIT_S
        st = d.status(job)
        # Woken by each usage report (no version changes): until the work's memory shows.
        while not (st.nodes and st.nodes[0].usage.get("rss_bytes", 0) >= 48 << 20):
            assert time.monotonic() < deadline, f"usage at the deadline: {st.nodes and st.nodes[0].usage}"
            st = d.watch(job, st.version, deadline - time.monotonic(), reports=st.reports)
        usage = st.nodes[0].usage
        assert usage["processes"] >= 1 and st.nodes[0].figures == {}  # usage is not the work's figures
        go.write_text("go")
        assert sup.wait(WAIT_S).state == SUCCEEDED
        assert d.await_job(job, WAIT_S).nodes[0].usage == {}  # an ended node uses nothing


def _prints(args, ctx):
    print(f"hello from {ctx.job_name}:{ctx.task_index}", flush=True)
    print("\x1b[2Jcleared?", file=sys.stderr, flush=True)
    return {}


def test_the_output_of_map_fun_and_of_a_command_reaches_the_coordinator_escaped(coordinator):
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(js := JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        assert start_node(_spec(coordinator, d, job, js, _prints), 0).wait(WAIT_S).state == SUCCEEDED
        got = d.logs(job)
    # stdout and stderr are two pipes read apart: their lines' relative order is not defined.
    assert sorted((x[3], x[4]) for x in got["lines"]) == [
        ("stderr", "\\x1b[2Jcleared?"),
        ("stdout", "hello from worker:0"),
    ]
    code = "import sys\nprint('out line')\nprint('err line', file=sys.stderr)\nsys.exit(3)"
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        outcome = NodeSupervisor(_config(coordinator, d, job, 0), _python(code)).run()
        got = d.logs(job)
    assert outcome.state == FAILED and "err line" in outcome.error  # the error text is still the stderr tail
    assert sorted((x[3], x[4]) for x in got["lines"]) == [("stderr", "err line"), ("stdout", "out line")]


def _crashes_in_native_code(args, ctx):
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV, as a crash inside TensorFlow would


def test_a_crash_in_native_code_is_named_and_its_python_stack_is_in_the_output(coordinator):
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(js := JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        forked = start_node(_spec(coordinator, d, job, js, _crashes_in_native_code), 0).wait(WAIT_S)
        forked_lines = [x[4] for x in d.logs(job)["lines"]]
    assert forked.state == FAILED
    assert "map_fun process was killed by signal 11 (SIGSEGV: a crash in native code" in forked.error
    assert "Fatal Python error: Segmentation fault" in forked_lines
    assert any("_crashes_in_native_code" in line for line in forked_lines)  # where it crashed

    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        command = NodeSupervisor(
            _config(coordinator, d, job, 0), _python("import ctypes; ctypes.string_at(0)")
        ).run()
    assert command.state == FAILED
    assert "was killed by signal 11 (SIGSEGV" in command.error
    assert "Fatal Python error: Segmentation fault" in command.error  # the stderr tail it carries


def test_a_progress_bar_redrawn_in_place_reaches_the_coordinator_as_its_last_state(coordinator):
    # Keras's Progbar on a terminal: backspaces and a carriage return before each step's
    # bar, flushed step by step; tqdm: a carriage return only, here with no final line break.
    code = (
        "import sys\n"
        "last = ''\n"
        "for i in range(1, 301):\n"
        "    bar = f'{i}/300 [' + '=' * (i // 10) + f'>] - loss: {1 / i:.4f}'\n"
        "    sys.stdout.write('\\b' * len(last) + '\\r' + bar); sys.stdout.flush(); last = bar\n"
        "print()\n"
        "sys.stderr.write('50%\\r100%'); sys.exit(2)\n"
    )
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=30))
        outcome = NodeSupervisor(_config(coordinator, d, job, 0), _python(code)).run()
        got = d.logs(job)
    assert outcome.state == FAILED
    assert sorted((x[3], x[4]) for x in got["lines"]) == [
        ("stderr", "100%"),
        ("stdout", "300/300 [" + "=" * 30 + ">] - loss: 0.0033"),
    ]
    assert "100%" in outcome.error and "\\x08" not in outcome.error  # the failure's tail too


class _HeldAtStart(Command):
    """A command that counts as started only once the test lets it (``ready()`` blocks until
    then), as a server-mode node is RUNNING only once its TensorFlow server listens."""

    def __init__(self, held: threading.Event, code: str, out: Path) -> None:
        super().__init__((sys.executable, "-c", code), {"OUT": str(out)})
        self.held = held

    def ready(self) -> bool:
        assert self.held.wait(WAIT_S)
        return super().ready()


def test_a_node_whose_work_was_starting_when_a_peer_died_rejoins_the_new_generation(
    coordinator, tmp_path: Path
):
    # Each generation of each node leaves a file named for it; worker 1 is killed (SIGKILL)
    # in generation 0 and succeeds in generation 1.
    record = "import os; open(os.environ['OUT'] + '-' + os.environ['TFCOORD_RESTARTS'], 'w').write('ran')\n"
    dies = "import signal\nif os.environ['TFCOORD_RESTARTS'] == '0': os.kill(os.getpid(), signal.SIGKILL)\n"
    held = threading.Event()
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = d.submit(
            JobSpec(roles=make_roles(2), reservation_timeout_s=60, max_restarts=1, restart_backoff_s=0)
        )
        starting = NodeSupervisor(
            _config(coordinator, d, job, 0), _HeldAtStart(held, record, tmp_path / "w0")
        )
        dying = NodeSupervisor(
            _config(coordinator, d, job, 1),
            Command((sys.executable, "-c", record + dies), {"OUT": str(tmp_path / "w1")}),
        )
        try:
            starting.start()
            dying.start()
            # Worker 0's work is starting (not yet RUNNING) when worker 1 dies: the cluster
            # restarts as generation 1 before worker 0's RUNNING report is sent.
            st = watch_until(d, job, lambda st: st.generation == 1, timeout_s=WAIT_S)
            assert st.generation == 1, st.wire
            held.set()
            outcomes = [starting.wait(WAIT_S), dying.wait(WAIT_S)]
        finally:
            held.set()
            for s in (starting, dying):
                s.stop("the test ended")
        status = d.await_job(job, WAIT_S, raise_on_failure=False)
    assert status["state"] == "SUCCEEDED" and status["generation"] == 1, status["error"]
    assert [(o.state, o.index) for o in outcomes] == [(SUCCEEDED, 0), (SUCCEEDED, 1)]
    assert (tmp_path / "w0-1").read_text() == "ran" and (tmp_path / "w1-1").read_text() == "ran"
