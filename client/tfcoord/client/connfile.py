"""Connection files: how another shell of the same user finds an embedded coordinator.

An embedded coordinator (inside a Spark driver) has a random secret, an admin credential
and, by default, a certificate of its own; an operator in another shell knows none of them.
So it writes one small JSON file — its local address, admin credential, CA and pid — into
a per-user runtime directory that only that user can read (the directory 0700, the file
0600), and removes it when it stops. ``tfcoord stop JOB`` (and TensorFlowOnSpark's
``reservation.Client((host, port)).request_stop()``, which ``utils/stop_streaming.py``
uses) read it, so they need no ``--address``, secret or CA flags. Anyone who can read the
file could equally read the driver's memory, so it gives away nothing the user did not
already hold.

The directory is ``$TFCOORD_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/tfcoord``, else
``/tmp/tfcoord-UID``; a directory that another user owns, or that others may read, is
refused rather than used. A file whose process is gone (a driver killed outright) is stale:
readers skip it and remove it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

#: Overrides where connection files live (tests; a site with its own runtime directory).
RUNTIME_DIR_ENV = "TFCOORD_RUNTIME_DIR"
#: Connection files are named PREFIX + port + ".json".
PREFIX = "coordinator-"
#: A connection file is a few KB (a PEM certificate); anything far larger is not ours.
MAX_FILE_BYTES = 64 * 1024
VERSION = 1


class ConnectionFileError(OSError):
    """The runtime directory or a connection file is unsafe or unreadable; the message says which."""


@dataclass(frozen=True)
class Connection:
    """What a connection file holds."""

    #: Where this machine reaches the coordinator (loopback when it listens on every interface).
    address: str
    #: The address its nodes dial (the driver's host), as its logs show it.
    advertised: str
    port: int
    admin_secret: bytes
    #: The PEM of the coordinator's own CA, when it serves TLS with an ephemeral certificate.
    ca_pem: str | None
    pid: int
    path: Path | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": VERSION,
                "address": self.address,
                "advertised": self.advertised,
                "port": self.port,
                "admin_secret": self.admin_secret.decode(),
                "ca_pem": self.ca_pem,
                "pid": self.pid,
            }
        )

    @classmethod
    def from_json(cls, text: str, path: Path | None = None) -> Connection:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("version") != VERSION:
            raise ValueError("not a tfcoord connection file of this version")
        return cls(
            address=str(d["address"]),
            advertised=str(d["advertised"]),
            port=int(d["port"]),
            admin_secret=str(d["admin_secret"]).encode(),
            ca_pem=str(d["ca_pem"]) if d.get("ca_pem") else None,
            pid=int(d["pid"]),
            path=path,
        )


def runtime_dir(env: Mapping[str, str]) -> Path:
    """The per-user directory connection files live in (not created here)."""
    if env.get(RUNTIME_DIR_ENV):
        return Path(env[RUNTIME_DIR_ENV])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "tfcoord"
    return Path(tempfile.gettempdir()) / f"tfcoord-{os.getuid()}"


def check_dir(path: Path) -> None:
    """Refuse a directory that is not ours alone: a link, another owner, or group/other access."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ConnectionFileError(f"cannot use runtime directory {path}: {e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConnectionFileError(f"runtime directory {path} is not a directory (a link?): remove it")
    if st.st_uid != os.getuid():
        raise ConnectionFileError(
            f"runtime directory {path} belongs to uid {st.st_uid}, not to you: set {RUNTIME_DIR_ENV} to a "
            "directory of your own"
        )
    if st.st_mode & 0o077:
        raise ConnectionFileError(
            f"runtime directory {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}): "
            f"chmod 700 {path}"
        )


def ensure_dir(path: Path) -> None:
    try:
        check_dir(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile: check what it is
            pass
        check_dir(path)


def write(directory: Path, conn: Connection) -> Path:
    """Write ``conn`` as ``directory/coordinator-PORT.json``, mode 0600, atomically; returns its path.

    Raises:
        ConnectionFileError: the directory is not this user's alone, or cannot be written.
    """
    ensure_dir(directory)
    path = directory / f"{PREFIX}{conn.port}.json"
    tmp = directory / f".{PREFIX}{conn.port}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(conn.to_json())
        os.replace(tmp, path)  # a reader never sees a half-written file
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConnectionFileError(f"cannot write connection file {path}: {e}") from None
    return path


def remove(path: Path, pid: int | None = None) -> None:
    """Remove a connection file, if it is still the one ``pid`` wrote (another coordinator
    may have taken the same port since)."""
    with contextlib.suppress(OSError, ValueError):
        if pid is None or Connection.from_json(path.read_text()).pid == pid:
            path.unlink()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the pid: not our coordinator
        return False
    return True


def find(directory: Path) -> Iterator[Connection]:
    """The live coordinators' connection files in ``directory``, by port; stale files are removed.

    Raises:
        ConnectionFileError: the directory exists but is not this user's alone.
    """
    try:
        check_dir(directory)
    except FileNotFoundError:
        return
    found = []
    for path in sorted(directory.glob(f"{PREFIX}*.json")):
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
                continue
            conn = Connection.from_json(path.read_text(), path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive(conn.pid):
            remove(path, conn.pid)
            continue
        found.append(conn)
    yield from sorted(found, key=lambda c: c.port)
