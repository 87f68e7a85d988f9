"""A real coordinator on port 0 with real blocking clients in threads and subprocesses."""

from __future__ import annotations

import os
import random
import select
import socket
import string
import struct
import subprocess
import sys
import threading

import msgpack
import pytest

from tfcoord.client import (
    AuthenticationFailed,
    ClusterInfo,
    DriverClient,
    JobFailed,
    JobSpec,
    JobStopped,
    NodeClient,
    RequestRejected,
    make_roles,
)
from tfcoord.client import messages as m
from tfcoord.client.protocol import Connection, decode_spec
from tfcoord.client.vocab import WaitKind
from tfcoord.coordinator.embedded import EmbeddedCoordinator

from .rawwire import Raw, wait_until


def _driver(coord: EmbeddedCoordinator) -> DriverClient:
    return DriverClient(coord.address, coord.secret).connect()


def _node(
    coord: EmbeddedCoordinator, driver: DriverClient, job: str, executor_id: int, attempt: int = 0
) -> NodeClient:
    return NodeClient(coord.address, driver.job_token(job), job, executor_id, attempt).connect()


def _rendezvous(coord, driver, job, executor_id, port, events=None) -> ClusterInfo:
    with _node(coord, driver, job, executor_id) as n:
        n.register("127.0.0.1", port)
        n.start_heartbeats(0.2)
        info = n.await_cluster(30)
        n.report("running")
        n.report("succeeded")
        return info


def test_rendezvous_of_several_nodes(coordinator, background):
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(3, 1, chief="chief"), reservation_timeout_s=30))
        for i in range(5):
            background.start(_rendezvous, coordinator, d, job, i, 6000 + i)
        infos = background.results()
        status = d.await_job(job, 30)
    assert status["state"] == "SUCCEEDED"
    expected = {
        "ps": ["127.0.0.1:6000"],
        "chief": ["127.0.0.1:6001"],
        "worker": ["127.0.0.1:6002", "127.0.0.1:6003", "127.0.0.1:6004"],
    }
    assert [i.cluster for i in infos] == [expected] * 5
    assert [(i.role, i.index) for i in infos] == [
        ("ps", 0),
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]
    assert infos[3].tf_config == {"cluster": expected, "task": {"type": "worker", "index": 1}}
    assert infos[3].num_workers == 4


def test_a_cluster_completion_in_chunks_reaches_every_node(coordinator, background):
    # Two nodes per CompleteCluster: the server hands in the rest of the completion on its
    # next loop turns, and every node still gets the one spec with its own role and index.
    coordinator.call(lambda: setattr(coordinator.server.state, "complete_per_event", 2))
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(5), reservation_timeout_s=30))
        for i in range(5):
            background.start(_rendezvous, coordinator, d, job, i, 6100 + i)
        infos = background.results()
        status = d.await_job(job, 30)
        assert status["state"] == "SUCCEEDED"
        assert coordinator.call(lambda: coordinator.server.state.jobs[job].completing) is None
    expected = {"worker": [f"127.0.0.1:{6100 + i}" for i in range(5)]}
    assert [i.cluster for i in infos] == [expected] * 5
    assert [(i.role, i.index) for i in infos] == [("worker", i) for i in range(5)]


def test_a_cluster_reply_larger_than_the_sockets_take_at_once_arrives_whole(coordinator):
    # The spec names hosts of random letters (zlib cannot shrink it to fit) and one node's
    # socket buffers, on both sides, are made as small as the kernel allows: the reply's one
    # vectored write sends a part, the transport keeps the rest until the node reads.
    rng = random.Random(28)
    hosts = ["".join(rng.choices(string.ascii_lowercase, k=250)) for _ in range(64)]
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(len(hosts)), reservation_timeout_s=30))
        token = d.job_token(job)
    slow = Raw(coordinator.port, recv_buffer=2048).login(token, "node", job)

    def its_socket() -> socket.socket:
        (peer,) = [p for p in coordinator.server.peers.values() if p.role == "node"]
        return peer.transport.get_extra_info("socket")

    coordinator.call(lambda: its_socket().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2048))
    ids = {"job": job, "attempt": 0}
    others = []
    try:
        slow.send(m.Register(id=1, executor_id=0, host=hosts[0], port=20000, **ids))
        assert isinstance(slow.next(), m.Reply)
        slow.send(m.AwaitCluster(id=2, executor_id=0, timeout_s=30.0, **ids))
        for i, host in enumerate(hosts[1:], 1):
            other = Raw(coordinator.port).login(token, "node", job)
            others.append(other)
            other.send(m.Register(id=1, executor_id=i, host=host, port=20000 + i, **ids))
            other.send(m.AwaitCluster(id=2, executor_id=i, timeout_s=30.0, **ids))

        def held_back() -> bool:
            peer = next(p for p in coordinator.server.peers.values() if p.role == "node")
            return peer.transport.get_write_buffer_size() > 0

        wait_until(lambda: coordinator.call(held_back), what="part of the reply waiting in the transport")
        reply = slow.next()
        assert isinstance(reply, m.ClusterReply) and (reply.id, reply.role, reply.index) == (2, "worker", 0)
        assert len(reply.spec) > 8192
        assert decode_spec(reply.spec) == {"worker": [f"{h}:{20000 + i}" for i, h in enumerate(hosts)]}
    finally:
        for raw in [slow, *others]:
            raw.close()


def test_a_restart_goes_through_a_journaled_completion_and_finishes_a_cut_one(tmp_path):
    from tfcoord.client import auth
    from tfcoord.coordinator import state as s
    from tfcoord.coordinator.journal import SqliteJournal
    from tfcoord.coordinator.server import CoordinatorServer, ServerConfig

    journal = SqliteJournal(tmp_path)
    journal.append(s.SubmitJob(now=1.0, job="j", spec=JobSpec(roles=make_roles(5)), owner=b"o"))
    for i in range(5):
        req = m.Register(id=1, job="j", executor_id=i, attempt=0, host="10.0.0.1", port=7000 + i)
        journal.append(s.RegisterNode(now=2.0, req=req))
    journal.append(s.CompleteCluster(now=3.0, job="j", upto=2))  # then killed
    journal.commit()
    server = CoordinatorServer(
        ServerConfig(secret=auth.new_secret()),
        journal=journal,
        state=s.CoordinatorState(complete_per_event=2),
    )
    try:
        server.recover()
        server.state.validate()
        job = server.state.jobs["j"]
        assert job.state.value == "READY" and job.completing is None
        ready = [(when, text) for when, text in job.events if text.endswith(" READY") and "worker:" in text]
        assert [text for _, text in ready] == [f"worker:{i} READY" for i in range(5)]
        # The journaled step at its own time, the rest at the restart (Recovered).
        assert [when for when, _ in ready[:2]] == [3.0, 3.0] and all(when > 3.0 for when, _ in ready[2:])
        assert [n.state.value for n in job.nodes()] == ["READY"] * 5
    finally:
        server._committer.shutdown()
        journal.close()


def test_failure_propagates_to_every_node_and_the_driver(coordinator, background):
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(3), reservation_timeout_s=30))
        stopped = {i: threading.Event() for i in range(3)}
        nodes = [_node(coordinator, d, job, i) for i in range(3)]
        for i, n in enumerate(nodes):
            n.register("127.0.0.1", 7000 + i)
            n.start_heartbeats(0.2, on_stop=lambda reason, i=i: stopped[i].set())
        for n in nodes:
            n.await_cluster(10)
        nodes[1].report("failed", error="Traceback (most recent call last):\nValueError: bad batch")
        assert stopped[0].wait(10) and stopped[2].wait(10)
        assert "ValueError: bad batch" in nodes[0].stop_reason
        with pytest.raises(JobFailed) as e:
            d.await_job(job, 10)
        for n in nodes:
            n.close()
    msg = str(e.value)
    assert "worker:1 (executor 1, host 127.0.0.1)" in msg and "ValueError: bad batch" in msg


def test_duplicate_registration_is_refused_and_retry_supersedes(coordinator):
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(2), reservation_timeout_s=30))
        a = _node(coordinator, d, job, 0)
        a.register("10.0.0.1", 5000)
        b = _node(coordinator, d, job, 0)
        with pytest.raises(RequestRejected) as e:
            b.register("10.0.0.2", 5000)
        assert e.value.code == "duplicate" and "already held by worker:0" in e.value.message
        # the same registration again (a reconnect) gets the same answer
        assert a.register("10.0.0.1", 5000)["role"] == "worker"
        # a live, heartbeating holder cannot be displaced by a higher attempt
        retry = _node(coordinator, d, job, 0, attempt=1)
        with pytest.raises(RequestRejected) as e:
            retry.register("10.0.0.3", 5001)
        assert e.value.code == "slot_held"
        # a Spark task retry: once attempt 0's process is gone, attempt 1 supersedes it
        a.close()
        wait_until(
            lambda: coordinator.call(lambda: coordinator.server.state.jobs[job].slots[0].node.conn) is None,
            what="the coordinator to see attempt 0's connection close",
        )
        assert retry.register("10.0.0.3", 5001)["index"] == 0
        a = _node(coordinator, d, job, 0)
        with pytest.raises(RequestRejected) as e:
            a.report("running")
        assert e.value.code == "stale_attempt"
        st = d.status(job)
        assert st["nodes"][0]["host"] == "10.0.0.3" and st["history"][0]["state"] == "STOPPED"
        for c in (a, b, retry):
            c.close()


def test_reservation_timeout_names_every_missing_slot(coordinator):
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(2, 1), reservation_timeout_s=0.5))
        with _node(coordinator, d, job, 1) as n:
            n.register("127.0.0.1", 5000)
            with pytest.raises(RequestRejected) as waited:
                n.await_cluster(30)
        with pytest.raises(JobFailed) as e:
            d.await_job(job, 10)
    msg = str(e.value)
    assert "reservation timed out after 0.5 s: 2 of 3 slots" in msg
    assert "ps:0 (executor 0): never registered" in msg and "worker:1 (executor 2): never registered" in msg
    assert "worker:0" not in msg
    assert waited.value.code == "job_failed"


def test_stop_is_pushed_and_ends_stopped(coordinator):
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(2), reservation_timeout_s=30))
        nodes = [_node(coordinator, d, job, i) for i in range(2)]
        for i, n in enumerate(nodes):
            n.register("127.0.0.1", 5000 + i)
            n.start_heartbeats(5.0)  # stop must arrive by push, not by the next heartbeat
        for n in nodes:
            n.await_cluster(10)
            n.report("running")
        dry = d.stop(job, dry_run=True)
        assert dry["state"] == "RUNNING" and len(dry["nodes"]) == 2
        assert d.stop(job, "streaming done")["state"] == "STOPPING"
        for n in nodes:
            assert n.stop_event.wait(5) and n.stop_reason == "streaming done"
            n.report("stopped")
        with pytest.raises(JobStopped):
            d.await_job(job, 10)
        assert d.await_job(job, 10, raise_on_failure=False)["state"] == "STOPPED"
        for n in nodes:
            n.close()


def test_wrong_secret_is_refused(coordinator):
    with pytest.raises(AuthenticationFailed, match="does not match the coordinator secret"):
        DriverClient(coordinator.address, b"x" * 32).connect()


def test_node_token_only_works_for_its_own_job(coordinator):
    with _driver(coordinator) as d:
        a = d.submit(JobSpec(roles=make_roles(1)))
        b = d.submit(JobSpec(roles=make_roles(1)))
        with pytest.raises(AuthenticationFailed, match=f"job token of {b}"):
            NodeClient(coordinator.address, d.job_token(a), b, 0).connect()
        with NodeClient(coordinator.address, d.job_token(a), a, 0).connect() as n:
            with pytest.raises(RequestRejected) as e:
                n.request(lambda i: m.Register(id=i, job=b, executor_id=0, attempt=0, host="h", port=1))
            assert e.value.code == "forbidden" and f"job {a} only" in e.value.message
            with pytest.raises(RequestRejected, match="forbidden"):
                n.request(lambda i: m.Status(id=i, job=a))


def _raw(coord: EmbeddedCoordinator) -> tuple[socket.socket, Connection]:
    sock = socket.create_connection(("127.0.0.1", coord.port), timeout=10)
    conn = Connection()
    conn.receive_data(sock.recv(65536))
    assert isinstance(conn.next_event(), m.Challenge)
    return sock, conn


def _read_until_closed(sock: socket.socket) -> list[m.Message]:
    conn, out = Connection(), []
    while data := sock.recv(65536):
        conn.receive_data(data)
        while isinstance(ev := conn.next_event(), m.Message):
            out.append(ev)
    sock.close()
    return out


@pytest.mark.parametrize(
    ("payload", "expect"),
    [
        (b"\x00\x00\x00\x05garbage", "undecodable frame"),
        (struct.pack(">I", 1 << 30), "exceeds the 4096-byte limit"),  # before the handshake: a hello's worth
        (struct.pack(">I", 3) + msgpack.packb([1, 2]), "must hold a map"),
        (struct.pack(">I", 9) + msgpack.packb({"op": "nope"}), "unknown op"),
        (Connection().send(m.Status(id=1)), "first message must be hello"),
    ],
)
def test_malformed_frames_get_an_error_and_a_close(coordinator, payload, expect):
    sock, _ = _raw(coordinator)
    sock.sendall(payload)
    replies = _read_until_closed(sock)
    assert len(replies) == 1 and isinstance(replies[0], m.Error) and replies[0].id is None
    assert expect in replies[0].message
    # the coordinator is unharmed: a normal client still works
    with _driver(coordinator) as d:
        assert d.status() == {"jobs": []}


def test_requests_before_a_bad_frame_in_the_same_read_are_still_answered(coordinator):
    raw = Raw(coordinator.port).login(coordinator.secret, "driver")
    raw.sock.sendall(
        raw.conn.send(m.Status(id=1)) + raw.conn.send(m.Status(id=2)) + b"\x00\x00\x00\x05garbage"
    )
    replies = raw.until_closed()
    assert [(type(r).__name__, r.id) for r in replies] == [("Reply", 1), ("Reply", 2), ("Error", None)]  # type: ignore[attr-defined]
    assert replies[2].code == "protocol_error"  # type: ignore[attr-defined]


def test_a_reply_too_large_for_a_frame_is_refused_and_the_connection_carries_on():
    with EmbeddedCoordinator(plaintext=True, max_frame_bytes=64 * 1024) as coord, _driver(coord) as d:
        big = d.submit(JobSpec(roles=make_roles(2000)))  # its status is a few hundred KiB
        small = d.submit(JobSpec(roles=make_roles(1)))
        with pytest.raises(RequestRejected) as info:
            d.status(big)
        assert info.value.code == "too_large" and "65536-byte limit" in info.value.message
        assert d.status(small)["state"] == "SUBMITTED"  # the same connection still answers
        assert [j["job"] for j in d.status()["jobs"]] == [big, small]


def test_a_wait_on_its_default_deadline_survives_a_reconnect(coordinator, background):
    """The resent wait asks for what is left of it, never more than the field allows."""
    admin = DriverClient(coordinator.address, coordinator.admin_secret, role="admin").connect()
    with _driver(coordinator) as d, admin as other:
        job = d.submit(JobSpec(roles=make_roles(1)))
        background.start(d.await_job, job)  # timeout_s = MAX_TIMEOUT_S, the default
        wait_until(
            lambda: bool(coordinator.call(lambda: coordinator.server.state.waits.of_job(job, WaitKind.JOB))),
            what="the await_job to reach the coordinator",
        )
        d._sock.shutdown(socket.SHUT_RDWR)  # the network drops the connection
        wait_until(lambda: d.reconnects >= 1, what="a reconnect")
        wait_until(
            lambda: bool(coordinator.call(lambda: coordinator.server.state.waits.of_job(job, WaitKind.JOB))),
            what="the resent await_job",
        )
        other.stop(job, "enough")
        [outcome] = background.results(timeout_s=10)
        assert isinstance(outcome, JobStopped) and "enough" in str(outcome)


def test_a_node_runners_command_dies_with_the_runner(coordinator):
    """SIGKILL the node runner (as a lost Mesos executor or an interrupted engine would):
    the command it started goes with it instead of running on, orphaned."""
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
        env = dict(os.environ, TFCOORD_TOKEN=d.job_token(job).hex())
        script = "import time; time.sleep(600)"
        runner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfcoord.node",
                "--address",
                coordinator.address,
                "--job",
                job,
                "--executor-id",
                "0",
                "--",
                sys.executable,
                "-c",
                script,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            st = d.watch(job, 0, 30)
            while st["state"] != "RUNNING":  # reported once the command started
                st = d.watch(job, st["version"], 30)
            child = int(st["nodes"][0]["meta"]["child_pid"])
            runner.kill()
            runner.wait(30)
            fd = os.pidfd_open(child)  # readable once the process ends
            try:
                ready, _, _ = select.select([fd], [], [], 30)
            finally:
                os.close(fd)
            assert ready, f"the command (pid {child}) outlived its runner"
        finally:
            runner.kill()


def test_handshake_timeout_cuts_off_silent_clients():
    with EmbeddedCoordinator(plaintext=True, handshake_timeout_s=0.2) as coord:
        sock, _ = _raw(coord)
        replies = _read_until_closed(sock)
        assert replies[0].code == "handshake_timeout"


def test_max_connections_refuses_the_extra_one():
    with EmbeddedCoordinator(plaintext=True, max_connections=2) as coord:
        held = [Raw(coord.port).login(coord.secret, "driver") for _ in range(2)]
        extra = Raw(coord.port)  # the handshake has a budget of its own...
        extra.send(extra.hello(coord.secret, "driver"))
        replies = extra.until_closed()  # ...the authenticated one is full
        assert replies[0].code == "too_many_connections"  # type: ignore[attr-defined]
        for r in held:
            r.close()


def test_node_in_a_subprocess(coordinator):
    code = (
        "import sys; from tfcoord.client import NodeClient\n"
        "n = NodeClient(sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3], 0).connect()\n"
        "n.register('127.0.0.1', 5555); info = n.await_cluster(30)\n"
        "print(info.tf_config_json()); n.report('succeeded'); n.close()\n"
    )
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
        out = subprocess.run(
            [sys.executable, "-c", code, coordinator.address, d.job_token(job).hex(), job],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert d.await_job(job, 10)["state"] == "SUCCEEDED"
    assert (
        out.stdout.strip() == '{"cluster":{"worker":["127.0.0.1:5555"]},"task":{"type":"worker","index":0}}'
    )


def test_client_package_imports_no_heavy_dependencies():
    code = (
        "import sys, tfcoord.client, tfcoord.client.progress\n"
        "heavy = sorted(k for k in sys.modules if k.split('.')[0] in ('aiohttp', 'pyspark', 'tensorflow'))\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_jobs_are_isolated(coordinator):
    with _driver(coordinator) as d:
        a = d.submit(JobSpec(roles=make_roles(1)))
        b = d.submit(JobSpec(roles=make_roles(1)))
        na, nb = _node(coordinator, d, a, 0), _node(coordinator, d, b, 0)
        na.register("127.0.0.1", 1)
        nb.register("127.0.0.1", 1)
        na.await_cluster(5)
        nb.await_cluster(5)
        na.report("failed", error="boom")
        assert d.status(b)["state"] == "READY" and d.status(a)["state"] == "FAILED"
        assert nb.heartbeat()["stop"] is False
        nb.report("succeeded")
        assert d.await_job(b, 5)["state"] == "SUCCEEDED"
        na.close()
        nb.close()


def test_lost_node_fails_the_job_fast(coordinator):
    """A node whose process dies (connection closed, no reconnect) is LOST after the grace."""
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(2), reconnect_grace_s=0.3))
        keep = _node(coordinator, d, job, 0)
        keep.register("127.0.0.1", 1)
        code = (
            "import os, sys; from tfcoord.client import NodeClient\n"
            "n = NodeClient(sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3], 1).connect()\n"
            "n.register('127.0.0.1', 2); n.await_cluster(30); n.report('running'); os._exit(9)\n"
        )
        subprocess.run(
            [sys.executable, "-c", code, coordinator.address, d.job_token(job).hex(), job], timeout=60
        )
        with pytest.raises(
            JobFailed, match=r"worker:1 \(executor 1, host 127.0.0.1\) was lost: connection lost"
        ):
            d.await_job(job, 10)
        keep.close()


def test_env_does_not_leak_token_into_process_list(coordinator):
    """The node runner takes its token from the environment, never argv."""
    with _driver(coordinator) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
        token = d.job_token(job).hex()
        env = dict(os.environ, TFCOORD_TOKEN=token)
        cmd = [
            sys.executable,
            "-m",
            "tfcoord.node",
            "--address",
            coordinator.address,
            "--job",
            job,
            "--executor-id",
            "0",
            "--",
            sys.executable,
            "-c",
            "import os, json; print(json.loads(os.environ['TF_CONFIG'])['task']); "
            "print('TFCOORD_TOKEN' in os.environ)",
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert token not in " ".join(cmd)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["{'type':", "'worker',", "'index':", "0}", "False"]
        assert d.await_job(job, 10)["state"] == "SUCCEEDED"
