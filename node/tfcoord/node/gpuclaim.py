"""Host-local GPU claims that the kernel releases when their holder dies.

nvidia-smi only shows a GPU as busy once a process has created a CUDA context on it,
seconds after a node picked it (TensorFlow imports first). Two nodes starting together
on one host would both see GPU 0 free and both take it. So a node that picks GPUs by
discovery also *claims* each one: an exclusive, non-blocking ``flock`` on a lock file
named after the GPU's UUID in a directory every node on the host shares. A GPU whose
file is locked is skipped.

``flock`` locks belong to the open file, not to a path or a pid: the lock lasts while
any process holds the descriptor, and the kernel drops it when the last one closes,
however that process ended (SIGKILL included). There is never a stale lock to clean
up. A forked child (the node's ``map_fun``) inherits the descriptor, so the GPU stays
claimed as long as anything that may be driving it lives; exec'd programs do not
(descriptors are close-on-exec).

Each lock file holds one line saying who holds it, for the error that lists what holds
each GPU; it is written after the lock is taken and read without a lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from collections.abc import Iterable, Mapping

#: Where claims live unless TFCOORD_GPU_LOCK_DIR says otherwise. A fixed path under
#: /tmp rather than tempfile.gettempdir(): executors of one host may run with different
#: TMPDIRs, and a claim only works if every node on the host looks in the same place.
#: Per user, because a directory another user created is not ours to write in.
DEFAULT_LOCK_DIR = "/tmp/tfcoord-gpus-{uid}"
LOCK_DIR_ENV = "TFCOORD_GPU_LOCK_DIR"
#: What a lock file may say about its holder; more is cut.
MAX_HOLDER_LEN = 500

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class ClaimError(OSError):
    """The lock directory cannot be used (not creatable, not writable)."""


def lock_dir(env: Mapping[str, str] | None = None) -> str:
    """The claims directory: ``TFCOORD_GPU_LOCK_DIR``, else ``/tmp/tfcoord-gpus-<uid>``."""
    found = (os.environ if env is None else env).get(LOCK_DIR_ENV)
    return found or DEFAULT_LOCK_DIR.format(uid=os.getuid())


def _path(directory: str, uuid: str) -> str:
    return os.path.join(directory, _UNSAFE.sub("_", uuid) + ".lock")


class GpuClaim:
    """The GPUs this process holds; :meth:`release` (or exiting) frees them."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fds: dict[str, int] = {}

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(self._fds)

    def try_claim(self, uuid: str, holder: str) -> bool:
        """Claim ``uuid`` unless some live process holds it; True when it is ours now.

        Raises:
            ClaimError: the directory or the lock file cannot be created or opened.
        """
        if uuid in self._fds:
            return True
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            fd = os.open(_path(self.directory, uuid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise ClaimError(
                e.errno,
                f"cannot claim GPU {uuid} in {self.directory}: {e.strerror}; set "
                f"{LOCK_DIR_ENV} to a directory every node on this host can write",
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise ClaimError(e.errno, f"cannot lock {_path(self.directory, uuid)}: {e.strerror}") from e
        line = f"pid {os.getpid()} {holder}".strip()[:MAX_HOLDER_LEN].encode("utf-8", "replace") + b"\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, line, 0)
        self._fds[uuid] = fd
        return True

    def release(self, uuids: Iterable[str] | None = None) -> None:
        """Free ``uuids`` (default: all). Safe to call twice."""
        for uuid in list(self._fds if uuids is None else uuids):
            fd = self._fds.pop(uuid, None)
            if fd is not None:
                os.close(fd)  # the lock goes with the last descriptor (a forked child may keep one)


def holder(directory: str, uuid: str) -> str:
    """What the lock file of ``uuid`` says about its holder ("?" when it says nothing)."""
    try:
        with open(_path(directory, uuid), encoding="utf-8", errors="replace") as f:
            return f.readline().strip() or "?"
    except OSError:
        return "?"
