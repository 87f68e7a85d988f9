"""Shared-secret authentication: HMAC-SHA256 proofs, driver owners and per-job node tokens.

The secret never crosses the wire. The server sends a random nonce; the client
answers with ``HMAC(key, context || nonce)`` where the key is the coordinator
secret (drivers), the admin secret (admins) or the job's token (nodes). The context
binds the proof to the role, job and owner claimed, so a proof cannot be reused for
another, and a fresh nonce per connection stops replays.

Drivers share the coordinator secret, so the secret alone cannot tell one driver from
another. Each driver therefore also holds an *owner key* of its own (random, per
``DriverClient``), sent in its hello (inside TLS); the coordinator keeps only its digest,
:func:`owner_digest`, with every job the driver submits, and shows and stops a job only
for a connection with the same owner (or an admin). A job token is
``HMAC(secret, "tfcoord job token" || job || owner digest)``: a node holding it can prove
itself only for that one job; another driver, who knows the secret but not the owner
key, cannot make it; and the coordinator recomputes it without storing it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

NONCE_BYTES = 32
#: The environment variable that hands a node its job token (hex): the engines set it, the node
#: entry point reads it, and the node strips it from what its child sees.
TOKEN_ENV = "TFCOORD_TOKEN"
#: Secrets shorter than this are refused: 16 bytes is 128 bits of key.
MIN_SECRET_BYTES = 16


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def new_secret() -> bytes:
    """A fresh random coordinator secret (as printable hex, so it can live in a text file)."""
    return secrets.token_hex(32).encode()


#: Bytes of a driver's owner key.
OWNER_KEY_BYTES = 32


def new_owner_key() -> bytes:
    """A fresh owner key for one driver."""
    return secrets.token_bytes(OWNER_KEY_BYTES)


def owner_digest(owner_key: bytes) -> bytes:
    """What the coordinator keeps of a driver's owner key: enough to recognise it, not to
    present it."""
    return hashlib.sha256(b"tfcoord owner\0" + owner_key).digest()


def job_token(secret: bytes, job: str, owner: bytes = b"") -> bytes:
    """The key a node of ``job`` authenticates with; ``owner`` is the submitting driver's
    :func:`owner_digest`."""
    return hmac.new(secret, b"tfcoord job token\0" + job.encode() + b"\0" + owner, hashlib.sha256).digest()


def credential_key(secret: bytes) -> bytes:
    """The key of the node credentials a coordinator hands out at registration (each binds a
    node to its slot, attempt and generation): derived from the coordinator secret, so a
    restarted coordinator hands out the same ones, and no node can make another's."""
    return hmac.new(secret, b"tfcoord node credential", hashlib.sha256).digest()


def client_proof(key: bytes, nonce: bytes, role: str, job: str | None, owner_key: bytes = b"") -> bytes:
    context = b"tfcoord hello\0" + role.encode() + b"\0" + (job or "").encode() + b"\0" + owner_key + b"\0"
    # hmac.digest: OpenSSL's one-shot HMAC, the same bytes as hmac.new(...).digest() for less.
    return hmac.digest(key, context + nonce, "sha256")


def server_proof(key: bytes, cnonce: bytes) -> bytes:
    return hmac.digest(key, b"tfcoord welcome\0" + cnonce, "sha256")


def verify(expected: bytes, given: bytes) -> bool:
    return hmac.compare_digest(expected, given)


def read_secret(path: str | os.PathLike[str], *, check_mode: bool = True) -> bytes:
    """Read a secret file: its content with surrounding whitespace stripped.

    The checks look at the file actually opened (``fstat`` of the open descriptor), so a
    file swapped in between a check and the read is still checked.

    Raises:
        ValueError: the file is readable by group or others, belongs to another user, or
            the secret is too short.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if check_mode and os.name == "posix":
            st = os.fstat(fd)
            if st.st_mode & 0o077:
                raise ValueError(
                    f"secret file {path} is readable by other users (mode {st.st_mode & 0o777:o}); "
                    f"run: chmod 600 {path}"
                )
            # A file of another user's is theirs to change (root reads anyone's 0600 file):
            # whoever owns it decides this coordinator's secret.
            if st.st_uid != os.geteuid():
                raise ValueError(
                    f"secret file {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); "
                    f"use a secret file of your own, or run: chown {os.geteuid()} {path}"
                )
        secret = f.read().strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"secret in {path} is {len(secret)} bytes; use at least {MIN_SECRET_BYTES} "
            f"(e.g. python -c 'import secrets; print(secrets.token_hex(32))' > {path})"
        )
    return secret


def write_secret(path: str | os.PathLike[str], secret: bytes | None = None) -> bytes:
    """Create a new secret file readable by its owner only; returns the secret.

    The file must not exist yet, not even as a dangling symbolic link: following one
    would write the secret wherever the link points (another user's file, a world-readable
    directory).

    Raises:
        FileExistsError: something already has this name.
    """
    secret = secret or new_secret()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, 0o600)  # whatever the umask
        f.write(secret + b"\n")
    return secret
