"""Masters as production runs them: several, a leader elected in a real ZooKeeper, failover.

Two fake masters register in a real ZooKeeper server (the session's ``zookeeper`` fixture)
the way Mesos masters do; the standby answers 307 to the leader; :func:`fail_over` hands
the agents, frameworks and running tasks to the standby mid-job, as a Mesos master failover
does. The framework must resubscribe at the new leader with its framework id, keep its tasks
(reconciled, never relaunched) and the job must succeed. Every wait is on an event: the
coordinator's state changes, the masters' change notifications, the tasks' gate connections.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.mesos.fake_master import AgentSpec, FakeMaster, fail_over
from tests.mesos.test_framework import WAIT_S, until_job
from tests.mesos.zookeeper import ZooKeeperServer
from tfcoord.client import auth
from tfcoord.coordinator import state as s
from tfcoord.coordinator.journal import SqliteJournal
from tfcoord.coordinator.mesos.config import MesosConfig
from tfcoord.coordinator.mesos.detector import LeaderDetector
from tfcoord.coordinator.mesos.engine import MesosEngine
from tfcoord.coordinator.mesos.errors import MesosUnreachable
from tfcoord.coordinator.mesos.jobs import MesosJob, parse_role
from tfcoord.coordinator.server import CoordinatorServer, ServerConfig

#: Each task connects to the test's gate and exits 0 once the gate says so: the job runs
#: until the test lets it finish, with no sleep on either side.
GATE = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)"
AGENTS = [AgentSpec(cpus=4, mem=8192)]


def zk_path() -> str:
    return f"/mesos-{uuid.uuid4().hex[:12]}"  # one test's masters never meet another's


def masters(**kw: Any) -> tuple[FakeMaster, FakeMaster]:
    return (
        FakeMaster(AGENTS, heartbeat_interval_s=0.5, kill_grace_s=1.0, **kw),
        FakeMaster(AGENTS, heartbeat_interval_s=0.5, kill_grace_s=1.0, **kw),
    )


class Gate:
    """A Unix socket the tasks connect to; :meth:`open` lets every connected task exit."""

    def __init__(self, path: Path, expected: int) -> None:
        self.path = path
        self.expected = expected
        self.writers: list[asyncio.StreamWriter] = []
        self.all_in = asyncio.Event()

    async def _accept(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if len(self.writers) >= self.expected:
            self.all_in.set()

    def open(self) -> None:
        for w in self.writers:
            w.write(b"x")
            w.close()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[Gate]:
        server = await asyncio.start_unix_server(self._accept, path=str(self.path))
        try:
            yield self
        finally:
            for w in self.writers:
                w.close()
            server.close()
            await server.wait_closed()


@asynccontextmanager
async def coordinator(
    tmp_path: Path, config: MesosConfig
) -> AsyncIterator[tuple[CoordinatorServer, MesosEngine]]:
    server = CoordinatorServer(ServerConfig(secret=auth.new_secret()), SqliteJournal(tmp_path / "state"))
    server.recover()
    _, port = await server.start()
    try:
        engine = await MesosEngine(server, config, f"127.0.0.1:{port}", teardown_on_close=True).start()
        try:
            yield server, engine
        finally:
            await engine.close()
    finally:
        await server.close()


def launched(master: FakeMaster) -> int:
    """The tasks this master was asked to launch."""
    return sum(
        len(op["launch"]["task_infos"])
        for call in master.calls_of("ACCEPT")
        for op in call["accept"]["operations"]
        if op.get("type") == "LAUNCH"
    )


@pytest.mark.parametrize("named", ["zookeeper", "list"])
async def test_a_job_survives_a_master_failover_mid_run(
    zookeeper: ZooKeeperServer, tmp_path: Path, named: str
) -> None:
    path = zk_path()
    a, b = masters()
    async with a, b, Gate(tmp_path / "gate", 2).serving() as gate:
        await a.register_in_zookeeper(zookeeper.servers, path)
        await b.register_in_zookeeper(zookeeper.servers, path)  # a standby: a's sequence is lower
        await b.set_leader(a.address)
        # zk://: the leader is read from ZooKeeper. A list: b comes first and redirects to a.
        master = f"zk://{zookeeper.servers}{path}" if named == "zookeeper" else f"{b.address},{a.address}"
        config = MesosConfig.from_env({"MESOS_MASTER": master}, python=sys.executable)
        spec = MesosJob.of(
            [parse_role("worker:2:cpus=0.5,mem=256")], [sys.executable, "-c", GATE, str(gate.path)]
        ).to_spec()
        async with coordinator(tmp_path, config) as (server, engine):
            server.apply(s.SubmitJob(now=time.time(), job="j", spec=spec))
            await until_job(server, "j", {"RUNNING"})
            async with asyncio.timeout(WAIT_S):
                await gate.all_in.wait()  # both tasks' commands run
            framework_id = engine.client.framework_id
            assert framework_id and engine.client.leader == a.url
            assert len(a.calls_of("SUBSCRIBE")) == 1 and b.calls_of("SUBSCRIBE") == []
            if named == "list":
                assert b.redirects >= 1  # the standby sent the first SUBSCRIBE on to a
            else:
                assert b.redirects == 0 and config.masters == ()  # ZooKeeper named a
            pids = {tid: t.pid for tid, t in a.tasks.items()}
            assert len(pids) == 2 and launched(a) == 2

            await fail_over(a, b)  # mid-run: the tasks keep running, b leads

            await b.wait_until(
                lambda: (
                    (fw := b.frameworks.get(framework_id)) is not None
                    and fw.connected
                    and len(b.calls_of("RECONCILE")) >= 2
                ),
                WAIT_S,
            )
            [again] = b.calls_of("SUBSCRIBE")
            assert again["framework_id"] == {"value": framework_id}
            assert again["subscribe"]["framework_info"]["id"] == {"value": framework_id}
            assert engine.client.framework_id == framework_id and engine.client.leader == b.url
            if named == "list":
                assert a.redirects >= 1  # the resubscription went to a first, which sent it on
            explicit = [r for r in b.calls_of("RECONCILE") if r["reconcile"]["tasks"]]
            assert {t["task_id"]["value"] for t in explicit[0]["reconcile"]["tasks"]} == set(pids)
            assert {tid: t.pid for tid, t in b.tasks.items()} == pids
            assert {t.state for t in b.tasks.values()} == {"TASK_RUNNING"}
            assert server.state.jobs["j"].state.value == "RUNNING"

            gate.open()  # let the job finish, on the new leader
            await until_job(server, "j", {"SUCCEEDED", "FAILED", "STOPPED"})
            assert server.state.jobs["j"].state.value == "SUCCEEDED"
            await b.wait_until(lambda: {t.state for t in b.tasks.values()} == {"TASK_FINISHED"}, WAIT_S)
            assert launched(b) == 0 and engine.counters["relaunches"] == 0
            assert {tid: t.pid for tid, t in b.tasks.items()} == pids


async def test_a_framework_that_does_not_come_back_within_its_failover_timeout_is_torn_down(
    tmp_path: Path,
) -> None:
    a, b = masters()
    async with a, b, Gate(tmp_path / "gate", 1).serving() as gate:
        await b.set_leader(a.address)
        config = MesosConfig.from_env({"MESOS_MASTER": a.address}, python=sys.executable)
        config = config.with_options(failover_timeout_s=0.5)
        spec = MesosJob.of(
            [parse_role("worker:1:cpus=0.5,mem=256")], [sys.executable, "-c", GATE, str(gate.path)]
        ).to_spec()
        async with coordinator(tmp_path, config) as (server, engine):
            server.apply(s.SubmitJob(now=time.time(), job="j", spec=spec))
            async with asyncio.timeout(WAIT_S):
                await gate.all_in.wait()
            framework_id = engine.client.framework_id
            # The framework only knows a: it cannot find b, and b's failover timeout runs out.
            await fail_over(a, b)
            await a.stop()
            fw = await b.wait_until(
                lambda: (f := b.frameworks.get(framework_id)) is not None and f.removed and f
            )
            assert fw.removed
            await b.wait_until(lambda: all(t.terminal and t.gone for t in b.tasks.values()), WAIT_S)
            assert {t.state for t in b.tasks.values()} == {"TASK_KILLED"}


async def test_the_detector_follows_the_leader_zookeeper_names(zookeeper: ZooKeeperServer) -> None:
    path = zk_path()
    a, b = masters()
    async with a, b:
        config = MesosConfig.from_env({"MESOS_MASTER": f"zk://{zookeeper.servers}{path}"})
        assert config.zookeeper is not None
        seen: list[str | None] = []
        detector = LeaderDetector(config.zookeeper, "http", seen.append)
        await detector.start()
        try:
            assert await detector.wait_leader(1.0) is None  # nothing registered yet
            assert "no znode" in detector.why or "no master" in detector.why
            await a.register_in_zookeeper(zookeeper.servers, path)
            assert await detector.wait_leader(WAIT_S) == a.url
            await b.register_in_zookeeper(zookeeper.servers, path)
            await a.leave_zookeeper()
            assert await detector.wait_leader(WAIT_S, besides=a.url) == b.url
        finally:
            await detector.close()
        assert seen[0] == a.url and seen[-1] == b.url


async def test_no_master_in_zookeeper_fails_the_first_subscription_saying_so(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    path = zk_path()
    config = MesosConfig.from_env({"MESOS_MASTER": f"zk://{zookeeper.servers}{path}"}, python=sys.executable)
    config = config.with_options(first_subscribe_deadline_s=1.0)
    with pytest.raises(MesosUnreachable) as info:
        async with coordinator(tmp_path, config):
            pass
    message = str(info.value)
    assert f"no leading Mesos master found in ZooKeeper zk://{zookeeper.servers}{path} within 1 s" in message
    assert "\n" not in message


async def test_a_new_leader_in_zookeeper_ends_the_stream_held_by_the_old_one(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    # a keeps serving its stream but loses its znode (a partitioned master): ZooKeeper names
    # the standby b, so the framework leaves a's stream and resubscribes there -- and b,
    # still a standby here, redirects it back to a, which leads as far as the masters know.
    path = zk_path()
    a, b = masters()
    async with a, b:
        await a.register_in_zookeeper(zookeeper.servers, path)
        await b.register_in_zookeeper(zookeeper.servers, path)
        await b.set_leader(a.address)
        config = MesosConfig.from_env(
            {"MESOS_MASTER": f"zk://{zookeeper.servers}{path}"}, python=sys.executable
        )
        async with coordinator(tmp_path, config) as (_, engine):
            framework_id = engine.client.framework_id
            await a.leave_zookeeper()
            # A RECONCILE follows each subscription once the framework has heard SUBSCRIBED.
            await a.wait_until(
                lambda: len(a.calls_of("SUBSCRIBE")) == 2 and len(a.calls_of("RECONCILE")) == 2, WAIT_S
            )
            assert b.redirects >= 1 and b.calls_of("SUBSCRIBE") == []
            assert a.calls_of("SUBSCRIBE")[1]["framework_id"] == {"value": framework_id}
            assert engine.client.framework_id == framework_id and engine.client.leader == a.url


async def test_a_call_a_deposed_master_redirects_resubscribes_and_goes_out_at_the_leader(
    tmp_path: Path,
) -> None:
    a, b = masters()
    async with a, b:
        config = MesosConfig.from_env({"MESOS_MASTER": a.address}, python=sys.executable)
        async with coordinator(tmp_path, config) as (_, engine):
            framework_id = engine.client.framework_id
            # a stops leading but keeps our stream open: only a call finds out.
            await a.set_leader(b.address, drop_streams=False)
            engine.client.call("REVIVE")
            await b.wait_until(lambda: b.calls_of("REVIVE"), WAIT_S)
            [subscribe] = b.calls_of("SUBSCRIBE")
            assert subscribe["framework_id"] == {"value": framework_id}
            assert a.redirects >= 2  # the REVIVE, then the resubscription, sent on to b
            assert a.calls_of("REVIVE") == []
