"""Errors raised by tfcoord clients and the protocol layer.

Few and typed, each saying which side failed (h11's LocalProtocolError vs
RemoteProtocolError, dask's CommClosedError). Errors cross the wire as a code
and a message (:class:`RequestRejected`), never as pickled exceptions. A job that ended
other than it should is :class:`~tfcoord.client.replies.JobFailed` or ``JobStopped``,
beside the status they carry.
"""

from __future__ import annotations


class TfcoordError(Exception):
    """Base class of every error tfcoord raises on purpose."""


class ProtocolError(TfcoordError):
    """A frame or message broke the wire protocol."""


class LocalProtocolError(ProtocolError):
    """We were about to send something the protocol forbids (a bug on our side)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids: bad frame, wrong type, unknown op."""


class ConnectionClosed(TfcoordError, OSError):
    """The connection ended before the exchange finished.

    Also an ``OSError`` so code that handles socket failures handles this too.
    """


class Unreachable(ConnectionClosed):
    """No connection to the coordinator could be made at all: refused, no such host, no
    route, or no answer before the connect deadline. Nothing was sent."""


class AuthenticationFailed(TfcoordError):
    """The handshake was refused: wrong secret, wrong job token, version mismatch."""


class TlsError(TfcoordError):
    """TLS could not be set up: an unusable certificate or key file, or the two sides
    disagree (one speaks TLS and the other does not, a certificate is not trusted, a
    client certificate is missing). A configuration problem: clients do not retry it.
    """


class RequestRejected(TfcoordError):
    """The coordinator refused a request; ``code`` is stable, ``message`` is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ClusterRestarted(RequestRejected):
    """A request of a cluster generation the job has already left: the job restarted its
    cluster (a peer was lost) between this node's requests, and the coordinator refused the
    request as ``stale_generation``. The node client has asked where the job is now, as its
    stop watch would have told it: ``restart_to`` is the generation to rejoin (see
    ``NodeClient.rejoin``), or None when the job is ending and the node should only stop."""

    def __init__(self, code: str, message: str, restart_to: int | None) -> None:
        super().__init__(code, message)
        self.restart_to = restart_to


class DeadlineExceeded(TfcoordError, TimeoutError):
    """A wait passed its deadline; the message says what was being waited for."""
