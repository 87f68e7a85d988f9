"""TLS for the data feed: each fed node's own certificate, pinned by the feeding tasks.

A job whose coordinator traffic is TLS (the embedded coordinator's ephemeral CA, or a
``tfcoord serve`` with ``--tls-cert``) feeds over TLS too; only an explicitly plaintext job
(``run(..., plaintext=True)``, ``serve --plaintext``) feeds in the clear.

Theory of operation. When a node that takes fed data binds its feed port it makes a key
pair and a certificate issued for its job (:func:`new_identity`; the key never leaves the
node's process), and registers the certificate's SHA-256 fingerprint with the coordinator in
its node metadata (:data:`FEED_TLS_META`, beside ``feed_address``). That registration
travels over the job's authenticated, TLS-protected coordinator connection, and only the
live holder of a slot can set its metadata, so the fingerprint is as trustworthy as the
coordinator itself. The driver reads the fingerprints with the feed addresses, and they
travel to the feeding tasks in the job's closure (``FeedPlan``), the path the coordinator's
own pinned CA takes. A feeding task completes a TLS handshake with the node and accepts it
only if its certificate is exactly the registered one (:func:`connect`): another job's node,
a node of this job at another address, or anyone on the path fails the pin, before a byte of
the feed protocol is sent. Inside the channel the feed's HMAC handshake still proves the
job token both ways.

Pinning by fingerprint rather than by a shared CA: a CA whose key signed every node's
certificate would have to travel to every executor, and any executor of the job could then
impersonate any other node's feed port; a fingerprint names one key held by one process.

Both ends are tfcoord, so the feed speaks TLS 1.3 only: no renegotiation, and with session
tickets off no post-handshake messages, so a node's reader thread and its consumer's writes
never touch the handshake state at the same time.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import socket
import ssl
import tempfile
from dataclasses import dataclass

#: The node metadata key a fed node registers its certificate's fingerprint under.
FEED_TLS_META = "feed_tls"
#: How the fingerprint is written: ``sha256:`` and the DER certificate's digest in hex.
_PREFIX = "sha256:"
#: The certificate lives as long as the node; a generous bound, with room for clock skew.
VALIDITY = datetime.timedelta(days=30)
BACKDATE = datetime.timedelta(hours=1)


class FeedTlsError(OSError):
    """The TLS handshake with a node's feed port failed, or the node's certificate is not
    the one it registered; the message names the node and says which."""


def fingerprint(der: bytes) -> str:
    """The pin of a DER certificate: ``sha256:<hex>``."""
    return _PREFIX + hashlib.sha256(der).hexdigest()


def valid_fingerprint(value: object) -> bool:
    return (
        isinstance(value, str)
        and value.startswith(_PREFIX)
        and len(value) == len(_PREFIX) + 64
        and all(c in "0123456789abcdef" for c in value[len(_PREFIX) :])
    )


@dataclass(frozen=True)
class FeedIdentity:
    """A fed node's TLS identity: the server context that presents its certificate, and the
    certificate's fingerprint (what it registers, and what feeders pin)."""

    context: ssl.SSLContext
    fingerprint: str


def new_identity(job: str) -> FeedIdentity:
    """A fresh key and a self-signed certificate issued for ``job``, as a server context.

    Raises:
        FeedTlsError: the ``cryptography`` package is missing (a dependency of tfcoord-node).
    """
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as e:  # pragma: no cover - a dependency of tfcoord-node
        raise FeedTlsError(
            f"this job's feed is TLS and the node needs the 'cryptography' package for its feed "
            f"certificate ({e}); pip install cryptography on the executors"
        ) from None
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    # The job id is what the certificate is for; printable ASCII, as job ids are.
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"tfcoord feed of job {job}"[:64])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    der = cert.public_bytes(serialization.Encoding.DER)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.num_tickets = 0
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # load_cert_chain reads files only: a private directory, gone as soon as it is read.
    with tempfile.TemporaryDirectory(prefix="tfcoord-feed-tls-") as d:
        paths = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        for path, data in zip(paths, (cert.public_bytes(serialization.Encoding.PEM), key_pem), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(*paths)
    return FeedIdentity(ctx, fingerprint(der))


def _client_context() -> ssl.SSLContext:
    # Trust is the pin, checked after the handshake (the certificate is self-signed and
    # names no host): no CA store, no host name.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


_CLIENT = _client_context()


def connect(sock: socket.socket, pin: str, node: str) -> ssl.SSLSocket:
    """TLS over the connected ``sock`` to ``node``'s feed port, accepted only if the node
    presents the certificate whose fingerprint is ``pin``.

    Raises:
        FeedTlsError: the handshake failed (the node speaks plaintext, or went away) or its
            certificate is not the pinned one. ``sock`` is closed.
    """
    try:
        tls = _CLIENT.wrap_socket(sock)
    except ssl.SSLError as e:
        sock.close()
        raise FeedTlsError(
            f"the TLS handshake with the feed port of {node} failed ({e.reason or e}): does it serve "
            "plaintext? A job's feed is TLS exactly when its coordinator traffic is"
        ) from None
    der = tls.getpeercert(binary_form=True) or b""
    if not hmac.compare_digest(fingerprint(der), pin):
        tls.close()
        raise FeedTlsError(
            f"the feed port of {node} presented a certificate other than the one the node registered "
            f"with the coordinator ({pin}): refused (another process at that address, or someone on "
            "the path)"
        )
    return tls


def accept(sock: socket.socket, identity: FeedIdentity) -> ssl.SSLSocket:
    """The node's side of :func:`connect`, on an accepted ``sock`` (its timeout bounds the
    handshake).

    Raises:
        ssl.SSLError, OSError: the peer does not speak TLS or went away (``sock`` is closed).
    """
    return identity.context.wrap_socket(sock, server_side=True)
