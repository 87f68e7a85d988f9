"""TLS contexts from PEM files, with the standard library only.

The coordinator serves TLS when given a certificate and key (``--tls-cert``,
``--tls-key``), and asks every client for a certificate signed by a CA of its own
choosing when given one (``--tls-ca``: mutual TLS). Clients verify the coordinator
against a CA file and, for mutual TLS, present their own certificate and key.

TLS protects the bytes on the wire; it does not replace the HMAC handshake, which still
decides who is a driver and which job a node belongs to. Both contexts require TLS 1.2
or newer. Every failure is a :class:`TlsError` that names the file and says what to
change, and :func:`explain` turns the errors a handshake can end in (one side not
speaking TLS, an untrusted certificate, a missing client certificate) into the same.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from .errors import TlsError

PathLike = str | os.PathLike[str]

#: TLS 1.0 and 1.1 are broken and retired (RFC 8996).
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal: a service would hang there.
    raise TlsError(
        "the TLS key file is encrypted; tfcoord needs an unencrypted key (protect it with "
        "chmod 600 instead), e.g. openssl pkey -in KEY -out KEY.plain"
    )


def _readable(path: PathLike, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise TlsError(f"{what} {p} does not exist or is not a file")
    if not os.access(p, os.R_OK):
        raise TlsError(f"{what} {p} is not readable by this user")
    return p


def check_key_file(path: PathLike) -> Path:
    """A private key file, refused if group or others may read it (like the secret file).

    Raises:
        TlsError: missing, unreadable or readable by others (the message says how to fix it).
    """
    p = _readable(path, "TLS key file")
    if os.name == "posix":
        mode = p.stat().st_mode
        if mode & 0o077:
            raise TlsError(
                f"TLS key file {p} is readable by other users (mode {mode & 0o777:o}); run: chmod 600 {p}"
            )
    return p


def _load_chain(ctx: ssl.SSLContext, cert_file: PathLike, key_file: PathLike) -> None:
    cert = _readable(cert_file, "TLS certificate file")
    key = check_key_file(key_file)
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(
                f"the TLS key {key} does not belong to the certificate {cert}; "
                "pass the key the certificate was issued for"
            ) from None
        raise TlsError(
            f"cannot load the TLS certificate {cert} with key {key} ({e.reason or e}); "
            "both must be PEM files: the certificate (chain) and its private key"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca_file: PathLike) -> None:
    ca = _readable(ca_file, "TLS CA file")
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as e:
        raise TlsError(f"TLS CA file {ca} holds no PEM certificate ({e.reason or e})") from None


def server_context(
    cert_file: PathLike, key_file: PathLike, ca_file: PathLike | None = None
) -> ssl.SSLContext:
    """The coordinator's context: its certificate and key; with ``ca_file``, mutual TLS.

    With ``ca_file`` every client must present a certificate signed by that CA, or the
    handshake fails before a byte of the protocol is read.

    Raises:
        TlsError: a file is missing, unreadable, not PEM, or the key does not match.
    """
    # PROTOCOL_TLS_SERVER trusts no CA until told: with ``ca_file`` that CA alone signs
    # client certificates (the system's store is never loaded here).
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MINIMUM_VERSION
    _load_chain(ctx, cert_file, key_file)
    if ca_file is not None:
        _load_ca(ctx, ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


#: A pinned CA certificate itself (PEM text), for nodes on hosts where no file of it
#: exists: an embedded coordinator's Mesos tasks get its ephemeral CA this way.
CA_PEM_ENV = "TFCOORD_TLS_CA_PEM"


def client_context(
    ca_file: PathLike | None = None,
    cert_file: PathLike | None = None,
    key_file: PathLike | None = None,
    *,
    ca_pem: str | None = None,
) -> ssl.SSLContext:
    """A client's context: trust ``ca_file`` (else the system's CAs), check the host name,
    and present ``cert_file``/``key_file`` when the coordinator asks (mutual TLS).

    A pinned CA (``ca_file``, ``ca_pem`` or both) is trusted *instead of* the system's
    store, not beside it: any public CA, or one a host's administrator added, could
    otherwise sign a certificate for the coordinator's address.

    Raises:
        TlsError: a file is missing, unreadable, not PEM, the key does not match, or only
            one of ``cert_file`` and ``key_file`` is given.
    """
    if (cert_file is None) != (key_file is None):
        raise TlsError(
            "a TLS client certificate needs its key and the key its certificate: "
            "give both (TFCOORD_TLS_CERT and TFCOORD_TLS_KEY) or neither"
        )
    # PROTOCOL_TLS_CLIENT verifies the certificate and the host name, and trusts nothing
    # until told what to trust (create_default_context would load the system's store first).
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = MINIMUM_VERSION
    if ca_file is None and ca_pem is None:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if ca_file is not None:
        _load_ca(ctx, ca_file)
    if ca_pem is not None:  # a pinned CA, e.g. an embedded coordinator's own (coordinator.ephemeral)
        try:
            ctx.load_verify_locations(cadata=ca_pem)
        except ssl.SSLError as e:
            raise TlsError(f"the pinned coordinator CA is not a PEM certificate ({e.reason or e})") from None
    if cert_file is not None and key_file is not None:
        _load_chain(ctx, cert_file, key_file)
    return ctx


def unverified_client_context() -> ssl.SSLContext:
    """TLS that checks neither the certificate nor the host name: encrypted, not authenticated.

    Only for a node told so by tfmesos2's ``TFMESOS2_VERIFY_SSL=false`` and given no CA to
    check against; the job token's HMAC handshake still authenticates both sides' knowledge
    of the token, but a man in the middle could read the traffic.
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = MINIMUM_VERSION
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


#: OpenSSL reasons that mean the peer does not speak TLS at all: it sent plaintext
#: (our protocol's challenge) where a TLS record belongs.
_NOT_TLS = frozenset(
    {
        "WRONG_VERSION_NUMBER",
        "RECORD_LAYER_FAILURE",
        "PACKET_LENGTH_TOO_LONG",
        "UNKNOWN_PROTOCOL",
        "HTTP_REQUEST",
        "RECORD_TOO_LARGE",
    }
)
#: Alerts a mutual-TLS coordinator sends when our certificate is not trusted (TLS 1.2
#: also says HANDSHAKE_FAILURE when a certificate is missing; TLS 1.3 says CERTIFICATE_REQUIRED).
_BAD_CLIENT_CERT = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_ACCESS_DENIED",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    }
)


def explain(error: ssl.SSLError, address: str) -> TlsError | None:
    """A clear :class:`TlsError` for a handshake that failed for a TLS reason, else None.

    None means the failure may be transient (the connection dropped mid-handshake, a
    coordinator restarting), and the caller should treat it like any lost connection.
    """
    reason = getattr(error, "reason", None) or ""
    if isinstance(error, ssl.SSLCertVerificationError):
        return TlsError(
            f"the coordinator at {address} presented a certificate this client does not trust "
            f"({error.verify_message}); set TFCOORD_TLS_CA to the CA file that signed the "
            "coordinator's --tls-cert, and dial a host name or IP the certificate names"
        )
    if reason in _NOT_TLS:
        return TlsError(
            f"the coordinator at {address} does not speak TLS (TLS? it answered in plaintext): "
            "start it with --tls-cert/--tls-key, or unset TFCOORD_TLS_CA to connect without TLS"
        )
    if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return TlsError(
            f"the coordinator at {address} requires a client certificate (mutual TLS, --tls-ca) and "
            "this client sent none; set TFCOORD_TLS_CERT and TFCOORD_TLS_KEY to a certificate "
            "signed by the coordinator's CA"
        )
    if reason in _BAD_CLIENT_CERT:
        return TlsError(
            f"the coordinator at {address} refused this client's TLS certificate ({reason.lower()}); "
            "it must be signed by the CA the coordinator was given with --tls-ca, and be current"
        )
    return None
