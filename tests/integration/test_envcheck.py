"""``tfcoord env-check``: each check against a made-up machine (fake ``java`` and
``nvidia-smi`` programs on a private PATH, fake Spark directories), and the coordinator
check against a real coordinator."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfcoord import envcheck as ec
from tfcoord.client import auth, tls
from tfcoord.coordinator.embedded import EmbeddedCoordinator

from .pki import Pki, have_openssl

LINE = re.compile(r"(OK|WARN|FAIL) [^:]+: .+")
#: A plaintext client waits this long for a TLS coordinator's challenge in these tests
#: (env-check's own default, COORDINATOR_TIMEOUT_S, allows a loaded network more).
SILENT_S = 1.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if not have_openssl():
        pytest.skip("the openssl command makes the test certificates")
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_coord(pki: Pki) -> Iterator[EmbeddedCoordinator]:
    coord = EmbeddedCoordinator(ssl_context=tls.server_context(pki.server.cert, pki.server.key)).start()
    try:
        yield coord
    finally:
        coord.stop()


def fake_program(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def machine(tmp_path: Path, **programs: str) -> dict[str, str]:
    """An environment whose PATH holds only the given fake programs (and /bin for sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, script in programs.items():
        fake_program(bin_dir, name.replace("_", "-"), script)
    return {"PATH": str(bin_dir)}


def by_check(results: list[ec.Result]) -> dict[str, ec.Result]:
    return {r.check: r for r in results}


def test_result_lines():
    assert ec.Result("OK", "java", "Java 17").line() == "OK java: Java 17"
    assert (
        ec.Result("FAIL", "java", "missing", "install a JDK").line()
        == "FAIL java: missing [fix: install a JDK]"
    )


def test_python_version():
    assert ec.check_python((3, 11, 7)).status == "OK"
    old = ec.check_python((3, 9, 1))
    assert old.status == "FAIL" and "3.11" in old.fix


def test_packages_required_fail_optional_warn():
    installed = {
        "msgpack": "1.0.8",
        "aiohttp": "3.9.5",
        "prometheus-client": "0.20.0",
        "tensorflow-cpu": "2.21.0",
        "tensorboard": "2.20.0",
    }
    got = by_check(ec.check_packages(installed.get))
    assert got["package msgpack"].status == "OK" and got["package pyspark"].status == "WARN"
    assert got["package tensorflow"].detail == "2.21.0 (tensorflow-cpu)"
    assert got["package tensorboard"].status == "WARN" and "2.21" in got["package tensorboard"].fix
    del installed["aiohttp"]
    assert by_check(ec.check_packages(installed.get))["package aiohttp"].status == "FAIL"


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.9" 2023-10-17', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("no version here", None),
    ],
)
def test_java_version_parsing(text, major):
    assert ec.parse_java_version(text) == major


def test_java_against_the_spark_version(tmp_path):
    env = machine(tmp_path, java="echo 'openjdk version \"11.0.2\" 2019-01-15' >&2")
    got = by_check(ec.check_java(env, "4.0.1"))
    assert got["java"].status == "FAIL" and "needs Java 17" in got["java"].detail
    assert got["JAVA_HOME"].status == "WARN"
    assert by_check(ec.check_java(env, "3.5.1"))["java"].status == "OK"
    jdk = tmp_path / "jdk"
    fake_program(jdk / "bin", "java", "echo 'openjdk version \"17.0.9\"' >&2")
    got = by_check(ec.check_java({"PATH": "", "JAVA_HOME": str(jdk)}, "4.0.1"))
    assert got["JAVA_HOME"].status == "OK" and got["java"].status == "OK"
    broken = by_check(ec.check_java({"PATH": "", "JAVA_HOME": str(tmp_path / "nowhere")}, None))
    assert broken["JAVA_HOME"].status == "FAIL" and "java" not in broken
    # No Java and no Spark: only a warning, Java is needed only for Spark.
    assert by_check(ec.check_java({"PATH": str(tmp_path / "empty")}, None))["java"].status == "WARN"
    assert by_check(ec.check_java({"PATH": str(tmp_path / "empty")}, "4.0.1"))["java"].status == "FAIL"


def test_spark_home(tmp_path):
    assert ec.check_spark({}, "4.0.1")[0].status == "OK"
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    assert ec.check_spark({"SPARK_HOME": str(home)}, "4.0.1")[0].status == "FAIL"
    fake_program(home / "bin", "spark-submit", "exit 0")
    (home / "jars" / "spark-core_2.13-3.5.1.jar").write_bytes(b"")
    mismatch = ec.check_spark({"SPARK_HOME": str(home)}, "4.0.1")[0]
    assert mismatch.status == "WARN" and "pyspark==3.5.1" in mismatch.fix
    assert ec.check_spark({"SPARK_HOME": str(home)}, "3.5.0")[0].status == "OK"


def test_gpus_through_nvidia_smi(tmp_path):
    absent = ec.check_gpus({"PATH": str(tmp_path / "empty")})
    assert absent.status == "WARN" and "CPU" in absent.detail
    two = machine(
        tmp_path, nvidia_smi='echo "0, GPU-aaa, 81559, 0, 81559"; echo "1, GPU-bbb, 81559, 10, 81549"'
    )
    ok = ec.check_gpus({**two, "CUDA_VISIBLE_DEVICES": "1"})
    assert ok.status == "OK" and "2 GPU(s)" in ok.detail and "GPU-bbb" in ok.detail
    assert "CUDA_VISIBLE_DEVICES=1" in ok.detail
    failing = machine(
        tmp_path, nvidia_smi="echo 'NVIDIA-SMI has failed because it could not communicate' >&2; exit 9"
    )
    bad = ec.check_gpus(failing)
    assert bad.status == "WARN" and "exited 9" in bad.detail and "communicate" in bad.detail


def test_every_warning_says_what_to_do(tmp_path, monkeypatch):
    """Each WARN branch carries a fix: the report is for people who will act on it."""
    warnings = []
    broken = tmp_path / "broken"  # exec fails: the interpreter it names does not exist
    fake_program(broken, "nvidia-smi", "exit 0")
    (broken / "nvidia-smi").write_text("#!/nonexistent/interpreter\n")
    unrunnable = ec.check_gpus({"PATH": str(broken)})
    assert unrunnable.detail.startswith("cannot run") and unrunnable.fix
    warnings.append(unrunnable)
    for name in ("garbage", "none"):
        (tmp_path / name).mkdir()
    garbage = ec.check_gpus(machine(tmp_path / "garbage", nvidia_smi="echo 'not, csv'"))
    assert "expected 5 fields" in garbage.detail and "driver" in garbage.fix
    warnings.append(garbage)
    none = ec.check_gpus(machine(tmp_path / "none", nvidia_smi="exit 0"))
    assert "lists no GPU" in none.detail and "nvidia-smi -L" in none.fix
    warnings.append(none)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.python.worker.reuse true\n")

    def unreadable(path: Path) -> dict[str, str]:  # root reads any file, whatever its mode
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(ec, "read_spark_defaults", unreadable)
    reuse = by_check(ec.check_background({"SPARK_CONF_DIR": str(conf)}, "linux"))["spark.python.worker.reuse"]
    assert reuse.detail.startswith("cannot read") and "readable" in reuse.fix
    warnings.append(reuse)
    monkeypatch.undo()
    warnings += ec.run_checks({"PATH": str(tmp_path / "empty")}, platform="win32")
    warnings += ec.check_packages(lambda dist: {"tensorflow": "2.21.0", "tensorboard": "2.20.1"}.get(dist))
    warnings += ec.check_java({"PATH": str(tmp_path / "empty")}, "4.0.1")
    assert all(w.status == "WARN" for w in warnings[:4])
    silent = [w.line() for w in warnings if w.status == "WARN" and not w.fix]
    assert silent == []


def test_background_mode_prerequisites(tmp_path):
    windows = by_check(ec.check_background({}, "win32"))["background mode"]
    assert windows.status == "WARN" and "no fork" in windows.detail and "Linux" in windows.fix
    conf = tmp_path / "conf"
    conf.mkdir()
    env = {"SPARK_CONF_DIR": str(conf)}
    assert by_check(ec.check_background(env, "linux"))["spark.python.worker.reuse"].status == "OK"
    (conf / "spark-defaults.conf").write_text(
        "# defaults\nspark.master  spark://m:7077\nspark.python.worker.reuse   false\n"
    )
    reuse = by_check(ec.check_background(env, "linux"))["spark.python.worker.reuse"]
    assert reuse.status == "OK" and reuse.detail.startswith("false in") and "over TCP" in reuse.detail
    (conf / "spark-defaults.conf").write_text("spark.python.worker.reuse=true\n")
    assert by_check(ec.check_background(env, "linux"))["spark.python.worker.reuse"].status == "OK"


def test_coordinator_reachability_and_authentication(coordinator, tmp_path):
    assert ec.check_coordinator(None, None).status == "OK"
    assert ec.check_coordinator("no-port", None).status == "FAIL"
    good = tmp_path / "good"
    auth.write_secret(good, coordinator.secret)
    ok = ec.check_coordinator(coordinator.address, str(good))
    assert ok.status == "OK" and "authenticated" in ok.detail
    assert ec.check_coordinator(coordinator.address, None).status == "WARN"
    wrong = tmp_path / "wrong"
    auth.write_secret(wrong)
    refused = ec.check_coordinator(coordinator.address, str(wrong))
    assert refused.status == "FAIL" and "refused our secret" in refused.detail
    loose = tmp_path / "loose"
    auth.write_secret(loose, coordinator.secret)
    loose.chmod(0o644)
    assert "chmod 600" in ec.check_coordinator(coordinator.address, str(loose)).detail


def test_an_unreachable_coordinator_fails_with_the_fix():
    # A bound socket that never listens: connections to its port are refused, and no other
    # process can take the port while the test holds it.
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{bound.getsockname()[1]}"
        down = ec.check_coordinator(address, None)
    assert down.status == "FAIL" and down.detail.startswith(f"{address} is not reachable")
    assert "start tfcoord serve there" in down.fix


def test_the_coordinator_check_speaks_tls_to_a_tls_coordinator(pki, tls_coord, tmp_path):
    secret = tmp_path / "secret"
    auth.write_secret(secret, tls_coord.secret)
    ctx = tls.client_context(pki.ca.cert)
    ok = ec.check_coordinator(tls_coord.address, str(secret), ctx)
    assert ok.status == "OK" and "over TLS and authenticated" in ok.detail
    plain = ec.check_coordinator(tls_coord.address, str(secret), timeout_s=SILENT_S)
    assert plain.status == "FAIL" and "sent no challenge" in plain.detail
    assert plain.fix.startswith("the coordinator serves TLS and this client speaks plaintext")
    untrusted = ec.check_coordinator(
        tls_coord.address, str(secret), tls.client_context(pki.other_ca.cert), timeout_s=SILENT_S
    )
    assert untrusted.status == "FAIL" and "does not trust" in untrusted.detail
    assert "a certificate was refused" in untrusted.fix
    bad = ec.check_coordinator(tls_coord.address, str(secret), tls_problem="TLS CA file /x does not exist")
    assert bad.status == "FAIL" and "/x does not exist" in bad.detail and "TFCOORD_TLS_CA" in bad.fix


def test_the_coordinator_check_tells_a_tls_client_the_coordinator_is_plaintext(pki, coordinator, tmp_path):
    secret = tmp_path / "secret"
    auth.write_secret(secret, coordinator.secret)
    got = ec.check_coordinator(
        coordinator.address, str(secret), tls.client_context(pki.ca.cert), timeout_s=SILENT_S
    )
    assert got.status == "FAIL" and "does not speak TLS" in got.detail
    assert got.fix.startswith("the coordinator serves plaintext and this client speaks TLS")


def _env_check(env: dict[str, str]) -> tuple[int, dict[str, str]]:
    out = subprocess.run(
        [sys.executable, "-m", "tfcoord", "env-check"], env=env, capture_output=True, text=True, timeout=120
    )
    lines = out.stdout.splitlines()
    assert lines and all(LINE.fullmatch(ln) for ln in lines), out.stdout + out.stderr
    return out.returncode, {ln.split(":")[0].split(" ", 1)[1]: ln for ln in lines}


def test_env_check_command_uses_the_tls_client_settings(pki, tls_coord, tmp_path):
    """TFCOORD_TLS_* reach the coordinator check, as they reach status and stop."""
    secret = tmp_path / "secret"
    auth.write_secret(secret, tls_coord.secret)
    env = dict(
        os.environ,
        TFCOORD_ADDRESS=tls_coord.address,
        TFCOORD_SECRET_FILE=str(secret),
        TFCOORD_TLS_CA=str(pki.ca.cert),
    )
    for name in ("TFCOORD_TLS_CERT", "TFCOORD_TLS_KEY"):
        env.pop(name, None)
    _, lines = _env_check(env)
    assert lines["coordinator"].startswith(f"OK coordinator: {tls_coord.address} reachable over TLS")
    # A TLS setting the CLI cannot use is one FAIL line, not an exit before the report.
    code, lines = _env_check(dict(env, TFCOORD_TLS_CERT=str(pki.client.cert)))
    assert code == 1 and lines["coordinator"].startswith("FAIL coordinator: TLS client settings:")
    assert "give both" in lines["coordinator"] and "python" in lines


def test_env_check_command(coordinator, tmp_path):
    wrong = tmp_path / "wrong"
    auth.write_secret(wrong)
    env = dict(os.environ, TFCOORD_ADDRESS=coordinator.address, TFCOORD_SECRET_FILE=str(wrong))
    out = subprocess.run(
        [sys.executable, "-m", "tfcoord", "env-check"], env=env, capture_output=True, text=True, timeout=120
    )
    lines = out.stdout.splitlines()
    assert lines and all(LINE.fullmatch(ln) for ln in lines), out.stdout
    assert any(ln.startswith("FAIL coordinator:") for ln in lines) and out.returncode == 1
    checks = {ln.split(":")[0].split(" ", 1)[1] for ln in lines}
    assert {
        "python",
        "package tfcoord",
        "package aiohttp",
        "package tensorflow",
        "java",
        "SPARK_HOME",
        "gpus",
        "background mode",
        "spark.python.worker.reuse",
        "coordinator",
    } <= checks
