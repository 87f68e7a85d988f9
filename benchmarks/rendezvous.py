"""Rendezvous benchmark: N nodes start at once; how long until every one holds the cluster spec?

    python benchmarks/rendezvous.py --nodes 10,100,1000 [--repeats N] [--against tfos] [--json]

For tfcoord, ``tfcoord serve`` runs as its own process (so its RSS is its own), and
N simulated nodes run in this process on one epoll (:class:`Nodes`). Each node does
exactly what ``NodeClient`` does on the wire, through the same sans-io protocol: connect,
answer the challenge with an HMAC proof of its job token, check the welcome, register,
and wait in ``await_cluster`` until the spec is pushed (with an ``await_stop`` pending
beside it, as ``NodeClient.start_heartbeats`` leaves one), while a driver watches the
job's progress as ``run()`` and ``tfcoord submit`` do; the spec is decoded and checked
once, and every node's reply checked to hold the same bytes and the node's own role and
index. One thread and one epoll fit 10,000 nodes on two cores (10,000 threads, or
asyncio's transports and tasks, would measure the simulator, not the coordinator), and
this process runs with its garbage collector off while the nodes run: 10,000 real nodes
each have a small heap of their own, where one shared heap of 10,000 nodes' objects
would have the simulator spend a second traversing it. The coordinator runs as it does
in production.

``--against tfos`` runs TensorFlowOnSpark 2.2.5's own reservation server and
clients on the same N in the same run (``anchor_tfos.py``); a failure there is
recorded, not raised. With ``--repeats N`` (N > 1) tfcoord runs N times per size, each
against a fresh coordinator, and prints one row per size: all_ready_s_median,
all_ready_s_p95 (nearest rank), all_ready_s_max, rss_per_node_kb (median),
coordinator_cpu_us_per_node (median) and every run's all_ready_s; the anchor runs once
and its ratio is to tfcoord's median. Otherwise each system prints one JSON line: system, nodes,
all_ready_s, coordinator_rss_mb (and for tfcoord rss_per_node_kb, the growth over
the idle coordinator divided by N, and the CPU seconds the coordinator and the
simulator each spent: on two cores the two together bound all_ready_s).
"""

from __future__ import annotations

import argparse
import errno
import gc
import itertools
import json
import math
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from floor import figure, load_average  # noqa: E402
from rendezvous_floor import run_floor  # noqa: E402

from tfcoord.client import DriverClient, JobSpec, auth, make_roles  # noqa: E402
from tfcoord.client import messages as m  # noqa: E402
from tfcoord.client.handshake import Connecting  # noqa: E402
from tfcoord.client.protocol import NEED_DATA, Connection, decode_spec  # noqa: E402

#: How the coordinator process is started: ``TFCOORD_BENCH_PROFILE=FILE`` runs it under
#: cProfile, ``TFCOORD_BENCH_LOOPTRACE=FILE`` under ``looptrace.py`` (each loop turn and
#: callback timed), each written when it stops.
SERVE_PREFIX = (
    [sys.executable, "-m", "cProfile", "-o", os.environ["TFCOORD_BENCH_PROFILE"], "-m", "tfcoord"]
    if os.environ.get("TFCOORD_BENCH_PROFILE")
    else [sys.executable, str(HERE / "looptrace.py"), os.environ["TFCOORD_BENCH_LOOPTRACE"], "-m", "tfcoord"]
    if os.environ.get("TFCOORD_BENCH_LOOPTRACE")
    else [sys.executable, "-m", "tfcoord"]
)


def serve_command(port: int, port_file: Path, secret_file: Path, *extra: str) -> list[str]:
    """``tfcoord serve`` as every benchmark runs it: plaintext (the simulated nodes' wire
    work is what is measured), warnings only, the port written to ``port_file`` once it
    listens, then ``extra`` (``--state-dir DIR``...)."""
    return [
        *SERVE_PREFIX,
        "--log-level",
        "WARNING",
        "serve",
        "--plaintext",
        # Every simulated node dials from this one host: its handshakes in flight are
        # many hosts' worth (the per-source default is a quarter of the budget).
        "--max-unauthenticated-per-source",
        "4096",
        "--port",
        str(port),
        "--port-file",
        str(port_file),
        "--secret-file",
        str(secret_file),
        *extra,
    ]


#: Generous: a run that takes this long has failed anyway.
RUN_TIMEOUT_S = 300.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


#: Connects in flight at once from this one simulating process. Every node starts at
#: once, but 10,000 SYNs from one host in a burst overflow the kernel's SYN queue
#: (net.ipv4.tcp_max_syn_backlog, 2048 here) and each dropped SYN costs a 1 s
#: retransmit: an artefact of simulating every node from one host, not a property of
#: the coordinator, whose nodes arrive from many hosts.
CONNECTS_IN_FLIGHT = 1024


def _address(i: int) -> tuple[str, int]:
    """A realistic address for node i: 8 executors per host, ports scattered like port-0 binds.

    Nothing listens there; only the coordinator sees it. Sequential ports on one host
    would compress far better than real clusters' specs and flatter the figure.
    """
    host = i // 8
    return f"10.{host // 62500}.{host // 250 % 250}.{host % 250 + 1}", 20000 + (i * 7919) % 40000


class _SpecCheck:
    """Checks the cluster spec every node receives: decoded (every address checked) the
    first time, and byte for byte the same as that one every other time."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.checked: bytes | None = None

    def __call__(self, blob: bytes) -> None:
        if blob == self.checked:
            return
        if self.checked is not None:
            raise RuntimeError("nodes of one job received different cluster specs")
        spec = decode_spec(blob)
        want = [f"{host}:{port}" for host, port in map(_address, range(self.size))]
        if spec != {"worker": want}:
            raise RuntimeError("the cluster spec does not name every node at its address")
        self.checked = blob


class _Node:
    """One simulated node: the wire work of ``NodeClient``, driven by bytes (see :class:`Nodes`)."""

    __slots__ = ("conn", "handshake", "i", "sock")

    def __init__(self, i: int, sock: socket.socket, handshake: Connecting) -> None:
        self.i, self.sock, self.handshake = i, sock, handshake
        self.conn = Connection()

    def send(self, data: bytes) -> None:
        # A node's frames are a few hundred bytes: the socket takes them whole unless its
        # buffer is full, which one request per reply never makes it.
        if self.sock.send(data) != len(data):
            raise RuntimeError(f"node {self.i}: the socket took part of a frame")


class Nodes:
    """N simulated nodes on one epoll, in one thread: connect (at most CONNECTS_IN_FLIGHT
    until their handshake is done), answer the challenge with an HMAC proof of the job
    token, check the welcome, register, and wait in ``await_cluster`` until the spec is
    pushed (with an ``await_stop`` pending beside it, as ``NodeClient.start_heartbeats``
    leaves one), through the same sans-io ``Connection`` as ``NodeClient``.

    Not asyncio: its transports, tasks and futures cost the one simulating core as much
    as the coordinator's whole rendezvous, which ten thousand real nodes spend on ten
    thousand cores. The sockets stay open (as live nodes' would) until :meth:`close`.
    """

    def __init__(self, host: str, port: int, token: bytes, job: str, n: int) -> None:
        self.address = (host, port)
        self.token, self.job, self.n = token, job, n
        self.check = _SpecCheck(n)
        self.nodes: dict[int, _Node] = {}
        self.ready = 0

    def run(self, timeout_s: float = RUN_TIMEOUT_S) -> float:
        """Start every node; returns the seconds until all of them hold the spec."""
        ep = select.epoll()
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        try:
            upcoming = iter(range(self.n))
            for i in itertools.islice(upcoming, CONNECTS_IN_FLIGHT):
                self._connect(ep, i)
            while self.ready < self.n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.ready} of {self.n} nodes hold the spec after {timeout_s:g} s")
                for fd, _ in ep.poll(min(left, 1.0), 4096):
                    node = self.nodes[fd]
                    data = node.sock.recv(1 << 18)
                    if not data:
                        raise ConnectionError(f"node {node.i}: the coordinator closed the connection")
                    node.conn.receive_data(data)
                    while (msg := node.conn.next_event()) is not NEED_DATA:
                        if self._on(node, msg):  # type: ignore[arg-type]
                            nxt = next(upcoming, None)
                            if nxt is not None:
                                self._connect(ep, nxt)
            return time.perf_counter() - t0
        finally:
            ep.close()

    def close(self) -> None:
        for node in self.nodes.values():
            node.sock.close()
        self.nodes.clear()

    def _connect(self, ep: select.epoll, i: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the client's sockets
        err = sock.connect_ex(self.address)
        if err not in (0, errno.EINPROGRESS):
            raise ConnectionError(f"node {i}: connect: {os.strerror(err)}")
        handshake = Connecting(self.token, "node", self.job, m.PROTOCOL_VERSION, "the coordinator")
        self.nodes[sock.fileno()] = _Node(i, sock, handshake)
        # The coordinator speaks first: the challenge arriving says the connect is done (a
        # failed connect wakes the poll as well, and its recv raises).
        ep.register(sock.fileno(), select.EPOLLIN)

    def _on(self, node: _Node, msg: m.Message) -> bool:
        """Handle one message; True once the node's handshake is done."""
        conn, job, i = node.conn, self.job, node.i
        if isinstance(msg, m.Challenge):
            node.send(conn.send(node.handshake.hello(msg)))
        elif isinstance(msg, m.Welcome):
            node.handshake.welcome(msg)  # the coordinator's proof that it knows the token
            node_host, node_port = _address(i)
            # Register, then (as NodeClient.start_heartbeats does) a stop wait that stays
            # pending beside the cluster wait: pipelined, in one write.
            node.send(
                conn.send(m.Register(id=1, job=job, executor_id=i, attempt=0, host=node_host, port=node_port))
                + conn.send(m.AwaitStop(id=3, job=job, executor_id=i, attempt=0, timeout_s=3600.0))
                + conn.send(m.AwaitCluster(id=2, job=job, executor_id=i, attempt=0, timeout_s=RUN_TIMEOUT_S))
            )
            return True
        elif isinstance(msg, m.Error):
            raise RuntimeError(f"node {i}: {msg.code}: {msg.message}")
        elif isinstance(msg, m.ClusterReply):
            # The frame has arrived whole and validated: the node holds the spec. Decoding
            # its inner map costs each real node ~0.5 ms at 10,000 nodes on its own
            # executor, in parallel; here all nodes share one core, so the spec is decoded
            # and checked (every address) once, and every node's reply is checked to carry
            # exactly those bytes, and this node's own role and index.
            if msg.role != "worker" or msg.index != i:
                raise RuntimeError(f"node {i}: told it is {msg.role}:{msg.index}")
            self.check(msg.spec)
            self.ready += 1
        # The register reply (m.Reply) needs no answer.
        return False


def _watch(
    address: str, secret: bytes, owner_key: bytes, job: str, stop: threading.Event, seen: list[int]
) -> None:
    """What a driver does meanwhile (``tfcoord submit``, ``run()``): watch the job's progress, briefly."""
    with DriverClient(address, secret, owner_key=owner_key) as d:
        version = 0
        while not stop.is_set():
            st = d.watch(job, version, 1.0, brief=True)
            version = st["version"]
            seen.append(st["registered"])
            if st["state"] != "RESERVING" and st["state"] != "SUBMITTED":
                return


def _all_nodes(host: str, port: int, token: bytes, job: str, n: int, pid: int) -> tuple[float, float]:
    """Run every node at once; returns (seconds until all hold the spec, coordinator RSS then)."""
    nodes = Nodes(host, port, token, job, n)
    gc.disable()  # see the module's docstring
    try:
        took = nodes.run()
        rss = _rss_mb(pid)
    finally:
        gc.enable()
        nodes.close()
    return took, rss


def run_tfcoord(nodes: int) -> dict:
    _raise_fd_limit()
    with tempfile.TemporaryDirectory() as tmp:
        secret_file, port_file = Path(tmp, "secret"), Path(tmp, "port")
        secret = auth.write_secret(secret_file)
        proc = subprocess.Popen(
            serve_command(0, port_file, secret_file),
        )
        try:
            deadline = time.monotonic() + 60
            while not port_file.exists():  # the coordinator writes it atomically once listening
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("tfcoord serve did not start")
                time.sleep(0.02)
            port = int(port_file.read_text())
            owner_key = auth.new_owner_key()  # the watcher below is the same driver
            with DriverClient(f"127.0.0.1:{port}", secret, owner_key=owner_key) as d:
                job = d.submit(JobSpec(roles=make_roles(nodes), reservation_timeout_s=RUN_TIMEOUT_S))
                token = d.job_token(job)
                rss_idle, cpu0 = _rss_mb(proc.pid), _cpu_s(proc.pid)
                stop, seen = threading.Event(), []
                watcher = threading.Thread(
                    target=_watch, args=(f"127.0.0.1:{port}", secret, owner_key, job, stop, seen)
                )
                watcher.start()
                try:
                    sim0 = _own_cpu_s()
                    took, rss = _all_nodes("127.0.0.1", port, token, job, nodes, proc.pid)
                    cpu, sim = _cpu_s(proc.pid) - cpu0, _own_cpu_s() - sim0
                finally:
                    stop.set()
                    watcher.join(30)
                state = d.status(job)["state"]
                assert state == "READY", f"job is {state}, not READY"
            return {
                "system": "tfcoord",
                "nodes": nodes,
                "ok": True,
                "all_ready_s": round(took, 4),
                "coordinator_rss_mb": round(rss, 1),
                "rss_per_node_kb": round((rss - rss_idle) * 1024 / nodes, 2),
                "driver_updates": len(seen),
                # Of all_ready_s, how much the coordinator computed (the rest it waited for
                # the simulated nodes, which share the machine's cores with it).
                "coordinator_cpu_s": round(cpu, 2),
                # What simulating the nodes (and the driver's watch) cost this process.
                "simulator_cpu_s": round(sim, 2),
            }
        except Exception as e:
            return {
                "system": "tfcoord",
                "nodes": nodes,
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "all_ready_s": None,
                "coordinator_rss_mb": None,
            }
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _absolute_goal(row: dict) -> str:
    """Issue 28's 10,000-node goal beside what this run measured (median and p95 of its runs)."""
    if not row.get("ok") or "all_ready_s_p95" not in row:
        return "goal also: median < 1 s, p95 < 1.5 s (needs --repeats > 1)"
    med, p95 = row["all_ready_s_median"], row["all_ready_s_p95"]
    met = "met" if med < 1.0 and p95 < 1.5 else "not met"
    return f"goal also: median < 1 s, p95 < 1.5 s: median {med:.2f} s, p95 {p95:.2f} s ({met})"


def _rank(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile: the smallest value at or above a ``q`` share of runs."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def summarise(nodes: int, runs: list[dict]) -> dict:
    """One row for ``runs`` of one cluster size: the distribution of all_ready_s and the
    medians of the per-node costs. A failed run fails the row (and is counted)."""
    ok = [r for r in runs if r["ok"]]
    row: dict = {
        "system": "tfcoord",
        "nodes": nodes,
        "ok": len(ok) == len(runs),
        "runs": len(runs),
        "failed_runs": len(runs) - len(ok),
    }
    if not ok:
        return {**row, "error": runs[0].get("error"), "all_ready_s_median": None}
    took = sorted(r["all_ready_s"] for r in ok)
    cpu = sorted(r["coordinator_cpu_s"] for r in ok)
    return {
        **row,
        "all_ready_s_median": round(statistics.median(took), 4),
        "all_ready_s_p95": round(_rank(took, 0.95), 4),
        "all_ready_s_max": round(took[-1], 4),
        "all_ready_s_min": round(took[0], 4),
        "rss_per_node_kb": round(statistics.median(r["rss_per_node_kb"] for r in ok), 2),
        "rss_per_node_kb_max": max(r["rss_per_node_kb"] for r in ok),
        "coordinator_rss_mb": round(statistics.median(r["coordinator_rss_mb"] for r in ok), 1),
        # What the coordinator itself computed per node (median over runs), and in all.
        "coordinator_cpu_us_per_node": round(statistics.median(cpu) / nodes * 1e6, 1),
        "coordinator_cpu_s_median": round(statistics.median(cpu), 3),
        "simulator_cpu_s_median": round(statistics.median(r["simulator_cpu_s"] for r in ok), 3),
        "all_ready_s": [r["all_ready_s"] for r in runs if r["ok"]],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="10,100,1000", help="comma list of cluster sizes")
    ap.add_argument(
        "--against", choices=("tfos",), help="also run TensorFlowOnSpark 2.2.5's reservation server"
    )
    ap.add_argument("--repeats", type=int, default=1, help="tfcoord runs per size (a fresh coordinator each)")
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    sizes = [int(x) for x in args.nodes.split(",") if x]
    rows = []
    for n in sizes:
        runs = [run_tfcoord(n) for _ in range(args.repeats)]
        ours = runs[0] if args.repeats == 1 else summarise(n, runs)
        floors = sorted(run_floor(n)["floor_s"] for _ in range(args.repeats))
        mine = ours["all_ready_s"] if args.repeats == 1 else ours["all_ready_s_median"]
        ours.update(
            floor_s=statistics.median(floors),
            floor_runs_s=floors,
            ratio_to_floor=round(mine / statistics.median(floors), 3) if ours["ok"] else None,
            loadavg=load_average(),
        )
        rows.append(ours)
        print(json.dumps(ours), flush=True)
        theirs = None
        if args.against == "tfos":
            from anchor_tfos import run_tfos

            theirs = run_tfos(n)
            rows.append(theirs)
            print(json.dumps(theirs), flush=True)
            if ours["ok"] and theirs.get("ok"):
                ratio = theirs["all_ready_s"] / mine
                print(
                    json.dumps(
                        {
                            "nodes": n,
                            "tfos_all_ready_s": theirs["all_ready_s"],
                            "tfcoord_all_ready_s": mine,
                            "speedup_vs_tfos": round(ratio, 1),
                        }
                    ),
                    flush=True,
                )
        row = figure(
            f"rendezvous, {n:,} nodes: all hold the spec",
            unit="s",
            tfcoord=mine if ours["ok"] else None,
            floor=ours["floor_s"],
            anchor=theirs["all_ready_s"] if theirs and theirs.get("ok") else None,
            anchor_name="TensorFlowOnSpark 2.2.5 reservation server",
            anchor_error=str(theirs.get("error") or "failed") if theirs and not theirs.get("ok") else "",
            # Issue 28's goals: within 2x the floor at 1,000 and 10,000 nodes (none at fewer,
            # where the fixed costs of one connection's set-up dominate a few milliseconds).
            goal=2.0 if n >= 1000 else None,
            shape=f"{n:,} simulated nodes on one epoll, tfcoord serve in its own process"
            + (f", median of {args.repeats}" if args.repeats > 1 else ""),
            loadavg=ours["loadavg"],
            note=_absolute_goal(ours) if n >= 10_000 else "",
        )
        if n >= 10_000 and row["goal_met"]:  # met only if the absolute goal is met as well
            row["goal_met"] = row["note"].endswith("(met)")
        print(json.dumps(row), flush=True)
    if not args.json:
        print(f"\n{'system':<28}{'nodes':>7}{'all_ready_s':>13}{'rss_mb':>9}", file=sys.stderr)
        for r in rows:
            t = f"{r.get('all_ready_s_median', r['all_ready_s']):.3f}" if r.get("ok") else "FAIL"
            rss = f"{r['coordinator_rss_mb']:.0f}" if r.get("ok") else "-"
            floor = f"  floor {r['floor_s']:.3f} s, {r['ratio_to_floor']}x" if r.get("floor_s") else ""
            print(
                f"{r['system']:<28}{r['nodes']:>7}{t:>13}{rss:>9}{floor}  {r.get('error', '')}",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
