"""The handshake, sans-io: written once for the coordinator protocol and the data feed.

Theory of operation (after dask's ``comm/core.py``): the accepting side speaks first with a
:class:`~.messages.Challenge` (its version and a fresh nonce); the connecting side answers
with a :class:`~.messages.Hello` (its version, role, job and an HMAC proof over the nonce,
see :mod:`.auth`, plus a nonce of its own); the accepting side checks version and proof
and answers :class:`~.messages.Welcome` with its own proof over that nonce, which the
connecting side checks in turn. Neither secret crosses the wire, and both sides know
the other holds the key before any request.

The coordinator protocol runs it with :data:`~.messages.PROTOCOL_VERSION` (roles node,
driver, admin); a node's feed port with its feed version (role feeder, keyed with the
job token). No sockets here: the blocking client, the asyncio server, the feeder and the
feed server move the messages.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from . import auth
from . import messages as m
from .errors import AuthenticationFailed, ConnectionClosed, ProtocolError, RemoteProtocolError, TfcoordError
from .vocab import FATAL_REFUSALS, ErrorCode


class HandshakeRefused(TfcoordError):
    """The accepting side refuses a hello: send ``Error(code, message)`` and close.

    Attributes:
        code: the error code to send.
        bad_proof: the peer named a key it could not prove it holds (counted as an
            authentication failure), rather than sending something malformed.
    """

    def __init__(self, code: ErrorCode, message: str, *, bad_proof: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.bad_proof = bad_proof


@dataclass(frozen=True)
class KeyFor:
    """What the accepting side expects a peer of one role (and job) to prove: a key and its name."""

    key: bytes
    #: How refusals name the key: "the coordinator secret", "the job token of j".
    what: str
    #: Appended to a refusal: what the peer should check.
    hint: str = ""


class Accepting:
    """The accepting side of one handshake (the coordinator, a feed port).

    Args:
        version: the protocol version spoken (and demanded).
        roles: the roles a peer may claim here.
        key_for: ``(role, job) -> KeyFor``; raises HandshakeRefused for a role or job this
            side does not serve.
    """

    def __init__(
        self, version: int, roles: Collection[str], key_for: Callable[[str, str | None], KeyFor]
    ) -> None:
        self.version = version
        self.roles = roles
        self.key_for = key_for
        self.nonce = auth.new_nonce()

    def challenge(self) -> m.Challenge:
        return m.Challenge(version=self.version, nonce=self.nonce)

    def accept(self, hello: m.Message) -> m.Welcome:
        """Check the peer's first message; returns the Welcome to send.

        Raises:
            HandshakeRefused: not a hello, another version, a role not served here, or a
                proof that does not match.
        """
        if not isinstance(hello, m.Hello):
            raise HandshakeRefused(
                ErrorCode.PROTOCOL_ERROR, f"the first message must be hello, not {hello.op}"
            )
        if hello.version != self.version:
            raise HandshakeRefused(
                ErrorCode.VERSION_MISMATCH,
                f"client speaks protocol version {hello.version}, this "
                f"side {self.version}; install matching tfcoord versions",
            )
        if hello.role not in self.roles:
            raise HandshakeRefused(
                ErrorCode.AUTH_FAILED,
                f"role {hello.role!r} may not connect here (only {', '.join(self.roles)})",
            )
        expected = self.key_for(hello.role, hello.job)
        proof = auth.client_proof(expected.key, self.nonce, hello.role, hello.job, hello.owner)
        if not auth.verify(proof, hello.proof):
            raise HandshakeRefused(
                ErrorCode.AUTH_FAILED,
                f"authentication failed for this {hello.role} connection: the proof does not match "
                f"{expected.what}{expected.hint}",
                bad_proof=True,
            )
        return m.Welcome(proof=auth.server_proof(expected.key, hello.cnonce))


class Connecting:
    """The connecting side of one handshake (a client, a feeder).

    Args:
        key: the secret or job token this side proves it holds.
        role, job: who this side says it is.
        owner_key: a driver's owner key (see :mod:`.auth`), sent in the hello and covered by the proof.
        version: the protocol version spoken (and demanded).
        peer: how errors name the other side ("the coordinator at h:p").
    """

    def __init__(
        self, key: bytes, role: str, job: str | None, version: int, peer: str, *, owner_key: bytes = b""
    ) -> None:
        self.key = key
        self.owner_key = owner_key
        self.role = role
        self.job = job
        self.version = version
        self.peer = peer
        self.cnonce = auth.new_nonce()

    def hello(self, challenge: m.Message) -> m.Hello:
        """The answer to the accepting side's first message.

        Raises:
            ConnectionClosed: it refused the connection at once (a connection limit).
            RemoteProtocolError: it is not a challenge.
            ProtocolError: it speaks another version.
        """
        if isinstance(challenge, m.Error) and challenge.id is None:  # e.g. too_many_connections: back off
            raise ConnectionClosed(
                f"{self.peer} refused the connection: {challenge.code}: {challenge.message}"
            )
        if not isinstance(challenge, m.Challenge):
            raise RemoteProtocolError(f"expected a challenge from {self.peer}, got {challenge.op}")
        if challenge.version != self.version:
            raise ProtocolError(
                f"{self.peer} speaks protocol version {challenge.version}, this side {self.version}; "
                "install matching tfcoord versions"
            )
        proof = auth.client_proof(self.key, challenge.nonce, self.role, self.job, self.owner_key)
        return m.Hello(
            version=self.version,
            role=self.role,
            job=self.job,
            proof=proof,
            cnonce=self.cnonce,
            owner=self.owner_key,
        )

    def welcome(self, answer: m.Message) -> None:
        """Check the accepting side's answer to our hello.

        Raises:
            AuthenticationFailed: it refused our proof, or could not prove it holds the key.
            ConnectionClosed: it refused the connection for another reason.
            RemoteProtocolError: the answer is neither welcome nor error.
        """
        if isinstance(answer, m.Error):
            if answer.code in FATAL_REFUSALS:
                raise AuthenticationFailed(answer.message)
            raise ConnectionClosed(f"{self.peer} refused the connection: {answer.code}: {answer.message}")
        if not isinstance(answer, m.Welcome):
            raise RemoteProtocolError(f"expected welcome from {self.peer}, got {answer.op}")
        if not auth.verify(auth.server_proof(self.key, self.cnonce), answer.proof):
            raise AuthenticationFailed(
                f"{self.peer} could not prove it knows the key; it is not the peer you configured"
            )
