"""``tfcoord env-check``: is this machine ready for distributed TensorFlow work?

It covers what TensorFlowOnSpark's ``tfos_cluster_env_check.py`` checks, plus the
coordinator: Python and package versions, Java and Spark, GPU visibility through
``nvidia-smi``, the prerequisites of background mode (data fed by Spark into a
TensorFlow process that a Python worker started), and whether the configured
coordinator answers (over TLS when the CLI was given TFCOORD_TLS_*) and accepts our
secret. Each check gives one line,
``OK|WARN|FAIL <check>: <detail> [fix: ...]``; a FAIL means work here will not run.

Checks take the environment as an argument (the CLI passes ``os.environ``), look for
programs on *that* ``PATH``, and never import TensorFlow or pyspark (package versions
come from their metadata): the check stays fast, and a broken install is reported
rather than crashing the check.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tfcoord.client import __version__

OK, WARN, FAIL = "OK", "WARN", "FAIL"

#: The oldest Python tfcoord supports (pyproject's requires-python).
MIN_PYTHON = (3, 11)
#: ``java -version`` starts a JVM: well under a second, a few on a loaded host.
JAVA_TIMEOUT_S = 30.0
#: nvidia-smi initialises every GPU without persistence mode; a wedged driver hangs.
NVIDIA_SMI_TIMEOUT_S = 30.0
#: Reaching the coordinator: a LAN answers in milliseconds; a silent firewall would
#: otherwise hold the check for the client's full retry budget.
COORDINATOR_TIMEOUT_S = 5.0

#: Needed by every tfcoord process that imports the coordinator or the client.
REQUIRED_PACKAGES = ("msgpack", "aiohttp", "prometheus-client")
#: TensorFlow ships under several distribution names; the first one installed counts.
TENSORFLOW_DISTS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-macos",
    "intel-tensorflow",
    "tf-nightly",
    "tf-nightly-cpu",
)
#: Spark 4 runs on Java 17 or 21; Spark 3.x on 8, 11 and 17.
MIN_JAVA_FOR_SPARK = {4: 17, 3: 8}


@dataclass(frozen=True)
class Result:
    """One line of the report."""

    status: str  # OK, WARN or FAIL
    check: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status} {self.check}: {self.detail}" + (f" [fix: {self.fix}]" if self.fix else "")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _major_minor(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _which(program: str, env: Mapping[str, str]) -> str | None:
    return shutil.which(program, path=env.get("PATH", os.defpath))


def _run(cmd: Sequence[str], env: Mapping[str, str], timeout_s: float) -> tuple[int, str]:
    """Run a program; returns (exit code, stdout+stderr). Raises OSError or TimeoutExpired."""
    proc = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout_s, env=dict(env), check=False
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


# -- Python and packages ------------------------------------------------------------------


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Result:
    shown = ".".join(map(str, version))
    if tuple(version[:2]) < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return Result(FAIL, "python", f"{shown} ({sys.executable})", f"use Python {need} or newer")
    return Result(OK, "python", f"{shown} ({sys.executable})")


def check_packages(version: Callable[[str], str | None] = _version) -> list[Result]:
    out = [Result(OK, "package tfcoord", __version__)]
    for dist in REQUIRED_PACKAGES:
        v = version(dist)
        out.append(
            Result(OK, f"package {dist}", v)
            if v
            else Result(FAIL, f"package {dist}", "not installed", f"pip install 'tfcoord=={__version__}'")
        )
    spark = version("pyspark")
    out.append(
        Result(OK, "package pyspark", spark)
        if spark
        else Result(
            WARN,
            "package pyspark",
            "not installed (needed only to run jobs on Spark)",
            "pip install 'tfcoord[spark]'",
        )
    )
    tf = next(((d, v) for d in TENSORFLOW_DISTS if (v := version(d))), None)
    out.append(
        Result(OK, "package tensorflow", f"{tf[1]} ({tf[0]})")
        if tf
        else Result(
            WARN,
            "package tensorflow",
            "not installed (needed where nodes run TensorFlow)",
            "pip install 'tfcoord[tensorflow]'",
        )
    )
    tb = version("tensorboard")
    if not tb:
        out.append(
            Result(
                WARN,
                "package tensorboard",
                "not installed (needed only with tensorboard=True)",
                "pip install tensorboard (the version matching TensorFlow)",
            )
        )
    elif tf and _major_minor(tb) != _major_minor(tf[1]):
        out.append(
            Result(
                WARN,
                "package tensorboard",
                f"{tb} does not match TensorFlow {tf[1]}",
                f"pip install 'tensorboard=={'.'.join(map(str, _major_minor(tf[1]) or ()))}.*'",
            )
        )
    else:
        out.append(Result(OK, "package tensorboard", tb))
    return out


# -- Java and Spark -----------------------------------------------------------------------


def parse_java_version(text: str) -> int | None:
    """The major version from ``java -version`` output ("1.8.0_392" is 8, "17.0.9" is 17)."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def check_java(env: Mapping[str, str], spark_version: str | None) -> list[Result]:
    spark_major = (_major_minor(spark_version) or (0, 0))[0] if spark_version else None
    need = MIN_JAVA_FOR_SPARK.get(spark_major or 0, 17) if spark_major else None
    missing = FAIL if spark_version else WARN
    out: list[Result] = []
    java_home = env.get("JAVA_HOME", "")
    java: str | None
    if java_home:
        java = str(Path(java_home) / "bin" / "java")
        if not os.access(java, os.X_OK):
            out.append(
                Result(
                    FAIL,
                    "JAVA_HOME",
                    f"{java_home} has no bin/java",
                    "point JAVA_HOME at a JDK directory (the one holding bin/java)",
                )
            )
            return out
        out.append(Result(OK, "JAVA_HOME", java_home))
    else:
        java = _which("java", env)
        out.append(
            Result(
                WARN if spark_version else OK,
                "JAVA_HOME",
                "not set" + (f"; Spark will use {java}" if java else ""),
                "export JAVA_HOME=<JDK directory> so the driver and executors use the same JDK"
                if spark_version
                else "",
            )
        )
    if not java:
        out.append(
            Result(
                missing,
                "java",
                "not found on PATH" + ("" if spark_version else " (needed only for Spark)"),
                "install a JDK (17 for Spark 4) and set JAVA_HOME",
            )
        )
        return out
    try:
        code, text = _run([java, "-version"], env, JAVA_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        out.append(Result(missing, "java", f"{java} -version failed: {e}", "reinstall the JDK"))
        return out
    major = parse_java_version(text)
    first = text.splitlines()[0] if text else ""
    if code != 0 or major is None:
        out.append(
            Result(missing, "java", f"{java} -version exited {code}: {first[:120]}", "reinstall the JDK")
        )
    elif need and major < need:
        out.append(
            Result(
                FAIL,
                "java",
                f"Java {major} ({java}); Spark {spark_version} needs Java {need}+",
                f"install JDK {need} or newer and point JAVA_HOME at it",
            )
        )
    else:
        out.append(Result(OK, "java", f"Java {major} ({java})"))
    return out


def _spark_home_version(spark_home: Path) -> str | None:
    for jar in sorted((spark_home / "jars").glob("spark-core_*.jar")):
        found = re.search(r"spark-core_[\d.]+-(\d+\.\d+\.\d+)", jar.name)
        if found:
            return found.group(1)
    return None


def check_spark(env: Mapping[str, str], spark_version: str | None) -> list[Result]:
    spark_home = env.get("SPARK_HOME", "")
    if not spark_home:
        if spark_version:
            return [Result(OK, "SPARK_HOME", f"not set; pyspark {spark_version} uses the Spark it bundles")]
        return [Result(OK, "SPARK_HOME", "not set (Spark is not used here)")]
    home = Path(spark_home)
    if not (home / "bin" / "spark-submit").exists() and not (home / "bin" / "spark-class").exists():
        return [
            Result(
                FAIL,
                "SPARK_HOME",
                f"{home} has no bin/spark-submit",
                "point SPARK_HOME at a Spark distribution, or unset it to use pyspark's own",
            )
        ]
    found = _spark_home_version(home)
    if found and spark_version and _major_minor(found) != _major_minor(spark_version):
        return [
            Result(
                WARN,
                "SPARK_HOME",
                f"{home} is Spark {found} but pyspark is {spark_version}",
                f"pip install 'pyspark=={found}' (driver and cluster must agree)",
            )
        ]
    return [Result(OK, "SPARK_HOME", f"{home}" + (f" (Spark {found})" if found else ""))]


# -- GPUs ---------------------------------------------------------------------------------


def check_gpus(env: Mapping[str, str]) -> Result:
    from tfcoord.node.gpus import GPU_QUERY, GpuUnavailable, parse_gpus

    smi = _which("nvidia-smi", env)
    if not smi:
        return Result(
            WARN,
            "gpus",
            "nvidia-smi not found: nodes here run on the CPU",
            "install the NVIDIA driver (it brings nvidia-smi) if this host has GPUs",
        )
    try:
        code, text = _run([smi, *GPU_QUERY], env, NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Result(
            WARN,
            "gpus",
            f"{smi} did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s (hung driver?)",
            "check the driver (dmesg), or enable persistence mode: nvidia-smi -pm 1",
        )
    except OSError as e:
        return Result(
            WARN,
            "gpus",
            f"cannot run {smi}: {e}",
            f"make {smi} executable by this user, or reinstall the NVIDIA driver that ships it",
        )
    if code != 0:
        return Result(
            WARN,
            "gpus",
            f"{smi} exited {code}: {text.splitlines()[0][:160] if text else ''}",
            "check that the NVIDIA driver is loaded and this user may use the GPUs",
        )
    try:
        gpus = parse_gpus(text)
    except GpuUnavailable as e:
        return Result(
            WARN,
            "gpus",
            str(e),
            f"update the NVIDIA driver: this {smi} prints a format tfcoord "
            "cannot read; until then nodes here run on the CPU",
        )
    if not gpus:
        return Result(
            WARN,
            "gpus",
            f"{smi} lists no GPU: nodes here run on the CPU",
            "nothing to do on a CPU host; on a GPU host check that the driver is loaded "
            "(nvidia-smi -L, dmesg) and that no cgroup hides the devices",
        )
    visible = env.get("CUDA_VISIBLE_DEVICES")
    shown = ", ".join(f"{g.index}:{g.uuid}" for g in gpus)
    return Result(
        OK,
        "gpus",
        f"{len(gpus)} GPU(s) visible ({shown})"
        + (f"; CUDA_VISIBLE_DEVICES={visible}" if visible is not None else ""),
    )


# -- background mode ----------------------------------------------------------------------


def read_spark_defaults(path: Path) -> dict[str, str]:
    """Parse spark-defaults.conf: ``key value`` (or ``key=value``) lines, ``#`` comments."""
    conf: dict[str, str] = {}
    for raw in path.read_text(errors="replace").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        found = re.match(r"([^\s=:]+)\s*[=:\s]\s*(.*)", line)
        if found:
            conf[found.group(1)] = found.group(2).strip()
    return conf


def check_background(env: Mapping[str, str], platform: str = sys.platform) -> list[Result]:
    out = []
    if platform.startswith("win"):
        out.append(
            Result(
                WARN,
                "background mode",
                "Windows: the tfcoord node supervisor forks map_fun "
                "into a child process (to stop it the moment the coordinator says so), and "
                "Windows has no fork; neither input mode runs on Windows executors",
                "run the Spark executors on Linux",
            )
        )
    else:
        out.append(Result(OK, "background mode", f"{platform} can run TensorFlow beside the Spark worker"))
    conf_dir = env.get("SPARK_CONF_DIR") or (
        str(Path(env["SPARK_HOME"]) / "conf") if env.get("SPARK_HOME") else ""
    )
    defaults = Path(conf_dir) / "spark-defaults.conf" if conf_dir else None
    if defaults is None or not defaults.is_file():
        out.append(
            Result(OK, "spark.python.worker.reuse", "no spark-defaults.conf; Spark's default (true) applies")
        )
        return out
    try:
        value = read_spark_defaults(defaults).get("spark.python.worker.reuse")
    except OSError as e:
        out.append(
            Result(
                WARN,
                "spark.python.worker.reuse",
                f"cannot read {defaults}: {e}",
                f"make {defaults} readable by this user (Spark reads it too)",
            )
        )
        return out
    if value is None:
        out.append(Result(OK, "spark.python.worker.reuse", f"not set in {defaults} (default true)"))
    elif value.lower() == "true":
        out.append(Result(OK, "spark.python.worker.reuse", f"true in {defaults}"))
    else:
        # TensorFlowOnSpark needs reuse on (its feeders find TensorFlow through the Python worker
        # that started it); tfcoord's feeders connect to the node's feed port over TCP instead.
        out.append(
            Result(
                OK,
                "spark.python.worker.reuse",
                f"{value} in {defaults}: tfcoord does not need "
                "reused Python workers (feeding goes over TCP to the node); each task then "
                "pays a Python worker start",
            )
        )
    return out


# -- the coordinator ----------------------------------------------------------------------


#: The fix when a plaintext client dials a coordinator that waits for a TLS handshake.
_FIX_NEEDS_TLS = (
    "the coordinator serves TLS and this client speaks plaintext: set TFCOORD_TLS_CA to the "
    "CA file that signed its --tls-cert (and TFCOORD_TLS_CERT/TFCOORD_TLS_KEY if it was "
    "started with --tls-ca)"
)
#: The fix when a TLS client dials a coordinator that answers in plaintext.
_FIX_NO_TLS = (
    "the coordinator serves plaintext and this client speaks TLS: unset TFCOORD_TLS_CA, "
    "TFCOORD_TLS_CERT and TFCOORD_TLS_KEY, or restart the coordinator with --tls-cert and --tls-key"
)


def _speaks_plaintext(host: str, port: int, timeout_s: float) -> bool:
    """Whether the service at host:port speaks first, as a plaintext coordinator does (its
    challenge). A TLS coordinator stays silent, waiting for our TLS handshake."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            return bool(sock.recv(1))
    except OSError:  # silent until the deadline, or closed on us: not a plaintext coordinator
        return False


def check_coordinator(
    address: str | None,
    secret_file: str | None,
    ssl_context: ssl.SSLContext | None = None,
    *,
    tls_problem: str | None = None,
    timeout_s: float = COORDINATOR_TIMEOUT_S,
) -> Result:
    """Whether the coordinator at ``address`` answers and accepts the secret in ``secret_file``.

    Args:
        ssl_context: the client TLS context (from TFCOORD_TLS_*); None dials plaintext.
        tls_problem: why the CLI could not build that context; reported as a FAIL.
        timeout_s: how long to wait for the connection and for the coordinator's challenge.
    """
    from tfcoord.client import DriverClient, TfcoordError, TlsError, auth
    from tfcoord.client.client import parse_address
    from tfcoord.client.errors import AuthenticationFailed

    if not address:
        return Result(
            OK,
            "coordinator",
            "no address configured (TFCOORD_ADDRESS): drivers start an embedded coordinator",
        )
    try:
        host, port = parse_address(address)
    except ValueError as e:
        return Result(FAIL, "coordinator", str(e), "set TFCOORD_ADDRESS=HOST:PORT")
    if tls_problem is not None:
        return Result(
            FAIL,
            "coordinator",
            f"TLS client settings: {tls_problem}",
            "fix TFCOORD_TLS_CA, TFCOORD_TLS_CERT and TFCOORD_TLS_KEY, or unset all three "
            "for a coordinator that serves plaintext",
        )
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return Result(
            FAIL,
            "coordinator",
            f"{address} is not reachable: {e}",
            "start tfcoord serve there, or fix the address and the firewall",
        )
    if not secret_file:
        return Result(
            WARN,
            "coordinator",
            f"{address} is reachable; authentication not checked (no secret file)",
            "set TFCOORD_SECRET_FILE to the coordinator's secret file",
        )
    try:
        secret = auth.read_secret(secret_file)
    except (OSError, ValueError) as e:
        return Result(FAIL, "coordinator", f"secret file: {e}", "fix the secret file (TFCOORD_SECRET_FILE)")
    try:
        # As a driver (the secret is a driver's credential): it sees only its own jobs, none.
        with DriverClient(
            address,
            secret,
            ssl_context=ssl_context,
            connect_deadline_s=timeout_s,
            challenge_timeout_s=timeout_s,
        ) as c:
            c.jobs()
    except AuthenticationFailed as e:
        return Result(
            FAIL,
            "coordinator",
            f"{address} refused our secret: {e}",
            "use the secret file of the coordinator at that address",
        )
    except TlsError as e:
        # A plaintext client learns only that the coordinator stayed silent; a TLS client's
        # handshake can fail for several reasons, so ask the coordinator whether it speaks first.
        if ssl_context is None:
            fix = _FIX_NEEDS_TLS
        elif _speaks_plaintext(host, port, timeout_s):
            fix = _FIX_NO_TLS
        else:
            fix = (
                "both sides speak TLS but a certificate was refused: TFCOORD_TLS_CA must name the CA that "
                "signed the coordinator's --tls-cert, and for mutual TLS TFCOORD_TLS_CERT/TFCOORD_TLS_KEY "
                "a certificate signed by its --tls-ca"
            )
        return Result(FAIL, "coordinator", f"{address}: {e}", fix)
    except (TfcoordError, OSError) as e:
        return Result(
            FAIL, "coordinator", f"{address}: {e}", "check that the address is a tfcoord coordinator"
        )
    over = " over TLS" if ssl_context is not None else ""
    return Result(OK, "coordinator", f"{address} reachable{over} and authenticated")


def check_aliases() -> list[Result]:
    """Which ``tensorflowonspark`` / ``tfmesos2`` an ``import`` gives here (tfcoord.aliases)."""
    from tfcoord import aliases

    out = []
    for top in aliases.ALIASES:
        detail = aliases.describe(top).partition(": ")[2]
        if aliases.real_location(top) is not None or aliases.installed():
            out.append(Result(OK, f"import {top}", detail))
        else:
            out.append(
                Result(
                    WARN,
                    f"import {top}",
                    "not importable on this driver (executors get tfcoord's alias from TFCluster.run)",
                    "pip install ./aliases, or run under tfcoord submit",
                )
            )
    return out


def run_checks(
    env: Mapping[str, str],
    *,
    address: str | None = None,
    secret_file: str | None = None,
    platform: str = sys.platform,
    ssl_context: ssl.SSLContext | None = None,
    tls_problem: str | None = None,
    timeout_s: float = COORDINATOR_TIMEOUT_S,
) -> list[Result]:
    """Every check, in report order. ``ssl_context``, ``tls_problem`` and ``timeout_s``: see
    :func:`check_coordinator`."""
    spark = _version("pyspark")
    return [
        check_python(),
        *check_packages(),
        *check_java(env, spark),
        *check_spark(env, spark),
        check_gpus(env),
        *check_background(env, platform),
        *check_aliases(),
        check_coordinator(address, secret_file, ssl_context, tls_problem=tls_problem, timeout_s=timeout_s),
    ]
