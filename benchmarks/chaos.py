"""Chaos: ``tfcoord serve`` killed with SIGKILL at random points of 1,000-node rendezvous.

    python benchmarks/chaos.py [--nodes 1000] [--kills 20] [--seed N] [--json]

One coordinator (``tfcoord serve --state-dir``) lives through ``--kills`` rounds. Each
round submits a fresh job of ``--nodes`` workers and starts that many simulated nodes
(the wire work of ``NodeClient``, as in ``rendezvous.py``: handshake, register, a
pending ``await_stop``, ``await_cluster``, then a ``succeeded`` report). When the
simulator has seen a random number of registrations acknowledged (1 .. nodes-1), it
kills the coordinator with SIGKILL from inside the very callback that counted the
acknowledgement, so the kill lands while other registrations are in flight.

Then, before any node may reconnect, the coordinator is restarted on the same port and
state directory and a driver checks what survived:

- every registration the simulator saw acknowledged is in the job, with its host,
  port and attempt (an acknowledgement is a promise the journal keeps);
- every earlier round's job still has its outcome (SUCCEEDED, each of its nodes too).

Then the nodes reconnect (re-registering with the same attempt, as ``NodeClient``
does), and the round passes only if the rendezvous completes: every node gets its
cluster spec, all the same bytes, naming every node at its own address, and the job
SUCCEEDS. Exits 1 if any check failed. Prints one JSON line per round and a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rendezvous import CONNECTS_IN_FLIGHT, _address, _raise_fd_limit, serve_command  # noqa: E402

from tfcoord.client import DriverClient, JobSpec, auth, make_roles  # noqa: E402
from tfcoord.client import messages as m  # noqa: E402
from tfcoord.client.protocol import NEED_DATA, Connection, decode_spec  # noqa: E402
from tfcoord.client.vocab import NodeState  # noqa: E402

#: Generous bounds: a round that takes this long has failed anyway.
ROUND_TIMEOUT_S = 300.0
START_TIMEOUT_S = 60.0
#: Register, the stop wait and the cluster wait share a connection; the report follows.
REGISTER_ID, CLUSTER_ID, STOP_ID, REPORT_ID = 1, 2, 3, 4


class _Round:
    """What one round's simulator knows: acknowledgements, specs, when to kill."""

    def __init__(self, job: str, token: bytes, nodes: int, kill_at: int, kill) -> None:
        self.job, self.token, self.nodes, self.kill_at, self._kill = job, token, nodes, kill_at, kill
        self.acked: dict[int, tuple[str, int]] = {}  # executor -> the address acknowledged
        self.specs: dict[int, bytes] = {}
        self.killed = asyncio.Event()
        #: Set while the coordinator is up and nodes may (re)connect.
        self.up = asyncio.Event()
        self.up.set()
        self.reconnects = 0

    def on_ack(self, i: int) -> None:
        self.acked[i] = _address(i)
        if len(self.acked) == self.kill_at and not self.killed.is_set():
            self._kill()  # right here, in the callback: other replies are still in flight
            self.up.clear()
            self.killed.set()


class _Conn(asyncio.Protocol):
    """One connection of one simulated node; the node's coroutine reconnects on loss."""

    def __init__(self, rnd: _Round, i: int) -> None:
        self.rnd, self.i = rnd, i
        self.conn = Connection()
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.welcomed: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()

    def _fail(self, e: BaseException) -> None:
        for fut in (self.welcomed, self.done):
            if not fut.done():
                fut.set_exception(e)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        try:
            while (msg := self.conn.next_event()) is not NEED_DATA:
                self._on(msg)  # type: ignore[arg-type]
        except Exception as e:
            self._fail(e)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionResetError(f"node {self.i}: connection lost: {exc}"))

    def _send(self, *msgs: m.Message) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(self.conn.send(x) for x in msgs))

    def _on(self, msg: m.Message) -> None:
        rnd, i, job = self.rnd, self.i, self.rnd.job
        if isinstance(msg, m.Challenge):
            proof = auth.client_proof(rnd.token, msg.nonce, "node", job)
            self._send(
                m.Hello(
                    version=m.PROTOCOL_VERSION, role="node", job=job, proof=proof, cnonce=auth.new_nonce()
                )
            )
        elif isinstance(msg, m.Welcome):
            if not self.welcomed.done():
                self.welcomed.set_result(None)
            host, port = _address(i)
            # Every connection registers again with the same attempt and address: after
            # a restart that is the same node coming back, answered as before.
            self._send(
                m.Register(id=REGISTER_ID, job=job, executor_id=i, attempt=0, host=host, port=port),
                m.AwaitStop(id=STOP_ID, job=job, executor_id=i, attempt=0, timeout_s=3600.0),
                m.AwaitCluster(id=CLUSTER_ID, job=job, executor_id=i, attempt=0, timeout_s=ROUND_TIMEOUT_S),
            )
        elif isinstance(msg, m.Error):
            raise RuntimeError(f"node {i}: {msg.code}: {msg.message}")
        elif isinstance(msg, m.ClusterReply):
            rnd.specs[i] = msg.spec
            self._send(m.Report(id=REPORT_ID, job=job, executor_id=i, attempt=0, state=NodeState.SUCCEEDED))
        elif isinstance(msg, m.Reply):
            if msg.id == REGISTER_ID:
                rnd.on_ack(i)
            elif msg.id == REPORT_ID and not self.done.done():
                self.done.set_result(None)


async def _node(host: str, port: int, rnd: _Round, i: int, gate: asyncio.Queue[None]) -> None:
    """Node ``i``: connect, register, get the spec, report; over again after each kill."""
    loop = asyncio.get_running_loop()
    while True:
        await rnd.up.wait()
        await gate.get()
        try:
            transport, conn = await loop.create_connection(lambda: _Conn(rnd, i), host, port)
            await conn.welcomed
        except (ConnectionError, OSError):
            rnd.reconnects += 1
            continue
        finally:
            gate.put_nowait(None)
        try:
            await conn.done
            transport.close()
            return
        except ConnectionError:
            rnd.reconnects += 1  # the coordinator was killed under this node: come back


class _Coordinator:
    """``tfcoord serve`` on one port and state directory, restartable."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.secret_file, self.state = tmp / "secret", tmp / "state"
        self.secret = auth.write_secret(self.secret_file)
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> float:
        """Start it (on the first run's port after that); returns seconds until it listened."""
        port_file = self.tmp / f"port-{self.starts}"
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            serve_command(self.port, port_file, self.secret_file, "--state-dir", str(self.state)),
        )
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():  # written atomically once listening
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tfcoord serve did not start (exit {self.proc.poll()})")
            time.sleep(0.01)
        self.port = int(port_file.read_text())
        return time.perf_counter() - t0

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)

    def reap(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def _survived(status: dict, acked: dict[int, tuple[str, int]]) -> list[str]:
    """What of the acknowledged registrations the restarted coordinator lost."""
    nodes = {x["executor_id"]: x for x in status["nodes"]}
    lost = []
    for i, (host, port) in sorted(acked.items()):
        x = nodes.get(i)
        if x is None or (x["host"], x["port"], x["attempt"]) != (host, port, 0):
            lost.append(f"executor {i}: acknowledged at {host}:{port}, after restart {x}")
    return lost


def _outcomes_kept(d: DriverClient, done_jobs: list[str]) -> list[str]:
    bad = []
    for job in done_jobs:
        st = d.status(job)
        states = {x["state"] for x in st["nodes"]}
        if st["state"] != "SUCCEEDED" or states != {"SUCCEEDED"}:
            bad.append(f"job {job}: {st['state']}, nodes {sorted(states)}")
    return bad


async def _round(coord: _Coordinator, owner: bytes, nodes: int, kill_at: int, done_jobs: list[str]) -> dict:
    address = f"127.0.0.1:{coord.port}"

    def submit() -> tuple[str, bytes]:
        with DriverClient(address, coord.secret, owner_key=owner) as d:
            job = d.submit(JobSpec(roles=make_roles(nodes), reservation_timeout_s=ROUND_TIMEOUT_S))
            return job, d.job_token(job)

    job, token = await asyncio.to_thread(submit)
    rnd = _Round(job, token, nodes, kill_at, coord.kill)
    gate: asyncio.Queue[None] = asyncio.Queue()
    for _ in range(CONNECTS_IN_FLIGHT):
        gate.put_nowait(None)
    t0 = time.perf_counter()
    tasks = asyncio.gather(*(_node("127.0.0.1", coord.port, rnd, i, gate) for i in range(nodes)))
    await asyncio.wait_for(rnd.killed.wait(), ROUND_TIMEOUT_S)
    killed_after = time.perf_counter() - t0
    specs_at_kill = len(rnd.specs)
    code = await asyncio.to_thread(coord.reap)
    restart_s = await asyncio.to_thread(coord.start)
    # Every acknowledgement the dead coordinator got out, counted after the restart: by
    # then the loop has read what was left in the sockets, and no node reconnects before
    # ``up`` is set.
    acked_at_kill = dict(rnd.acked)

    def check() -> tuple[dict, list[str], list[str]]:
        with DriverClient(address, coord.secret, owner_key=owner) as d:
            st = d.status(job)
            return st, _survived(st, acked_at_kill), _outcomes_kept(d, done_jobs)

    st, lost, outcomes_lost = await asyncio.to_thread(check)
    t1 = time.perf_counter()
    rnd.up.set()  # only now may the nodes come back
    await asyncio.wait_for(tasks, ROUND_TIMEOUT_S)
    after_restart_s = time.perf_counter() - t1

    def final() -> dict:
        with DriverClient(address, coord.secret, owner_key=owner) as d:
            return d.await_job(job, ROUND_TIMEOUT_S)

    end = await asyncio.to_thread(final)
    problems = [*lost, *outcomes_lost]
    if code != -signal.SIGKILL:
        problems.append(f"the coordinator exited {code}, not by SIGKILL")
    if len(rnd.specs) != nodes or len(set(rnd.specs.values())) != 1:
        problems.append(f"{len(rnd.specs)} nodes hold a spec, {len(set(rnd.specs.values()))} distinct")
    else:
        spec = decode_spec(next(iter(rnd.specs.values())))
        if spec != {"worker": [f"{h}:{p}" for h, p in map(_address, range(nodes))]}:
            problems.append("the cluster spec does not name every node at its address")
    if end["state"] != "SUCCEEDED":
        problems.append(f"job {job} ended {end['state']}: {end.get('error')}")
    done_jobs.append(job)
    return {
        "job": job,
        "nodes": nodes,
        "kill_at_acks": kill_at,
        "acked_at_kill": len(acked_at_kill),
        "specs_out_at_kill": specs_at_kill,
        "state_after_restart": st["state"],
        "registered_after_restart": st["registered"],
        "acked_lost": len(lost),
        "earlier_outcomes_checked": len(done_jobs) - 1,
        "earlier_outcomes_lost": len(outcomes_lost),
        "killed_after_s": round(killed_after, 3),
        "restart_s": round(restart_s, 3),
        "rendezvous_after_restart_s": round(after_restart_s, 3),
        "reconnects": rnd.reconnects,
        "final_state": end["state"],
        "ok": not problems,
        "problems": problems[:5],
    }


def run(nodes: int, kills: int, seed: int, emit) -> dict:
    """``kills`` rounds against one coordinator; returns the summary."""
    _raise_fd_limit()
    rng = random.Random(seed)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        coord = _Coordinator(Path(tmp))
        coord.start()
        owner = auth.new_owner_key()
        done_jobs: list[str] = []
        try:
            for _ in range(kills):
                gc.disable()  # as in rendezvous.py: one heap for every node is the simulator's artefact
                try:
                    row = asyncio.run(_round(coord, owner, nodes, rng.randint(1, nodes - 1), done_jobs))
                except Exception as e:
                    row = {"ok": False, "problems": [f"{type(e).__name__}: {e}"]}
                finally:
                    gc.enable()
                rows.append(row)
                emit(row)
                if not row["ok"]:
                    break
            # The last word: after every kill, every job's outcome is still there.
            with DriverClient(f"127.0.0.1:{coord.port}", coord.secret, owner_key=owner) as d:
                final_lost = _outcomes_kept(d, done_jobs)
        finally:
            coord.stop()
    ok_rows = [r for r in rows if r["ok"]]
    return {
        "summary": True,
        "nodes": nodes,
        "kills": len(rows),
        "rounds_ok": len(ok_rows),
        "acknowledged_registrations_checked": sum(r.get("acked_at_kill", 0) for r in rows),
        "acknowledged_registrations_lost": sum(r.get("acked_lost", 0) for r in rows),
        "job_outcomes_checked": sum(r.get("earlier_outcomes_checked", 0) for r in rows) + len(done_jobs),
        "job_outcomes_lost": sum(r.get("earlier_outcomes_lost", 0) for r in rows) + len(final_lost),
        "kills_before_ready": sum(1 for r in rows if r.get("state_after_restart") == "RESERVING"),
        "restart_s_median": round(statistics.median(r["restart_s"] for r in ok_rows), 3) if ok_rows else None,
        "rendezvous_after_restart_s_median": (
            round(statistics.median(r["rendezvous_after_restart_s"] for r in ok_rows), 3) if ok_rows else None
        ),
        "ok": len(ok_rows) == kills and not final_lost,
        "seed": seed,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="nodes per rendezvous (at least 2)")
    ap.add_argument("--kills", type=int, default=20, help="rounds, one SIGKILL each")
    ap.add_argument("--seed", type=int, default=None, help="for the kill points (default: random, printed)")
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    args = ap.parse_args()
    if args.nodes < 2 or args.kills < 1:
        ap.error("--nodes must be at least 2 and --kills at least 1")
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    summary = run(args.nodes, args.kills, seed, lambda row: print(json.dumps(row), flush=True))
    print(json.dumps(summary), flush=True)
    if not args.json:
        print(
            f"\n{summary['rounds_ok']}/{summary['kills']} kills survived at {args.nodes} nodes: "
            f"{summary['acknowledged_registrations_lost']} of {summary['acknowledged_registrations_checked']} "
            f"acknowledged registrations lost, {summary['job_outcomes_lost']} of "
            f"{summary['job_outcomes_checked']} job outcome checks failed (seed {seed})",
            file=sys.stderr,
        )
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
