"""The coordinator's Mesos framework end to end, against the fake master.

Tasks are real processes (the fake master runs them): each runs the fetched node archive,
registering with a real coordinator. Every wait is on an event (the coordinator's push, the
master's state-change notification), never a sleep. The one test with real TensorFlow is
marked slow.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.lines import Lines, as_from_a_terminal
from tests.integration.pki import Authority
from tests.integration.served import TFCOORD, Served
from tests.mesos.fake_master import AgentSpec, FakeMaster, ThreadedFakeMaster
from tfcoord.cli import ADMIN_SUFFIX
from tfcoord.client import DriverClient, JobFailed, auth
from tfcoord.compat.tfmesos2 import Job, cluster
from tfcoord.compat.tfmesos2 import _config as tfmesos2_config
from tfcoord.coordinator import state as s
from tfcoord.coordinator.journal import SqliteJournal
from tfcoord.coordinator.mesos.config import MesosConfig, Volume
from tfcoord.coordinator.mesos.engine import FRAMEWORK_ID_META, MesosEngine
from tfcoord.coordinator.mesos.errors import MesosAuthError, MesosError
from tfcoord.coordinator.mesos.jobs import MesosJob, parse_role
from tfcoord.coordinator.server import CoordinatorServer, ServerConfig
from tfcoord.driver import mesos

ROOT = Path(__file__).resolve().parents[2]
#: A task command that runs until its node is told to stop.
SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]
THREE = [Job("ps", 1, cpus=0.5, mem=256), Job("worker", 2, cpus=0.5, mem=256)]
#: No wait here should come near this; it only turns a hang into a failure.
WAIT_S = 30.0


@pytest.fixture
def master() -> Iterator[ThreadedFakeMaster]:
    with ThreadedFakeMaster([AgentSpec(cpus=4, mem=8192)], heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        yield m


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "MESOS_MASTER",
        "MESOS_SSL",
        "MESOS_VERIFY_SSL",
        "MESOS_USERNAME",
        "MESOS_PASSWORD",
        "MESOS_FRAMEWORK_ROLE",
        "DOCKER_IMAGE",
        "MESOS_ATTRIBUTES",
        "MESOS_CA_FILE",
        "TFCOORD_ADDRESS",
    ):
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.startswith("TFCOORD_MESOS_")]:
        monkeypatch.delenv(var)


def run_cluster(m: ThreadedFakeMaster, jobs: Any = THREE, **kw: Any) -> Any:
    kw.setdefault("command", SLEEP)
    kw.setdefault("python", sys.executable)
    return cluster(jobs, master=m.master.address, client_ip="127.0.0.1", **kw)


def wait(m: ThreadedFakeMaster, predicate: Any, timeout_s: float = WAIT_S) -> Any:
    """Block until ``predicate()`` holds on the master's side (checked at each of its changes)."""
    return m.call(m.master.wait_until(predicate, timeout_s), timeout_s + 5)


def all_ended(m: ThreadedFakeMaster) -> bool:
    return all(t.terminal and t.gone for t in m.master.tasks.values())


# -- readiness, shape, teardown ---------------------------------------------------------------


def test_cluster_places_every_task_from_the_first_offer_and_tears_them_down(
    master: ThreadedFakeMaster,
) -> None:
    with run_cluster(master) as c:
        assert set(c.cluster_def) == {"ps", "worker"} and len(c.cluster_def["worker"]) == 2
        assert c.targets == {
            "/job:ps/task:0": f"grpc://{c.cluster_def['ps'][0]}",
            "/job:worker/task:0": f"grpc://{c.cluster_def['worker'][0]}",
            "/job:worker/task:1": f"grpc://{c.cluster_def['worker'][1]}",
        }
        ports = [int(a.rsplit(":", 1)[1]) for addrs in c.cluster_def.values() for a in addrs]
        assert len(set(ports)) == 3 and all(31000 <= p <= 32000 for p in ports)  # the offer's ports
        tasks = master.master.tasks
        assert sorted(tasks) == [f"tfcoord.{c.job}.{i}.0" for i in range(3)]
        assert {t.state for t in tasks.values()} == {"TASK_RUNNING"}
        [accept] = master.master.calls_of("ACCEPT")  # one offer, one ACCEPT, every task in it
        assert len(accept["accept"]["operations"][0]["launch"]["task_infos"]) == 3
        assert master.master.calls_of("SUPPRESS")  # nothing more to place: no more offers wanted
        info = tasks[f"tfcoord.{c.job}.1.0"].task_info
        assert info["container"]["docker"]["network"] == "HOST"
        assert "TFCOORD_TOKEN" not in info["command"]["value"]
        status = c.status()
        assert status["state"] == "RUNNING" and status["engine"] == "mesos"
        assert {n["task_id"] for n in status["nodes"]} == set(tasks)
        [subscribe] = master.master.calls_of("SUBSCRIBE")
        assert subscribe["subscribe"]["framework_info"]["failover_timeout"] > 0
        info = subscribe["subscribe"]["framework_info"]
        assert info["capabilities"] == [{"type": "MULTI_ROLE"}]  # no GPU job, no GPU_RESOURCES
        assert info["roles"] == ["tensorflow"]  # tfmesos2's role when MESOS_FRAMEWORK_ROLE is unset
    assert master.master.calls_of("TEARDOWN")
    wait(master, lambda: all_ended(master))


def test_cluster_can_be_used_twice_in_one_process(master: ThreadedFakeMaster) -> None:
    seen = []
    for _ in range(2):
        with run_cluster(master, [Job("worker", 1, cpus=0.5, mem=256)]) as c:
            seen.append((c.job, c.coordinator))
        wait(master, lambda: all_ended(master))
    assert seen[0] != seen[1]
    assert len(master.master.frameworks) == 2


def test_unused_offers_are_declined_with_a_refuse_filter_and_logged_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agents = [
        AgentSpec(cpus=4, mem=8192, ports=((31000, 31099),)),
        AgentSpec(cpus=4, mem=8192, ports=((32000, 32099),)),
    ]
    caplog.set_level(logging.INFO, logger="tfcoord.mesos")
    with ThreadedFakeMaster(agents, heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        with run_cluster(m, [Job("worker", 1, cpus=0.5, mem=256)]):
            [offers] = [
                e["offers"]["offers"]
                for fw in m.master.frameworks.values()
                for e in fw.events
                if e["type"] == "OFFERS"
            ][:1]
            assert len(offers) == 2  # one round, both agents
            [accept] = m.master.calls_of("ACCEPT")
            [used] = accept["accept"]["offer_ids"]
            [unused] = [o["id"]["value"] for o in offers if o["id"] != used]
            [decline] = m.master.calls_of("DECLINE")
            assert decline["decline"] == {
                "offer_ids": [{"value": unused}],
                "filters": {"refuse_seconds": 3600.0},
            }
            [fw] = m.master.frameworks.values()
            [refusal] = [f for f in fw.filters if f.agent_id == m.master.agents[1].id]  # the master keeps it
            assert refusal.expires - time.monotonic() > 3000
            lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("declining offer")]
            assert lines == [
                f"declining offer {unused} from 127.0.0.1: every task is placed (refused for 3600 s)"
            ]
        wait(m, lambda: all_ended(m))


def test_mesos_attributes_place_tasks_only_on_matching_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    agents = [
        AgentSpec(cpus=4, mem=8192, ports=((31000, 31099),), attributes={"rack": "r1", "cores": 8.0}),
        AgentSpec(cpus=4, mem=8192, ports=((32000, 32099),), attributes={"rack": "r2", "cores": 8.0}),
    ]
    with ThreadedFakeMaster(agents, heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        monkeypatch.setenv("MESOS_ATTRIBUTES", "RACK:R2,cores:8")  # case-insensitive, TEXT and SCALAR
        with run_cluster(m) as c:
            assert {t.agent_id for t in m.master.tasks.values()} == {m.master.agents[1].id}
            assert all(a.startswith("127.0.0.1:320") for addrs in c.cluster_def.values() for a in addrs)
        wait(m, lambda: all_ended(m))
        config = MesosConfig(masters=(m.url,), python=sys.executable)
        job = MesosJob.of([parse_role("worker:1:cpus=0.5,mem=256")], SLEEP, attributes="rack:r3")
        coord = mesos.start_coordinator(config, advertise_host="127.0.0.1")
        try:
            with DriverClient(coord.address, coord.secret, ssl_context=mesos.driver_tls(coord)) as driver:
                jid = driver.submit(job.to_spec(reservation_timeout_s=600.0))
                status = watch_until(driver, jid, lambda st: any("attribute" in x for x in st["missing"]))
                [line] = status["missing"]
                assert "no offer can ever fit it: no offer matched the attribute constraints rack:r3" in line
                assert "rack:r1" in line and "rack:r2" in line
                mesos.stop_and_wait(driver, jid, "test over")
        finally:
            coord.stop()


def test_message_and_failure_events_are_handled(
    master: ThreadedFakeMaster, caplog: pytest.LogCaptureFixture
) -> None:
    fm = master.master
    caplog.set_level(logging.INFO, logger="tfcoord.mesos")
    with run_cluster(master) as c:
        agent = fm.agents[0].id
        master.call(
            fm.send_event(
                {
                    "type": "MESSAGE",
                    "message": {
                        "agent_id": {"value": agent},
                        "executor_id": {"value": "ex-1"},
                        "data": "aGk=",
                    },
                }
            )
        )
        master.call(fm.send_event({"type": "FAILURE", "failure": {"agent_id": {"value": agent}}}))
        # The agent's failure makes the engine ask for its tasks at once, naming each.
        ours = {f"tfcoord.{c.job}.{i}.0" for i in range(3)}
        wait(
            master,
            lambda: any(
                {t["task_id"]["value"] for t in r["reconcile"]["tasks"]} == ours
                for r in fm.calls_of("RECONCILE")
            ),
        )
        messages = [r.getMessage() for r in caplog.records]
        assert any(m.startswith("message from executor ex-1 (ignored") for m in messages)
        assert f"Mesos reports a failure: agent {agent}, executor None, status None" in messages
        assert c.status()["state"] == "RUNNING"  # the tasks still run: nothing was failed for it
    wait(master, lambda: all_ended(master))


# -- tfmesos2's signature, defaults and members -------------------------------------------------

#: tfmesos2 0.4.0: ``cluster(jobs, client_ip=None, port=11000, **kw)``, the keywords going to
#: ``TensorflowMesos(task_spec, client_ip=None, port=11000, volumes=None, env=None,
#: loglevel=logging.INFO, containerizer_type="DOCKER", force_pull_image=True, fetcher=None,
#: gpu_vendor=None, extra_config=None, readiness_timeout=600, verify_ssl=None)``.
TFMESOS2_KEYWORDS = (
    "volumes",
    "env",
    "loglevel",
    "containerizer_type",
    "force_pull_image",
    "fetcher",
    "gpu_vendor",
    "extra_config",
    "readiness_timeout",
    "verify_ssl",
)


def test_cluster_has_tfmesos2s_signature() -> None:
    params = inspect.signature(cluster).parameters
    positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["jobs", "client_ip", "port"]
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in (*TFMESOS2_KEYWORDS, "master"))
    assert (params["loglevel"].default, params["readiness_timeout"].default) == (logging.INFO, 600.0)


def test_cluster_config_keeps_tfmesos2s_defaults_and_the_environment_wins_over_them() -> None:
    none = dict.fromkeys(
        (
            "master",
            "image",
            "verify_ssl",
            "ca_file",
            "python",
            "containerizer_type",
            "force_pull_image",
            "gpu_vendor",
            "volumes",
            "fetcher",
            "env",
        )
    )
    cfg = tfmesos2_config({}, **none)
    assert cfg.masters == ("http://localhost:5050",)  # tfmesos2's MESOS_MASTER default
    assert (cfg.role, cfg.force_pull_image, cfg.containerizer) == ("tensorflow", True, "docker")
    env = {
        "MESOS_MASTER": "m1:5050",
        "MESOS_FRAMEWORK_ROLE": "ml",
        "TFCOORD_MESOS_FORCE_PULL_IMAGE": "false",
        "TFCOORD_MESOS_VOLUMES": "/a:/b",
    }
    cfg = tfmesos2_config(env, **none)
    assert (cfg.masters, cfg.role, cfg.force_pull_image) == (("http://m1:5050",), "ml", False)
    assert cfg.volumes == (Volume("/a", "/b", "RW"),)
    cfg = tfmesos2_config(
        env,
        **{
            **none,
            "force_pull_image": True,
            "containerizer_type": "MESOS",
            "volumes": {"/data": "/mnt/data"},
            "master": "m2",
        },
    )
    assert (cfg.masters, cfg.force_pull_image, cfg.containerizer) == (("http://m2:5050",), True, "mesos")
    assert cfg.volumes == (Volume("/data", "/mnt/data", "RW"),)  # the argument, not the variable


def test_cluster_called_as_tfmesos2_is_and_its_members(
    master: ThreadedFakeMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESOS_MASTER", master.master.address)
    jobs = [
        {"name": "ps", "num": 1, "cpus": 0.5, "mem": 256},
        {"name": "worker", "num": 1, "cpus": 0.5, "mem": 256},
    ]
    with cluster(jobs, "127.0.0.1", None, python=sys.executable, command=SLEEP) as c:  # client_ip, port
        assert c.client_ip == "127.0.0.1" and c.coordinator == f"127.0.0.1:{c.port}"
        tasks = c.tasks
        assert set(tasks) == set(master.master.tasks) == set(c.get_tasks)
        ps = next(t for t in tasks.values() if t.job_name == "ps")
        assert (ps.task_index, ps.addr, ps.state, ps.initialized, ps.cpus, ps.mem) == (
            0,
            "127.0.0.1",
            "TASK_RUNNING",
            True,
            0.5,
            256.0,
        )
        assert c.cluster_def["ps"] == [f"{ps.addr}:{ps.port}"]
        c.wait_until_ready()  # ready already: returns at once
        info = master.master.task(ps.mesos_task_id).task_info
        assert info["container"]["docker"]["force_pull_image"] is True  # tfmesos2's default
        c.shutdown()
        assert master.master.calls_of("TEARDOWN")
        wait(master, lambda: all_ended(master))
        c.shutdown()  # once is enough; leaving the block after it is fine too
    assert len(master.master.calls_of("TEARDOWN")) == 1


# -- failures -----------------------------------------------------------------------------------


def test_a_task_that_cannot_start_fails_the_job_at_once_naming_it(master: ThreadedFakeMaster) -> None:
    t0 = time.monotonic()
    with (
        pytest.raises(JobFailed) as info,
        run_cluster(master, python="/nonexistent/python3", readiness_timeout=600),
    ):
        pass
    took = time.monotonic() - t0
    message = str(info.value)
    assert "never registered: mesos task tfcoord." in message and "ended TASK_FAILED" in message
    assert "Command exited with status 127" in message
    assert took < 15, f"took {took:.1f} s: not failing fast"
    wait(master, lambda: all_ended(master))


def test_a_task_lost_before_readiness_fails_the_job_fast_naming_the_task(background: Any) -> None:
    # Room for two of the three tasks: the job cannot become ready while one is lost.
    with ThreadedFakeMaster([AgentSpec(cpus=1, mem=1024)], heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        background.start(lambda: run_cluster(m).__enter__())
        wait(m, lambda: sum(t.state == "TASK_RUNNING" for t in m.master.tasks.values()) == 2)
        lost = sorted(m.master.tasks)[1]
        t0 = time.monotonic()
        m.call(m.master.fail_task(lost, "TASK_LOST", "agent went away"))
        [error] = background.results(WAIT_S)
        assert isinstance(error, JobFailed), error
        assert time.monotonic() - t0 < 10
        assert f"mesos task {lost} ended TASK_LOST: agent went away" in str(error)
        assert "worker:0" in str(error)
        wait(m, lambda: all_ended(m))


def test_a_job_no_offer_can_fit_says_so_in_its_status() -> None:
    agents = [AgentSpec(cpus=4, mem=8192, gpus=2, gpu_kind="SET")]
    with ThreadedFakeMaster(agents, heartbeat_interval_s=0.5) as m:
        config = MesosConfig(masters=(m.url,), python=sys.executable)
        job = MesosJob.of([parse_role("ps:1:cpus=1,mem=512"), parse_role("worker:1:gpus=8")], SLEEP)
        coord = mesos.start_coordinator(config, advertise_host="127.0.0.1", gpus=True)
        try:
            with DriverClient(coord.address, coord.secret, ssl_context=mesos.driver_tls(coord)) as driver:
                jid = driver.submit(job.to_spec(reservation_timeout_s=600.0))
                version, status = 0, driver.status(jid)
                while not any("needs 8 GPUs" in line for line in status["missing"]):
                    status = driver.watch(jid, version, WAIT_S)
                    version = status["version"]
                [line] = [x for x in status["missing"] if "worker:0" in x]
                assert line == (
                    "worker:0 (executor 1): never registered; mesos: no offer can ever fit it: "
                    "needs 8 GPUs, the largest offer had 2"
                )
                assert status["state"] in ("SUBMITTED", "RESERVING")  # waiting, not failed: an agent may join
                mesos.stop_and_wait(driver, jid, "test over")
        finally:
            coord.stop()


def test_gpu_tasks_get_the_offered_gpus_and_cpu_tasks_stay_off_gpu_agents() -> None:
    agents = [
        AgentSpec("gpu-agent", cpus=4, mem=4096, gpus=2, gpu_kind="SET", ports=((31000, 31099),)),
        AgentSpec("127.0.0.1", cpus=4, mem=4096, ports=((32000, 32099),)),
    ]
    with ThreadedFakeMaster(agents, heartbeat_interval_s=0.5) as m:
        # The GPU agent's hostname does not resolve: its task must not need it (--host is given).
        jobs = [Job("ps", 1, cpus=0.5, mem=256), Job("worker", 1, cpus=0.5, mem=256, gpus=1)]
        with run_cluster(m, jobs) as c:
            info = m.master.task(f"tfcoord.{c.job}.1.0").task_info
            assert info["container"]["docker"]["parameters"] == [{"key": "gpus", "value": '"device=0"'}]
            assert "--gpus 0" in info["command"]["value"]
            assert m.master.task(f"tfcoord.{c.job}.0.0").agent_id == m.master.agents[1].id
            caps = m.master.calls_of("SUBSCRIBE")[0]["subscribe"]["framework_info"]["capabilities"]
            assert {"type": "GPU_RESOURCES"} in caps
            assert c.cluster_def["worker"][0].startswith("gpu-agent:")
            worker = next(n for n in c.status()["nodes"] if n["role"] == "worker")
            assert worker["gpus"] == ["0"]


def watch_until(driver: DriverClient, job: str, predicate: Any) -> dict[str, Any]:
    """The job's status once ``predicate(status)`` holds, waiting on the coordinator's push."""
    version, status = 0, driver.status(job)
    deadline = time.monotonic() + WAIT_S
    while not predicate(status):
        assert time.monotonic() < deadline, status
        status = driver.watch(job, version, WAIT_S)
        version = status["version"]
    return status


def test_scalar_gpu_tasks_under_docker_get_an_agent_each() -> None:
    # Docker's --gpus 1 takes an agent's first GPU: two tasks on one agent would share GPU 0.
    agents = [
        AgentSpec(cpus=4, mem=4096, gpus=2, ports=((31000, 31099),)),
        AgentSpec(cpus=4, mem=4096, ports=((32000, 32099),)),
    ]
    with ThreadedFakeMaster(agents, heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        config = MesosConfig(masters=(m.url,), python=sys.executable)
        job = MesosJob.of(
            [parse_role("ps:1:cpus=0.5,mem=256"), parse_role("worker:2:cpus=0.5,mem=256,gpus=1")], SLEEP
        )
        coord = mesos.start_coordinator(config, advertise_host="127.0.0.1", gpus=True)
        try:
            with DriverClient(coord.address, coord.secret, ssl_context=mesos.driver_tls(coord)) as driver:
                jid = driver.submit(job.to_spec(reservation_timeout_s=600.0))
                status = watch_until(
                    driver, jid, lambda st: any("agent of its own" in x for x in st["missing"])
                )
                wait(m, lambda: len(m.master.tasks) == 2)  # the ps and one worker: ACCEPT reached the master
                [first] = [
                    t
                    for t in m.master.tasks.values()
                    if t.agent_id == m.master.agents[0].id and "--gpus" in t.task_info["command"]["value"]
                ]
                assert first.task_info["container"]["docker"]["parameters"] == [{"key": "gpus", "value": "1"}]
                assert "--gpus 0" in first.task_info["command"]["value"]
                [line] = [x for x in status["missing"] if "agent of its own" in x]
                assert "127.0.0.1 offers GPUs only as a count, which names no device" in line
                gpu_tasks = [
                    t for t in m.master.tasks.values() if "--gpus" in t.task_info["command"]["value"]
                ]
                assert len(gpu_tasks) == 1  # the second GPU task was not packed onto the same agent
                assert status["state"] in ("SUBMITTED", "RESERVING")
                mesos.stop_and_wait(driver, jid, "test over")
        finally:
            coord.stop()
        wait(m, lambda: all_ended(m))


# -- the master misbehaving ---------------------------------------------------------------------


def test_an_offer_rescinded_while_we_accept_it_is_survived(master: ThreadedFakeMaster) -> None:
    fm = master.master
    original = fm._handlers["ACCEPT"]
    raced: list[str] = []

    def accept_after_rescind(fw: Any, call: dict[str, Any]) -> None:
        if not raced:  # the master rescinds the offer a moment before our ACCEPT arrives
            for item in call["accept"]["offer_ids"]:
                if fm.offers.pop(item["value"], None) is not None:
                    raced.append(item["value"])
                    fw.send({"type": "RESCIND", "rescind": {"offer_id": item}})
        original(fw, call)

    fm._handlers["ACCEPT"] = accept_after_rescind
    with run_cluster(master) as c:
        assert raced
        lost = sorted(tid for tid, t in fm.tasks.items() if t.state == "TASK_LOST")
        assert lost == [f"tfcoord.{c.job}.{i}.0" for i in range(3)]
        assert {fm.task(tid).statuses[-1]["reason"] for tid in lost} == {"REASON_INVALID_OFFERS"}
        running = sorted(tid for tid, t in fm.tasks.items() if t.state == "TASK_RUNNING")
        assert running == [f"tfcoord.{c.job}.{i}.1" for i in range(3)]  # attempt 1 of each slot
        assert any("placing it again" in text for _, text in c.status()["events"])
        assert len(fm.calls_of("ACCEPT")) == 2


def test_a_failed_accept_is_reconciled_and_its_tasks_placed_again(master: ThreadedFakeMaster) -> None:
    fm = master.master
    master.call(fm.fail_next("ACCEPT", 503, text="no leader elected yet"))  # the stream stays up
    with run_cluster(master, readiness_timeout=20) as c:  # before: STAGING until the timeout
        first, _ = fm.calls_of("ACCEPT")  # the failed one, then the launch of attempt 1
        declined = {o["value"] for d in fm.calls_of("DECLINE") for o in d["decline"]["offer_ids"]}
        assert {o["value"] for o in first["accept"]["offer_ids"]} <= declined  # its offer is not left held
        reconciled = {
            t["task_id"]["value"] for r in fm.calls_of("RECONCILE") for t in r["reconcile"]["tasks"]
        }
        assert {f"tfcoord.{c.job}.{i}.0" for i in range(3)} <= reconciled
        running = sorted(tid for tid, t in fm.tasks.items() if t.state == "TASK_RUNNING")
        assert running == [f"tfcoord.{c.job}.{i}.1" for i in range(3)]
        assert any(
            "launch not confirmed (ACCEPT answered HTTP 503: no leader elected yet)" in text
            for _, text in c.status()["events"]
        )


def test_a_dropped_event_stream_is_survived_and_keeps_the_tasks(master: ThreadedFakeMaster) -> None:
    fm = master.master
    with run_cluster(master) as c:
        pids = {tid: t.pid for tid, t in fm.tasks.items()}
        [fw] = fm.frameworks.values()
        master.call(fm.disconnect())
        wait(master, lambda: fw.connected and len(fm.calls_of("SUBSCRIBE")) == 2)
        again = fm.calls_of("SUBSCRIBE")[1]
        assert again["framework_id"] == {"value": fw.id}
        assert again["subscribe"]["framework_info"]["id"] == {"value": fw.id}
        wait(master, lambda: len(fm.calls_of("RECONCILE")) >= 3)  # implicit; then explicit and implicit
        explicit = [r for r in fm.calls_of("RECONCILE") if r["reconcile"]["tasks"]][-1]
        assert {t["task_id"]["value"] for t in explicit["reconcile"]["tasks"]} == set(pids)
        assert {tid: t.pid for tid, t in fm.tasks.items()} == pids
        assert {t.state for t in fm.tasks.values()} == {"TASK_RUNNING"}
        assert c.status()["state"] == "RUNNING"
    wait(master, lambda: all_ended(master))


# -- finding and reaching the master ------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:  # nothing listens here once closed: a refused connection
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_masters_are_tried_in_turn_and_the_leader_redirect_followed(master: ThreadedFakeMaster) -> None:
    with ThreadedFakeMaster(heartbeat_interval_s=0.5) as follower:
        follower.call(follower.master.set_leader(master.master.address))
        masters = f"127.0.0.1:{closed_port()},{follower.master.address}"
        with cluster(
            [Job("worker", 1, cpus=0.5, mem=256)],
            master=masters,
            python=sys.executable,
            client_ip="127.0.0.1",
            command=SLEEP,
        ) as c:
            assert c.cluster_def["worker"]
        assert follower.master.frameworks == {}
        assert len(master.master.frameworks) == 1


def test_tls_to_the_master_with_a_test_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = Authority.create(tmp_path)
    leaf = ca.issue("master", server=True)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(leaf.cert, leaf.key)
    with ThreadedFakeMaster(ssl_context=server, heartbeat_interval_s=0.5) as m:
        assert m.url.startswith("https://")
        monkeypatch.setenv("MESOS_SSL", "true")
        with run_cluster(m, [Job("worker", 1, cpus=0.5, mem=256)], ca_file=str(ca.cert)) as c:
            assert c.cluster_def["worker"]
        t0 = time.monotonic()
        with (
            pytest.raises(MesosError, match=r"TLS certificate is not trusted .* MESOS_CA_FILE"),
            run_cluster(m, [Job("worker", 1, cpus=0.5, mem=256)]),
        ):
            pass
        assert time.monotonic() - t0 < 10  # refused at once, not retried until a deadline
        monkeypatch.setenv("MESOS_VERIFY_SSL", "false")
        with run_cluster(m, [Job("worker", 1, cpus=0.5, mem=256)]) as c:
            assert c.cluster_def["worker"]


def test_wrong_basic_auth_is_a_clear_error_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with ThreadedFakeMaster(username="alice", password="s3cret", heartbeat_interval_s=0.5) as m:
        monkeypatch.setenv("MESOS_USERNAME", "alice")
        monkeypatch.setenv("MESOS_PASSWORD", "wrong")
        t0 = time.monotonic()
        with pytest.raises(MesosAuthError) as info, run_cluster(m):
            pass
        assert time.monotonic() - t0 < 5
        assert "refused our credentials (HTTP 401, user 'alice')" in str(info.value)
        assert "MESOS_USERNAME" in str(info.value) and "MESOS_PASSWORD" in str(info.value)
        assert m.master.frameworks == {}
        monkeypatch.setenv("MESOS_PASSWORD", "s3cret")
        with run_cluster(m, [Job("worker", 1, cpus=0.5, mem=256)]) as c:
            assert c.cluster_def["worker"]


# -- a coordinator restart --------------------------------------------------------------------


async def until_job(server: CoordinatorServer, job: str, states: set[str]) -> None:
    """Wait until the job's state is one of ``states``, on the state machine's own effects."""
    changed = asyncio.Event()

    class Watch:
        def on_effects(self, event: s.Event, effects: Any) -> None:
            changed.set()

        def on_commit(self, seconds: float) -> None:
            pass

    watch = Watch()
    server.observers.append(watch)
    try:
        async with asyncio.timeout(WAIT_S):
            while server.state.jobs[job].state.value not in states:
                changed.clear()
                await changed.wait()
    finally:
        server.observers.remove(watch)


async def test_a_restarted_coordinator_resubscribes_as_the_same_framework_and_keeps_its_tasks(
    tmp_path: Path,
) -> None:
    secret = auth.new_secret()
    config = MesosConfig(masters=("http://placeholder:5050",), python=sys.executable)
    spec = MesosJob.of(
        [parse_role("ps:1:cpus=0.5,mem=256"), parse_role("worker:1:cpus=0.5,mem=256")], SLEEP
    ).to_spec()
    async with FakeMaster([AgentSpec(cpus=4, mem=8192)], heartbeat_interval_s=0.5, kill_grace_s=1.0) as fm:
        config = config.with_options(masters=(fm.url,))
        first = CoordinatorServer(ServerConfig(secret=secret), SqliteJournal(tmp_path / "state"))
        first.recover()
        _, port = await first.start()
        engine = await MesosEngine(first, config, f"127.0.0.1:{port}", teardown_on_close=False).start()
        first.apply(s.SubmitJob(now=time.time(), job="j", spec=spec))
        await until_job(first, "j", {"RUNNING"})
        framework_id = engine.client.framework_id
        pids = {tid: t.pid for tid, t in fm.tasks.items()}
        await engine.close()  # no TEARDOWN: the framework outlives this process
        await first.close()

        second = CoordinatorServer(ServerConfig(secret=secret, port=port), SqliteJournal(tmp_path / "state"))
        second.recover()
        assert second.journal.get_meta(FRAMEWORK_ID_META) == framework_id
        await second.start()
        engine = await MesosEngine(second, config, f"127.0.0.1:{port}", teardown_on_close=True).start()
        assert fm.calls_of("SUBSCRIBE")[-1]["framework_id"] == {"value": framework_id}
        assert engine.client.framework_id == framework_id
        assert second.state.jobs["j"].state.value == "RUNNING"
        await fm.wait_until(lambda: len(fm.calls_of("RECONCILE")) >= 3)
        assert {tid: t.pid for tid, t in fm.tasks.items()} == pids  # nothing relaunched
        assert {t.state for t in fm.tasks.values()} == {"TASK_RUNNING"}
        second.apply(s.StopJobEvent(now=time.time(), job="j", reason="test over"))
        await until_job(second, "j", {"STOPPED"})  # the nodes reconnected and answered the stop
        await engine.close()
        await second.close()
        await fm.wait_until(lambda: all(t.terminal for t in fm.tasks.values()))


async def test_tasks_alive_after_their_job_ended_are_killed_and_a_failed_kill_is_sent_again(
    tmp_path: Path,
) -> None:
    # A task whose node never starts (its "python" only sleeps) cannot be told to stop: the
    # engine kills it kill_after_end_s after its job ended, again when the first KILL fails.
    stuck = tmp_path / "python"
    stuck.write_text("#!/bin/sh\nexec sleep 3600\n")
    stuck.chmod(0o755)
    async with FakeMaster([AgentSpec(cpus=4, mem=8192)], heartbeat_interval_s=0.5, kill_grace_s=0.5) as fm:
        server = CoordinatorServer(ServerConfig(secret=auth.new_secret()))
        _, port = await server.start()
        config = MesosConfig(masters=(fm.url,), python=str(stuck), kill_after_end_s=0.3)
        engine = await MesosEngine(server, config, f"127.0.0.1:{port}", teardown_on_close=False).start()
        try:
            await fm.fail_next("KILL", 503)
            spec = MesosJob.of([parse_role("worker:1:cpus=0.5,mem=256")], SLEEP).to_spec()
            server.apply(s.SubmitJob(now=time.time(), job="j", spec=spec))
            await fm.wait_task_state("tfcoord.j.0.0", "TASK_RUNNING")
            server.apply(s.StopJobEvent(now=time.time(), job="j", reason="test over"))
            await until_job(server, "j", {"STOPPED", "FAILED"})
            ended = time.monotonic()
            await fm.wait_until(lambda: fm.calls_of("KILL"))
            assert time.monotonic() - ended >= 0.3 - 0.05  # the nodes' grace first
            await fm.wait_task_state("tfcoord.j.0.0", "TASK_KILLED")
            kills = fm.calls_of("KILL")
            assert len(kills) == 2 and {k["kill"]["task_id"]["value"] for k in kills} == {"tfcoord.j.0.0"}
        finally:
            await engine.close()
            await server.close()


async def test_an_offer_in_the_turn_a_job_fails_places_none_of_its_tasks() -> None:
    # The engine hears of a job's end through a callback it schedules; an offer handled in
    # between must not launch a task for the job that just failed (CI once saw one launched
    # after TASK_LOST, outliving the framework's teardown).
    async with FakeMaster([AgentSpec(cpus=0.5, mem=512)], heartbeat_interval_s=0.5, kill_grace_s=0.5) as fm:
        server = CoordinatorServer(ServerConfig(secret=auth.new_secret()))
        _, port = await server.start()
        config = MesosConfig(masters=(fm.url,), python=sys.executable)
        engine = await MesosEngine(server, config, f"127.0.0.1:{port}", teardown_on_close=True).start()
        try:
            spec = MesosJob.of([parse_role("worker:2:cpus=0.5,mem=256")], SLEEP).to_spec()
            server.apply(s.SubmitJob(now=time.time(), job="j", spec=spec))
            await fm.wait_task_state("tfcoord.j.0.0", "TASK_RUNNING")  # the second task waits for room
            agent = fm.tasks["tfcoord.j.0.0"].agent_id
            server.apply(s.EngineJobFailed(now=time.time(), job="j", reason="test: the job fails"))
            engine._offers(
                [
                    {  # arriving before the callback that tells the engine the job ended
                        "id": {"value": "late-offer"},
                        "agent_id": {"value": agent},
                        "hostname": "127.0.0.1",
                        "resources": [
                            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 4.0}},
                            {"name": "mem", "type": "SCALAR", "scalar": {"value": 4096.0}},
                            {
                                "name": "ports",
                                "type": "RANGES",
                                "ranges": {"range": [{"begin": 31100, "end": 31200}]},
                            },
                        ],
                    }
                ]
            )
            await fm.wait_until(
                lambda: any(
                    o["value"] == "late-offer"
                    for c in fm.calls_of("DECLINE")
                    for o in c["decline"]["offer_ids"]
                )
            )
            launched = [o["value"] for c in fm.calls_of("ACCEPT") for o in c["accept"]["offer_ids"]]
            assert "late-offer" not in launched and "tfcoord.j.1.0" not in fm.tasks
        finally:
            await engine.close()
            await server.close()


# -- tfcoord submit --engine mesos --------------------------------------------------------------

#: Each task writes its TF_CONFIG to DIR/ROLEINDEX, through a rename: the ps is stopped
#: whenever both workers have succeeded, which may be halfway through its write.
PRINT_TASK = (
    "import json, os, pathlib, sys; c = json.loads(os.environ['TF_CONFIG']); t = c['task']; "
    "p = pathlib.Path(sys.argv[1], f\"{t['type']}{t['index']}\"); "
    "p.with_suffix('.part').write_text(json.dumps(c)); p.with_suffix('.part').rename(p); print(t)"
)


def submit(m: ThreadedFakeMaster, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MESOS_MASTER=m.master.address, TFCOORD_TASK_PYTHON=sys.executable)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "mesos",
            "--advertise-host",
            "127.0.0.1",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_submit_engine_mesos_runs_a_user_command_end_to_end(
    master: ThreadedFakeMaster, tmp_path: Path
) -> None:
    out = submit(
        master,
        "--job",
        "ps:1:cpus=0.5,mem=256",
        "--job",
        "worker:2:cpus=0.5,mem=256",
        "--",
        sys.executable,
        "-c",
        PRINT_TASK,
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    configs = {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir() if not p.suffix}
    # The ps runs the command too, but is stopped as soon as both workers succeeded.
    assert {"worker0", "worker1"} <= set(configs) <= {"ps0", "worker0", "worker1"}
    cluster_spec = configs["worker0"]["cluster"]
    assert all(c["cluster"] == cluster_spec for c in configs.values())
    assert len(cluster_spec["worker"]) == 2 and len(set(cluster_spec["worker"] + cluster_spec["ps"])) == 3
    assert configs["worker1"]["task"] == {"type": "worker", "index": 1}
    assert "submitted to Mesos: 1 ps (cpus=0.5,mem=256,gpus=0), 2 worker" in out.stderr
    assert "TASK_RUNNING" in out.stderr
    # The job turns RUNNING once no node is still waiting to start: when both workers ended
    # before the ps had reported running (or was told to stop before it started), it went
    # from READY to SUCCEEDED, which is as right.
    assert re.search(r"^tfcoord: job (READY|RUNNING) -> SUCCEEDED$", out.stderr, re.M), out.stderr[-3000:]
    # Each event once: the timeline, not the embedded coordinator's log of the same events too.
    assert len(re.findall(r"worker:1 REGISTERED from", out.stderr)) == 1, out.stderr[-3000:]
    assert "INFO tfcoord" not in out.stderr, out.stderr[-3000:]
    # The tasks' own output (in their sandboxes) followed from the coordinator, as under Spark.
    for i in (0, 1):
        assert f"[worker:{i}] {{'type': 'worker', 'index': {i}}}" in out.stderr.splitlines(), out.stderr[
            -3000:
        ]
    wait(master, lambda: all_ended(master))


def test_submit_engine_mesos_exits_non_zero_naming_the_failed_task(master: ThreadedFakeMaster) -> None:
    fail = "import json, os, sys; t = json.loads(os.environ['TF_CONFIG'])['task']; sys.exit(3 if t['index'] else 0)"
    out = submit(master, "--job", "worker:2:cpus=0.5,mem=256", "--", sys.executable, "-c", fail)
    assert out.returncode == 1, out.stderr
    assert "failed: worker:1 (executor 1, host 127.0.0.1, task tfcoord." in out.stderr
    assert "ended with exit code 3" in out.stderr
    wait(master, lambda: all_ended(master))


def test_ctrl_c_under_the_mesos_engine_stops_the_job_and_exits_130(master: ThreadedFakeMaster) -> None:
    env = dict(os.environ, MESOS_MASTER=master.master.address, TFCOORD_TASK_PYTHON=sys.executable)
    proc = subprocess.Popen(
        [
            *TFCOORD,
            "submit",
            "--engine",
            "mesos",
            "--advertise-host",
            "127.0.0.1",
            "--job",
            "worker:2:cpus=0.5,mem=256",
            "--",
            *SLEEP,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=as_from_a_terminal,
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)  # type: ignore[arg-type]
    try:
        job = err.wait_for(r"job \S+ submitted to Mesos").split("job ", 1)[1].split()[0]
        err.wait_for(r"-> RUNNING")
        proc.send_signal(signal.SIGINT)  # as Ctrl-C does
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130, err.text()[-3000:]
    assert err.text().strip().splitlines()[-1] == f"tfcoord: interrupted: job {job} STOPPED", err.text()[
        -3000:
    ]
    assert "Traceback" not in err.text() and out.text() == ""
    wait(master, lambda: all_ended(master))  # every task was killed


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--", "true"], "needs the cluster's roles"),
        (["--job", "worker:x"], "is not ROLE:COUNT"),
        (["--job", "worker:1:gpus=0.5"], "must be a whole number"),
        (["--job", "bad-name:1"], "is not a TensorFlow job name"),
    ],
)
def test_submit_engine_mesos_usage_errors(master: ThreadedFakeMaster, args: list[str], why: str) -> None:
    out = submit(master, *args)
    assert out.returncode == 2 and why in out.stderr, out.stderr
    assert master.master.frameworks == {}  # refused before any framework subscribed


# -- real TensorFlow ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.timeout(300)
def test_parameter_server_training_over_the_cluster_def(master: ThreadedFakeMaster) -> None:
    tf = pytest.importorskip("tensorflow")
    jobs = [Job("ps", 1, cpus=0.5, mem=512), Job("worker", 2, cpus=0.5, mem=512)]
    with run_cluster(master, jobs, command=(), readiness_timeout=240) as c:  # server mode
        assert {n["state"] for n in c.status()["nodes"]} == {"RUNNING"}  # every server listens
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(c.cluster_def), rpc_layer="grpc"
        )
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            w = tf.Variable(0.0)
            b = tf.Variable(0.0)
        assert "/job:ps/" in w.device

        @tf.function
        def step() -> Any:
            def replica() -> Any:
                x = tf.random.uniform((32,))
                y = 3.0 * x + 2.0
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((w * x + b - y) ** 2)
                for var, grad in zip((w, b), tape.gradient(loss, [w, b]), strict=True):
                    var.assign_sub(0.5 * grad)
                return loss

            return strategy.run(replica)

        losses = [coordinator.schedule(step) for _ in range(40)]
        coordinator.join()
        first, last = losses[0].fetch(), losses[-1].fetch()
        assert last < first, (first, last)
        assert coordinator.done()
    wait(master, lambda: all_ended(master), 60)


# -- a coordinator service running the framework --------------------------------------------


def test_a_coordinator_without_the_framework_refuses_mesos_jobs(coordinator: Any) -> None:
    from tfcoord.client import RequestRejected

    spec = MesosJob.of([parse_role("worker:1")]).to_spec()
    with (
        DriverClient(coordinator.address, coordinator.secret) as driver,
        pytest.raises(RequestRejected) as info,
    ):
        driver.submit(spec)
    assert info.value.code == "no_engine" and "MESOS_MASTER" in info.value.message


def test_serve_runs_the_framework_for_submitted_jobs(master: ThreadedFakeMaster, tmp_path: Path) -> None:
    # Served waits for READY=1 on $NOTIFY_SOCKET, sent once listening and subscribed: no polling.
    env = dict(os.environ, TFCOORD_TASK_PYTHON=sys.executable)
    serve = Served(
        tmp_path, "--mesos-master", master.master.address, "--advertise-host", "127.0.0.1", env=env
    )
    try:
        assert len(master.master.frameworks) == 1
        out = serve.cli(
            "submit",
            "--engine",
            "mesos",
            "--job",
            "worker:2:cpus=0.5,mem=256",
            "--",
            sys.executable,
            "-c",
            "print('hello')",
            env=dict(serve.env, **env),
        )
        assert out.returncode == 0, out.stderr
        assert "job RUNNING -> SUCCEEDED" in out.stderr
        # --no-wait: the id, at once; the coordinator's framework runs the job on its own.
        quick = serve.cli(
            "submit",
            "--engine",
            "mesos",
            "--no-wait",
            "--json",
            "--job",
            "worker:1:cpus=0.5,mem=256",
            "--",
            sys.executable,
            "-c",
            "print('later')",
            env=dict(serve.env, **env),
        )
        assert quick.returncode == 0, quick.stderr
        job = json.loads(quick.stdout)["job"]
        # The job is not this test's driver's (each driver sees its own): the admin credential sees it.
        admin = auth.read_secret(f"{serve.secret_file}{ADMIN_SUFFIX}")
        with DriverClient(serve.address, admin, role="admin") as driver:
            assert driver.await_job(job, timeout_s=120).state.value == "SUCCEEDED"
    finally:
        assert serve.stop() == 0, serve.log
    assert master.master.calls_of("TEARDOWN")  # no journal: the framework ends with the service
    wait(master, lambda: all_ended(master))


def test_an_offered_port_left_in_time_wait_by_a_previous_task_is_usable(master: ThreadedFakeMaster) -> None:
    # A previous task's server closed its connections first: its port sits in TIME_WAIT for a
    # minute, and Mesos offers it again at once.
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 31000))
        listener.listen()
        client = socket.create_connection(("127.0.0.1", 31000))
        conn, _ = listener.accept()
        conn.close()  # the server side closes first: 127.0.0.1:31000 enters TIME_WAIT
        client.recv(1)
        client.close()
    with run_cluster(master, [Job("worker", 1, cpus=0.5, mem=256)]) as c:
        assert c.cluster_def == {"worker": ["127.0.0.1:31000"]}


def test_a_task_lost_mid_run_is_placed_again_and_the_job_restarts_from_its_checkpoint(
    master: ThreadedFakeMaster, tmp_path: Path
) -> None:
    """``--max-restarts 1`` on Mesos: worker 1's task is LOST mid-run (its agent went away); the
    cluster restarts as generation 1, the framework places the task again on a new offer as
    the slot's next attempt, the survivor rejoins from its own task, and both resume from their
    checkpoints (issue 25)."""
    steps = ROOT / "tests" / "e2e" / "restart_work" / "steps.py"
    for name in ("hold", "never"):
        os.mkfifo(tmp_path / name)
    env = dict(os.environ, MESOS_MASTER=master.master.address, TFCOORD_TASK_PYTHON=sys.executable)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfcoord",
            "submit",
            "--engine",
            "mesos",
            "--advertise-host",
            "127.0.0.1",
            "--job",
            "worker:2:cpus=0.5,mem=256",
            "--max-restarts",
            "1",
            "--restart-backoff",
            "0.2",
            "--json",
            "--",
            sys.executable,
            str(steps),
            str(tmp_path),
            "--hold-at",
            "5",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        with open(tmp_path / "hold") as fifo:  # worker 1 holds at step 5 of generation 0
            fifo.read()
        [lost] = [tid for tid in master.master.tasks if tid.endswith(".1.0")]
        master.call(master.master.fail_task(lost, "TASK_LOST", "agent went away"))
        stdout, stderr = proc.communicate(timeout=100)
    finally:
        # Whatever failed (this test's timeout included), the submission does not outlive it:
        # `with proc:` would wait for it without a limit.
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-4000:]
    status = json.loads(stdout)
    assert status["state"] == "SUCCEEDED" and status["generation"] == 1
    [restart] = status["restarts"]
    assert (
        restart["lost"] is True and f"mesos task {lost} ended TASK_LOST: agent went away" in restart["cause"]
    )
    nodes = {n["index"]: n for n in status["nodes"]}
    assert nodes[1]["task_id"].endswith(".1.1") and nodes[0]["task_id"].endswith(".0.0")
    assert (tmp_path / "ckpt-worker-1").read_text() == "10"
    wait(master, lambda: all_ended(master))
