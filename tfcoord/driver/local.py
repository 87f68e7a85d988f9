"""The local engine: every node of a job as a process on this machine.

``tfcoord submit --engine local --workers 2 -- python train.py`` lets a user try
a script with a real ``TF_CONFIG`` before moving it to Spark or Mesos. Each node is
``python -m tfcoord.node`` wrapping the user's command, so the path through the
coordinator is the one Mesos tasks take. Output is streamed with a role prefix.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import IO

from tfcoord.client import DriverClient, JobSpec
from tfcoord.client.auth import TOKEN_ENV
from tfcoord.client.progress import ProgressLines
from tfcoord.client.replies import JobStatus
from tfcoord.client.vocab import JobState
from tfcoord.client.watcher import FOREVER_S, watch_until

from .session import stops_on_interrupt

#: After the job ends, node processes get this long to exit on their own (they were
#: told to stop, and stop their command with its own grace) before being killed.
EXIT_GRACE_S = 20.0


def _pump(src: IO[bytes], prefix: bytes, out: IO[bytes], lock: threading.Lock) -> None:
    for line in iter(src.readline, b""):
        with lock:
            out.write(prefix + line)
            out.flush()


class _LocalNodes:
    """The node processes of one local job, one per slot; a slot's process that dies while
    the job can still restart its cluster is started again as the slot's next attempt (as
    Spark retries a task and Mesos relaunches one): it joins the job's new generation."""

    def __init__(
        self,
        driver: DriverClient,
        spec: JobSpec,
        job: str,
        command: Sequence[str],
        env: dict[str, str],
        out: IO[bytes],
    ) -> None:
        self.driver, self.spec, self.job, self.command, self.env, self.out = (
            driver,
            spec,
            job,
            command,
            env,
            out,
        )
        self.lock = threading.Lock()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.attempts: dict[int, int] = {}
        self.pumps: list[threading.Thread] = []
        self.done = threading.Event()
        self.relaunched = 0

    def start(self) -> None:
        for executor_id in range(self.spec.size):
            self._launch(executor_id)

    def _launch(self, executor_id: int) -> None:
        role, index = self.spec.slots()[executor_id]
        attempt = self.attempts.get(executor_id, -1) + 1
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfcoord.node",
                "--address",
                self.driver.address,
                "--job",
                self.job,
                "--executor-id",
                str(executor_id),
                "--attempt",
                str(attempt),
                "--host",
                "127.0.0.1",
                "--",
                *self.command,
            ],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.procs[executor_id], self.attempts[executor_id] = p, attempt
        t = threading.Thread(
            target=_pump, args=(p.stdout, f"[{role}:{index}] ".encode(), self.out, self.lock), daemon=True
        )
        t.start()
        self.pumps.append(t)
        if self.spec.max_restarts:
            threading.Thread(
                target=self._relaunch_when_dead, args=(executor_id, p), name="tfcoord-local-node", daemon=True
            ).start()

    def _relaunch_when_dead(self, executor_id: int, p: subprocess.Popen[bytes]) -> None:
        """Start the slot again if its process died while the job still runs and may restart
        (at most ``max_restarts`` times in all: the coordinator decides the rest)."""
        if p.wait() == 0 or self.done.is_set():
            return
        with self.lock:
            if self.relaunched >= self.spec.max_restarts:
                return
            try:
                st = self.driver.status(self.job)
            except Exception:  # the coordinator is going away with the job: nothing to restart
                return
            if st.terminal or self.done.is_set():
                return
            self.relaunched += 1
            self._launch(executor_id)

    def stop(self) -> None:
        self.done.set()
        for p in list(self.procs.values()):
            try:
                p.wait(timeout=EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in self.pumps:
            t.join(timeout=5)
        for (
            p
        ) in self.procs.values():  # the pumps are done with them (a caller that goes on must not leak them)
            if p.stdout is not None:
                p.stdout.close()


def run_local(
    driver: DriverClient,
    spec: JobSpec,
    command: Sequence[str],
    *,
    emit: Callable[[str], None],
    out: IO[bytes] | None = None,
    job: str | None = None,
    env: dict[str, str] | None = None,
) -> JobStatus:
    """Submit ``spec``, run each node locally, follow the job; returns its final status.

    With ``spec.max_restarts``, a node process that dies is started again (its next attempt)
    and the job's cluster restarts as a new generation; each restart is one line.
    """
    out = out or sys.stdout.buffer
    job = driver.submit(spec, job)
    emit(f"job {job} submitted: {spec.size} local nodes running {' '.join(command)}")
    node_env = dict(os.environ if env is None else env)
    node_env[TOKEN_ENV] = driver.job_token(job).hex()
    node_env.setdefault("PYTHONUNBUFFERED", "1")
    nodes = _LocalNodes(driver, spec, job, command, node_env, out)
    try:
        with stops_on_interrupt(driver, job, "the submitting process was interrupted"):
            nodes.start()
            watch_until(
                driver,
                job,
                timeout_s=spec.reservation_timeout_s + FOREVER_S,
                brief=True,
                on_change=ProgressLines(emit),
            )
            status = driver.status(job)
            if status.state != JobState.SUCCEEDED:  # say why at once; stopping the nodes may take seconds
                emit(status.why)
    finally:
        nodes.stop()
    return status
