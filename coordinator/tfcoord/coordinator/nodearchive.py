"""The node archive: tfcoord's node runtime as one file a task fetches and runs. Pure.

A Mesos task must run the tfcoord node whatever its image holds -- tfmesos2's
``avhost/tensorflow-mesos``, a site's own TensorFlow image -- so the coordinator serves the
node runtime itself (see ``docs/src/mesos.md``, "Task images"), as tfmesos2 serves files
under ``/v0/download``: the TaskInfo's ``CommandInfo.uris`` names the archive on the
coordinator's HTTP port and the Mesos fetcher puts it in the task's sandbox before the
command starts.

The archive is a zipapp (PEP 441), not a tarball: Python imports from it in place, so it
needs no extraction step, no writable directory besides the sandbox and no tool in the image
but ``python3``, and a task runs exactly these bytes. It holds ``tfcoord.client`` and
``tfcoord.node`` (whose entry point, ``tfcoord.node.main``, is ``tfcoord node``: the
node needs nothing above its own layer) and msgpack's pure-Python
implementation (``_vendor/msgpack``: an image needs no compiler and no msgpack of its own;
the node's traffic is small control messages). Its ``__main__`` puts both on ``sys.path``
ahead of the image's own packages, so a task never mixes the image's tfcoord (if any) with
the coordinator's: coordinator and node always run one version of the protocol.

Integrity does not rest on the transport: the TaskInfo, which reaches the agent from the
master over the framework's authenticated connection, carries the archive's SHA-256, and
the task's command (:func:`bootstrap_argv`) checks the fetched file against it before
running anything from it. The archive is tfcoord's public code and holds no credential.

Every module travels as source and as bytecode compiled by the coordinator's Python
(``name.pyc`` beside ``name.py``, where zipimport looks first): zipimport never writes a
compiled module back into the archive, so without it every task start compiled the node's
every module from source (about 0.1 s of a cold start). The bytecode is hash-based and
unchecked (PEP 552): it carries no timestamp, and the archive's SHA-256 already ties it to
the source beside it. A task whose Python is another version finds a foreign magic number,
and zipimport falls back to the source.

Built once per process from the installed modules, byte for byte the same for the same
files (sorted entries, fixed timestamps), so its digest names its content.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import marshal
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tfcoord.client import __version__

#: The route on the coordinator's HTTP port; the archive's file name follows it.
ROUTE_PREFIX = "/v1/node-archive/"
#: Packages copied whole (their ``.py`` files) into the archive.
PACKAGES = ("tfcoord.client", "tfcoord.node")
#: msgpack's pure-Python modules (its C extension is left out: it is built for one Python).
MSGPACK_FILES = ("__init__.py", "exceptions.py", "ext.py", "fallback.py")
VENDOR = "_vendor"
#: zip's epoch: every entry gets it, so the same files make the same bytes.
_EPOCH = (1980, 1, 1, 0, 0, 0)

MAIN = f'''\
"""tfcoord {__version__} node runtime: ``python3 ARCHIVE NODE-ARGS...`` is ``tfcoord-node NODE-ARGS...``."""
import os
import sys

archive = os.path.dirname(os.path.abspath(__file__))
vendor = os.path.join(archive, "{VENDOR}")
# Ahead of the image's packages: this archive's tfcoord and msgpack, never a mix.
sys.path[:0] = [p for p in (archive, vendor) if p not in sys.path]
# An image with tfcoord installed may have imported its top package already, at Python's
# start (tfcoord's import-alias hook does): tfcoord.* would then come from the image.
for name in [n for n in sys.modules if n == "tfcoord" or n.startswith("tfcoord.")]:
    del sys.modules[name]
# What the node starts (a tf.distribute.Server for --server-mode) imports from here too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [archive, vendor] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
from tfcoord.node.main import main

sys.exit(main(sys.argv[1:], prog="tfcoord-node"))
'''

#: The task command's first step: check the fetched archive against the digest the TaskInfo
#: carries, then run it in this same interpreter (one Python start, no tool but python3).
BOOTSTRAP = (
    "import hashlib,runpy,sys\n"
    "path,digest=sys.argv[1],sys.argv[2]\n"
    "with open(path,'rb') as f: got=hashlib.sha256(f.read()).hexdigest()\n"
    "if got!=digest: sys.exit('tfcoord: the node archive %s has SHA-256 %s, not %s as its "
    "TaskInfo says: refusing to run it' % (path,got,digest))\n"
    "sys.argv=[path]+sys.argv[3:]\n"
    "runpy.run_path(path,run_name='__main__')\n"
)


@dataclass(frozen=True)
class NodeArchive:
    """The archive's bytes, the name it is served and fetched under, and its digest."""

    data: bytes
    sha256: str

    @property
    def name(self) -> str:
        # The digest in the name: a fetcher cache or a sandbox never confuses two builds.
        return f"tfcoord-node-{__version__}-{self.sha256[:12]}.pyz"

    @property
    def path(self) -> str:
        return ROUTE_PREFIX + self.name


def _package_dir(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"cannot build the node archive: package {name} is not installed")
    return [Path(p) for p in spec.submodule_search_locations]


def _entries() -> dict[str, bytes]:
    # zipimport finds no namespace package, so tfcoord is a regular one here (it is one
    # package anyway: the image's tfcoord, if any, is never mixed in).
    files: dict[str, bytes] = {"__main__.py": MAIN.encode(), "tfcoord/__init__.py": b""}
    for pkg in PACKAGES:
        prefix = pkg.replace(".", "/")
        for root in _package_dir(pkg):
            for f in sorted(root.glob("*.py")):
                files[f"{prefix}/{f.name}"] = f.read_bytes()
    msgpack_dir = _package_dir("msgpack")[0]
    for name in MSGPACK_FILES:
        files[f"{VENDOR}/msgpack/{name}"] = (msgpack_dir / name).read_bytes()
    return files


def compiled(arcname: str, source: bytes) -> bytes:
    """``source`` as an unchecked hash-based ``.pyc`` (PEP 552) for this interpreter.

    Its code objects are named for their place in the archive (``tfcoord/node/main.py``):
    where the archive will lie on a task is not known here, and tracebacks find the source
    lines through the archive's loader by that name anyway."""
    code = compile(source, arcname, "exec", dont_inherit=True)
    unchecked_hash_based = (0b01).to_bytes(4, "little")
    return (
        importlib.util.MAGIC_NUMBER
        + unchecked_hash_based
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def build() -> NodeArchive:
    """A fresh archive from the installed modules (see :func:`node_archive` for the cached one).

    Raises:
        RuntimeError: a module it needs is not installed as source.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        sources = _entries()
        entries = {**sources, **{name + "c": compiled(name, data) for name, data in sources.items()}}
        for arcname, data in sorted(entries.items()):
            info = zipfile.ZipInfo(arcname, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    data = buf.getvalue()
    return NodeArchive(data, hashlib.sha256(data).hexdigest())


_lock = threading.Lock()
_cached: NodeArchive | None = None


def node_archive() -> NodeArchive:
    """This process's archive, built on first use."""
    global _cached
    with _lock:
        if _cached is None:
            _cached = build()
        return _cached


def bootstrap_argv(python: str, archive_path: str, sha256: str) -> list[str]:
    """``python -c BOOTSTRAP ARCHIVE SHA256``: the node's argv follows."""
    return [python, "-c", BOOTSTRAP, archive_path, sha256]
