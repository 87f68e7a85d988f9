"""A new user's mistakes against the real ``tfcoord`` command: one line each, naming the
cause and the fix, the documented exit code (2 usage, 1 failed, 3 unreachable), never a
traceback of tfcoord's, and an unreachable coordinator reported in well under 3 s."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfcoord.client import DriverClient, JobSpec, NodeClient, make_roles

from .served import TFCOORD, Served

#: The newcomer check's bound on reporting a coordinator that is not there.
UNREACHABLE_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("newcomer"), http=True)
    yield s
    s.stop()
    for held in free_port.held:  # type: ignore[attr-defined]
        held.close()


def tfcoord(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run([*TFCOORD, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def one_line(out: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The single ``tfcoord: ...`` line a mistake must produce; checks its exit code and words."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, out.stderr
    assert len(lines) == 1 and lines[0].startswith("tfcoord: "), out.stderr
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def free_port() -> int:
    """A port nothing listens on: bound (so no one else takes it meanwhile) but not listening."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    free_port.held.append(s)  # type: ignore[attr-defined]
    return s.getsockname()[1]


free_port.held = []  # type: ignore[attr-defined]


def test_an_address_without_a_port(served):
    one_line(tfcoord("status", "--address", "localhost", env=served.env), 2, "HOST:PORT", "localhost:7070")


def test_a_log_level_that_does_not_exist_and_global_flags_after_the_command(served):
    one_line(tfcoord("--log-level", "verbose", "status", env=served.env), 2, "VERBOSE", "choose from")
    out = tfcoord("status", "--log-level", "debug", "--log-format", "json", "--json", env=served.env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"jobs": []} or "jobs" in json.loads(out.stdout)


def test_a_refused_connection_fails_at_once_with_exit_3(served):
    t0 = time.monotonic()
    line = one_line(tfcoord("status", "--address", f"127.0.0.1:{free_port()}", env=served.env), 3, "refused")
    assert time.monotonic() - t0 < UNREACHABLE_WITHIN_S, line
    assert "tfcoord serve" in line


def test_a_host_name_that_does_not_resolve_fails_at_once_with_exit_3(served):
    t0 = time.monotonic()
    one_line(
        tfcoord("status", "--address", "no-such-host.invalid:7070", env=served.env), 3, "does not resolve"
    )
    assert time.monotonic() - t0 < UNREACHABLE_WITHIN_S


def test_the_http_port_given_for_the_protocol_port(served):
    t0 = time.monotonic()
    one_line(
        tfcoord("status", "--address", f"127.0.0.1:{served.http_port}", env=served.env),
        2,
        "HTTP server",
        "--port",
    )
    assert time.monotonic() - t0 < UNREACHABLE_WITHIN_S


def test_a_silent_peer_is_given_up_on_after_timeout(served):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts (the kernel does) but never speaks, nor answers HTTP
    try:
        t0 = time.monotonic()
        out = tfcoord(
            "status", "--address", f"127.0.0.1:{silent.getsockname()[1]}", "--timeout", "1", env=served.env
        )
        assert time.monotonic() - t0 < UNREACHABLE_WITHIN_S + 2
        one_line(out, 2, "TLS?")
    finally:
        silent.close()


def test_bad_timeout_and_unknown_command(served):
    one_line(tfcoord("status", "--timeout", "0", env=served.env), 2, "--timeout", "above 0")
    one_line(tfcoord("statsu", env=served.env), 2, "invalid choice", "status")


def test_an_unknown_job_is_exit_1_and_says_how_to_find_jobs(served):
    one_line(tfcoord("status", "nope", env=served.env), 1, "no job 'nope'", "tfcoord status")


def test_serve_on_a_busy_port(served, tmp_path):
    out = tfcoord(  # ERROR: the plaintext warning is not the mistake's line
        "serve",
        "--plaintext",
        "--log-level",
        "ERROR",
        "--port",
        str(served.port),
        "--secret-file",
        str(served.secret_file),
    )
    one_line(out, 2, "cannot listen", "--port", "0 picks a free one")


def test_serve_flags_from_the_environment_and_a_bad_one_named(tmp_path):
    env = {"TFCOORD_PORT": "seventy", "TFCOORD_SECRET_FILE": str(tmp_path / "s"), "PATH": "/usr/bin:/bin"}
    one_line(tfcoord("serve", env=env), 2, "TFCOORD_PORT='seventy'", "--port")
    # deploy/tfcoord.env's variables, with this test's paths and free ports: serve honours each.
    env_file = Path(__file__).resolve().parents[2] / "deploy" / "tfcoord.env"
    names = [ln.split("=", 1)[0] for ln in env_file.read_text().splitlines() if ln and not ln.startswith("#")]
    values = {
        "TFCOORD_HOST": "127.0.0.1",
        "TFCOORD_PORT": "0",
        "TFCOORD_SECRET_FILE": str(tmp_path / "secret"),
        "TFCOORD_STATE_DIR": str(tmp_path / "journal"),
        "TFCOORD_HTTP_HOST": "127.0.0.1",
        "TFCOORD_HTTP_PORT": "0",
        "TFCOORD_HTTP_TOKEN_FILE": str(tmp_path / "token"),
        "TFCOORD_LOG_LEVEL": "INFO",
        "TFCOORD_PLAINTEXT": "1",
    }
    assert sorted(names) == sorted(values), "deploy/tfcoord.env changed: give this test a value for each"

    served = Served(tmp_path, env=dict(os.environ, **values, TFCOORD_HTTP_PORT_FILE=str(tmp_path / "hp")))
    try:
        assert (tmp_path / "journal").is_dir() and (tmp_path / "token").is_file()
        assert "WARNING tfcoord: serving plaintext (--plaintext)" in served.log
        assert f"HTTP on 127.0.0.1:{(tmp_path / 'hp').read_text().strip()}" in served.ready["STATUS"]
    finally:
        served.stop()


def test_submit_local_names_a_missing_program(served):
    one_line(tfcoord("submit", "--engine", "local", "--", "no-such-binary"), 2, "'no-such-binary'", "PATH")
    one_line(
        tfcoord("submit", "--engine", "local", "--", "python", "no_such.py"), 2, "no script at no_such.py"
    )


def test_a_spark_script_that_does_not_compile_shows_its_own_file_and_line(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def main_fun(argv, ctx):\n    return {\n\nx = (\n")
    out = tfcoord("submit", "--engine", "spark", "--num-executors", "1", "--", "python", str(script))
    assert out.returncode == 1, out.stderr
    assert f'File "{script}", line' in out.stderr and "SyntaxError" in out.stderr
    assert "tfcoord/" not in out.stderr.replace(str(script), "")  # none of tfcoord's frames
    assert out.stderr.strip().splitlines()[-1].startswith("tfcoord: ")


def test_status_of_a_job_prints_each_nodes_results_and_the_timeline(served):
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), name="results"))
        with NodeClient(served.address, d.job_token(job), job, 0).connect() as n:
            n.register("127.0.0.1", 2222)
            n.await_cluster(timeout_s=10)
            n.report("running")
            n.report("succeeded", meta={"result.final_loss": 0.0123, "result.steps": 60})
        d.await_job(job, timeout_s=10)
    out = tfcoord("status", job, env=served.env)
    assert out.returncode == 0, out.stderr
    assert "results:\n  worker:0  final_loss=0.0123  steps=60" in out.stdout
    timeline = out.stdout.split("timeline:\n", 1)[1].splitlines()
    assert len(timeline) >= 3 and any("SUCCEEDED" in ln for ln in timeline), out.stdout


def test_json_on_every_command(served, tmp_path):
    out = tfcoord("stop", "--json", "no-such-job", env=served.env)
    one_line(out, 1, "no job")
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), name="j"))
    out = tfcoord("--json", "stop", job, "--dry-run", env=served.env)
    assert out.returncode == 0 and json.loads(out.stdout)["dry_run"] is True, out.stderr
    out = tfcoord("env-check", "--json", env=served.env)
    report = json.loads(out.stdout)
    assert {"status", "check", "detail", "fix"} <= set(report[0])
    assert any(r["check"] == "coordinator" and r["status"] == "OK" for r in report), report
    ok = tfcoord("submit", "--json", "--engine", "local", "--", sys.executable, "-c", "print('hi')")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["state"] == "SUCCEEDED" and "[worker:0] hi" in ok.stderr


def test_the_local_engine_prints_a_progress_bar_as_a_terminal_shows_it(tmp_path):
    # Keras's Progbar: backspaces and a carriage return before each redraw; the last line
    # has no line break. Raw, the carriage return would put the cursor back over the prefix
    # (the node's output is submit's stdout; its own lines go to stderr).
    code = (
        "import sys\n"
        "for i in range(1, 4):\n"
        "    sys.stdout.write('\\b' * 9 + '\\r' + f'{i}/3 [===]'); sys.stdout.flush()\n"
        "print()\n"
        "sys.stdout.write('no line break')\n"
    )
    out = tfcoord("submit", "--engine", "local", "--", sys.executable, "-c", code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # Contains, not equals: the node's supervisor may log a line of its own to that pipe.
    assert "[worker:0] 3/3 [===]\n" in out.stdout and "[worker:0] no line break" in out.stdout, repr(
        out.stdout
    )
    assert "\b" not in out.stdout and "\r" not in out.stdout, repr(out.stdout)


def test_driver_client_from_env_reads_the_secret_file_as_serve_does(served):
    with DriverClient.from_env(served.env) as d:
        assert "jobs" in d.status()
    # A secret read by hand keeps the file's newline; the client strips it as serve does.
    raw = served.secret_file.read_bytes()
    assert raw.endswith(b"\n")
    with DriverClient(served.address, raw) as d:
        assert "jobs" in d.status()
    with pytest.raises(ValueError, match="TFCOORD_ADDRESS is not set"):
        DriverClient.from_env({})


def test_shell_completion_completes_commands_and_choices(tmp_path):
    script = tfcoord("completion", "bash").stdout
    probe = (
        script + '\nCOMP_WORDS=(tfcoord sub); COMP_CWORD=1; _tfcoord; echo "${COMPREPLY[@]}"'
        "\nCOMP_WORDS=(tfcoord submit --engine ''); COMP_CWORD=3; _tfcoord; echo \"${COMPREPLY[@]}\""
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.splitlines() == ["submit", "local spark mesos"]


def test_serve_without_tls_files_needs_plaintext_asked_for_by_name(tmp_path):
    """No certificate and no --plaintext: one line saying what to pass, never a silent plaintext."""
    base = ("serve", "--port", "0", "--secret-file", str(tmp_path / "s"))
    env = {"TFCOORD_SECRET_FILE": str(tmp_path / "s"), "PATH": "/usr/bin:/bin"}
    one_line(tfcoord(*base), 2, "serve needs TLS", "--tls-cert", "--plaintext")
    one_line(tfcoord(*base, env=dict(env, TFCOORD_PLAINTEXT="0")), 2, "serve needs TLS")
    one_line(
        tfcoord(*base, env=dict(env, TFCOORD_PLAINTEXT="maybe")), 2, "TFCOORD_PLAINTEXT='maybe'", "1 or 0"
    )
    key = tmp_path / "key.pem"
    key.write_text("unused")
    one_line(
        tfcoord(*base, "--plaintext", "--tls-cert", str(key), "--tls-key", str(key)),
        2,
        "--plaintext contradicts --tls-cert",
    )
    assert not (tmp_path / "s").exists()  # refused before any file was made


def test_submit_local_serves_tls_by_default_and_its_nodes_pin_the_embedded_ca():
    """The embedded coordinator of ``submit --engine local`` serves TLS with a CA of its own;
    its nodes (which would fail to register otherwise) trust exactly that CA."""
    probe = (
        "import os, ssl; ca = os.environ.get('TFCOORD_TLS_CA'); "
        "print('pinned', len(ssl.create_default_context(cafile=ca).get_ca_certs()) if ca else 'none')"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCOORD_")}
    ok = tfcoord(
        "submit", "--json", "--engine", "local", "--workers", "2", "--", sys.executable, "-c", probe, env=env
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["state"] == "SUCCEEDED"
    assert "[worker:0] pinned 1" in ok.stderr and "[worker:1] pinned 1" in ok.stderr, ok.stderr
    assert "PLAINTEXT" not in ok.stderr
    plain = tfcoord(
        "submit", "--json", "--engine", "local", "--plaintext", "--", sys.executable, "-c", probe, env=env
    )
    assert plain.returncode == 0, plain.stderr
    assert "[worker:0] pinned none" in plain.stderr
    assert "the embedded coordinator serves PLAINTEXT (plaintext=True, --plaintext)" in plain.stderr
