"""The TLS files nodes use toward a coordinator that serves TLS, passed to them by path.

A driver that reaches its coordinator over TLS (``TFCOORD_TLS_CA``, and for mutual TLS
``TFCOORD_TLS_CERT``/``TFCOORD_TLS_KEY``) hands the same *paths* to its nodes in the
job's node spec; each node reads the files once, when it starts, into one
``ssl.SSLContext`` for all its connections. Paths, not contents: a private key does not
travel inside Spark task closures, and the files must be readable where the nodes run
(the same host here; a shared filesystem, or ``spark-submit --files`` with executor-local
paths, on a real cluster).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from tfcoord.client import tls

CA_ENV, CERT_ENV, KEY_ENV = "TFCOORD_TLS_CA", "TFCOORD_TLS_CERT", "TFCOORD_TLS_KEY"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA that signed the coordinator's certificate, and the client's own
    certificate and key for mutual TLS. Absolute paths (nodes run in other directories)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    #: A pinned CA certificate itself (PEM text, public): an embedded coordinator's
    #: ephemeral CA, which exists in no file and travels with the job.
    ca_pem: str | None = None

    @classmethod
    def of(cls, ca: str | None = None, cert: str | None = None, key: str | None = None) -> TlsFiles:
        """Paths made absolute, so they mean the same file from a node's working directory."""
        return cls(*(os.path.abspath(p) if p else None for p in (ca, cert, key)))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TlsFiles | None:
        """``TFCOORD_TLS_CA``/``_CERT``/``_KEY``; None when none is set (plaintext)."""
        ca, cert, key = (env.get(k) or None for k in (CA_ENV, CERT_ENV, KEY_ENV))
        return None if ca is None and cert is None and key is None else cls.of(ca, cert, key)

    def context(self) -> ssl.SSLContext:
        """A client context from the files.

        Raises:
            TlsError: a file is missing, unreadable or not PEM, or only one of cert and key is set.
        """
        return tls.client_context(self.ca, self.cert, self.key, ca_pem=self.ca_pem)
