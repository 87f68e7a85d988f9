"""The node archive (coordinator/nodearchive.py): what it holds, that it is reproducible, and that
its bootstrap runs it in a Python that has nothing installed -- and refuses a tampered one."""

from __future__ import annotations

import hashlib
import importlib.util
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
    # Every module as source and as this interpreter's bytecode (unchecked hash-based: no
    # timestamp), and nothing else: no compiled extension.
    sources = [n for n in names if n.endswith(".py")]
    assert sorted(sources + [n + "c" for n in sources]) == names
    pyc = zipfile.ZipFile(BytesIO(a.data)).read("tfcoord/node/main.pyc")
    assert pyc[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(pyc[4:8], "little") == 0b01
    # The node's layer and the one below it, nothing above: no coordinator, driver or command line.
    assert not [
        n
        for n in names
        if n.count("/") >= 1
        and n.split("/")[1] not in ("__init__.py", "__init__.pyc", "client", "node", "msgpack")
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
        "print(msgpack.Packer.__module__, p.__file__.startswith(sys.path[0]), p.__file__.endswith('.pyc'))"
    )
    got = subprocess.run([*BARE, "-c", probe], capture_output=True, text=True, timeout=60)
    assert got.stdout.split() == ["msgpack.fallback", "True", "True"], got.stderr
    tampered = tmp_path / "tampered.pyz"
    tampered.write_bytes(archive.data[:-1] + bytes([archive.data[-1] ^ 1]))
    refused = subprocess.run(
        [*BARE, "-c", BOOTSTRAP, str(tampered), archive.sha256, "--help"], capture_output=True, text=True
    )
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"not {archive.sha256} as its TaskInfo says: refusing to run it" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


#: What a node does not load before it registers: the answers about jobs (only drivers read
#: them) and what only starting and watching its child needs.
NOT_BEFORE_REGISTERING = {
    "tfcoord.client.jobreplies",
    "tfcoord.node.outputlog",
    "tfcoord.node.reporting",
    "tfcoord.node.pdeath",
    "ctypes",
    "subprocess",
}


def test_the_node_loads_only_what_it_needs_before_it_connects_to_register(tmp_path: Path) -> None:
    # A Mesos task is ready once its node registers, and registering waits on every import
    # before it: at the node's first connect (an audit hook lists the modules, then ends the
    # process), none of the above is loaded.
    archive = node_archive()
    path = tmp_path / archive.name
    path.write_bytes(archive.data)
    at_connect = (
        "import os,sys\n"
        "def hook(event, args):\n"
        "    if event == 'socket.connect':\n"
        "        print(' '.join(sorted(sys.modules)), flush=True)\n"
        "        os._exit(0)\n"
        "sys.addaudithook(hook)\n"
    )
    node = ["--address", "127.0.0.1:9", "--job", "j", "--executor-id", "0", "--server-mode"]
    env = {"PATH": os.environ.get("PATH", os.defpath), "TFCOORD_TOKEN": "ab" * 32}
    ran = subprocess.run(
        [*BARE, "-c", at_connect + BOOTSTRAP, str(path), archive.sha256, *node],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    loaded = set(ran.stdout.split())
    assert {"tfcoord.client.client", "tfcoord.node.supervisor"} <= loaded  # it got as far as registering
    assert not loaded & NOT_BEFORE_REGISTERING


def test_a_python_of_another_version_runs_the_archive_from_its_sources(tmp_path: Path) -> None:
    # Bytecode with a foreign magic number (another Python's), as such a Python sees the
    # archive's: zipimport passes over it and compiles the source beside it.
    archive = node_archive()
    foreign = tmp_path / "foreign.pyz"
    with (
        zipfile.ZipFile(BytesIO(archive.data)) as src,
        zipfile.ZipFile(foreign, "w", compression=zipfile.ZIP_DEFLATED) as dst,
    ):
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, b"\x00\x00\r\n" + data[4:] if info.filename.endswith(".pyc") else data)
    probe = (
        f"import sys;sys.path[:0]=[{str(foreign)!r},{str(foreign)!r}+'/_vendor'];"
        "import tfcoord.node.main as n;print(n.__file__)"
    )
    got = subprocess.run([*BARE, "-c", probe], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == f"{foreign}/tfcoord/node/main.py"


def test_the_archive_runs_its_own_tfcoord_where_the_image_imported_one_at_start(tmp_path: Path) -> None:
    # This environment's Python imports tfcoord as it starts (the import-alias hook of
    # tfcoord-aliases.pth), from the installed tree: the archive must not run that one.
    archive = node_archive()
    path = tmp_path / archive.name
    path.write_bytes(archive.data)
    at_start = "import sys;print(sys.modules['tfcoord'].__path__)"
    assert subprocess.run([sys.executable, "-c", at_start], capture_output=True, timeout=60).returncode == 0
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{str(path)!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(path)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    print(sys.modules['tfcoord.client'].__file__, sys.modules['tfcoord.node.main'].__file__)\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[-2:] == [f"{path}/tfcoord/client/__init__.pyc", f"{path}/tfcoord/node/main.pyc"]
