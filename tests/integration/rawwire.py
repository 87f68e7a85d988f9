"""Speak the wire protocol by hand over a blocking socket, for tests that misbehave on purpose.

The blocking client never sends a bad frame, a replayed hello or a trickled header, so
tests that need those build frames here, with the same sans-io ``Connection``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from tfcoord.client import auth
from tfcoord.client import messages as m
from tfcoord.client.protocol import CLOSED, Connection

#: Generous: every read here is answered in milliseconds by a coordinator on loopback.
READ_TIMEOUT_S = 10.0


class Raw:
    """One hand-driven connection: the challenge is read on construction."""

    def __init__(
        self, port: int, host: str = "127.0.0.1", source: str | None = None, recv_buffer: int | None = None
    ) -> None:
        if recv_buffer is None:
            self.sock = socket.create_connection(
                (host, port), timeout=READ_TIMEOUT_S, source_address=(source, 0) if source else None
            )
        else:
            # Before connecting: the window the peer may fill is agreed in the handshake.
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)
            self.sock.settimeout(READ_TIMEOUT_S)
            if source:
                self.sock.bind((source, 0))
            self.sock.connect((host, port))
        self.conn = Connection()
        challenge = self.next()
        assert isinstance(challenge, m.Challenge), challenge
        self.challenge = challenge

    def send(self, msg: m.Message) -> bytes:
        data = self.conn.send(msg)
        self.sock.sendall(data)
        return data

    def hello(self, key: bytes, role: str, job: str | None = None, owner_key: bytes | None = None) -> m.Hello:
        """The hello a correct client would send on this connection (not sent); a driver's
        carries ``owner_key``, a fresh one unless given."""
        owner = (owner_key or auth.new_owner_key()) if role == "driver" else b""
        proof = auth.client_proof(key, self.challenge.nonce, role, job, owner)
        return m.Hello(
            version=m.PROTOCOL_VERSION, role=role, job=job, proof=proof, cnonce=auth.new_nonce(), owner=owner
        )

    def login(self, key: bytes, role: str, job: str | None = None, owner_key: bytes | None = None) -> Raw:
        self.send(self.hello(key, role, job, owner_key))
        welcome = self.next()
        assert isinstance(welcome, m.Welcome), welcome
        return self

    def next(self) -> m.Message:
        """The next message; raises ConnectionError if the coordinator closes first."""
        while True:
            ev = self.conn.next_event()
            if isinstance(ev, m.Message):
                return ev
            if ev is CLOSED:
                raise ConnectionError("the coordinator closed the connection")
            self.conn.receive_data(self.sock.recv(1 << 20))

    def until_closed(self) -> list[m.Message]:
        """Every message until the coordinator closes the connection."""
        out: list[m.Message] = []
        while True:
            try:
                out.append(self.next())
            except (ConnectionError, OSError):
                self.sock.close()
                return out

    def close(self) -> None:
        self.sock.close()


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Block until ``condition()`` holds, checking every few milliseconds; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        time.sleep(0.005)
