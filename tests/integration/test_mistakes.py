"""Every user mistake the ``tfcoord`` command knows of, made for real: one line on stderr
naming what to change, a specific exit code, no traceback, and never "a tfcoord bug".

Each case runs the CLI as a subprocess against a real ``tfcoord serve``; the Spark cases are
refused before Spark starts, so they need no JVM and must be quick (a typo in ``--master``
used to be a 13-line PySpark error, an unreachable master 66 s and 169 lines).
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tfcoord.client import DriverClient, JobSpec, NodeClient, auth, make_roles
from tfcoord.client.entry import ExitCode

from .lines import Lines, as_from_a_terminal
from .served import TFCOORD, Served

#: A refused coordinator or Spark master, under any engine: the local engine's 0.2 s plus a
#: Python start on a loaded machine.
REFUSED_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("mistakes"))
    yield s
    s.stop()
    for held in _held:
        held.close()


def tfcoord(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*TFCOORD, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def one_line(out: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The single ``tfcoord: ...`` line a mistake must produce, with its exit code and words."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, out.stderr
    assert len(lines) == 1 and lines[0].startswith("tfcoord: "), out.stderr
    for never in ("Traceback", "tfcoord bug", "internal error"):
        assert never not in out.stderr, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@dataclass(frozen=True)
class Mistake:
    args: tuple[str, ...]
    code: int
    needles: tuple[str, ...]
    #: Environment changes: a value None removes the variable.
    env: tuple[tuple[str, str | None], ...] = ()


def _closed_port() -> int:
    """A port nothing listens on: bound for the module's lifetime (no one takes it), never listening."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _held.append(s)
    return int(s.getsockname()[1])


_held: list[socket.socket] = []
CLOSED = _closed_port()
SCRIPT = "train.py"  # written in the test's working directory
USAGE, FAILED, UNREACHABLE = ExitCode.USAGE, ExitCode.FAILED, ExitCode.UNREACHABLE
SPARK = ("submit", "--engine", "spark", "--num-executors", "2")

MISTAKES = [
    # global flags and commands
    Mistake(("statsu",), USAGE, ("invalid choice", "status")),
    Mistake(("--log-level", "verbose", "status"), USAGE, ("VERBOSE", "choose from")),
    Mistake(("completion", "fish"), USAGE, ("invalid choice", "bash")),
    # status, logs, stop
    Mistake(("status", "--address", "localhost"), USAGE, ("HOST:PORT", "localhost:7070")),
    Mistake(("status", "--timeout", "0"), USAGE, ("--timeout", "above 0")),
    Mistake(("status", "--follow"), USAGE, ("--follow follows one job",)),
    Mistake(("status", "no-such-job"), FAILED, ("no job 'no-such-job'", "tfcoord status")),
    Mistake(("status", "--address", f"127.0.0.1:{CLOSED}"), UNREACHABLE, ("refused", "tfcoord serve")),
    Mistake(("status", "--address", "no-such-host.invalid:7070"), UNREACHABLE, ("does not resolve",)),
    # In a runtime directory of its own: the session's holds the run records of other tests'
    # ended drivers, which `tfcoord status` would list instead.
    Mistake(
        ("status",),
        USAGE,
        ("no coordinator address", "--address"),
        (("TFCOORD_ADDRESS", None), ("TFCOORD_RUNTIME_DIR", "empty-run")),
    ),
    Mistake(
        ("status",),
        USAGE,
        ("no admin secret at", "sees and stops every job", "tfcoord serve` wrote it beside its secret file"),
        (("TFCOORD_ADMIN_SECRET_FILE", "/no/such/admin"),),
    ),
    Mistake(
        ("status",),
        USAGE,
        ("authentication failed", "admin secret"),
        (("TFCOORD_ADMIN_SECRET_FILE", "wrong-secret"),),
    ),
    Mistake(("logs",), USAGE, ("required: job",)),
    Mistake(("logs", "no-such-job"), FAILED, ("no job 'no-such-job'",)),
    Mistake(("stop",), USAGE, ("required: job",)),
    Mistake(("stop", "no-such-job"), FAILED, ("no job 'no-such-job'",)),
    Mistake(("stop", "x", "--secret-file", "/no/such/secret"), USAGE, ("admin secret",)),
    # serve
    Mistake(("serve", "--port", "seventy"), USAGE, ("--port", "'seventy' is not a port number")),
    Mistake(
        ("serve", "--plaintext", "--port", "99999"), USAGE, ("--port: 99999 is not a TCP port", "1-65535")
    ),
    Mistake(
        ("serve", "--plaintext", "--max-connections", "0"), USAGE, ("--max-connections must be at least 1",)
    ),
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): no machine's own address.
    Mistake(
        ("serve", "--plaintext", "--host", "192.0.2.1", "--port", "0"),
        USAGE,
        ("cannot listen on 192.0.2.1:0", "not an address of this machine", "--host 0.0.0.0"),
    ),
    Mistake(
        ("serve", "--plaintext", "--host", "no-such-host.invalid", "--port", "0"),
        USAGE,
        ("--host names no host this machine can resolve",),
    ),
    Mistake(("serve", "--secret-file", "s"), USAGE, ("serve needs TLS", "--plaintext")),
    Mistake(("serve", "--plaintext", "--http-port", "0"), USAGE, ("--http-token-file",)),
    Mistake(("serve", "--plaintext", "--keep-finished-jobs", "0"), USAGE, ("--keep-finished-jobs",)),
    # submit, every engine
    Mistake(("submit", "--engine", "local", "--", "no-such-binary"), USAGE, ("'no-such-binary'", "PATH")),
    Mistake(("submit", "--engine", "local"), USAGE, ("nothing to run",)),
    Mistake(("submit", "--engine", "local", "--workers", "0", "--", "true"), USAGE, ("at least one worker",)),
    Mistake(
        ("submit", "--engine", "local", "--workers", "100000", "--", "true"),
        USAGE,
        ("100000 local nodes need at least 4,000,000 MiB", "this machine has", "--engine spark"),
    ),
    Mistake(("submit", "--engine", "local", "--max-restarts", "-1", "--", "true"), USAGE, ("max_restarts",)),
    Mistake(("submit", "--engine", "mesos"), USAGE, ("--job ps:1",)),
    Mistake(
        ("submit", "--num-executors", "2", "--master", "yarn", "--", "true"),
        USAGE,
        ("--master, --num-executors: for --engine spark only", "--engine local"),
    ),
    Mistake(
        ("submit", "--engine", "mesos", "--master", "h:5050", "--job", "worker:1", "--", "true"),
        USAGE,
        ("--master: for --engine spark only", "the Mesos master is --mesos-master HOST:5050"),
    ),
    Mistake(
        ("submit", "--engine", "local", "--job", "worker:1", "--", "true"),
        USAGE,
        ("--job: for --engine mesos",),
    ),
    Mistake(
        (*SPARK, "--workers", "3", "--", SCRIPT),
        USAGE,
        ("--workers: for --engine local and mesos", "--num-executors"),
    ),
    Mistake(("submit", "--engine", "local", "--no-wait", "--", "true"), USAGE, ("--no-wait needs",)),
    Mistake(("submit", "--engine", "spark", "--", SCRIPT), USAGE, ("--num-executors N",)),
    Mistake((*SPARK, "--", "ls"), USAGE, ("give the Python script after --",)),
    Mistake((*SPARK, "--", "missing.py"), USAGE, ("no script at missing.py",), (("TFCOORD_ADDRESS", None),)),
    Mistake((*SPARK, "--master", "spak://h:7077", "--", SCRIPT), USAGE, ("did you mean spark://h:7077?",)),
    Mistake((*SPARK, "--master", "locall[2]", "--", SCRIPT), USAGE, ("did you mean local[2]?",)),
    Mistake((*SPARK, "--master", "spark://h", "--", SCRIPT), USAGE, ("'h' is not HOST:PORT", "7077")),
    Mistake((*SPARK, "--master", "mesos://h:5050", "--", SCRIPT), USAGE, ("--engine mesos",)),
    Mistake(
        (*SPARK, "--master", f"spark://127.0.0.1:{CLOSED}", "--", SCRIPT),
        UNREACHABLE,
        (f"cannot reach the Spark master spark://127.0.0.1:{CLOSED}", "refused", "--master"),
    ),
    Mistake(
        (*SPARK, "--master", "spark://no-such-host.invalid:7077", "--", SCRIPT),
        UNREACHABLE,
        ("no-such-host.invalid:7077: no such host",),
    ),
    Mistake(
        ("submit", "--engine", "spark", "--num-ps", "3", "--num-executors", "2", "--", SCRIPT),
        USAGE,
        ("no room for 3 ps", "--num-executors"),
    ),
    Mistake((*SPARK, "--chief", "--evaluator", "--num-ps", "1", "--", SCRIPT), USAGE, ("no room",)),
    Mistake(
        (*SPARK, "--deploy-mode", "cluster", "--", SCRIPT),
        USAGE,
        ("client mode", "spark-submit --deploy-mode cluster"),
    ),
    Mistake((*SPARK, "--deploy-mode", "yarn", "--", SCRIPT), USAGE, ("--deploy-mode", "client")),
    Mistake(
        (*SPARK, "--py-files", "missing.zip", "--", SCRIPT), USAGE, ("--py-files missing.zip: no such file",)
    ),
    Mistake((*SPARK, "--files", "a.txt,missing.txt", "--", SCRIPT), USAGE, ("--files missing.txt",)),
    Mistake((*SPARK, "--archives", "missing.zip#env", "--", SCRIPT), USAGE, ("--archives missing.zip#env",)),
    Mistake((*SPARK, "--conf", "spark.task.cpus", "--", SCRIPT), USAGE, ("KEY=VALUE", "'spark.task.cpus'")),
    Mistake((*SPARK, "--executor-memory", "lots", "--", SCRIPT), USAGE, ("'lots' is not a memory size",)),
    Mistake((*SPARK, "--driver-memory", "2gigs", "--", SCRIPT), USAGE, ("--driver-memory '2gigs'",)),
    Mistake((*SPARK, "--reservation-timeout", "0", "--", SCRIPT), USAGE, ("reservation_timeout",)),
    Mistake((*SPARK, "--address", f"127.0.0.1:{CLOSED}", "--", SCRIPT), UNREACHABLE, ("refused",)),
    Mistake((*SPARK, "--", SCRIPT), USAGE, ("secret",), (("TFCOORD_SECRET_FILE", "wrong-secret"),)),
    Mistake(
        ("submit", "--engine", "local", "--", "true"),
        USAGE,
        ("secret",),
        (("TFCOORD_SECRET_FILE", "wrong-secret"),),
    ),
]


@pytest.mark.timeout(600)
def test_every_user_mistake_is_one_line_with_a_specific_exit_code(served, tmp_path):
    (tmp_path / SCRIPT).write_text("def main_fun(argv, ctx):\n    pass\n")
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "empty-run").mkdir(mode=0o700)
    auth.write_secret(tmp_path / "wrong-secret")  # a key, but not the coordinator's
    for mistake in MISTAKES:
        env = dict(served.env)
        for key, value in mistake.env:
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        t0 = time.monotonic()
        out = tfcoord(*mistake.args, env=env, cwd=tmp_path)
        took = time.monotonic() - t0
        try:
            one_line(out, mistake.code, *mistake.needles)
        except AssertionError as e:
            raise AssertionError(f"tfcoord {' '.join(mistake.args)}: {e}") from None
        # Nothing here waits for Spark or a peer: a refusal is as quick as a Python start.
        assert took < REFUSED_WITHIN_S, (mistake.args, took)


def test_serve_on_a_port_in_use_names_the_likely_holder_and_what_to_change(served, tmp_path):
    out = tfcoord("serve", "--plaintext", "--port", str(served.port), env=served.env, cwd=tmp_path)
    one_line(
        out,
        USAGE,
        f"cannot listen on 127.0.0.1:{served.port}",
        "address already in use",
        "a running tfcoord serve?",
        "pick another --port",
    )


def test_logs_into_a_pipe_closed_early_exits_quietly(served):
    """`tfcoord logs JOB | head -1`: the reader goes away; no BrokenPipeError, nothing on stderr."""
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), name="chatty"))
        with NodeClient(served.address, d.job_token(job), job, 0).connect() as n:
            n.register("127.0.0.1", 2222)
            for batch in range(8):  # more than a pipe's 64 KiB buffer
                n.send_logs("stdout", [f"line {batch}.{i} " + "x" * 100 for i in range(250)])
            proc = subprocess.Popen(
                [*TFCOORD, "logs", job], env=served.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline().startswith(b"worker:0 | line 0.0")
            proc.stdout.close()  # as head does once it has its line
            err = proc.stderr.read().decode()
            assert proc.wait(timeout=60) == ExitCode.PIPE_CLOSED, err
            proc.stderr.close()
    assert err == ""


def test_status_without_the_admin_secret_says_what_it_is_where_serve_wrote_it_and_what_to_run(served):
    env = dict(served.env)  # the coordinator secret alone, as a driver's user has it
    env.pop("TFCOORD_ADMIN_SECRET_FILE", None)
    assert (served.secret_file.parent / "secret.admin").exists()
    lonely = served.secret_file.parent / "only" / "secret"
    lonely.parent.mkdir(exist_ok=True)
    lonely.write_bytes(served.secret_file.read_bytes())
    lonely.chmod(0o600)
    env["TFCOORD_SECRET_FILE"] = str(lonely)
    line = one_line(
        tfcoord("status", env=env),
        USAGE,
        f"no admin secret at {lonely}.admin",
        "the secret file's name + .admin",
        "apart from the coordinator secret",
        "sees and stops every job",
        "`tfcoord serve` wrote it beside its secret file, as SECRET_FILE.admin",
        "--admin-secret-file",
        "`tfcoord submit` that runs it",
        "with no --address `tfcoord status` finds",
    )
    assert "\n" not in line


def _popen(*args: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], Lines, Lines]:
    """The CLI started, with its stdout and stderr read as they come."""
    proc = subprocess.Popen(
        [*TFCOORD, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,  # the tests interrupt it as Ctrl-C does
    )
    return proc, Lines(proc.stdout), Lines(proc.stderr)  # type: ignore[arg-type]


def _finish(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> int:
    """The process's exit status; killed if it has not exited within ``timeout_s``."""
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("command", ["status", "logs"])
def test_ctrl_c_while_following_a_job_is_one_line_and_exit_130(served, command):
    """`tfcoord status JOB --follow` / `logs JOB --follow`, interrupted once they print: the
    watching ends with one line; the job, which this command does not run, goes on."""
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1), name="watched"))
        with NodeClient(served.address, d.job_token(job), job, 0).connect() as n:
            n.register("127.0.0.1", 2222)
            n.send_logs("stdout", ["started"])
            proc, out, err = _popen(command, job, "--follow", env=served.env)
            out.wait_for("worker:0 . started" if command == "logs" else f"job {job} READY")
            proc.send_signal(signal.SIGINT)  # as Ctrl-C does
            code = _finish(proc)
            one_line(
                subprocess.CompletedProcess(proc.args, code, "", err.text()),
                ExitCode.INTERRUPTED,
                f"interrupted: stopped following job {job}",
                f"tfcoord stop {job}",
            )
            assert not d.status(job).terminal


def test_ctrl_c_under_the_local_engine_stops_the_job_and_exits_130(served):
    proc, _, err = _popen(
        "submit",
        "--engine",
        "local",
        "--workers",
        "2",
        "--",
        "python",
        "-c",
        "import time; time.sleep(600)",
        env=served.env,
    )
    job = re.search(r"job (\S+) RUNNING", err.wait_for(r"job \S+ RUNNING")).group(1)  # type: ignore[union-attr]
    proc.send_signal(signal.SIGINT)
    assert _finish(proc) == ExitCode.INTERRUPTED, err.text()
    assert err.text().strip().splitlines()[-1] == f"tfcoord: interrupted: job {job} STOPPED", err.text()
    assert "Traceback" not in err.text()
    status = tfcoord("status", job, env=served.env)
    assert status.stdout.startswith(f"job {job} STOPPED"), status.stdout + status.stderr


def test_a_stopped_job_exits_4_and_a_failed_one_1(served):
    proc, _, err = _popen(
        "submit", "--engine", "local", "--", "python", "-c", "import time; time.sleep(600)", env=served.env
    )
    job = re.search(r"job (\S+) RUNNING", err.wait_for(r"job \S+ RUNNING")).group(1)  # type: ignore[union-attr]
    assert tfcoord("stop", job, env=served.env).returncode == 0
    assert _finish(proc) == ExitCode.STOPPED, err.text()
    failed = tfcoord(
        "submit", "--engine", "local", "--", "python", "-c", "raise SystemExit(3)", env=served.env
    )
    assert failed.returncode == ExitCode.FAILED, failed.stderr
