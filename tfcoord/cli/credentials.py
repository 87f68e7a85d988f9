"""Key files: the coordinator secret, the admin secret and the HTTP tokens, created (mode
600) where ``serve`` may create them, refused with one line naming the file and the fix."""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

from tfcoord.client import auth
from tfcoord.client.entry import SECRET_FILE_ENV, UsageError

log = logging.getLogger("tfcoord")

#: The admin credential (sees and stops every job); by default beside the secret file.
ADMIN_SECRET_FILE_ENV = "TFCOORD_ADMIN_SECRET_FILE"
ADMIN_SUFFIX = ".admin"


def secret_from(path: str | None, *, create: bool = False) -> bytes:
    if not path:
        raise UsageError(f"no coordinator secret: pass --secret-file or set {SECRET_FILE_ENV}")
    return credential(Path(path), "coordinator secret", create=create)


def _http_token_from(path: str) -> bytes:
    """The HTTP bearer token: a separate credential that only reads."""
    return credential(Path(path), "HTTP bearer token", create=True)


def separate_http_token(token_file: str, secret_file: str | None, secret: bytes) -> bytes:
    """The HTTP token, refused when it is the coordinator secret under another name.

    The token only reads, and it travels where the secret never may: in the dashboard's
    ``?token=`` URL, so in browser history and sometimes in proxy logs. Whoever holds the
    secret can submit and stop jobs and mint every job token.
    """
    why = (
        "the HTTP token travels in browser URLs (the dashboard's ?token=), while the secret lets its "
        "holder run and stop jobs; give --http-token-file a file of its own (created if missing)"
    )
    token_path, secret_path = Path(token_file), Path(secret_file or "")
    if token_path.resolve() == secret_path.resolve() or (
        token_path.exists() and secret_path.exists() and token_path.samefile(secret_path)
    ):
        raise UsageError(f"--http-token-file {token_file} is the coordinator secret file: {why}")
    token = _http_token_from(token_file)
    if hmac.compare_digest(token, secret):
        raise UsageError(f"--http-token-file {token_file} holds the coordinator secret: {why}")
    return token


def credential(p: Path, what: str, *, create: bool) -> bytes:
    """A key file: created (mode 600) when missing and ``create``; refused if others can read it.

    Every way the file can be wrong is a :class:`UsageError` naming the file and the fix.
    """
    if p.is_symlink() and not p.exists():
        # Never created through the link: the secret would land wherever it points.
        fix = f"remove the link (a new {what} is then made in its place), or " if create else ""
        raise UsageError(
            f"{what} file {p} is a symbolic link to {os.readlink(p)}, which does not exist: "
            f"{fix}create the file it points to (mode 600)"
        )
    if not p.exists():
        if not create:
            raise UsageError(
                f"{what} file {p} does not exist: give the file the coordinator was started with "
                "(tfcoord serve --secret-file wrote it, mode 600), copied here if it runs elsewhere"
            )
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            auth.write_secret(p)
        except OSError as e:
            raise UsageError(
                f"cannot create the {what} file {p}: {e.strerror or e}; give a path in a "
                "directory of yours, or create the file (mode 600) yourself"
            ) from None
        log.info("created a new %s in %s (mode 600)", what, p)
    try:
        return auth.read_secret(p)
    except IsADirectoryError:
        raise UsageError(f"{what} file {p} is a directory; give the path of a file") from None
    except OSError as e:
        raise UsageError(f"{what} file {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"{what}: {e}") from None
