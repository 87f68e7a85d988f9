"""What the worst frame a job's token holder can send costs the coordinator, and what it does
to another job's heartbeats (issue 26, N3).

    python benchmarks/worst_frames.py --json [--seconds 10] [--frame-mib 6]

1. **Per frame**: the coordinator's own framing (``Connection`` with the budget it gives its
   peers, and the same without one) decodes one frame of empty maps in lists, the densest
   expansion msgpack allows; the time, and the peak memory (tracemalloc, a run of its own).
2. **Under attack**: a ``tfcoord serve`` (plaintext, this checkout) and two jobs. An innocent
   node heartbeats every 20 ms and records each round trip, while another job's node sends
   worst frames as fast as the coordinator takes them (each closes its connection; it logs in
   again and sends the next). Printed: the innocent heartbeat p50/p99/max, with and without
   the attack, and the frames sent.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / p) for p in ("client", "node", "coordinator", "")]

from tfcoord.client import DriverClient, JobSpec, NodeClient, auth, make_roles  # noqa: E402
from tfcoord.client import messages as m  # noqa: E402
from tfcoord.client.protocol import Connection  # noqa: E402


def worst_frame(mib: float) -> bytes:
    """A frame of empty maps in lists of 16,000 (under any per-list limit), ``mib`` MiB long."""
    per_list = 16_000
    inner = b"\xdc" + per_list.to_bytes(2, "big") + b"\x80" * per_list
    lists = int(mib * 1024 * 1024) // len(inner)
    body = b"\xdc" + lists.to_bytes(2, "big") + inner * lists
    return len(body).to_bytes(4, "big") + body


def decode_cost(frame: bytes, budgeted: bool) -> dict[str, Any]:
    from tfcoord.coordinator import server

    budget = getattr(server, "FRAME_BUDGET", None) if budgeted else None
    kw = {"budget": budget} if budget is not None else {}

    def once() -> str:
        conn = Connection(len(frame), **kw)
        conn.receive_data(frame)
        try:
            conn.next_event()
            return "decoded"
        except Exception as e:  # the budget refuses it (or the message table does)
            return type(e).__name__

    t = time.perf_counter()
    outcome = once()
    seconds = time.perf_counter() - t
    tracemalloc.start()
    once()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "budget": budget is not None,
        "decode_s": round(seconds, 4),
        "peak_mib": round(peak / 2**20, 1),
        "outcome": outcome,
    }


def attacker(address: str, token: bytes, job: str, frame: bytes, stop_at: float, sent: Any) -> None:
    import socket

    host, _, port = address.rpartition(":")
    while time.time() < stop_at:
        try:
            sock = socket.create_connection((host, int(port)), timeout=5)
            conn = Connection()
            conn.receive_data(sock.recv(4096))
            challenge = conn.next_event()
            proof = auth.client_proof(token, challenge.nonce, "node", job, b"")  # type: ignore[union-attr]
            hello = m.Hello(
                version=m.PROTOCOL_VERSION,
                role="node",
                job=job,
                proof=proof,
                cnonce=auth.new_nonce(),
                owner=b"",
            )
            sock.sendall(conn.send(hello))
            sock.recv(4096)  # the welcome
            sock.sendall(frame)
            with sent.get_lock():
                sent.value += 1
            sock.settimeout(10)
            while sock.recv(65536):  # until the coordinator closes it
                pass
            sock.close()
        except OSError:
            time.sleep(0.01)


def heartbeats(node: NodeClient, seconds: float) -> list[float]:
    rtts = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        node.heartbeat()
        rtts.append(time.perf_counter() - t)
        time.sleep(0.02)
    return rtts


def summary(rtts: list[float]) -> dict[str, float]:
    q = statistics.quantiles(rtts, n=100)
    return {
        "p50_ms": round(q[49] * 1e3, 2),
        "p99_ms": round(q[98] * 1e3, 2),
        "max_ms": round(max(rtts) * 1e3, 2),
    }


def under_attack(frame: bytes, seconds: float) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import subprocess
    import tempfile

    from rendezvous import serve_command  # one way to start tfcoord serve for benchmarks

    with tempfile.TemporaryDirectory() as tmp:
        port_file, secret_file = Path(tmp, "port"), Path(tmp, "secret")
        cmd = serve_command(0, port_file, secret_file)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text().strip():
                assert time.monotonic() < deadline and proc.poll() is None, "tfcoord serve did not start"
                time.sleep(0.05)
            address = f"127.0.0.1:{int(port_file.read_text())}"
            secret = auth.read_secret(secret_file)
            with DriverClient(address, secret) as d:
                victim, bad = d.submit(JobSpec(roles=make_roles(1))), d.submit(JobSpec(roles=make_roles(1)))
                with NodeClient(address, d.job_token(victim), victim, 0) as node:
                    node.register("127.0.0.1", 7500)
                    quiet = heartbeats(node, seconds / 2)
                    sent = multiprocessing.Value("i", 0)
                    p = multiprocessing.Process(
                        target=attacker,
                        args=(address, d.job_token(bad), bad, frame, time.time() + seconds, sent),
                    )
                    p.start()
                    attacked = heartbeats(node, seconds)
                    p.join(30)
            return {"quiet": summary(quiet), "attacked": summary(attacked), "frames_sent": sent.value}
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--frame-mib", type=float, default=6.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    frame = worst_frame(args.frame_mib)
    out: dict[str, Any] = {"frame_bytes": len(frame)}
    out["per_frame"] = [decode_cost(frame, True), decode_cost(frame, False)]
    out["heartbeats"] = under_attack(frame, args.seconds)
    print(json.dumps(out) if args.json else out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
