"""A real ZooKeeper server for the tests: Debian's ``zookeeper`` package, run standalone.

The package (3.8) installs ``/usr/share/java/zookeeper.jar`` (its dependencies are on the
jar's manifest class path); ``.ci/run`` installs it. :class:`ZooKeeperServer` runs
``ZooKeeperServerMain`` on a free port of 127.0.0.1 with a data directory of its own, and
is ready when a ZooKeeper client connects (kazoo waits for the session, no polling here).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
#: A JVM and ZooKeeper start in a few seconds; this only turns a hang into an error.
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ZooKeeperServer:
    """One standalone ZooKeeper server; ``servers`` is the hosts string clients take."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tfcoord-zk-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @staticmethod
    def available() -> bool:
        return ZOOKEEPER_JAR.is_file() and shutil.which("java") is not None

    def start(self) -> ZooKeeperServer:
        """Start it and wait until a client connects. A port taken between choosing it and
        ZooKeeper binding it makes the server exit: it is started again on another.

        Raises:
            RuntimeError: it exited three times, or no client connected in time.
        """
        for _ in range(3):
            self.port = free_port()
            data = self.dir / f"data-{self.port}"
            data.mkdir()
            config = self.dir / f"zoo-{self.port}.cfg"
            config.write_text(
                "tickTime=500\n"
                f"dataDir={data}\n"
                f"clientPort={self.port}\n"
                "clientPortAddress=127.0.0.1\n"
                "admin.enableServer=false\n"
                "minSessionTimeout=1000\n"
                "maxSessionTimeout=60000\n"
            )
            log = open(self.dir / f"zookeeper-{self.port}.log", "wb")  # noqa: SIM115 (the process keeps it)
            self.proc = subprocess.Popen(
                ["java", "-Xmx128m", "-cp", str(ZOOKEEPER_JAR), MAIN, str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            log.close()
            if self._connects():
                return self
            self.stop()
        raise RuntimeError(f"ZooKeeper did not start; see the logs in {self.dir}")

    def _connects(self) -> bool:
        from kazoo.client import KazooClient

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False  # exited (its port was taken): start again on another
            client = KazooClient(hosts=self.servers, timeout=10.0)
            try:
                client.start(timeout=2.0)  # waits for the session; raises on a timeout
            except Exception:
                continue
            client.stop()
            client.close()
            return True
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
