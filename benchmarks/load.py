"""Load, hostile input and restart: the coordinator's reliability figures.

    python benchmarks/load.py [--nodes 10000] [--jobs 100] [--duration 60] [--clients 2]
                              [--fuzz-seconds 10] [--restart-nodes 1000] [--burst-nodes 10000]
                              [--hog-core 0] [--serve-nice=-10,0] [--phases load,burst,fuzz,restart]
                              [--json]

Each phase runs ``tfcoord serve --state-dir`` as its own process (so its CPU and RSS
are its own, read from /proc) and prints one JSON line:

- ``load``: ``--nodes`` node connections in ``--jobs`` concurrent jobs. Every node does
  on the wire what ``NodeClient`` and the node runtime do: handshake, register,
  heartbeat every 2 s, await the cluster, report running, keep an ``await_stop``
  pending, and at the end report success. Over ``--duration`` seconds of steady state:
  coordinator CPU (utime+stime from /proc/<pid>/stat, as % of one core), RSS, and the
  p50/p99/max heartbeat round trip measured client-side (send to reply received), with
  a CPU-bound process pinned to core ``--hog-core`` for the window (-1: none). Goal:
  p99 < 10 ms.
- ``burst``: ``--jobs`` jobs of ``--nodes`` in all heartbeating while one job of
  ``--burst-nodes`` registers at once; the steady heartbeats' p99 during it. Goal: < 20 ms.
- ``fuzz``: hostile frames from ``tests/fuzzframes.py`` (random fields, bit flips,
  truncations, length lies, garbage, bad hellos) from many connections for
  ``--fuzz-seconds``; frames per second, and whether the coordinator survived (still
  running, nothing logged at ERROR, a normal job still completes).
- ``restart``: ``--restart-nodes`` nodes heartbeating in one job; the coordinator is
  killed with SIGKILL and restarted on the same state directory and port. Each node
  reconnects with the client's own jittered backoff (``client.backoff_delays``),
  resends its pending ``await_stop`` and an immediate heartbeat; it has *resumed* when
  that heartbeat is answered, its requests from the new connection carrying the
  credential its registration answered (as ``NodeClient`` sends it). Figures: kill to
  listening, kill to every node resumed. Goal: < 2 s.

The load and burst phases run once per ``--serve-nice`` value, each with a row of its own
that names the priority. -10 is how deploy/tfcoord.service runs the coordinator: ``Nice=-10``
(set before exec, as ``nice -n`` does) in a scheduling group of its own weighted by
CPUWeight=1000; here its own session is its own group (the kernel's autogroup), weighted
by the group's nice (-10: 9.3 times the default weight). 0 is the default priority, in the
benchmark's own group, beside the CPU-bound process. Everything else runs at the default
priority; each simulating process in a session of its own, as nodes on other hosts do not
share the coordinator host's scheduling group.

After each phase with a goal comes its row of the results table (``floor.figure``, for
``benchmarks/results.py``), with the load average at the end of the measured window.

Simulated nodes run on asyncio in ``--clients`` forked processes (10,000 threads would
measure the simulator); they share the machine with the coordinator, so on a small
machine their own scheduling delay is part of every round trip measured.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/fuzzframes.py
sys.path.insert(0, str(ROOT / "benchmarks"))  # rendezvous.py (the burst phase's nodes)

from floor import figure, load_average  # noqa: E402
from rendezvous import serve_command  # noqa: E402

from tfcoord.client import DriverClient, JobSpec, auth, make_roles  # noqa: E402
from tfcoord.client import messages as m  # noqa: E402
from tfcoord.client.client import DEFAULT_HEARTBEAT_INTERVAL_S, backoff_delays  # noqa: E402
from tfcoord.client.protocol import NEED_DATA, Connection, encode_frame  # noqa: E402

# ``TFCOORD_BENCH_PROFILE=FILE`` runs the coordinator under cProfile (rendezvous.serve_command),
# written when it stops; with several phases the last one's profile is kept.
#: A phase that takes this long past its own duration has failed.
PHASE_TIMEOUT_S = 600.0
#: Connects in flight per simulating process: 10,000 SYNs at once from one host overflow
#: the kernel's SYN queue and cost 1 s retransmits (see benchmarks/rendezvous.py).
CONNECTS_IN_FLIGHT = 512
#: Nodes wait this long for their cluster; far more than setup takes.
AWAIT_CLUSTER_S = 600.0
#: A pending await_stop, as a running node keeps one.
AWAIT_STOP_S = 3600.0
#: Issue 28's goal: heartbeat p99 at 10,000 steady connections, a CPU-bound process on one core.
TARGET_P99_MS = 10.0
#: Between setup and the measured window. Registering 10,000 nodes journals 20,000
#: events, and each group commit's fsync runs on the coordinator's loop (up to a second
#: on a busy disk): the steady state is measured once those have drained; heartbeats
#: during setup are reported apart (setup_p99_ms).
SETTLE_S = 5.0
TARGET_RESUME_S = 2.0
#: The nice value deploy/tfcoord.service gives ``tfcoord serve`` (``Nice=``): the load and
#: burst phases run once at it and once at the default priority (``--serve-nice``). At a
#: nice value other than 0 the coordinator also gets a scheduling group of its own weighted
#: by it, as the unit's own cgroup is by CPUWeight=1000 (nice -10's weight is 9,548, the
#: default 1,024; CPUWeight=1000 is 10 times the default 100).
SERVICE_NICE = -10


# -- the coordinator process -----------------------------------------------------------------


class Coordinator:
    """``tfcoord serve --state-dir`` in a subprocess, restartable on the same port."""

    def __init__(self, tmp: Path, port: int = 0, nice: int = 0) -> None:
        self.tmp = tmp
        #: Its nice value: 0 is the default priority; deploy/tfcoord.service runs it at
        #: ``SERVICE_NICE`` (``--serve-nice``).
        self.nice = nice
        self.secret_file = tmp / "secret"
        if not self.secret_file.exists():
            auth.write_secret(self.secret_file)
        self.secret = auth.read_secret(self.secret_file)
        #: One driver identity for the whole phase: a job is seen only by its submitter.
        self.owner_key = auth.new_owner_key()
        self.state = tmp / "state"
        self.log = tmp / "serve.log"
        self.port = port
        self.start()

    def start(self) -> float:
        """Start (again); returns the seconds until it listened."""
        port_file = self.tmp / f"port-{time.monotonic_ns()}"
        t0 = time.monotonic()
        # As systemd's Nice= does: set before exec, so every thread it starts inherits it.
        prefix = ["nice", "-n", str(self.nice - os.getpriority(os.PRIO_PROCESS, 0))] if self.nice else []
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [
                    *prefix,
                    *serve_command(self.port, port_file, self.secret_file, "--state-dir", str(self.state)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                # A unit runs in a scheduling group of its own (its cgroup), weighed against the
                # other groups by CPUWeight=; here a session of its own is its own group
                # (the kernel's autogroup), weighed by the group's nice (see ``SERVICE_NICE``).
                start_new_session=bool(self.nice),
            )
        if self.nice:
            _set_group_nice(self.proc.pid, self.nice)
        while not port_file.exists():  # written atomically once it listens
            if self.proc.poll() is not None or time.monotonic() - t0 > 60:
                raise RuntimeError(f"tfcoord serve did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.002)
        self.listened_at = time.monotonic()
        self.port = int(port_file.read_text())
        if self.running_nice() != self.nice:
            raise RuntimeError(
                f"tfcoord serve runs at nice {self.running_nice()}, not {self.nice}: lowering it needs root (CAP_SYS_NICE)"
            )
        return self.listened_at - t0

    def running_nice(self) -> int:
        """The nice value it runs at, from /proc/<pid>/stat."""
        return int(Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def waited_s(self) -> float:
        """Seconds its event loop's thread spent runnable but waiting for a CPU
        (/proc/<pid>/schedstat): the machine's other work, not the coordinator's own."""
        return int(Path(f"/proc/{self.proc.pid}/schedstat").read_text().split()[1]) / 1e9

    def memory_mb(self) -> tuple[float, float]:
        """(current RSS, peak RSS) in MiB."""
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        )
        return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)

    def errors_logged(self) -> list[str]:
        return [ln for ln in self.log.read_text().splitlines() if " ERROR " in ln or "Traceback" in ln]


def _set_group_nice(pid: int, nice: int) -> None:
    """Weigh ``pid``'s scheduling group (its session's autogroup) as nice ``nice`` weighs a
    process: -10 is 9.3 times the default weight, as CPUWeight=1000 is 10 times systemd's 100."""
    path = Path(f"/proc/{pid}/autogroup")
    if not path.exists():  # a kernel without autogroups: the process's nice is all there is
        return
    try:
        path.write_text(str(nice))
    except PermissionError:
        raise RuntimeError(
            f"cannot weigh tfcoord serve's scheduling group as nice {nice}: that needs root "
            "(CAP_SYS_NICE); run as root, or --serve-nice 0 for the default priority alone"
        ) from None


def _spin(core: int) -> None:
    """A CPU-bound process (a training step, a feed's parsing) on one core until killed."""
    os.sched_setaffinity(0, {core})
    while True:
        pass


class CpuHog:
    """``_spin`` in a process of its own, pinned to one core, for the measured window: the
    steady goal is heartbeat p99 with such a process beside the coordinator."""

    def __init__(self, core: int | None) -> None:
        self.core = core
        self.proc: multiprocessing.Process | None = None

    def __enter__(self) -> CpuHog:
        if self.core is not None:
            self.proc = multiprocessing.get_context("fork").Process(
                target=_spin, args=(self.core,), daemon=True
            )
            self.proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# -- a simulated node ------------------------------------------------------------------------


def node_hello(token: bytes, job: str, challenge: m.Challenge) -> m.Hello:
    """A node's answer to the coordinator's challenge, as ``NodeClient`` sends it."""
    proof = auth.client_proof(token, challenge.nonce, "node", job)
    return m.Hello(version=m.PROTOCOL_VERSION, role="node", job=job, proof=proof, cnonce=auth.new_nonce())


class SimNode(asyncio.Protocol):
    """One node connection: the sans-io protocol under an asyncio transport."""

    def __init__(self, job: str, token: bytes, executor_id: int) -> None:
        self.job, self.token, self.executor_id = job, token, executor_id
        self.transport: asyncio.Transport | None = None
        self.conn = Connection()
        #: Frames without a request id (challenge, welcome); None once the connection is lost.
        self._handshake: asyncio.Queue[m.Message | None] = asyncio.Queue()
        self._replies: dict[int, asyncio.Future] = {}
        self._ids = iter(range(1, 2**31))
        self.lost = asyncio.Event()
        # The heartbeat in flight, driven by a Beater: its request id and send time.
        self.hb_id = -1
        self.hb_t0: float | None = None
        self.beater: Beater | None = None
        #: What the registration answered, proof that this is the slot's node when it speaks
        #: from another connection (as NodeClient keeps it; the coordinator refuses a
        #: reconnected node's requests without it: not_slot_holder).
        self.credential = ""
        #: Connections made so far, and which of them the registration came on.
        self.connects = 0
        self.registered_on = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.conn.receive_data(data)
        while (msg := self.conn.next_event()) is not NEED_DATA:
            if not isinstance(msg, m.Message):
                return
            if getattr(msg, "id", None) == self.hb_id and self.beater is not None:
                self.beater.answered(self, msg, now)
                continue
            fut = self._replies.pop(getattr(msg, "id", None), None)  # type: ignore[arg-type]
            if fut is not None:
                if not fut.done():
                    fut.set_result((msg, now))
            else:
                self._handshake.put_nowait(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()
        self._handshake.put_nowait(None)
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(ConnectionError("coordinator connection lost"))
        self._replies.clear()

    async def connect(self, host: str, port: int, gate: asyncio.Semaphore) -> None:
        loop = asyncio.get_running_loop()
        self.conn, self._handshake, self.lost = Connection(), asyncio.Queue(), asyncio.Event()
        self.connects += 1
        # The handshake too, not only the connect: a burst from one host stays within the
        # coordinator's budget of connections in their handshake (DEFAULT_MAX_UNAUTHENTICATED).
        async with gate:
            await loop.create_connection(lambda: self, host, port)
            challenge = await self._handshake.get()
            if not isinstance(challenge, m.Challenge):
                raise ConnectionError(f"no challenge: {challenge}")
            self._write(node_hello(self.token, self.job, challenge))
            welcome = await self._handshake.get()
        if not isinstance(welcome, m.Welcome):
            raise ConnectionError(f"refused: {welcome}")

    def _write(self, msg: m.Message) -> None:
        assert self.transport is not None
        self.transport.write(self.conn.send(msg))

    def send(self, build: Callable[[int], m.Request]) -> asyncio.Future:
        """Send ``build(id)``; the future resolves to (reply, perf_counter at arrival)."""
        if self.lost.is_set():
            raise ConnectionError("coordinator connection lost")
        msg = build(next(self._ids))
        fut = asyncio.get_running_loop().create_future()
        self._replies[msg.id] = fut
        self._write(msg)
        return fut

    async def call(self, build: Callable[[int], m.Request]) -> m.Message:
        msg, _ = await self.send(build)
        if isinstance(msg, m.Error):
            raise RuntimeError(f"executor {self.executor_id}: {msg.code}: {msg.message}")
        return msg

    async def register(self, host: str) -> None:
        """Claim the slot, keeping the credential the reply hands this node."""
        reply = await self.call(
            lambda i: m.Register(id=i, host=host, port=20000 + self.executor_id, **self.ids())
        )
        assert isinstance(reply, m.Reply)
        self.credential, self.registered_on = reply.result["credential"], self.connects

    async def heartbeat(self) -> float:
        """One heartbeat round trip; returns its seconds."""
        ids = self.ids()
        t0 = time.perf_counter()
        msg, t1 = await self.send(lambda i: m.Heartbeat(id=i, **ids))
        if not isinstance(msg, m.Reply) or msg.result.get("stop"):
            raise RuntimeError(f"executor {self.executor_id}: heartbeat answered {msg}")
        return t1 - t0

    def ids(self) -> dict[str, Any]:
        """The node's identity in every request: with its credential once it speaks from
        another connection than its registration's (NodeClient._proof)."""
        ids: dict[str, Any] = {"job": self.job, "executor_id": self.executor_id, "attempt": 0}
        if self.credential and self.connects != self.registered_on:
            ids["credential"] = self.credential
        return ids

    def beat(self) -> bool:
        """Send a heartbeat (as a pre-framed map: no message object to build); False if the
        last one is still unanswered, as the blocking client never has two in flight."""
        if self.hb_t0 is not None or self.transport is None or self.lost.is_set():
            return False
        self.hb_id = next(self._ids)
        frame = encode_frame({"op": "heartbeat", "id": self.hb_id, **self.ids(), "meta": {}})
        self.hb_t0 = time.perf_counter()
        self.transport.write(frame)
        return True

    def await_stop(self) -> None:
        self.send(lambda i: m.AwaitStop(id=i, timeout_s=AWAIT_STOP_S, **self.ids())).add_done_callback(
            lambda f: f.exception() if not f.cancelled() else None  # answered or lost, never awaited
        )


class Beater:
    """Every node's heartbeat from one timer wheel, each node on its own phase of the period.

    This is what each node's heartbeat thread does, without a coroutine (and its timers)
    per node: at 5,000 nodes per process those would measure the simulator's own
    overhead, which lands in every round trip it times.
    """

    #: The wheel's resolution: each node beats within this of its own phase.
    TICK_S = 0.005

    def __init__(self, interval_s: float) -> None:
        self.slots: list[list[SimNode]] = [[] for _ in range(max(1, round(interval_s / self.TICK_S)))]
        #: Which figures a round trip counts toward: "setup" (the registration storm and
        #: its settling), "steady" (the measured window), or None (not measured).
        self.phase: str | None = "setup"
        self.latencies = {"setup": array("d"), "steady": array("d"), "burst": array("d")}
        #: Beats skipped because the previous one was still unanswered, per phase.
        self.late = {"setup": 0, "steady": 0, "burst": 0}
        #: How late the wheel's ticks ran in the measured window: this process's own delay
        #: (a busy or starved simulator), as opposed to the coordinator's.
        self.tick_lag = array("d")
        self.refused: list[str] = []

    def add(self, node: SimNode) -> None:
        node.beater = self
        self.slots[random.randrange(len(self.slots))].append(node)

    def answered(self, node: SimNode, msg: m.Message, now: float) -> None:
        if not isinstance(msg, m.Reply) or msg.result.get("stop"):
            self.refused.append(f"executor {node.executor_id}: heartbeat answered {msg}")
        elif self.phase is not None and node.hb_t0 is not None:
            self.latencies[self.phase].append(now - node.hb_t0)
        node.hb_t0 = None

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        start, k = loop.time(), 0
        while not stop.is_set():
            if self.phase in ("steady", "burst"):
                self.tick_lag.append(loop.time() - (start + k * self.TICK_S))
            for node in self.slots[k % len(self.slots)]:
                if not node.beat() and self.phase is not None and node.transport is not None:
                    self.late[self.phase] += 1
            k += 1
            await asyncio.sleep(max(0.0, start + k * self.TICK_S - loop.time()))


# -- client processes ------------------------------------------------------------------------


class Control:
    """The parent's commands, read off the pipe inside the worker's event loop."""

    def __init__(self, pipe: Pipe) -> None:
        self.pipe = pipe
        self.go = asyncio.Event()  # start the measured window
        self.burst = asyncio.Event()  # (burst phase) the other job's registrations begin
        self.halt = asyncio.Event()  # end it (before any process starts its final reports)
        self.stop = asyncio.Event()  # stop beating, report, hang up
        asyncio.get_running_loop().add_reader(pipe.fileno(), self._read)

    def _read(self) -> None:
        while self.pipe.poll():
            getattr(self, self.pipe.recv()).set()


async def _load_worker(pipe: Pipe, port: int, nodes: list[tuple[str, bytes, int]], interval_s: float) -> None:
    ctl = Control(pipe)
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
    beater = Beater(interval_s)
    beating = asyncio.ensure_future(beater.run(ctl.stop))
    running = 0
    all_running = asyncio.Event()
    errors: list[str] = []
    t_start = time.monotonic()

    async def life(job: str, token: bytes, executor_id: int) -> None:
        nonlocal running
        node = SimNode(job, token, executor_id)
        try:
            await node.connect("127.0.0.1", port, gate)
            await node.register(f"10.0.{executor_id // 250}.{executor_id % 250}")
            beater.add(node)  # heartbeats from registration on, like NodeClient
            await node.call(lambda i: m.AwaitCluster(id=i, timeout_s=AWAIT_CLUSTER_S, **node.ids()))
            await node.call(lambda i: m.Report(id=i, state="running", **node.ids()))
            node.await_stop()
            running += 1
            if running == len(nodes):
                all_running.set()
            await ctl.stop.wait()
            await node.call(lambda i: m.Report(id=i, state="succeeded", **node.ids()))
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
            if len(errors) == 1:
                all_running.set()  # report the failure instead of waiting forever
        finally:
            if node.transport is not None:
                node.transport.close()

    lives = [asyncio.ensure_future(life(*n)) for n in nodes]
    await all_running.wait()
    pipe.send(("ready", running, time.monotonic() - t_start, errors[:3]))
    await ctl.go.wait()
    # The simulator's own objects (5,000 nodes' worth) are there to stay: keep its garbage
    # collector from walking them mid-window, a pause every round trip in flight would show.
    gc.freeze()
    beater.phase = "steady"
    await ctl.halt.wait()
    beater.phase = None
    await ctl.stop.wait()
    await beating
    await asyncio.gather(*lives)
    errors += beater.refused
    pipe.send(
        (
            "result",
            {k: a.tobytes() for k, a in beater.latencies.items()},
            errors[:3],
            len(errors),
            beater.late,
            beater.tick_lag.tobytes(),
        )
    )


def _worker(target: Callable[..., Any], pipe: Pipe, *args: Any) -> None:
    # The simulated nodes stand for other hosts: a session of their own is a scheduling group
    # of their own (the kernel's autogroup), so the CPU-bound process beside the coordinator
    # competes with the coordinator, not with the simulator inside one shared group.
    os.setsid()
    _raise_fd_limit()
    random.seed(os.getpid())
    asyncio.run(target(pipe, *args))


def _spawn(target: Callable[..., Any], *args: Any) -> tuple[multiprocessing.Process, Pipe]:
    parent, child = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(
        target=_worker, args=(target, child, *args), daemon=True
    )
    proc.start()
    child.close()
    return proc, parent


def _recv(pipe: Pipe, timeout_s: float = PHASE_TIMEOUT_S) -> Any:
    if not pipe.poll(timeout_s):
        raise TimeoutError("a client process did not answer in time")
    return pipe.recv()


# -- phases ----------------------------------------------------------------------------------


def run_load(
    nodes: int, jobs: int, duration_s: float, clients: int, hog_core: int | None, nice: int = 0
) -> dict[str, Any]:
    _raise_fd_limit()
    with tempfile.TemporaryDirectory() as tmp:
        coord = Coordinator(Path(tmp), nice=nice)
        try:
            per_job = nodes // jobs
            with DriverClient(coord.address, coord.secret, owner_key=coord.owner_key) as d:
                ids = [
                    d.submit(
                        JobSpec(
                            roles=make_roles(per_job), reservation_timeout_s=PHASE_TIMEOUT_S, name=f"load-{j}"
                        )
                    )
                    for j in range(jobs)
                ]
                tokens = {job: d.job_token(job) for job in ids}
            assignments: list[list[tuple[str, bytes, int]]] = [[] for _ in range(clients)]
            for j, job in enumerate(ids):
                for i in range(per_job):
                    assignments[(j * per_job + i) % clients].append((job, tokens[job], i))
            t0 = time.monotonic()
            procs = [_spawn(_load_worker, coord.port, a, DEFAULT_HEARTBEAT_INTERVAL_S) for a in assignments]
            ready = [_recv(pipe) for _, pipe in procs]
            setup_s = time.monotonic() - t0
            problems = [e for r in ready for e in r[3]]
            if problems:
                raise RuntimeError(f"nodes failed during setup: {problems}")
            time.sleep(SETTLE_S)  # let the registration storm's journal commits drain
            with CpuHog(hog_core):
                cpu0, wait0, w0 = coord.cpu_s(), coord.waited_s(), time.monotonic()
                for _, pipe in procs:
                    pipe.send("go")
                time.sleep(duration_s)  # the steady state being measured
                for _, pipe in procs:
                    pipe.send("halt")
                cpu1, wait1, w1 = coord.cpu_s(), coord.waited_s(), time.monotonic()
                loadavg = load_average()
            rss, peak = coord.memory_mb()
            for _, pipe in procs:
                pipe.send("stop")
            results = [_recv(pipe) for _, pipe in procs]
            for proc, _ in procs:
                proc.join(60)
            with DriverClient(coord.address, coord.secret, owner_key=coord.owner_key) as d:
                states = [j["state"] for j in d.status()["jobs"]]
            lat = sorted(x for r in results for x in array("d", r[1]["steady"]))
            storm = sorted(x for r in results for x in array("d", r[1]["setup"]))
            failures = sum(r[3] for r in results)
            late = sum(r[4]["steady"] for r in results)
            lag = sorted(x for r in results for x in array("d", r[5]))
            p99_ms = _percentile(lat, 0.99) * 1e3
            return {
                "phase": "load",
                "ok": failures == 0 and states.count("SUCCEEDED") == jobs,
                "serve_nice": nice,
                "window_monotonic_s": [round(w0, 3), round(w1, 3)],
                "connections": per_job * jobs,
                "jobs": jobs,
                "duration_s": round(w1 - w0, 1),
                "setup_s": round(setup_s, 1),
                "heartbeats": len(lat),
                "heartbeats_per_s": round(len(lat) / (w1 - w0)),
                "heartbeats_late": late,
                "p50_ms": round(_percentile(lat, 0.5) * 1e3, 2),
                "p99_ms": round(p99_ms, 2),
                "max_ms": round(lat[-1] * 1e3, 1) if lat else None,
                "p99_target_ms": TARGET_P99_MS,
                "p99_met": p99_ms < TARGET_P99_MS,
                "cpu_hog_core": hog_core,
                "setup_p50_ms": round(_percentile(storm, 0.5) * 1e3, 2),
                "setup_p99_ms": round(_percentile(storm, 0.99) * 1e3, 2),
                "setup_max_ms": round(storm[-1] * 1e3, 1) if storm else None,
                "setup_heartbeats_late": sum(r[4]["setup"] for r in results),
                "client_lag_p99_ms": round(_percentile(lag, 0.99) * 1e3, 2),
                "client_lag_max_ms": round(lag[-1] * 1e3, 1) if lag else None,
                "coordinator_cpu_percent": round((cpu1 - cpu0) / (w1 - w0) * 100, 1),
                "coordinator_cpu_wait_percent": round((wait1 - wait0) / (w1 - w0) * 100, 1),
                "coordinator_rss_mb": round(rss, 1),
                "coordinator_peak_rss_mb": round(peak, 1),
                "jobs_succeeded": states.count("SUCCEEDED"),
                "node_failures": failures,
                "errors": [e for r in results for e in r[2]][:3],
                "loadavg": loadavg,
            }
        finally:
            coord.stop()


async def _fuzz_worker(
    pipe: Pipe, port: int, secret: bytes, jobs: dict[str, int], seconds: float, seed: int
) -> None:
    from tests.fuzzframes import Generator, run_plans

    gen = Generator(random.Random(seed), secret, jobs)
    plans = gen.plans(20_000)  # made before the clock starts: the clock is for the coordinator
    frames = hung = bad = 0
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < seconds:
        batch = plans[i % len(plans) : i % len(plans) + 200]
        i += 200
        outcomes = await run_plans("127.0.0.1", port, gen, batch, concurrency=64, close_wait_s=0.05)
        frames += sum(o.plan.frames for o in outcomes)
        hung += sum(o.hung for o in outcomes)
        bad += sum(1 for o in outcomes if o.bad_reply)
    pipe.send((frames, time.monotonic() - t0, hung, bad))


# -- the burst phase ---------------------------------------------------------------------------


class Member:
    """One node of a :class:`SharedConn`: what the Beater drives (see ``SimNode.beat``)."""

    def __init__(self, conn: SharedConn, executor_id: int) -> None:
        self.conn, self.executor_id = conn, executor_id
        self.hb_t0: float | None = None
        self.beater: Beater | None = None

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.conn.transport

    def beat(self) -> bool:
        conn = self.conn
        if self.hb_t0 is not None or conn.transport is None or conn.lost:
            return False
        hb_id = next(conn.ids)
        conn.heartbeats[hb_id] = self
        frame = encode_frame(
            {
                "op": "heartbeat",
                "id": hb_id,
                "job": conn.job,
                "executor_id": self.executor_id,
                "attempt": 0,
                "meta": {},
            }
        )
        self.hb_t0 = time.perf_counter()
        conn.transport.write(frame)
        return True


class SharedConn(asyncio.Protocol):
    """One connection carrying several nodes of one job, each registering, waiting for the
    cluster, reporting running and keeping an ``await_stop`` pending as a node does, then
    heartbeating on its own phase. The protocol allows it (a node connection is bound to
    a job, not to a node); the burst phase uses it only where the descriptor limit leaves
    no room for one connection per node (see :func:`run_burst`)."""

    def __init__(self, job: str, token: bytes, executor_ids: list[int], beater: Beater) -> None:
        self.job, self.token, self.beater = job, token, beater
        self.members = [Member(self, e) for e in executor_ids]
        self.proto = Connection()
        self.transport: asyncio.Transport | None = None
        self.ids = iter(range(1, 2**31))
        self.heartbeats: dict[int, Member] = {}
        self.lost = False
        self.waiting = len(executor_ids)  # cluster replies still to come
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.welcomed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(f"job {self.job}: connection lost: {exc}")

    def _fail(self, text: str) -> None:
        for fut in (self.welcomed, self.ready):
            if not fut.done():
                fut.set_exception(RuntimeError(text))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.proto.receive_data(data)
        while (msg := self.proto.next_event()) is not NEED_DATA:
            member = self.heartbeats.pop(getattr(msg, "id", -1), None)
            if member is not None:
                assert member.beater is not None
                member.beater.answered(member, msg, now)  # type: ignore[arg-type]
            elif isinstance(msg, m.Challenge):
                self._write(node_hello(self.token, self.job, msg))
            elif isinstance(msg, m.Welcome):
                if not self.welcomed.done():
                    self.welcomed.set_result(None)
                for mb in self.members:
                    ids = {"job": self.job, "executor_id": mb.executor_id, "attempt": 0}
                    e = mb.executor_id
                    self._write(
                        m.Register(
                            id=next(self.ids), host=f"10.1.{e // 250}.{e % 250}", port=20000 + e, **ids
                        )
                    )
                    self._write(m.AwaitCluster(id=next(self.ids), timeout_s=AWAIT_CLUSTER_S, **ids))
                    self._write(m.AwaitStop(id=next(self.ids), timeout_s=AWAIT_STOP_S, **ids))
                for mb in self.members:  # heartbeating from registration on, as NodeClient does
                    self.beater.add(mb)  # type: ignore[arg-type]
            elif isinstance(msg, m.ClusterReply):
                mb = next(x for x in self.members if x.executor_id == msg.index)  # one role: index = executor
                self._write(
                    m.Report(
                        id=next(self.ids),
                        state="running",
                        job=self.job,
                        executor_id=mb.executor_id,
                        attempt=0,
                    )
                )
                self.waiting -= 1
                if self.waiting == 0 and not self.ready.done():
                    self.ready.set_result(None)
            elif isinstance(msg, m.Error):
                self._fail(f"job {self.job}: {msg.code}: {msg.message}")
            # Replies to register and report need nothing more.

    def _write(self, msg: m.Message) -> None:
        assert self.transport is not None
        self.transport.write(self.proto.send(msg))


async def _steady_worker(
    pipe: Pipe, port: int, conns: list[tuple[str, bytes, list[int]]], interval_s: float
) -> None:
    ctl = Control(pipe)
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
    beater = Beater(interval_s)
    beater.phase = None  # nothing counted until the baseline window
    beating = asyncio.ensure_future(beater.run(ctl.stop))
    t0 = time.monotonic()

    async def open_one(job: str, token: bytes, executor_ids: list[int]) -> SharedConn:
        c = SharedConn(job, token, executor_ids, beater)
        async with gate:  # the handshake too (see SimNode.connect)
            await loop.create_connection(lambda: c, "127.0.0.1", port)
            await c.welcomed
        await asyncio.wait_for(c.ready, AWAIT_CLUSTER_S)
        return c

    # Reported at the first failure: a refused connection's job never completes, and its
    # other connections would wait AWAIT_CLUSTER_S for it.
    opening = [asyncio.ensure_future(open_one(*c)) for c in conns]
    await asyncio.wait(opening, return_when=asyncio.FIRST_EXCEPTION)
    failed = [e for t in opening if t.done() and (e := t.exception()) is not None]
    errors = [f"{type(e).__name__}: {e}" for e in failed]
    opened = [t.result() for t in opening if t.done() and t.exception() is None]
    pipe.send(("ready", len(opened), time.monotonic() - t0, errors[:3]))
    await ctl.go.wait()
    gc.freeze()  # see _load_worker
    beater.phase = "steady"  # the baseline, before the burst
    await ctl.burst.wait()
    beater.phase = "burst"
    await ctl.halt.wait()
    beater.phase = None
    await ctl.stop.wait()
    await beating
    for c in opened:
        if isinstance(c, SharedConn) and c.transport is not None:
            c.transport.close()
    pipe.send(
        (
            "result",
            {k: a.tobytes() for k, a in beater.latencies.items()},
            beater.refused[:3],
            len(beater.refused),
            beater.late,
            beater.tick_lag.tobytes(),
        )
    )


async def _burst_worker(pipe: Pipe, port: int, job: str, token: bytes, nodes: int) -> None:
    """The rendezvous benchmark's nodes (``rendezvous.Nodes``): connect, authenticate,
    register, wait for the cluster with an await_stop pending; all at once on "burst"."""
    import rendezvous

    ctl = Control(pipe)
    pipe.send(("ready",))
    await ctl.burst.wait()
    burst = rendezvous.Nodes("127.0.0.1", port, token, job, nodes)
    gc.disable()  # as in the rendezvous benchmark: its nodes' objects stay until the end
    try:
        # Its own epoll in a thread; this loop only waits for it (and for "stop").
        took = await asyncio.get_running_loop().run_in_executor(None, burst.run, PHASE_TIMEOUT_S)
        pipe.send(("result", took, ""))
    except Exception as e:
        pipe.send(("result", None, f"{type(e).__name__}: {e}"))
    await ctl.stop.wait()
    burst.close()


#: The burst phase's p99 target for the steady jobs' heartbeats while the big job registers.
TARGET_BURST_P99_MS = 20.0
#: Steady heartbeats measured before the burst starts, for comparison.
BASELINE_S = 4.0
#: Descriptors the coordinator keeps for itself (listener, journal, driver, epoll, logs).
RESERVED_FDS = 100


def run_burst(jobs: int, per_job: int, burst_nodes: int, nice: int = 0) -> dict[str, Any]:
    """``jobs`` x ``per_job`` nodes heartbeating while one ``burst_nodes`` job registers."""
    _raise_fd_limit()
    steady_nodes = jobs * per_job
    # One descriptor per connection in the coordinator, which cannot lift its hard limit
    # (20,000 here): when steady and burst nodes together do not fit, the steady nodes
    # share connections, a few per connection. Every node still heartbeats on its own.
    room = resource.getrlimit(resource.RLIMIT_NOFILE)[1] - RESERVED_FDS - burst_nodes
    if room <= 0:
        raise RuntimeError(f"the descriptor limit leaves no room for {burst_nodes} burst connections")
    per_conn = max(1, -(-steady_nodes // room))
    with tempfile.TemporaryDirectory() as tmp:
        coord = Coordinator(Path(tmp), nice=nice)
        procs: list[tuple[multiprocessing.Process, Pipe]] = []
        try:
            with DriverClient(coord.address, coord.secret, owner_key=coord.owner_key) as d:
                ids = [
                    d.submit(
                        JobSpec(
                            roles=make_roles(per_job),
                            reservation_timeout_s=PHASE_TIMEOUT_S,
                            name=f"steady-{j}",
                        )
                    )
                    for j in range(jobs)
                ]
                tokens = {job: d.job_token(job) for job in ids}
                big = d.submit(
                    JobSpec(
                        roles=make_roles(burst_nodes), reservation_timeout_s=PHASE_TIMEOUT_S, name="burst"
                    )
                )
                big_token = d.job_token(big)
            conns = [
                (job, tokens[job], list(range(i, min(i + per_conn, per_job))))
                for job in ids
                for i in range(0, per_job, per_conn)
            ]
            steady = _spawn(_steady_worker, coord.port, conns, DEFAULT_HEARTBEAT_INTERVAL_S)
            procs.append(steady)
            ready = _recv(steady[1])
            if ready[3]:
                raise RuntimeError(f"steady nodes failed during setup: {ready[3]}")
            time.sleep(SETTLE_S)  # the steady jobs' own registrations committed
            burst = _spawn(_burst_worker, coord.port, big, big_token, burst_nodes)
            procs.append(burst)
            _recv(burst[1])
            steady[1].send("go")
            time.sleep(BASELINE_S)
            cpu0, wait0, w0 = coord.cpu_s(), coord.waited_s(), time.monotonic()
            steady[1].send("burst")
            burst[1].send("burst")
            _, burst_s, burst_error = _recv(burst[1])
            steady[1].send("halt")
            cpu1, wait1, w1 = coord.cpu_s(), coord.waited_s(), time.monotonic()
            loadavg = load_average()
            rss, peak = coord.memory_mb()
            with DriverClient(coord.address, coord.secret, owner_key=coord.owner_key) as d:
                states = {j["job"]: j["state"] for j in d.status()["jobs"]}
            for _, pipe in procs:
                pipe.send("stop")
            result = _recv(steady[1])
            for proc, _ in procs:
                proc.join(60)
            lat = sorted(array("d", result[1]["burst"]))
            base = sorted(array("d", result[1]["steady"]))
            lag = sorted(array("d", result[5]))
            steady_ok = sum(states.get(j) == "RUNNING" for j in ids)
            p99_ms = _percentile(lat, 0.99) * 1e3
            return {
                "phase": "burst",
                "ok": bool(lat) and not burst_error and result[3] == 0 and steady_ok == jobs
                and states.get(big) == "READY",
                "serve_nice": nice, "window_monotonic_s": [round(w0, 3), round(w1, 3)],
                "steady_jobs": jobs, "steady_nodes": steady_nodes, "steady_connections": len(conns),
                "nodes_per_connection": per_conn, "burst_nodes": burst_nodes,
                "burst_all_ready_s": round(burst_s, 3) if burst_s else None,
                "heartbeats": len(lat), "heartbeats_late": result[4]["burst"],
                "heartbeat_p50_ms": round(_percentile(lat, 0.5) * 1e3, 2),
                "heartbeat_p99_ms": round(p99_ms, 2),
                "heartbeat_max_ms": round(lat[-1] * 1e3, 1) if lat else None,
                "p99_target_ms": TARGET_BURST_P99_MS, "p99_met": p99_ms < TARGET_BURST_P99_MS,
                "baseline_p50_ms": round(_percentile(base, 0.5) * 1e3, 2),
                "baseline_p99_ms": round(_percentile(base, 0.99) * 1e3, 2),
                "client_lag_p99_ms": round(_percentile(lag, 0.99) * 1e3, 2),
                "client_lag_max_ms": round(lag[-1] * 1e3, 1) if lag else None,
                "coordinator_cpu_percent": round((cpu1 - cpu0) / (w1 - w0) * 100, 1),
                "coordinator_cpu_wait_percent": round((wait1 - wait0) / (w1 - w0) * 100, 1),
                "coordinator_rss_mb": round(rss, 1), "coordinator_peak_rss_mb": round(peak, 1),
                "steady_jobs_running": steady_ok, "burst_job_state": states.get(big),
                "errors": ([burst_error] if burst_error else []) + list(result[2]),
                "loadavg": loadavg,
            }  # fmt: skip
        finally:
            for proc, _ in procs:
                if proc.is_alive():
                    proc.kill()
            coord.stop()


def run_fuzz(seconds: float, clients: int) -> dict[str, Any]:
    from tests.fuzzframes import FUZZ_OWNER_KEY

    with tempfile.TemporaryDirectory() as tmp:
        coord = Coordinator(Path(tmp))
        try:
            with DriverClient(coord.address, coord.secret, owner_key=FUZZ_OWNER_KEY) as d:
                jobs = {d.submit(JobSpec(roles=make_roles(3)), f"fz-{k}"): 3 for k in range(4)}
            cpu0 = coord.cpu_s()
            procs = [_spawn(_fuzz_worker, coord.port, coord.secret, jobs, seconds, k) for k in range(clients)]
            results = [_recv(pipe) for _, pipe in procs]
            cpu = coord.cpu_s() - cpu0
            frames = sum(r[0] for r in results)
            wall = max(r[1] for r in results)
            alive = coord.proc.poll() is None
            with DriverClient(
                coord.address, coord.secret, owner_key=coord.owner_key
            ) as d:  # still serving a normal job?
                from tfcoord.client import NodeClient

                job = d.submit(JobSpec(roles=make_roles(1)))
                with NodeClient(coord.address, d.job_token(job), job, 0) as n:
                    n.register("127.0.0.1", 1)
                    n.await_cluster(30)
                    n.report("succeeded")
                normal = d.await_job(job, 30)["state"]
            errors = coord.errors_logged()
            hung = sum(r[2] for r in results)
            return {
                "phase": "fuzz",
                "ok": alive and normal == "SUCCEEDED" and not errors and hung == 0,
                "frames": frames,
                "seconds": round(wall, 1),
                "frames_per_s": round(frames / wall),
                "coordinator_cpu_percent": round(cpu / wall * 100, 1),
                "survived": alive,
                "normal_job_after": normal,
                "errors_logged": errors[:3],
                "hung_connections": hung,
                "bad_replies": sum(r[3] for r in results),
            }
        finally:
            coord.stop()


async def _restart_worker(pipe: Pipe, port: int, job: str, token: bytes, n: int, interval_s: float) -> None:
    ctl = Control(pipe)
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
    running = 0
    all_running = asyncio.Event()
    resumed: list[float] = []
    all_resumed = asyncio.Event()
    errors: list[str] = []

    async def reconnect(node: SimNode) -> None:
        for delay in backoff_delays():  # exactly the blocking client's schedule
            try:
                await node.connect("127.0.0.1", port, gate)
                return
            except OSError:
                await asyncio.sleep(delay)

    async def life(executor_id: int) -> None:
        nonlocal running
        node = SimNode(job, token, executor_id)
        try:
            await node.connect("127.0.0.1", port, gate)
            await node.register("127.0.0.1")
            await node.call(lambda i: m.AwaitCluster(id=i, timeout_s=AWAIT_CLUSTER_S, **node.ids()))
            await node.call(lambda i: m.Report(id=i, state="running", **node.ids()))
            node.await_stop()
            running += 1
            if running == n:
                all_running.set()
            await asyncio.sleep(random.uniform(0, interval_s))
            resuming = False
            while not ctl.stop.is_set():
                try:
                    await node.heartbeat()
                except ConnectionError:
                    resuming = True
                    await reconnect(node)
                    node.await_stop()  # what was pending is sent again
                    continue  # and the heartbeat in flight too, at once
                if resuming:
                    resuming = False
                    resumed.append(time.monotonic())
                    if len(resumed) == n:
                        all_resumed.set()
                # Until the next beat, or at once when the connection drops: the blocking
                # client's reader thread notices a lost connection and reconnects right away.
                try:
                    await asyncio.wait_for(node.lost.wait(), interval_s)
                except TimeoutError:
                    pass
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
            all_running.set()
            all_resumed.set()

    lives = [asyncio.ensure_future(life(i)) for i in range(n)]
    await all_running.wait()
    pipe.send(("ready", errors[:3]))
    await all_resumed.wait()
    pipe.send(("resumed", sorted(resumed), len(resumed), errors[:3]))
    await ctl.stop.wait()
    await asyncio.gather(*lives)


def run_restart(nodes: int) -> dict[str, Any]:
    _raise_fd_limit()
    with tempfile.TemporaryDirectory() as tmp:
        coord = Coordinator(Path(tmp))
        proc = None
        try:
            with DriverClient(coord.address, coord.secret, owner_key=coord.owner_key) as d:
                job = d.submit(
                    JobSpec(roles=make_roles(nodes), reservation_timeout_s=PHASE_TIMEOUT_S, name="restart")
                )
                token = d.job_token(job)
            proc, pipe = _spawn(_restart_worker, coord.port, job, token, nodes, DEFAULT_HEARTBEAT_INTERVAL_S)
            ready = _recv(pipe)
            if ready[1]:
                raise RuntimeError(f"nodes failed: {ready[1]}")
            time.sleep(2 * DEFAULT_HEARTBEAT_INTERVAL_S)  # steady heartbeating before the kill
            t_kill = time.monotonic()
            coord.kill()
            coord.start()
            listening_s = coord.listened_at - t_kill
            _, resumed_at, count, errors = _recv(pipe)
            loadavg = load_average()
            last_resumed = resumed_at[-1] if resumed_at else None
            with DriverClient(coord.address, coord.secret, owner_key=coord.owner_key) as d:
                st = d.status(job)
            pipe.send("stop")
            proc.join(60)
            resumed_s = (last_resumed - t_kill) if last_resumed else None
            return {
                "phase": "restart",
                "ok": count == nodes and not errors and st["state"] == "RUNNING",
                "nodes": nodes,
                "kill_to_listening_s": round(listening_s, 3),
                "kill_to_all_resumed_s": round(resumed_s, 3) if resumed_s else None,
                "kill_to_half_resumed_s": round(_percentile(resumed_at, 0.5) - t_kill, 3)
                if resumed_at
                else None,
                "listening_to_all_resumed_s": round(resumed_s - listening_s, 3) if resumed_s else None,
                "target_s": TARGET_RESUME_S,
                "target_met": bool(resumed_s and resumed_s < TARGET_RESUME_S),
                "resumed": count,
                "job_state_after": st["state"],
                "errors": errors,
                "loadavg": loadavg,
            }
        finally:
            if proc is not None and proc.is_alive():
                proc.kill()
            coord.stop()


def figure_row(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any] | None:
    """The results table's row for a phase with a goal (``floor.figure``); None for fuzz.

    These goals are absolute (issue 28), so the goal is in the note and ``goal_met`` is the
    phase's own verdict; no floor is measured for them. A failed phase's row has no figure
    and its error in the shape column."""
    ok, load = row["ok"], row.get("loadavg") or load_average()
    lag = (
        f"; the simulator's own lag p99 {row.get('client_lag_p99_ms')} ms; the coordinator ran"
        f" {row.get('coordinator_cpu_percent')} % of the window and waited for a CPU"
        f" {row.get('coordinator_cpu_wait_percent')} %"
    )
    nice = row.get("serve_nice", 0)
    priority = (
        f" (tfcoord serve at nice {nice} in a scheduling group of its own, as deploy/tfcoord.service runs it)"
        if nice == SERVICE_NICE
        else f" (tfcoord serve at nice {nice} in a scheduling group of its own)"
        if nice
        else " (tfcoord serve at the default priority)"
    )
    if row["phase"] == "load":
        value, goal_ms = row.get("p99_ms"), TARGET_P99_MS
        name = f"heartbeat p99, {args.nodes:,} steady connections{priority}"
        shape = f"{args.jobs} jobs, heartbeat every {DEFAULT_HEARTBEAT_INTERVAL_S:g} s, " + (
            f"a CPU-bound process pinned to core {args.hog_core}"
            if args.hog_core >= 0
            else "no CPU-bound process"
        )
    elif row["phase"] == "burst":
        value, goal_ms = row.get("heartbeat_p99_ms"), TARGET_BURST_P99_MS
        name = f"heartbeat p99 while {args.burst_nodes:,} nodes register{priority}"
        shape = (
            f"{args.nodes:,} steady nodes in {args.jobs} jobs on {row.get('steady_connections')} connections"
        )
    elif row["phase"] == "restart":
        value, goal_ms = row.get("kill_to_all_resumed_s"), None
        name = f"restart: SIGKILL to {args.restart_nodes:,} nodes resumed"
        shape, lag = f"listening after {row.get('kill_to_listening_s')} s", ""
    else:
        return None
    if not ok:
        value, shape, lag = None, f"failed: {str(row.get('error') or row.get('errors'))[:160]}", ""
    return figure(
        name,
        unit="s",
        tfcoord=value if goal_ms is None or value is None else value / 1e3,
        floor=None,
        anchor=None,
        anchor_name="",
        goal=None,
        shape=shape + lag,
        loadavg=load,
        note=f"goal: p99 < {goal_ms:g} ms" if goal_ms is not None else f"goal: < {TARGET_RESUME_S:g} s",
    ) | {"goal_met": bool(ok and (row.get("target_met") if goal_ms is None else row.get("p99_met")))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000, help="node connections in the load phase")
    ap.add_argument("--jobs", type=int, default=100, help="concurrent jobs the nodes belong to")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of steady-state load measured")
    ap.add_argument("--clients", type=int, default=2, help="client processes simulating the nodes")
    ap.add_argument("--fuzz-seconds", type=float, default=10.0)
    ap.add_argument("--restart-nodes", type=int, default=1000)
    ap.add_argument(
        "--burst-nodes", type=int, default=10_000, help="size of the job that registers in the burst phase"
    )
    ap.add_argument(
        "--phases", default="load,burst,fuzz,restart", help="comma list of load, burst, fuzz, restart"
    )
    ap.add_argument(
        "--hog-core", type=int, default=0, help="core of the CPU-bound process in the load phase (-1: none)"
    )
    ap.add_argument(
        "--serve-nice",
        default=f"{SERVICE_NICE},0",
        help="comma list of nice values to run the load and burst phases' tfcoord serve at, each "
        f"its own run and row ({SERVICE_NICE}: as deploy/tfcoord.service runs it; 0: the default priority; "
        "below 0 needs root)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    args = ap.parse_args()
    if args.nodes % args.jobs:
        ap.error("--nodes must be a multiple of --jobs")
    try:
        nices = [int(n) for n in args.serve_nice.split(",")]
    except ValueError:
        ap.error(f"--serve-nice takes a comma list of integers, not {args.serve_nice!r}")
    runs: dict[str, Callable[[int], dict[str, Any]]] = {
        "load": lambda nice: run_load(
            args.nodes,
            args.jobs,
            args.duration,
            args.clients,
            args.hog_core if args.hog_core >= 0 else None,
            nice,
        ),
        "fuzz": lambda _: run_fuzz(args.fuzz_seconds, args.clients),
        "restart": lambda _: run_restart(args.restart_nodes),
        "burst": lambda nice: run_burst(args.jobs, args.nodes // args.jobs, args.burst_nodes, nice),
    }
    rows = []
    for phase in args.phases.split(","):
        if phase not in runs:
            ap.error(f"unknown phase {phase!r}; the phases are {', '.join(runs)}")
        for nice in nices if phase in ("load", "burst") else [0]:
            try:
                row = runs[phase](nice)
            except Exception as e:
                row = {"phase": phase, "ok": False, "serve_nice": nice, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
            fig = figure_row(row, args)
            if fig is not None:
                print(json.dumps(fig), flush=True)
    if not args.json:
        for r in rows:
            print(
                f"{r['phase']:>8}: " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "phase"),
                file=sys.stderr,
            )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
