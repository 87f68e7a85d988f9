"""deploy/: what can be checked without systemd as PID 1 or a container engine.

- the unit passes ``systemd-analyze verify`` (where systemd-analyze exists) and has the
  directives operators rely on, its CPU priority the one the load benchmark names;
- every variable of the example environment file is a ``tfcoord serve`` flag that
  ``serve`` reads itself (the unit's ExecStart names none), and the configuration really
  starts: run with only the ports and paths moved to a temporary directory, it sends
  READY=1 on $NOTIFY_SOCKET once both ports answer, and STOPPING=1 on SIGTERM;
- the Containerfiles copy only what exists and start the coordinator with flags the CLI
  knows.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tfcoord.cli import build_parser
from tfcoord.client import DriverClient, auth
from tfcoord.coordinator.sdnotify import notify

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "tfcoord.service"
ENV_FILE = DEPLOY / "tfcoord.env"
#: How long the test waits for one notification datagram; startup takes well under a second.
NOTIFY_WAIT_S = 60.0


def unit_directives(text: str) -> dict[str, list[str]]:
    """Unit file → {key: [values]}, joining backslash-continued lines."""
    out: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def env_file(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"not KEY=VALUE: {line!r}"
            out[key] = value
    return out


def exec_start_argv() -> list[str]:
    """The unit's ExecStart: no ${VAR} in it, as ``tfcoord serve`` reads its environment."""
    (command,) = unit_directives(UNIT.read_text())["ExecStart"]
    assert "$" not in command, "ExecStart should leave the TFCOORD_* variables to tfcoord serve"
    return shlex.split(command)


# -- the unit -----------------------------------------------------------------------------


def test_unit_has_readiness_restart_state_directory_and_hardening():
    d = unit_directives(UNIT.read_text())
    for key, value in {
        "Type": "notify",
        "Restart": "on-failure",
        "StateDirectory": "tfcoord",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "EnvironmentFile": "/etc/tfcoord/tfcoord.env",
    }.items():
        assert d.get(key) == [value], key


def test_unit_runs_the_coordinator_ahead_of_batch_work_as_the_load_benchmark_does():
    """The heartbeat goals' rows name the priority the benchmark ran ``tfcoord serve`` at;
    the one they call the unit's must be the unit's (benchmarks/load.py ``SERVICE_NICE``)."""
    d = unit_directives(UNIT.read_text())
    assert int(d["CPUWeight"][0]) > 100  # systemd's default weight is 100
    tree = ast.parse((ROOT / "benchmarks" / "load.py").read_text())
    (service_nice,) = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SERVICE_NICE" for t in node.targets)
    ]
    assert d["Nice"] == [str(ast.literal_eval(service_nice))]
    assert int(d["Nice"][0]) < 0


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's program exists: point it at this checkout's tfcoord.
    tfcoord = Path(sys.executable).parent / "tfcoord"
    assert tfcoord.exists(), "tfcoord is not installed next to this Python (pip install -e .)"
    unit = tmp_path / "tfcoord.service"
    unit.write_text(UNIT.read_text().replace("/opt/tfcoord/bin/tfcoord", str(tfcoord)))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # Unknown keys and bad values are only warnings (exit 0): any line about our unit fails.
    about_us = [ln for ln in (out.stdout + out.stderr).splitlines() if "tfcoord" in ln]
    assert out.returncode == 0 and not about_us, out.stdout + out.stderr


# -- the example configuration ------------------------------------------------------------


def test_example_env_file_maps_onto_real_serve_flags():
    env = env_file(ENV_FILE.read_text())
    argv = exec_start_argv()
    assert argv[0] == "/opt/tfcoord/bin/tfcoord"
    args = build_parser(env).parse_args(argv[1:])
    assert args.cmd == "serve" and args.log_format == "json" and args.log_level == env["TFCOORD_LOG_LEVEL"]
    assert (args.host, args.port) == (env["TFCOORD_HOST"], int(env["TFCOORD_PORT"]))
    assert (args.http_host, args.http_port) == (env["TFCOORD_HTTP_HOST"], int(env["TFCOORD_HTTP_PORT"]))
    assert args.secret_file == env["TFCOORD_SECRET_FILE"] and args.state_dir == env["TFCOORD_STATE_DIR"]
    assert args.http_token_file == env["TFCOORD_HTTP_TOKEN_FILE"]
    # Everything the service writes stays under its StateDirectory (ProtectSystem=strict).
    state = "/var/lib/" + unit_directives(UNIT.read_text())["StateDirectory"][0]
    for key in ("TFCOORD_SECRET_FILE", "TFCOORD_STATE_DIR", "TFCOORD_HTTP_TOKEN_FILE"):
        assert env[key] == state or env[key].startswith(state + "/"), key


def _receive(sock: socket.socket, proc: subprocess.Popen) -> dict[str, str]:
    try:
        data = sock.recv(4096)
    except TimeoutError:
        proc.kill()
        raise AssertionError(f"no notification; tfcoord serve said: {proc.stderr.read()}") from None
    return dict(line.split("=", 1) for line in data.decode().splitlines())


def test_serve_with_the_example_configuration_notifies_systemd_once_listening(tmp_path):
    """READY=1 arrives on $NOTIFY_SOCKET after both ports answer; STOPPING=1 on SIGTERM."""
    env = env_file(ENV_FILE.read_text())
    state = tmp_path / "var-lib-tfcoord"  # the unit's StateDirectory, paths below it as configured
    moved = {
        k: str(state / Path(env[k]).relative_to("/var/lib/tfcoord"))
        for k in ("TFCOORD_STATE_DIR", "TFCOORD_SECRET_FILE", "TFCOORD_HTTP_TOKEN_FILE")
    }
    env.update(moved, TFCOORD_HOST="127.0.0.1", TFCOORD_PORT="0", TFCOORD_HTTP_PORT="0")
    argv = exec_start_argv()[1:]
    argv += ["--port-file", str(tmp_path / "port"), "--http-port-file", str(tmp_path / "http-port")]
    notify_path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(notify_path)
        sock.settimeout(NOTIFY_WAIT_S)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfcoord", *argv],
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **env, NOTIFY_SOCKET=notify_path),
        )
        try:
            ready = _receive(sock, proc)
            assert ready["READY"] == "1" and "listening on 127.0.0.1:" in ready["STATUS"]
            # Once READY=1 is sent, both ports answer and both port files are written.
            port = int((tmp_path / "port").read_text())
            http_port = int((tmp_path / "http-port").read_text())
            assert f":{port}, HTTP on 127.0.0.1:{http_port}" in ready["STATUS"]
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10) as r:
                assert json.load(r)["status"] == "ok"
            with DriverClient(f"127.0.0.1:{port}", auth.read_secret(moved["TFCOORD_SECRET_FILE"])) as d:
                assert d.status() == {"jobs": []}
            for key in ("TFCOORD_SECRET_FILE", "TFCOORD_HTTP_TOKEN_FILE"):
                assert oct(Path(moved[key]).stat().st_mode & 0o777) == "0o600", key
            proc.send_signal(signal.SIGTERM)
            assert _receive(sock, proc)["STOPPING"] == "1"
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            proc.stderr.close()


def test_notify_reaches_an_abstract_socket_and_is_a_no_op_outside_systemd():
    name = f"tfcoord-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(NOTIFY_WAIT_S)
        assert notify("@" + name, READY=1, STATUS="two\nlines")
        assert sock.recv(4096) == b"READY=1\nSTATUS=two lines\n"
    assert notify(None, READY=1) is False and notify("", READY=1) is False


# -- the container files ------------------------------------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = path.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("name", ["Containerfile", "Containerfile.task"])
def test_containerfiles_copy_what_exists(name):
    for word, rest in _instructions(DEPLOY / name):
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), f"{name} copies {src}, which is not in the repository"


def test_coordinator_image_starts_serve_with_known_flags():
    ins = dict(_instructions(DEPLOY / "Containerfile"))
    argv = json.loads(ins["ENTRYPOINT"]) + json.loads(ins["CMD"])
    assert argv[0] == "tfcoord"
    args = build_parser().parse_args(argv[1:])
    assert args.cmd == "serve" and args.host == "0.0.0.0" and args.http_port == 7071
    assert args.state_dir.startswith("/var/lib/tfcoord/") and ins["VOLUME"] == '["/var/lib/tfcoord"]'
    assert args.secret_file.startswith("/var/lib/tfcoord/") and args.http_token_file.startswith(
        "/var/lib/tfcoord/"
    )
    assert ins["USER"] != "root"


def test_task_image_has_tensorflow_and_the_node_entry_point():
    text = (DEPLOY / "Containerfile.task").read_text()
    assert re.search(r"ARG TENSORFLOW=tensorflow-cpu", text) and '"${TENSORFLOW}"' in text
    ins = dict(_instructions(DEPLOY / "Containerfile.task"))
    cmd = json.loads(ins["CMD"])
    assert cmd[:3] == ["python", "-m", "tfcoord.node"]
    assert ins["USER"] != "root"
