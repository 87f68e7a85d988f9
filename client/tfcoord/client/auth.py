"""Shared-secret authentication: HMAC-SHA256 proofs and per-job node tokens.

The secret never crosses the wire. The server sends a random nonce; the client
answers with ``HMAC(key, context || nonce)`` where the key is the coordinator
secret (drivers, admins) or the job's token (nodes). A job token is
``HMAC(secret, "tfcoord job token" || job)``: a node holding it can prove itself
only for that one job, and the coordinator can recompute it without storing it.
The context binds the proof to the role and job claimed, so a proof cannot be
reused for another role or job, and a fresh nonce per connection stops replays.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

NONCE_BYTES = 32
#: Secrets shorter than this are refused: 16 bytes is 128 bits of key.
MIN_SECRET_BYTES = 16


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def new_secret() -> bytes:
    """A fresh random coordinator secret (as printable hex, so it can live in a text file)."""
    return secrets.token_hex(32).encode()


def job_token(secret: bytes, job: str) -> bytes:
    """The key a node of ``job`` authenticates with."""
    return hmac.new(secret, b"tfcoord job token\0" + job.encode(), hashlib.sha256).digest()


def client_proof(key: bytes, nonce: bytes, role: str, job: str | None) -> bytes:
    context = b"tfcoord hello\0" + role.encode() + b"\0" + (job or "").encode() + b"\0"
    return hmac.new(key, context + nonce, hashlib.sha256).digest()


def server_proof(key: bytes, cnonce: bytes) -> bytes:
    return hmac.new(key, b"tfcoord welcome\0" + cnonce, hashlib.sha256).digest()


def verify(expected: bytes, given: bytes) -> bool:
    return hmac.compare_digest(expected, given)


def read_secret(path: str | os.PathLike[str], *, check_mode: bool = True) -> bytes:
    """Read a secret file: its content with surrounding whitespace stripped.

    Raises:
        ValueError: the file is readable by group or others, or the secret is too short.
    """
    if check_mode and os.name == "posix":
        mode = os.stat(path).st_mode
        if mode & 0o077:
            raise ValueError(
                f"secret file {path} is readable by other users (mode {mode & 0o777:o}); "
                f"run: chmod 600 {path}"
            )
    with open(path, "rb") as f:
        secret = f.read().strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"secret in {path} is {len(secret)} bytes; use at least {MIN_SECRET_BYTES} "
            f"(e.g. python -c 'import secrets; print(secrets.token_hex(32))' > {path})"
        )
    return secret


def write_secret(path: str | os.PathLike[str], secret: bytes | None = None) -> bytes:
    """Create a secret file readable by its owner only; returns the secret."""
    secret = secret or new_secret()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret + b"\n")
    os.chmod(path, 0o600)
    return secret
