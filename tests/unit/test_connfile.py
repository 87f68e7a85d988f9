"""Connection files of embedded coordinators: this user's alone, found while live, gone when stale."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tfcoord.client import connfile


def _conn(port: int, pid: int | None = None) -> connfile.Connection:
    return connfile.Connection(
        address=f"127.0.0.1:{port}",
        advertised=f"10.0.0.5:{port}",
        port=port,
        admin_secret=b"ab" * 32,
        ca_pem="-----BEGIN CERTIFICATE-----\n...\n",
        pid=os.getpid() if pid is None else pid,
    )


def test_written_readable_by_its_user_only_and_found_while_its_process_lives(tmp_path):
    run = tmp_path / "run"
    path = connfile.write(run, _conn(7070))
    assert stat.S_IMODE(run.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    (found,) = connfile.find(run)
    assert (found.address, found.advertised, found.admin_secret) == (
        "127.0.0.1:7070",
        "10.0.0.5:7070",
        b"ab" * 32,
    )
    connfile.remove(path, os.getpid() + 1)  # another coordinator's: left alone
    assert path.exists()
    connfile.remove(path, os.getpid())
    assert list(connfile.find(run)) == []


def test_a_stale_file_is_skipped_and_removed(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    path = connfile.write(tmp_path / "run", _conn(7071, pid=int(dead.stdout)))
    live = connfile.write(tmp_path / "run", _conn(7072))
    assert [c.port for c in connfile.find(tmp_path / "run")] == [7072]
    assert not path.exists() and live.exists()


def test_a_directory_others_may_read_or_another_user_owns_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    run.chmod(0o755)
    with pytest.raises(connfile.ConnectionFileError, match=r"open to other users \(mode 755\): chmod 700"):
        connfile.write(run, _conn(7073))
    with pytest.raises(connfile.ConnectionFileError, match="open to other users"):
        list(connfile.find(run))
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(connfile.ConnectionFileError, match="not a directory"):
        connfile.write(link, _conn(7074))


def test_the_directory_follows_the_environment():
    assert connfile.runtime_dir({"TFCOORD_RUNTIME_DIR": "/x/y"}) == connfile.Path("/x/y")
    assert connfile.runtime_dir({"XDG_RUNTIME_DIR": "/run/user/5"}) == connfile.Path("/run/user/5/tfcoord")
    assert connfile.runtime_dir({}).name == f"tfcoord-{os.getuid()}"
