"""The node archive (coordinator/nodearchive.py): what it holds, that it is reproducible, and that
its bootstrap runs it in a Python that has nothing installed -- and refuses a tampered one."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

from tfcoord.client import __version__
from tfcoord.coordinator.nodearchive import BOOTSTRAP, bootstrap_argv, build, node_archive

#: This interpreter without its environment: no site-packages (no tfcoord, no msgpack), no
#: PYTHON* variables -- an image with nothing but Python.
BARE = [os.path.realpath(sys.executable), "-I", "-S"]


def test_the_archive_holds_the_node_runtime_and_pure_python_msgpack_and_is_reproducible() -> None:
    a, b = build(), build()
    assert a.data == b.data and a.sha256 == b.sha256 == hashlib.sha256(a.data).hexdigest()
    assert a.name == f"tfcoord-node-{__version__}-{a.sha256[:12]}.pyz"
    assert a.path == f"/v1/node-archive/{a.name}"
    names = zipfile.ZipFile(BytesIO(a.data)).namelist()
    assert names == sorted(names)
    for required in (
        "__main__.py",
        "tfcoord/__init__.py",
        "tfcoord/client/protocol.py",
        "tfcoord/node/main.py",
        "tfcoord/node/supervisor.py",
        "tfcoord/node/tfserver.py",
        "_vendor/msgpack/fallback.py",
    ):
        assert required in names
    assert not [n for n in names if not n.endswith(".py")]  # no compiled extension, no bytecode
    # The node's layer and the one below it, nothing above: no coordinator, driver or command line.
    assert not [
        n
        for n in names
        if n.count("/") >= 1 and n.split("/")[1] not in ("__init__.py", "client", "node", "msgpack")
    ]
    assert node_archive() is node_archive()


def test_the_bootstrap_runs_the_archive_in_a_bare_python_and_refuses_a_tampered_one(tmp_path: Path) -> None:
    archive = node_archive()
    path = tmp_path / archive.name
    path.write_bytes(archive.data)
    assert subprocess.run([*BARE, "-c", "import msgpack"], capture_output=True).returncode != 0
    assert subprocess.run([*BARE, "-c", "import tfcoord.client"], capture_output=True).returncode != 0
    # --help ends the node command line at once; getting there imported client, node and msgpack.
    argv = bootstrap_argv(BARE[0], str(path), archive.sha256)
    ran = subprocess.run(
        [argv[0], *BARE[1:], *argv[1:], "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage: tfcoord-node")
    probe = (
        "import runpy,sys;sys.argv=['x'];"
        f"sys.path[:0]=[{str(path)!r},{str(path)!r}+'/_vendor'];"
        "import msgpack,tfcoord.client.protocol as p;"
        "print(msgpack.Packer.__module__, p.__file__.startswith(sys.path[0]))"
    )
    got = subprocess.run([*BARE, "-c", probe], capture_output=True, text=True, timeout=60)
    assert got.stdout.split() == ["msgpack.fallback", "True"], got.stderr
    tampered = tmp_path / "tampered.pyz"
    tampered.write_bytes(archive.data[:-1] + bytes([archive.data[-1] ^ 1]))
    refused = subprocess.run(
        [*BARE, "-c", BOOTSTRAP, str(tampered), archive.sha256, "--help"], capture_output=True, text=True
    )
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"not {archive.sha256} as its TaskInfo says: refusing to run it" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
