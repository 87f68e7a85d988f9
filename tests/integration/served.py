"""``tfcoord serve`` as a real subprocess, for tests that need its flags, its logs or a kill -9.

Readiness is an event, never a poll: the helper binds a unix datagram socket, passes it
as ``$NOTIFY_SOCKET`` the way systemd does for ``Type=notify`` units, and blocks on it
until the coordinator sends ``READY=1`` — which it does only once every listener is up
and every port file is written. A pidfd of the process is watched beside the socket, so
a coordinator that exits during start-up is reported at once, with its log.

Its log goes to a file rather than a pipe, so a chatty coordinator (DEBUG logging, a
hundred nodes) can never block on a full pipe while the test is busy elsewhere.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tfcoord.client import auth

TFCOORD = [sys.executable, "-m", "tfcoord"]
#: Starting Python and binding takes about a second; a loaded CI machine gets plenty more.
START_TIMEOUT_S = 60.0
#: One sd_notify datagram is a few KEY=VALUE lines.
NOTIFY_DATAGRAM_BYTES = 4096


def notify_fields(datagram: bytes) -> dict[str, str]:
    """An sd_notify datagram (``KEY=VALUE`` lines) as a dict."""
    return dict(line.split("=", 1) for line in datagram.decode().splitlines() if "=" in line)


class Served:
    """One ``tfcoord serve`` process on 127.0.0.1, returned once it has said READY=1.

    Args:
        tmp: where the secret, port files and log live (the secret is shared by restarts).
        extra: further ``serve`` flags (TLS, HTTP).
        port: 0 for a free port; a restart passes the first run's port.
        state_dir: the journal directory (``--state-dir``); None keeps state in memory.
        http: also serve the HTTP API on a free port, with a token file (``http_token_file``,
            default ``tmp/http-token``).
        log_level, log_format: the global ``--log-level`` and ``--log-format`` flags.
        env: the coordinator's environment (default: this process's); ``NOTIFY_SOCKET`` is
            always the helper's own.
        port_file: the ``--port-file`` (default: a fresh name in ``tmp``).

    Raises:
        AssertionError: the coordinator exited, or did not say READY=1 within
            :data:`START_TIMEOUT_S`; the message carries its log.
    """

    def __init__(
        self,
        tmp: Path,
        *extra: str,
        port: int = 0,
        state_dir: Path | None = None,
        http: bool = False,
        log_level: str = "INFO",
        log_format: str = "text",
        http_token_file: Path | None = None,
        env: dict[str, str] | None = None,
        port_file: Path | None = None,
    ) -> None:
        stamp = time.monotonic_ns()
        self.secret_file = tmp / "secret"
        self.log_path = tmp / f"serve-{stamp}.log"
        self.port_file = port_file or tmp / f"port-{stamp}"
        self.http_port_file = tmp / f"http-port-{stamp}"
        self.http_token_file = http_token_file or tmp / "http-token"
        cmd = [
            *TFCOORD,
            "--log-level",
            log_level,
            "--log-format",
            log_format,
            "serve",
            "--port",
            str(port),
            "--port-file",
            str(self.port_file),
            "--secret-file",
            str(self.secret_file),
            *extra,
        ]
        if "--tls-cert" not in extra and "TFCOORD_PLAINTEXT" not in (os.environ if env is None else env):
            cmd.append("--plaintext")  # serve refuses to go unencrypted unless told
        if state_dir is not None:
            cmd += ["--state-dir", str(state_dir)]
        if http:
            cmd += [
                "--http-port",
                "0",
                "--http-port-file",
                str(self.http_port_file),
                "--http-token-file",
                str(self.http_token_file),
            ]
        self.cmd = cmd
        # An abstract socket: no file to clean up, and no limit on tmp's path length (108 bytes).
        name = f"tfcoord-served-{os.getpid()}-{stamp}"
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._notify.bind("\0" + name)
        child_env = dict(os.environ if env is None else env, NOTIFY_SOCKET="@" + name)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=child_env)
        try:
            #: What the coordinator said with READY=1 (its STATUS names the ports).
            self.ready = self._await_ready()
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        self.port = int(self.port_file.read_text())
        self.http_port = int(self.http_port_file.read_text()) if http else None
        self.address = f"127.0.0.1:{self.port}"
        self.secret = auth.read_secret(self.secret_file)
        self.env = dict(os.environ, TFCOORD_ADDRESS=self.address, TFCOORD_SECRET_FILE=str(self.secret_file))

    def _await_ready(self) -> dict[str, str]:
        deadline = time.monotonic() + START_TIMEOUT_S
        exited = os.pidfd_open(self.proc.pid)  # readable once the process ends
        try:
            while (left := deadline - time.monotonic()) > 0:
                readable, _, _ = select.select([self._notify, exited], [], [], left)
                if self._notify in readable:
                    fields = notify_fields(self._notify.recv(NOTIFY_DATAGRAM_BYTES))
                    if fields.get("READY") == "1":
                        return fields
                elif exited in readable:
                    code = self.proc.wait()
                    raise AssertionError(f"tfcoord serve exited with {code} before READY=1:\n{self.log}")
            raise AssertionError(f"tfcoord serve sent no READY=1 within {START_TIMEOUT_S:g} s:\n{self.log}")
        finally:
            os.close(exited)

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*TFCOORD, *args], env=env or self.env, capture_output=True, text=True, timeout=120
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the coordinator and wait for it to exit; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        finally:
            # Open until the process is gone: its STOPPING=1 on the way out finds the socket.
            self._notify.close()
