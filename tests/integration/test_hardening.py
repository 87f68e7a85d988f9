"""Issue 26's findings about the operator's side, each tried against a real ``tfcoord serve``.

* N5: a pinned CA (``TFCOORD_TLS_CA`` on clients, ``--tls-ca`` on serve) is trusted instead
  of the system's store, not beside it. The "system store" here is ``SSL_CERT_FILE``, which
  OpenSSL reads for its default locations, pointed at a second CA that signed an impostor.
* N6: node-supplied text with C0 and C1 control characters (ESC, CSI ``\\x9b``, OSC, a
  carriage return) reaches ``tfcoord status``, ``tfcoord logs``, ``submit``'s progress and
  failure lines only escaped.
* N8: ``--port-file F`` does not follow a symbolic link planted at ``F.tmp``.
* N9: a state directory of another user's, or one others may write in, is refused; a second
  ``tfcoord serve`` on a state directory in use stops in one line naming the first's PID.
* Item 6: each such mistake (a secret file that is a dangling symbolic link, a wrong owner,
  a locked state directory, a port file in no directory) is one line saying what to change,
  exit code 2, never "a tfcoord bug".
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfcoord.client import DriverClient, JobSpec, NodeClient, TlsError, auth, make_roles, tls
from tfcoord.client.entry import ExitCode

from .pki import Pki, have_openssl
from .served import TFCOORD, Served

#: Any C0 control but the line break and the tab, DEL, and any C1 control: what a terminal acts on.
TERMINAL_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: What a hostile node writes: clear the screen, set the window title (OSC ... BEL), a CSI
#: in its one-character C1 form (colour), and a carriage return that overwrites the line.
HOSTILE = "boom\x1b[2J\x1b]0;pwned\x07\x9b31mred\x9b0m\roverwritten"


def one_line(out: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The single ``tfcoord: ...`` line a mistake must produce; checks its exit code and words."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, out.stderr
    assert len(lines) == 1 and lines[0].startswith("tfcoord: "), out.stderr
    assert "Traceback" not in out.stderr and "tfcoord bug" not in out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def serve(tmp: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``tfcoord serve`` (in ``tmp``, where ``s`` and ``s.admin`` are its secrets) expected to
    refuse to start: it must exit by itself."""
    for name in ("s", "s.admin"):
        if not (tmp / name).exists():
            auth.write_secret(tmp / name)
    return subprocess.run(
        [*TFCOORD, "serve", "--plaintext", "--port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp,
    )


# -- N5: a pinned CA is the only one trusted ----------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if not have_openssl():
        pytest.skip("the openssl command makes the test certificates")
    return Pki.create(tmp_path_factory.mktemp("pki"))


def test_a_pinned_ca_is_trusted_instead_of_the_system_store(pki: Pki, tmp_path: Path):
    """The coordinator presents a certificate of a CA the system store trusts (SSL_CERT_FILE),
    not the pinned one: a client that pinned TFCOORD_TLS_CA refuses it, where it used to
    accept it (the pinned CA was added to the system's)."""
    impostor = pki.other_ca.issue("impostor", server=True)
    served = Served(tmp_path, "--tls-cert", str(impostor.cert), "--tls-key", str(impostor.key))
    try:
        system = dict(served.env, SSL_CERT_FILE=str(pki.other_ca.cert))
        pinned = served.cli("status", env=dict(system, TFCOORD_TLS_CA=str(pki.ca.cert)))
        one_line(pinned, ExitCode.USAGE, "does not trust", "TFCOORD_TLS_CA")
        # The library, as a node or a driver program uses it.
        os.environ["SSL_CERT_FILE"] = str(pki.other_ca.cert)
        try:
            # The control: with no CA pinned the system store is trusted, and it signed the impostor.
            with DriverClient(served.address, served.secret, ssl_context=tls.client_context()) as d:
                assert d.jobs() == ()
            ctx = tls.client_context(pki.ca.cert)
            assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "tfcoord test CA"),),)]
            with pytest.raises(TlsError, match="does not trust"):
                DriverClient(served.address, served.secret, ssl_context=ctx).connect()
            with pytest.raises(TlsError, match="does not trust"):
                DriverClient(
                    served.address,
                    served.secret,
                    ssl_context=tls.client_context(ca_pem=pki.ca.cert.read_text()),
                ).connect()
        finally:
            del os.environ["SSL_CERT_FILE"]
    finally:
        served.stop()


def test_serve_tls_ca_alone_signs_client_certificates(pki: Pki, tmp_path: Path):
    """``serve --tls-ca`` with a system store (SSL_CERT_FILE) that trusts another CA: a client
    certificate of that other CA is refused, one of the pinned CA accepted."""
    served = Served(
        tmp_path,
        "--tls-cert",
        str(pki.server.cert),
        "--tls-key",
        str(pki.server.key),
        "--tls-ca",
        str(pki.ca.cert),
        env=dict(os.environ, SSL_CERT_FILE=str(pki.other_ca.cert)),
    )
    try:
        stranger = tls.client_context(pki.ca.cert, pki.stranger.cert, pki.stranger.key)
        with pytest.raises(
            TlsError, match=r"refused this client's TLS certificate|demands a client certificate"
        ):
            DriverClient(served.address, served.secret, ssl_context=stranger, fail_fast=True).connect()
        member = tls.client_context(pki.ca.cert, pki.client.cert, pki.client.key)
        with DriverClient(served.address, served.secret, ssl_context=member) as d:
            assert d.jobs() == ()
    finally:
        served.stop()


# -- N6: node text reaches the terminal escaped -------------------------------------------


def _no_controls(text: str, what: str) -> None:
    found = TERMINAL_CONTROLS.findall(text)
    assert not found, f"{what} carries terminal controls {found!r}:\n{text!r}"


def test_status_logs_and_stop_print_a_hostile_nodes_text_escaped(tmp_path: Path):
    served = Served(tmp_path)
    try:
        with DriverClient(served.address, served.secret) as d:
            job = d.submit(JobSpec(roles=make_roles(2), name="victim"))
            with NodeClient(served.address, d.job_token(job), job, 0) as n:
                n.register("127.0.0.1", 7601, task_id="task\x9b2J")
                # Log lines: the node runtime escapes C0 controls and the coordinator refuses
                # them, but C1 controls pass both (\x9b is a CSI on many terminals).
                n.send_logs("stdout", ["tab\tkept", "csi \x9b31mred\x9b0m and nel \x85 here"])
                listed = served.cli("logs", job)
                assert listed.returncode == 0, listed.stderr
                _no_controls(listed.stdout, "tfcoord logs")
                assert "worker:0 | tab\tkept" in listed.stdout  # a program's own tab stays
                assert "worker:0 | csi \\x9b31mred\\x9b0m and nel \\x85 here" in listed.stdout
                stopped = served.cli("stop", job, "--dry-run", "--reason", "why")
                _no_controls(stopped.stdout, "tfcoord stop")
                n.report("failed", error=f"Traceback (most recent call last):\n\tline\n{HOSTILE}")
            shown = served.cli("status", job)
            assert shown.returncode == 0, shown.stderr
            _no_controls(shown.stdout, "tfcoord status JOB")
            assert "boom\\x1b[2J\\x1b]0;pwned\\x07\\x9b31mred\\x9b0m\\roverwritten" in shown.stdout
            assert "\n\tline\n" in shown.stdout  # the traceback keeps its lines
            listing = served.cli("status")
            _no_controls(listing.stdout, "tfcoord status")
            followed = served.cli("status", job, "--follow")  # the job ended: prints and exits
            assert followed.returncode == 0, followed.stderr
            _no_controls(followed.stdout, "tfcoord status --follow")
    finally:
        served.stop()


def test_submit_prints_a_failing_nodes_error_escaped(tmp_path: Path):
    """A node's command fails writing controls to stderr: the driver's progress and failure
    lines (stderr, ``tfcoord: ...``) carry them escaped. (The command's own output, streamed
    to stdout as it is, is the user's program talking to the user's terminal.)"""
    served = Served(tmp_path)
    try:
        code = f"import sys; sys.stderr.write({HOSTILE!r} + '\\n'); sys.exit(3)"
        out = subprocess.run(
            [*TFCOORD, "submit", "--engine", "local", "--workers", "1", "--", sys.executable, "-c", code],
            env=served.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == ExitCode.FAILED, out.stderr
        assert "boom" in out.stderr  # the why is there, escaped
        _no_controls(out.stderr, "tfcoord submit's own lines")
    finally:
        served.stop()


# -- N8: the port file ----------------------------------------------------------------------


def test_the_port_file_does_not_follow_a_link_planted_at_its_temporary_name(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    port_file = tmp_path / "run" / "coordinator.port"
    port_file.parent.mkdir()
    planted = port_file.with_name(port_file.name + ".tmp")
    planted.symlink_to(victim)
    served = Served(tmp_path, port_file=port_file)
    try:
        assert victim.read_text() == "precious\n"  # nothing written through the link
        assert not port_file.is_symlink() and port_file.read_text() == f"{served.port}\n"
        assert planted.is_symlink()  # left alone; and nothing else left behind
        assert sorted(p.name for p in port_file.parent.iterdir()) == [port_file.name, planted.name]
    finally:
        served.stop()


def test_a_port_file_in_no_directory_is_one_line(tmp_path: Path):
    out = serve(tmp_path, "--secret-file", "s", "--port-file", str(tmp_path / "missing" / "port"))
    one_line(out, ExitCode.USAGE, "--port-file", "existing directory")


# -- N9: the state directory ----------------------------------------------------------------


def _anothers_directory(tmp_path: Path) -> Path:
    """A directory that belongs to another user: made and given away when we are root, else one
    of the system's (refused before anything is written in it)."""
    if os.geteuid() == 0:
        d = tmp_path / "theirs"
        d.mkdir(mode=0o700)
        os.chown(d, 65534, 65534)
        return d
    return Path("/")


def test_a_state_directory_of_another_user_is_refused(tmp_path: Path):
    theirs = _anothers_directory(tmp_path)
    out = serve(tmp_path, "--secret-file", "s", "--state-dir", str(theirs))
    one_line(out, ExitCode.USAGE, f"state directory {theirs} belongs to uid", "chown")
    assert not (theirs / "journal.sqlite3").exists()


def test_a_state_directory_others_may_write_is_refused(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    out = serve(tmp_path, "--secret-file", "s", "--state-dir", str(shared))
    one_line(out, ExitCode.USAGE, "may be written by other users (mode 777)", f"chmod go-w {shared}")
    assert list(shared.iterdir()) == []


def test_a_second_serve_on_a_state_directory_in_use_names_the_first(tmp_path: Path):
    state = tmp_path / "state"
    first = Served(tmp_path, state_dir=state)
    owner = auth.new_owner_key()
    try:
        with DriverClient(first.address, first.secret, owner_key=owner) as d:
            job = d.submit(JobSpec(roles=make_roles(1)))
        second = serve(tmp_path, "--secret-file", str(first.secret_file), "--state-dir", str(state))
        one_line(
            second, ExitCode.USAGE, f"in use by another tfcoord serve (PID {first.proc.pid})", "--state-dir"
        )
        with DriverClient(first.address, first.secret, owner_key=owner) as d:  # the first serves on
            assert d.status(job)["state"] == "SUBMITTED"
    finally:
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    # The kernel dropped the lock with the process: the next one starts and has the job.
    again = Served(tmp_path, state_dir=state)
    try:
        assert "journal events replayed" in again.log
    finally:
        again.stop()


def test_a_state_directory_that_is_a_file_is_one_line(tmp_path: Path):
    (tmp_path / "state").write_text("")
    one_line(
        serve(tmp_path, "--secret-file", "s", "--state-dir", "state"),
        ExitCode.USAGE,
        "is a file",
        "--state-dir",
    )


# -- item 6: every mistake is one line, exit 2 --------------------------------------------


@pytest.fixture
def dangling(tmp_path: Path) -> Iterator[Path]:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere" / "secret")
    yield link


def test_a_secret_file_that_is_a_dangling_link_is_one_line(tmp_path: Path, dangling: Path):
    """It used to be "internal error: FileExistsError ... (a tfcoord bug ...)"."""
    out = serve(tmp_path, "--secret-file", str(dangling))
    one_line(
        out, ExitCode.USAGE, f"{dangling} is a symbolic link to", "which does not exist", "remove the link"
    )
    assert not (tmp_path / "nowhere").exists()  # nothing was created where it points


def test_other_key_files_that_are_dangling_links_are_one_line(tmp_path: Path, dangling: Path):
    auth.write_secret(tmp_path / "t")
    for flags in (
        ("--secret-file", "s", "--admin-secret-file", str(dangling)),
        ("--secret-file", "s", "--http-port", "0", "--http-token-file", str(dangling)),
        (
            "--secret-file",
            "s",
            "--http-port",
            "0",
            "--http-token-file",
            "t",
            "--http-admin-token-file",
            str(dangling),
        ),
    ):
        one_line(serve(tmp_path, *flags), ExitCode.USAGE, "is a symbolic link to", "which does not exist")


def test_client_commands_with_a_dangling_secret_file_are_one_line(tmp_path: Path, dangling: Path):
    env = dict(os.environ, TFCOORD_ADDRESS="127.0.0.1:7070", TFCOORD_SECRET_FILE=str(dangling))
    for command in (
        ["status", "--admin-secret-file", str(dangling)],
        ["submit", "--workers", "1", "--", sys.executable, "-c", "pass"],
    ):
        out = subprocess.run([*TFCOORD, *command], env=env, capture_output=True, text=True, timeout=60)
        one_line(out, ExitCode.USAGE, "is a symbolic link to", "which does not exist")


def test_a_secret_file_that_is_a_directory_or_of_another_user_is_one_line(tmp_path: Path):
    (tmp_path / "dir").mkdir()
    one_line(serve(tmp_path, "--secret-file", "dir"), ExitCode.USAGE, "is a directory")
    theirs = tmp_path / "theirs"
    auth.write_secret(theirs)
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user takes root")
    os.chown(theirs, 65534, 65534)
    one_line(serve(tmp_path, "--secret-file", "theirs"), ExitCode.USAGE, "belongs to uid 65534", "chown")
