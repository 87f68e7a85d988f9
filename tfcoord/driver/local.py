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
    """Submit ``spec``, run each node locally, follow the job; returns its final status."""
    out = out or sys.stdout.buffer
    job = driver.submit(spec, job)
    emit(f"job {job} submitted: {spec.size} local nodes running {' '.join(command)}")
    node_env = dict(os.environ if env is None else env)
    node_env[TOKEN_ENV] = driver.job_token(job).hex()
    node_env.setdefault("PYTHONUNBUFFERED", "1")
    lock = threading.Lock()
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    try:
        with stops_on_interrupt(driver, job, "the submitting process was interrupted"):
            for executor_id, (role, index) in enumerate(spec.slots()):
                p = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tfcoord.node",
                        "--address",
                        driver.address,
                        "--job",
                        job,
                        "--executor-id",
                        str(executor_id),
                        "--host",
                        "127.0.0.1",
                        "--",
                        *command,
                    ],
                    env=node_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
                procs.append(p)
                t = threading.Thread(
                    target=_pump, args=(p.stdout, f"[{role}:{index}] ".encode(), out, lock), daemon=True
                )
                t.start()
                pumps.append(t)
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
        for p in procs:
            try:
                p.wait(timeout=EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in pumps:
            t.join(timeout=5)
        for p in procs:  # the pumps are done with them (a caller that goes on must not leak them)
            if p.stdout is not None:
                p.stdout.close()
    return status
