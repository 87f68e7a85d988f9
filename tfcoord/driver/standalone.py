"""A local Spark standalone cluster (master + one worker) from pip's pyspark.

pip's pyspark ships ``bin/spark-class`` but not ``sbin/start-*.sh``, so the master and
worker are started as ``spark-class org.apache.spark.deploy.{master.Master,worker.Worker}``
processes. Used by ``make demo``, the test session and the benchmarks: one cluster,
started once, stopped on exit. Readiness is read from the daemons' logs (the lines
they print once bound), never guessed with sleeps.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: The master binds in ~7 s and the worker registers ~6 s later on these machines;
#: a JVM that is not up after this is not coming.
START_TIMEOUT_S = 120.0


def _free_port() -> int:
    # Spark's daemons need the port on their command line; they bind it themselves a
    # moment later. The same race every peer has, limited to test/demo set-up.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's)."""
    return len(os.sched_getaffinity(0))


def machine_mib() -> int:
    """This machine's physical memory in MiB."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def java_home() -> str:
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no java on PATH and JAVA_HOME unset: install a JDK (Java 17) for Spark")
    return str(Path(os.path.realpath(java)).parent.parent)


class _Daemon:
    def __init__(self, args: list[str], env: dict[str, str], ready: re.Pattern[str], name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._match: re.Match[str] | None = None
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        threading.Thread(target=self._read, args=(ready,), daemon=True).start()

    def _read(self, ready: re.Pattern[str]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if not self._ready.is_set() and (found := ready.search(line)):
                self._match = found
                self._ready.set()
        self._ready.set()  # EOF: the daemon died; wait() reports it

    def wait(self, timeout: float) -> re.Match[str]:
        if not self._ready.wait(timeout) or self._match is None:
            tail = "".join(self.lines[-20:])
            raise RuntimeError(f"Spark {self.name} did not start within {timeout:g} s:\n{tail}")
        return self._match

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class LocalSparkCluster:
    """``with LocalSparkCluster(cores=2, memory_mb=4096) as c: SparkContext(c.master_url, ...)``.

    ``workers`` worker daemons, each offering ``cores`` cores and ``memory_mb``:
    ``LocalSparkCluster(cores=1, workers=3)`` is TensorFlowOnSpark's documented shape
    (``SPARK_WORKER_INSTANCES=3``, ``-c 1``), where an application that sets only
    ``spark.cores.max`` gets one 1-core executor per worker.
    """

    def __init__(
        self,
        cores: int = 2,
        memory_mb: int = 4096,
        workers: int = 1,
        worker_conf: dict[str, str] | None = None,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ValueError(
                f"a local Spark cluster needs at least 1 worker of 1 core (got {workers} x {cores})"
            )
        self.cores = cores
        self.memory_mb = memory_mb
        self.workers = workers
        #: Settings of the worker daemons (``SPARK_WORKER_OPTS``), e.g. the GPUs they offer:
        #: ``spark.worker.resource.gpu.amount`` and ``spark.worker.resource.gpu.discoveryScript``.
        self.worker_conf = dict(worker_conf or {})
        self.master_url = ""
        self._daemons: list[_Daemon] = []
        self._workdir = tempfile.mkdtemp(prefix="tfcoord-spark-")

    @staticmethod
    def env() -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("JAVA_HOME", java_home())
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env["SPARK_HOME"] = str(spark_home())
        # Executors run this interpreter (and so see tfcoord and TensorFlow); pyspark reads
        # PYSPARK_PYTHON when the SparkContext starts.
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        return env

    def start(self) -> LocalSparkCluster:
        env = self.env()
        spark_class = str(spark_home() / "bin" / "spark-class")
        port, ui = _free_port(), _free_port()
        master = _Daemon(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            env,
            re.compile(r"Starting Spark master at (spark://\S+)"),
            "master",
        )
        self._daemons.append(master)
        try:
            self.master_url = master.wait(START_TIMEOUT_S).group(1)
            started = []
            worker_env = dict(env)
            if self.worker_conf:
                opts = " ".join(f"-D{k}={v}" for k, v in self.worker_conf.items())
                worker_env["SPARK_WORKER_OPTS"] = f"{env.get('SPARK_WORKER_OPTS', '')} {opts}".strip()
            for i in range(self.workers):
                workdir = Path(self._workdir, f"worker-{i}")
                workdir.mkdir()
                worker = _Daemon(
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        self.master_url,
                        "--cores",
                        str(self.cores),
                        "--memory",
                        f"{self.memory_mb}M",
                        "--host",
                        "127.0.0.1",
                        "--webui-port",
                        str(_free_port()),
                        "--work-dir",
                        str(workdir),
                    ],
                    worker_env,
                    re.compile(r"Successfully registered with master"),
                    f"worker {i}",
                )
                self._daemons.append(worker)
                started.append(worker)
            for worker in started:  # the JVMs start side by side
                worker.wait(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for d in reversed(self._daemons):
            d.stop()
        self._daemons.clear()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
