"""The local engine: every node of a job as a process on this machine.

``tfcoord submit --engine local --workers 2 -- python train.py`` lets a user try
a script with a real ``TF_CONFIG`` before moving it to Spark or Mesos. Each node is
``python -m tfcoord.node`` wrapping the user's command, so the path through the
coordinator is the one Mesos tasks take. Output is streamed with a role prefix.

``role_resources`` pins each node process (and so its command) to as many of this machine's
CPUs as its role asks (``os.sched_setaffinity``), each node on CPUs of its own while there are
enough; GPUs and memory cannot be enforced on one machine, which it says in one warning line.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from tfcoord.client import DriverClient, JobSpec
from tfcoord.client.auth import TOKEN_ENV
from tfcoord.client.jobreplies import JobStatus
from tfcoord.client.progress import ProgressLines
from tfcoord.client.vocab import JobState
from tfcoord.client.watcher import FOREVER_S, watch_until
from tfcoord.node.outputlog import as_shown

from .resources import Resources
from .session import stops_on_interrupt

#: After the job ends, node processes get this long to exit on their own (they were
#: told to stop, and stop their command with its own grace) before being killed.
EXIT_GRACE_S = 20.0


def _pump(src: IO[bytes], prefix: bytes, out: IO[bytes], lock: threading.Lock) -> None:
    # Each line as a terminal shows it: a progress bar's carriage returns would otherwise
    # send the cursor back over the prefix on a terminal, and put every redraw in a file.
    for line in iter(src.readline, b""):
        body, end = (line[:-1], b"\n") if line.endswith(b"\n") else (line, b"")
        text = as_shown(body.decode("utf-8", "replace"))
        with lock:
            out.write(prefix + text.encode("utf-8", "replace") + end)
            out.flush()


def cpu_plan(
    slots: Sequence[tuple[str, int]], given: Mapping[str, Resources], available: Sequence[int]
) -> dict[int, tuple[int, ...]]:
    """executor id → the CPUs its process is pinned to, for the roles that ask for cpus.

    CPUs are handed out in order, each node taking ``ceil(cpus)`` of ``available`` (at most all of
    them); past the last CPU the handing out starts again at the first, so nodes then share CPUs.
    """
    plan: dict[int, tuple[int, ...]] = {}
    cpus = sorted(available)
    at = 0
    for executor_id, (role, _) in enumerate(slots):
        r = given.get(role)
        if r is None or r.cpus is None:
            continue
        n = min(len(cpus), math.ceil(r.cpus))
        plan[executor_id] = tuple(sorted({cpus[(at + i) % len(cpus)] for i in range(n)}))
        at += n
    return plan


def cpu_shortfall(
    slots: Sequence[tuple[str, int]], given: Mapping[str, Resources], available: int
) -> str | None:
    """What :func:`cpu_plan` could not give, in words: None when every node has CPUs of its own."""
    asked = {role: r.cpus for role, r in given.items() if r.cpus is not None}
    counts = {role: sum(1 for r, _ in slots if r == role) for role in asked}
    total = sum(math.ceil(cpus) * counts[role] for role, cpus in asked.items())
    if total <= available:
        return None
    each = ", ".join(f"{counts[role]} {role} x {cpus:g}" for role, cpus in sorted(asked.items()))
    return (
        f"the roles ask {total} CPUs in all ({each}), this machine lets this process use {available}: "
        "nodes share CPUs (a node asking more than all of them has all of them); ask for fewer cpus, "
        "or use --engine spark or mesos for them"
    )


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
        pinned: Mapping[int, tuple[int, ...]] | None = None,
    ) -> None:
        #: executor id → the CPUs its process runs on (``role_resources``' cpus).
        self.pinned = dict(pinned or {})
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
            # Set in the child before it runs Python: every thread and process it starts inherits it.
            preexec_fn=_pin(self.pinned[executor_id]) if executor_id in self.pinned else None,
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


def _pin(cpus: tuple[int, ...]) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, cpus)


def run_local(
    driver: DriverClient,
    spec: JobSpec,
    command: Sequence[str],
    *,
    emit: Callable[[str], None],
    out: IO[bytes] | None = None,
    job: str | None = None,
    env: dict[str, str] | None = None,
    role_resources: Mapping[str, Resources] | None = None,
) -> JobStatus:
    """Submit ``spec``, run each node locally, follow the job; returns its final status.

    With ``spec.max_restarts``, a node process that dies is started again (its next attempt)
    and the job's cluster restarts as a new generation; each restart is one line.
    ``role_resources``: each role's cpus pin its node processes (see :func:`cpu_plan`).
    """
    out = out or sys.stdout.buffer
    given = dict(role_resources or {})
    unenforced = sorted(role for role, r in given.items() if r.gpus or r.memory_mb is not None)
    pinned = cpu_plan(spec.slots(), given, sorted(os.sched_getaffinity(0))) if given else {}
    job = driver.submit(spec, job)
    emit(f"job {job} submitted: {spec.size} local nodes running {' '.join(command)}")
    for executor_id, cpus in sorted(pinned.items()):
        role, index = spec.slots()[executor_id]
        emit(f"{role}:{index} pinned to CPU(s) {','.join(map(str, cpus))}")
    if short := cpu_shortfall(spec.slots(), given, len(os.sched_getaffinity(0))):
        emit(f"warning: {short}")
    if unenforced:
        emit(
            "warning: the local engine does not enforce gpus or memory (roles "
            + ", ".join(unenforced)
            + "): its nodes share this machine's GPUs and memory; use --engine spark or mesos for them"
        )
    node_env = dict(os.environ if env is None else env)
    node_env[TOKEN_ENV] = driver.job_token(job).hex()
    node_env.setdefault("PYTHONUNBUFFERED", "1")
    nodes = _LocalNodes(driver, spec, job, command, node_env, out, pinned)
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
