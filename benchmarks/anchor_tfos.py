"""Anchor benchmark: TensorFlowOnSpark 2.2.5's own reservation server.

tfcoord replaces TensorFlowOnSpark's (TFoS) reservation server, so its
rendezvous figures only mean something next to the same figures for the
server it replaces. This module measures that server, using the real
``tensorflowonspark.reservation.Server`` and ``Client`` classes unchanged:

* the server runs in its own child process, as TFoS runs it inside the Spark
  driver, so its resident memory can be read from ``/proc/<pid>/status`` and a
  crash of the server (select() cannot watch a file descriptor >= FD_SETSIZE,
  1024, so it fails at about 1,000 nodes) cannot take the benchmark down;
* ``nodes`` simulated nodes all start at once and each does what
  ``TFSparkNode.run`` does: open a ``Client``, query the current reservations,
  register a node meta dict, and block in ``Client.await_reservations()``
  (which polls the server with one-second sleeps: that polling is part of
  what is measured) until the full list of reservations comes back.

Reported: ``all_ready_s``, the time from releasing all the nodes to the last
one holding the full list, and ``coordinator_rss_mb``, the server process's
VmRSS once every node is ready. The standalone server process holds only the
interpreter, the reservation module and the registered metas, so its RSS is a
lower bound on what TFoS really costs (there it lives inside the Spark
driver). For the same reason it starts with ~11 open file descriptors, not
the driver's many, so select() fails a little above 1,000 nodes here.

From a few hundred nodes on, the result is dominated by the connect burst:
Server listens with a backlog of 10, so most connections arrive through
SYN cookies and an overflowing accept queue. Some then take seconds of TCP
retransmits to get in, some are reset ("Connection reset by peer" in
get_reservations) and some are never accepted (the run times out). Those
are TFoS's failures, not the harness's, and are reported as such; expect
the figures and the failures at 500+ nodes to vary from run to run.

Run alone::

    python benchmarks/anchor_tfos.py --nodes 10,100 --nodes 500
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from typing import IO, Any

SYSTEM = "tensorflowonspark-2.2.5"

# Node threads per client process. Real TFoS nodes are separate executor
# processes, each with one blocking Client; on a 2-core machine we cannot run
# 1,000 processes, so every node is a thread (all blocking calls release the
# GIL, and the nodes spend nearly all their time in sleep() or recv(), so
# 1,000 threads in one process are no strain). Only past this many nodes are
# the threads spread over more processes. Keeping the clients to one process
# (so at most one core) up to 1,000 nodes matters on 2 cores: with two busy
# client processes the single-threaded server, the thing being measured, is
# starved of CPU during the connect burst and its listen(10) accept queue
# overflows far more often (at 500 nodes, 3 of 3 runs failed that way with
# two client processes; 1 of 5 with one), which says more about this machine
# than about TFoS.
NODES_PER_PROCESS = 1024

# Spark executors per simulated host, only used to make plausible host IPs.
EXECUTORS_PER_HOST = 8

# Children are plain subprocesses running this file, not multiprocessing
# "spawn" children: spawn re-imports the caller's __main__ (rendezvous.py, and
# with it tfcoord) into every child, which would inflate the server's RSS and
# make TFoS look heavier than it is. Each child reports JSON lines on stdout
# and takes commands on stdin; stdin closing means the parent is gone.

_emit_lock = threading.Lock()
_event_out: IO[str] | None = None


def _child_setup() -> None:
    """Child side: keep stdout for events only.

    TFoS itself print()s (Client._request on a socket error); its lines must
    not interleave with, and corrupt, the event lines, so they go to stderr.
    """
    global _event_out
    _event_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr


def _emit(**event: Any) -> None:
    """Child side: send one JSON event line to the parent (thread-safe)."""
    assert _event_out is not None, "_child_setup() first"
    with _emit_lock:
        _event_out.write(json.dumps(event) + "\n")
        _event_out.flush()


def _exit_when_parent_goes() -> None:
    """Child side: exit as soon as stdin closes, so no child outlives the parent."""

    def watch() -> None:
        while sys.stdin.readline():
            pass
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _quiet_tfos_logging() -> None:
    """Silence TFoS's INFO logging (it logs once per connection and request).

    tensorflowonspark/__init__.py calls logging.basicConfig(level=INFO); at
    1,000 nodes that is thousands of stderr lines. TFoS formats its log
    strings before the level check, so its work per request is unchanged.
    """
    logging.getLogger("tensorflowonspark").setLevel(logging.WARNING)


def _node_meta(executor_id: int) -> dict[str, Any]:
    """Build the meta dict that TFSparkNode.run registers for one executor.

    Same keys and value types as TFoS 2.2.5 for the usual TF2 layout
    (num_ps=0, master_node="chief", InputMode.TENSORFLOW, no TensorBoard):
    executor 0 is the chief, the rest are workers; ``addr`` is the
    executor's TFManager address (a "remote" manager, so a (host, port)
    tuple) and ``authkey`` a random uuid4, as TFoS makes them.
    """
    host_no = executor_id // EXECUTORS_PER_HOST
    host = f"10.0.{host_no // 250}.{host_no % 250 + 1}"
    job_name, task_index = ("chief", 0) if executor_id == 0 else ("worker", executor_id - 1)
    return {
        "executor_id": executor_id,
        "host": host,
        "job_name": job_name,
        "task_index": task_index,
        "port": 30000 + executor_id % 20000,
        "tb_pid": 0,
        "tb_port": 0,
        "addr": (host, 40000 + executor_id % 20000),
        "authkey": uuid.uuid4().bytes,
    }


def _server_main(nodes: int, timeout_s: float) -> None:
    """Child process: run a reservation.Server the way TFCluster.run does.

    Emits {"event": "addr"} once listening, {"event": "error"} if the server
    fails, and serves until the parent writes a line to stdin or goes away.
    """
    _quiet_tfos_logging()
    # The server binds '' but hands out the address below; by default TFoS
    # looks up the host's outbound IP, loopback keeps the run self-contained.
    os.environ.setdefault("TFOS_SERVER_HOST", "127.0.0.1")
    from tensorflowonspark import reservation

    if reservation.__name__.startswith("tfcoord."):  # the anchor must be TensorFlowOnSpark's own server
        _emit(
            event="error",
            text="tensorflowonspark here is tfcoord's alias, not TensorFlowOnSpark 2.2.5: run the anchor with .venv-bench/bin/python (make .venv-bench/.installed) or pass --tfos-path",
        )
        os._exit(3)

    def listener_died(args: threading.ExceptHookArgs) -> None:
        # Server.start()'s listener thread has no error handling of its own:
        # when select() fails (an fd >= FD_SETSIZE at ~1,000 clients) the
        # thread dies and TFoS waits out reservation_timeout (600 s). Report
        # it at once, so the run records the crash rather than a timeout.
        name = args.exc_type.__name__ if args.exc_type else "Exception"
        where = args.thread.name if args.thread else "?"
        _emit(event="error", text=f"server thread {where} died: {name}: {args.exc_value}")
        os._exit(3)

    threading.excepthook = listener_died
    server = reservation.Server(nodes)
    host, port = server.start()
    _emit(event="addr", host=host, port=port)

    def driver_wait() -> None:
        # The Spark driver blocks here in TFCluster.run (polling every 1 s);
        # sc is only touched when status holds an error, which it never does.
        server.await_reservations(None, {}, timeout=math.ceil(timeout_s))

    threading.Thread(target=driver_wait, name="await_reservations", daemon=True).start()
    sys.stdin.readline()  # a "stop" line, or EOF when the parent is gone
    server.stop()


def _clients_main(executor_ids: list[int], host: str, port: int, nodes: int, timeout_s: float) -> None:
    """Child process: one blocking TFoS Client per thread, released together.

    Emits "ready" when every thread waits at the start line, then on the
    parent's "go" line releases them; emits "error" as soon as any node fails,
    and "done" with the monotonic time the last of its nodes got the list.
    """
    _quiet_tfos_logging()
    from tensorflowonspark import reservation

    start_line = threading.Event()
    ready_at: list[float] = []
    ready_lock = threading.Lock()

    def node(executor_id: int) -> None:
        meta = _node_meta(executor_id)
        start_line.wait()
        step = "connect"  # which call failed says where TFoS broke: keep it in the error
        try:
            # Same calls, in the same order, as TFSparkNode.run's reservation step.
            client = reservation.Client((host, port))
            step = "get_reservations"
            client.get_reservations()
            step = "register"
            client.register(meta)
            step = "await_reservations"
            cluster_info = client.await_reservations()
            client.close()
            if len(cluster_info) != nodes:
                raise RuntimeError(f"got {len(cluster_info)} reservations, expected {nodes}")
            # CLOCK_MONOTONIC is system-wide on Linux, so this compares with
            # the parent's start time, taken in another process.
            done = time.monotonic()
            with ready_lock:
                ready_at.append(done)
        except Exception as exc:
            _emit(event="error", text=f"node {executor_id}, {step}: {type(exc).__name__}: {exc}")

    # Small stacks: a node thread needs little of the default 8 MiB.
    threading.stack_size(512 * 1024)
    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in executor_ids]
    for t in threads:
        t.start()
    _emit(event="ready")
    if sys.stdin.readline().strip() != "go":
        return  # the parent gave up before the start
    start_line.set()
    _exit_when_parent_goes()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if len(ready_at) == len(executor_ids):
        _emit(event="done", last=max(ready_at))
    # Otherwise an error was already emitted, or the parent times out.


def _rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (MiB: VmRSS kB / 1024)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


class _Failed(Exception):
    """A run failed; the message becomes the result's "error"."""


# (child name, event) pairs; event None means the child's stdout closed.
_EventQueue = queue.Queue[tuple[str, dict[str, Any] | None]]


class _Child:
    """Parent side of one child process: its events go to a shared queue."""

    def __init__(self, name: str, args: list[str], events: _EventQueue) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        # A reader thread per child, so one queue can wait on all of them.
        threading.Thread(target=self._pump, args=(self.proc.stdout, events), daemon=True).start()

    def _pump(self, out: IO[str] | None, events: _EventQueue) -> None:
        assert out is not None
        for line in out:
            try:
                events.put((self.name, json.loads(line)))
            except ValueError:
                continue  # not one of our event lines
        events.put((self.name, None))  # EOF: the child has exited

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


def run_tfos(nodes: int, timeout_s: float = 120.0) -> dict[str, Any]:
    """Rendezvous ``nodes`` simulated TFoS nodes on a real reservation.Server.

    Never raises and never runs much past ``timeout_s`` (the deadline covers
    starting the processes too); every child process is killed on the way out.
    """
    failed: dict[str, Any] = {
        "system": SYSTEM,
        "nodes": nodes,
        "ok": False,
        "error": "",
        "all_ready_s": None,
        "coordinator_rss_mb": None,
    }
    if nodes < 1:
        return {**failed, "error": "nodes must be >= 1"}

    deadline = time.monotonic() + timeout_s
    events: _EventQueue = queue.Queue()
    children: list[_Child] = []

    def next_event(what: str) -> tuple[str, dict[str, Any]]:
        """Next event from any child; fails on a deadline, an error or a child's exit."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Failed(f"timed out after {timeout_s:g} s waiting for {what}")
        try:
            name, event = events.get(timeout=left)
        except queue.Empty:
            raise _Failed(f"timed out after {timeout_s:g} s waiting for {what}") from None
        if event is None:
            child = next(c for c in children if c.name == name)
            try:
                code = child.proc.wait(2)
            except subprocess.TimeoutExpired:
                code = None
            raise _Failed(f"{name} process exited (code {code}) while waiting for {what}")
        if event.get("event") == "error":
            raise _Failed(str(event.get("text")))
        return name, event

    common = ["--nodes", str(nodes), "--timeout", str(timeout_s)]
    try:
        server = _Child("server", ["--role", "server", *common], events)
        children.append(server)
        _, event = next_event("the server address")
        host, port = str(event["host"]), int(event["port"])

        n_procs = math.ceil(nodes / NODES_PER_PROCESS)
        for w in range(n_procs):
            # Round-robin executor ids, so every process carries the same load.
            role = ["--role", "clients", "--ids", f"{w}:{nodes}:{n_procs}", "--addr", f"{host}:{port}"]
            children.append(_Child(f"clients-{w}", [*role, *common], events))

        ready = 0
        while ready < n_procs:
            ready += next_event("client processes to start")[1].get("event") == "ready"

        t0 = time.monotonic()
        for child in children[1:]:
            child.send("go")
        last = t0
        done = 0
        while done < n_procs:
            _, event = next_event(f"all {nodes} nodes to hold the full reservation list")
            if event.get("event") == "done":
                done += 1
                last = max(last, float(event["last"]))
        all_ready_s = last - t0

        if server.proc.poll() is not None:
            raise _Failed(f"server process exited (code {server.proc.returncode}) before its RSS was read")
        rss = _rss_mb(server.proc.pid)
        return {
            "system": SYSTEM,
            "nodes": nodes,
            "all_ready_s": round(all_ready_s, 3),
            "coordinator_rss_mb": round(rss, 1),
            "ok": True,
        }
    except _Failed as exc:
        return {**failed, "error": str(exc)}
    except Exception as exc:  # the benchmark itself broke: still report, never raise
        return {**failed, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        for child in children:
            child.kill()


def _parse_nodes(values: list[str]) -> list[int]:
    """Flatten repeated ``--nodes`` options, each possibly a comma list."""
    return [int(v) for value in values for v in value.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--nodes", action="append", required=True, help="node count; repeatable or comma list"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run (default 120)")
    # Internal: how run_tfos starts its child processes.
    parser.add_argument("--role", choices=("server", "clients"), help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)  # start:stop:step executor ids
    parser.add_argument("--addr", help=argparse.SUPPRESS)  # server host:port
    args = parser.parse_args(argv)

    if args.role:
        _child_setup()
    if args.role == "server":
        _server_main(int(args.nodes[0]), args.timeout)
        return 0
    if args.role == "clients":
        start, stop, step = (int(x) for x in args.ids.split(":"))
        host, port = args.addr.rsplit(":", 1)
        _clients_main(list(range(start, stop, step)), host, int(port), int(args.nodes[0]), args.timeout)
        return 0

    for n in _parse_nodes(args.nodes):
        print(json.dumps(run_tfos(n, args.timeout)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
