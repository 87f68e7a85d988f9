"""The rendezvous floor: what N nodes' connect, handshake, one request and one reply cost with no coordinator.

    python benchmarks/rendezvous_floor.py --nodes 1000 [--json]

A bare asyncio server (one ``asyncio.Protocol``, its own process, as ``tfcoord serve`` is)
and N clients on one epoll in this process (as ``rendezvous.py`` simulates its nodes)
exchange exactly the bytes of tfcoord's rendezvous, with the same authentication and
nothing else: per connection the server sends a frame of a challenge's size holding a
fresh nonce; the client answers with a frame of a hello's size holding HMAC-SHA256 of that
nonce under the job token and a nonce of its own; the server checks the proof and answers
a frame of a welcome's size holding its own HMAC over the client's nonce, which the client
checks; then the client sends one request of the size of its register, await_stop and
await_cluster frames together, and the server answers at once with one reply of the size
of the register answer and the cluster spec frame of an N-node job together (the same
bytes for every node, made once). Plaintext, as ``rendezvous.py`` runs ``tfcoord serve``.
No state is kept: the server neither counts nodes nor waits for the last one, so this is
what TCP, Python's asyncio and the HMACs cost by themselves on this machine.

The sizes come from tfcoord's own message classes for an N-node job whose nodes have
addresses like ``rendezvous.py``'s (:func:`sizes`).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import hashlib
import hmac
import itertools
import json
import os
import resource
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

HEADER = struct.Struct(">I")
#: As rendezvous.py: connects in flight from this one simulating host.
CONNECTS_IN_FLIGHT = 1024
RUN_TIMEOUT_S = 300.0


def sizes(n: int) -> dict[str, int]:
    """Bytes on the wire (frame headers included) of each step of an ``n``-node rendezvous."""
    from rendezvous import _address

    from tfcoord.client import messages as m
    from tfcoord.client.protocol import Connection, encode_spec

    conn = Connection()
    spec = encode_spec({"worker": [f"{h}:{p}" for h, p in map(_address, range(n))]})
    i, job = n - 1, "j" * 12
    host, port = _address(i)
    return {
        "challenge": len(conn.send(m.Challenge(version=m.PROTOCOL_VERSION, nonce=bytes(32)))),
        "hello": len(
            conn.send(
                m.Hello(version=m.PROTOCOL_VERSION, role="node", job=job, proof=bytes(32), cnonce=bytes(32))
            )
        ),
        "welcome": len(conn.send(m.Welcome(proof=bytes(32)))),
        "request": len(
            conn.send(m.Register(id=1, job=job, executor_id=i, attempt=0, host=host, port=port))
            + conn.send(m.AwaitStop(id=3, job=job, executor_id=i, attempt=0, timeout_s=3600.0))
            + conn.send(m.AwaitCluster(id=2, job=job, executor_id=i, attempt=0, timeout_s=RUN_TIMEOUT_S))
        ),
        "reply": len(
            conn.send(
                m.Reply(
                    id=1,
                    result={
                        "job": job,
                        "role": "worker",
                        "index": i,
                        "size": n,
                        "heartbeat_timeout_s": 10.0,
                        "state": "RESERVING",
                        "credential": "0" * 64,
                    },
                )
            )
            + conn.send(m.ClusterReply(id=2, role="worker", index=i, spec=spec))
        ),
    }


def _frame(size: int, payload: bytes = b"") -> bytes:
    """A frame of ``size`` bytes in all (header included) starting with ``payload``."""
    return HEADER.pack(size - HEADER.size) + payload + bytes(size - HEADER.size - len(payload))


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


# -- the server ------------------------------------------------------------------------------


class _Peer(asyncio.Protocol):
    """One connection: challenge, check the hello's proof, welcome, one reply to one request."""

    def __init__(self, token: bytes, size: dict[str, int], reply: bytes) -> None:
        self.token, self.size, self.reply = token, size, reply
        self.buf = bytearray()
        self.stage = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.nonce = os.urandom(32)
        transport.write(_frame(self.size["challenge"], self.nonce))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self.buf)
            if len(self.buf) < HEADER.size + length:
                return
            body = bytes(self.buf[HEADER.size : HEADER.size + length])
            del self.buf[: HEADER.size + length]
            if self.stage == 0:
                proof, cnonce = body[:32], body[32:64]
                if not hmac.compare_digest(proof, _mac(self.token, self.nonce)):
                    self.transport.close()
                    return
                self.transport.write(_frame(self.size["welcome"], _mac(self.token, cnonce)))
            elif self.stage == 1:
                self.transport.write(self.reply)
            self.stage += 1


def serve(port_file: Path, token: bytes, n: int) -> None:
    size = sizes(n)
    reply = _frame(size["reply"])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Peer(token, size, reply), "127.0.0.1", 0, backlog=4096)
        port = server.sockets[0].getsockname()[1]
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, port_file)
        await asyncio.Event().wait()  # until terminated

    asyncio.run(main())


# -- the clients -----------------------------------------------------------------------------


class _Client:
    __slots__ = ("buf", "cnonce", "sock", "stage")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf, self.stage, self.cnonce = sock, bytearray(), 0, os.urandom(32)


def _clients(port: int, token: bytes, n: int, size: dict[str, int]) -> float:
    """Every client at once on one epoll; the seconds until each has its reply."""
    ep = select.epoll()
    clients: dict[int, _Client] = {}
    done = 0

    def connect() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            raise ConnectionError(f"connect: {os.strerror(err)}")
        clients[sock.fileno()] = _Client(sock)
        ep.register(sock.fileno(), select.EPOLLIN)

    t0 = time.perf_counter()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    upcoming = iter(range(n))
    try:
        for _ in itertools.islice(upcoming, CONNECTS_IN_FLIGHT):
            connect()
        while done < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{done} of {n} clients have their reply after {RUN_TIMEOUT_S:g} s")
            for fd, _ in ep.poll(1.0, 4096):
                c = clients[fd]
                data = c.sock.recv(1 << 18)
                if not data:
                    raise ConnectionError("the floor server closed a connection")
                c.buf += data
                while len(c.buf) >= HEADER.size:
                    (length,) = HEADER.unpack_from(c.buf)
                    if len(c.buf) < HEADER.size + length:
                        break
                    body = bytes(c.buf[HEADER.size : HEADER.size + length])
                    del c.buf[: HEADER.size + length]
                    if c.stage == 0:  # the challenge: prove the token, send our nonce
                        c.sock.send(_frame(size["hello"], _mac(token, body[:32]) + c.cnonce))
                    elif c.stage == 1:  # the welcome: check the server's proof, then the request
                        if not hmac.compare_digest(body[:32], _mac(token, c.cnonce)):
                            raise RuntimeError("the floor server's proof does not match")
                        c.sock.send(_frame(size["request"]))
                        if next(upcoming, None) is not None:
                            connect()
                    else:  # the reply, whole
                        done += 1
                    c.stage += 1
        return time.perf_counter() - t0
    finally:
        ep.close()
        for c in clients.values():
            c.sock.close()


def run_floor(n: int) -> dict:
    """One floor run of ``n`` clients against a fresh floor server."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    token = os.urandom(32)
    with tempfile.TemporaryDirectory() as tmp:
        port_file, token_file = Path(tmp, "port"), Path(tmp, "token")
        token_file.write_bytes(token)
        proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve",
                str(port_file),
                "--token-file",
                str(token_file),
                "--nodes",
                str(n),
            ]
        )
        try:
            deadline = time.monotonic() + 60
            while not port_file.exists():  # written atomically once it listens
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the floor server did not start")
                time.sleep(0.02)
            port, size = int(port_file.read_text()), sizes(n)
            # One exchange first, as tfcoord's server has answered the driver's submit
            # before its timed run: the server's first connection pays one-off costs.
            _clients(port, token, 1, size)
            took = _clients(port, token, n, size)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {"system": "floor", "nodes": n, "floor_s": round(took, 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    ap.add_argument("--token-file", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print JSON only")
    args = ap.parse_args()
    if args.nodes < 1:
        ap.error("--nodes must be at least 1")
    if args.serve:
        serve(Path(args.serve), Path(args.token_file).read_bytes(), args.nodes)
        return 0
    row = run_floor(args.nodes)
    print(json.dumps(row) if args.json else f"floor: {args.nodes} nodes in {row['floor_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
