"""What ``spark-submit`` takes, checked before Spark starts: the master URL and the flags.

``tfcoord submit --engine spark`` is a Spark driver in its own process: it hands Spark the
same arguments ``spark-submit`` would (``PYSPARK_SUBMIT_ARGS``, read by pyspark when it
launches the JVM). Starting that JVM takes seconds and a mistake then surfaces as pages of
Java; so the master URL is parsed here first (a typo is named with the URL it resembles),
a standalone master is dialled with a short deadline (an address where nothing listens is
one line, not a minute of retries), and the files to ship are checked to exist.
"""

from __future__ import annotations

import difflib
import re
import shlex
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: tfcoord's own master: a standalone master and worker started on this machine for the job.
LOCAL_STANDALONE = "local-standalone"
#: A standalone master answers a TCP connection at once; one that has not within this long
#: is not there (Spark itself would retry its registration for a minute, then give up).
MASTER_CONNECT_TIMEOUT_S = 2.0
#: The forms of master URL Spark 4 accepts (``SparkContext.createTaskScheduler``).
_MASTER_FORMS = (
    re.compile(r"local(\[(\d+|\*)(\s*,\s*\d+)?\])?"),
    re.compile(r"local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]"),
    re.compile(r"spark://\S+"),
    re.compile(r"yarn"),
    re.compile(r"k8s://\S+"),
)
_KNOWN = ("spark://", "k8s://", "local", "local-cluster[", "yarn", LOCAL_STANDALONE)
#: What --deploy-mode may say (spark-submit's values).
DEPLOY_MODES = ("client", "cluster")
#: Spark's memory sizes: a number and a unit (``512m``, ``4g``; a bare number is bytes).
_MEMORY = re.compile(r"\d+([kmgtp]b?|b)?", re.IGNORECASE)


class SubmitError(ValueError):
    """A master URL or flag Spark would refuse, or a file to ship that is not there:
    the message names it and says what to change."""


class MasterUnreachable(SubmitError):
    """No standalone master answers at the URL's address(es)."""


@dataclass(frozen=True)
class SubmitOptions:
    """spark-submit's flags that tfcoord passes through unchanged: files and archives shipped
    to the executors (``--py-files`` also on the driver's ``sys.path``), the driver's memory,
    and ``--conf`` settings."""

    py_files: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    archives: tuple[str, ...] = ()
    driver_memory: str | None = None
    conf: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        deploy_mode: str = "client",
        executor_memory: str | None = None,
        driver_memory: str | None = None,
        conf: Iterable[str] = (),
        py_files: Iterable[str] = (),
        files: Iterable[str] = (),
        archives: Iterable[str] = (),
    ) -> SubmitOptions:
        """spark-submit's flags as typed (``conf``: ``KEY=VALUE`` items), checked.

        Raises:
            SubmitError: cluster deploy mode, a memory size Spark would not read, a ``--conf``
                item that is not ``KEY=VALUE``, or a local file to ship that is not there.
        """
        if deploy_mode != "client":
            raise SubmitError(
                f"--deploy-mode {deploy_mode}: tfcoord submit is the Spark driver itself (it follows "
                "the job and prints its progress here), so it runs in client mode; to run the driver "
                "on the cluster, use spark-submit --deploy-mode cluster with your script (tfcoord's "
                "run() works there)"
            )
        for flag, size in (("--executor-memory", executor_memory), ("--driver-memory", driver_memory)):
            if size is not None and not _MEMORY.fullmatch(size):
                raise SubmitError(
                    f"{flag} {size!r} is not a memory size: give a number and a unit, e.g. 2g or 512m"
                )
        settings: dict[str, str] = {}
        for item in conf:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise SubmitError(
                    f"--conf takes KEY=VALUE (e.g. --conf spark.task.maxFailures=1), not {item!r}"
                )
            settings[key.strip()] = value
        return cls(
            py_files=check_files("--py-files", py_files),
            files=check_files("--files", files),
            archives=check_files("--archives", archives),
            driver_memory=driver_memory,
            conf=settings,
        )

    def args(self) -> list[str]:
        """These flags as spark-submit's arguments (before ``--conf`` settings of tfcoord's own)."""
        out: list[str] = []
        for flag, items in (
            ("--py-files", self.py_files),
            ("--files", self.files),
            ("--archives", self.archives),
        ):
            if items:
                out += [flag, ",".join(items)]
        if self.driver_memory:
            out += ["--driver-memory", self.driver_memory]
        return out


def check_master(master: str) -> None:
    """Refuse a master URL Spark would not take; the message names the nearest it would.

    Raises:
        SubmitError: not a master URL of any form Spark (or tfcoord) takes.
    """
    if master == LOCAL_STANDALONE or any(form.fullmatch(master) for form in _MASTER_FORMS):
        if master.startswith("spark://"):
            _standalone_addresses(master)
        return
    if master.startswith("mesos://"):
        raise SubmitError(
            f"--master {master}: Spark 4 runs no applications on Mesos; run the cluster on Mesos "
            "with tfcoord submit --engine mesos --job ROLE:N:cpus=C,mem=MB"
        )
    scheme, sep, rest = master.partition("://")
    hint = ""
    if sep:
        near = difflib.get_close_matches(scheme + "://", ("spark://", "k8s://"), n=1, cutoff=0.6)
        if near:
            hint = f"; did you mean {near[0]}{rest}?"
    else:
        base, bracket, rest = master.partition("[")  # local[4], local-cluster[2,1,1024]
        near = difflib.get_close_matches(
            base, ("local", "local-cluster", "yarn", LOCAL_STANDALONE), n=1, cutoff=0.6
        )
        if near:
            hint = f"; did you mean {near[0]}{bracket}{rest}?"
    raise SubmitError(
        f"--master {master!r} is not a Spark master URL{hint} (spark://HOST:PORT, yarn, "
        f"k8s://https://HOST:PORT, local[N], or {LOCAL_STANDALONE} for a cluster on this machine)"
    )


def _standalone_addresses(master: str) -> list[tuple[str, int]]:
    """The HOST:PORT pairs of ``spark://HOST:PORT[,HOST:PORT]`` (several for standby masters)."""
    out = []
    for part in master[len("spark://") :].split(","):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SubmitError(
                f"--master {master}: {part!r} is not HOST:PORT; a standalone master's URL is "
                "spark://HOST:PORT (its log says it: 'Starting Spark master at spark://...'; port 7077 by default)"
            )
        out.append((host.strip("[]"), int(port)))
    return out


def check_master_reachable(master: str, timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """Dial a standalone master (``spark://``) before Spark does; other masters pass.

    Raises:
        MasterUnreachable: none of its addresses accepts a connection within ``timeout_s``
            (the message names each address and why).
    """
    if not master.startswith("spark://"):
        return
    why = []
    for host, port in _standalone_addresses(master):
        t0 = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except socket.gaierror:
            why.append(f"{host}:{port}: no such host")
        except TimeoutError:
            why.append(f"{host}:{port}: no answer within {time.monotonic() - t0:.1f} s")
        except OSError as e:
            why.append(f"{host}:{port}: {e.strerror or e}")
    raise MasterUnreachable(
        f"cannot reach the Spark master {master} ({'; '.join(why)}): is the master running there, "
        "and is that its port? (--master; start one with spark-class org.apache.spark.deploy.master.Master, "
        f"or pass --master {LOCAL_STANDALONE})"
    )


def check_files(flag: str, paths: Iterable[str]) -> tuple[str, ...]:
    """Local paths of a ``--files``/``--py-files``/``--archives`` list that must exist; URLs
    (``hdfs://``, ``s3a://``) are Spark's to fetch. An archive may carry ``#NAME``.

    Raises:
        SubmitError: a local path that is not a file.
    """
    out = []
    for item in paths:
        for path in item.split(","):
            path = path.strip()
            if not path:
                continue
            local = path.partition("#")[0] if flag == "--archives" else path
            if "://" not in local or local.startswith("file://"):
                name = local.removeprefix("file://")
                if not Path(name).is_file():
                    raise SubmitError(f"{flag} {path}: no such file; give the path of a file to ship")
            out.append(path)
    return tuple(out)


def submit_args(master: str, name: str, options: SubmitOptions, settings: Mapping[str, str]) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for what ``spark-submit --master M --conf K=V ...`` would set:
    a SparkContext the script creates itself (``SparkContext(conf=SparkConf())``) gets it.
    pyspark splits it as a shell would, so every argument is quoted."""
    args = ["--master", master, "--name", name, *options.args()]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    return " ".join(shlex.quote(a) for a in args) + " pyspark-shell"
