"""Issue 16's attacks, each replayed against a live coordinator: refused, bounded or harmless.

Every test first does what the attack did, then checks that the coordinator refused it,
kept it inside a bound, or shrugged it off, while a legitimate client still works.
(Attacks 5 and 6, the pre-handshake budgets, are in test_limits.py; 3 and 4 also have
state-machine tests in tests/unit/test_state.py; 10 is in tests/unit/test_protocol.py.)
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfcoord.client import (
    AuthenticationFailed,
    DriverClient,
    JobSpec,
    NodeClient,
    RequestRejected,
    auth,
    make_roles,
)
from tfcoord.client import messages as m
from tfcoord.client.protocol import Connection
from tfcoord.coordinator import state as s
from tfcoord.coordinator.embedded import EmbeddedCoordinator

from .rawwire import Raw, wait_until
from .served import Served

TOKEN = b"http-token-" + b"z" * 32


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    c = Served(tmp_path_factory.mktemp("served"), http=True)
    try:
        yield c
    finally:
        c.stop()


def _node(
    c: Served | EmbeddedCoordinator, d: DriverClient, job: str, eid: int, attempt: int = 0
) -> NodeClient:
    return NodeClient(c.address, d.job_token(job), job, eid, attempt).connect()


# -- 1: idle HTTP connections -----------------------------------------------------------------


def _closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_idle_http_connections_are_capped_and_timed_out_apart_from_the_node_port():
    """1,100 HTTP sockets that sent nothing took every descriptor: drivers failed and
    /healthz hung. Now HTTP has its own cap (503 beyond it) and a request deadline."""
    with EmbeddedCoordinator(plaintext=True) as coord:
        port = coord.start_http(TOKEN, max_connections=8, keepalive_timeout_s=3.0)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(7)]
        # A slow-loris request: headers begun, never finished.
        loris = socket.create_connection(("127.0.0.1", port), timeout=10)
        loris.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        over = socket.create_connection(("127.0.0.1", port), timeout=10)
        with over:
            answer = over.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
        # The node port is a budget of its own: a driver works meanwhile.
        with DriverClient(coord.address, coord.secret) as d:
            assert d.status() == {"jobs": []}
        # Every idle and half-sent connection is closed at the request deadline...
        for sock in [*idle, loris]:
            assert _closed_by_peer(sock, 10.0)
            sock.close()
        # ...and the probe answers again.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert r.status == 200


def test_serve_refuses_caps_that_do_not_fit_its_descriptor_limit(tmp_path: Path):
    import subprocess
    import sys

    out = subprocess.run(
        [
            "prlimit",
            "--nofile=1024:1024",
            sys.executable,
            "-m",
            "tfcoord",
            "serve",
            "--plaintext",
            "--port",
            "0",
            "--secret-file",
            str(tmp_path / "secret"),
            "--max-connections",
            "20000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "--max-connections 20000 does not fit the descriptor limit (RLIMIT_NOFILE 1024)" in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2, out.stderr


# -- 2: one node token grows memory ---------------------------------------------------------


def test_re_registering_a_slot_in_a_loop_is_bounded(served: Served):
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2), reservation_timeout_s=120))
        big = {f"k{i}": "v" * m.MAX_TEXT_LEN for i in range(m.MAX_META_ENTRIES)}
        refused = []
        for attempt in range(60):
            with NodeClient(served.address, d.job_token(job), job, 0, attempt) as n:
                try:
                    n.register("10.0.0.1", 5000 + attempt, task_id="t" * m.MAX_TEXT_LEN, meta=big)
                except RequestRejected as e:
                    refused.append(e.code)
        assert set(refused) == {"too_many_attempts"} and len(refused) == 60 - s.MAX_ATTEMPTS_PER_SLOT
        status = d.status(job)  # still fits a frame, and says what happened
        assert len(status["history"]) == s.MAX_HISTORY_PER_SLOT
        assert d.stop(job)["state"] in ("STOPPING", "STOPPED")


# -- 3: cross-job GPU blocking ----------------------------------------------------------------


def test_gpu_claims_of_one_job_do_not_block_another(served: Served):
    with DriverClient(served.address, served.secret) as d:
        a = d.submit(JobSpec(roles=make_roles(1)))
        b = d.submit(JobSpec(roles=make_roles(1)))
        with _node(served, d, a, 0) as na, _node(served, d, b, 0) as nb:
            na.register("gpuhost", 5000, gpus=tuple(f"GPU-{i}" for i in range(8)))
            assert nb.register("gpuhost", 5001, gpus=("GPU-0",))["job"] == b
        d.stop(a)
        d.stop(b)


# -- 4: the timer heap ------------------------------------------------------------------------


def test_waits_of_closed_connections_leave_the_timer_heap():
    owner_key = auth.new_owner_key()
    with EmbeddedCoordinator(plaintext=True) as coord:
        with DriverClient(coord.address, coord.secret, owner_key=owner_key) as d:
            job = d.submit(JobSpec(roles=make_roles(1)))
        for _ in range(60):
            raw = Raw(coord.port).login(coord.secret, "driver", owner_key=owner_key)
            for i in range(60):
                raw.send(m.AwaitJob(id=i + 1, job=job, timeout_s=7 * 86400.0))
            wait_until(
                lambda: coord.call(lambda: len(coord.server.state.waits.pending)) == 60, what="60 waits"
            )
            raw.close()
            wait_until(
                lambda: coord.call(lambda: len(coord.server.state.waits.pending)) == 0, what="waits gone"
            )
        assert coord.call(lambda: len(coord.server.state.timers.heap)) <= 2 * s.STALE_TIMER_SLACK + 8


# -- 6: one source taking every handshake slot ---------------------------------------------------


def _refused_from(port: int, source: str) -> m.Error:
    """Connect from ``source`` and read what the coordinator says before it hangs up."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as sock:
        conn = Connection()
        while data := sock.recv(65536):
            conn.receive_data(data)
        conn.receive_data(b"")
        err = conn.next_event()
    assert isinstance(err, m.Error), err
    return err


def test_one_source_cannot_take_every_handshake_slot_by_default(tmp_path: Path):
    """Attack 6 with the defaults: the per-source cap used to be the whole handshake budget, so
    idle sockets from one host still refused every other host's nodes. Now one source gets a
    quarter of it (here TFCOORD_MAX_UNAUTHENTICATED=16, so 4) and a node from another source
    registers while the stranger's sockets sit idle."""
    env = dict(os.environ, TFCOORD_MAX_UNAUTHENTICATED="16")
    env.pop("TFCOORD_MAX_UNAUTHENTICATED_PER_SOURCE", None)
    c = Served(tmp_path, env=env)
    idle: list[Raw] = []
    try:
        idle = [Raw(c.port, source="127.0.0.2") for _ in range(4)]
        refused = [_refused_from(c.port, "127.0.0.2") for _ in range(12)]  # what used to fill the budget
        assert {e.code for e in refused} == {"too_many_connections"}
        assert "4 connections from 127.0.0.2 are in their handshake" in refused[0].message
        with DriverClient(c.address, c.secret) as d:
            job = d.submit(JobSpec(roles=make_roles(1)))
            with _node(c, d, job, 0) as n:
                n.register("10.0.0.1", 7000)
                assert n.await_cluster(30).cluster == {"worker": ["10.0.0.1:7000"]}
            d.stop(job)
    finally:
        for r in idle:
            r.close()
        c.stop()


# -- 8: displacing a live holder ----------------------------------------------------------------


def test_a_second_token_holder_cannot_take_over_a_live_slot(served: Served):
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2), reservation_timeout_s=120))
        with _node(served, d, job, 0) as holder, _node(served, d, job, 1) as other:
            holder.register("10.0.0.1", 6000)
            holder.heartbeat()
            with (
                NodeClient(served.address, d.job_token(job), job, 0, 7) as thief,
                pytest.raises(RequestRejected) as e,
            ):
                thief.register("203.0.113.66", 6666)
            assert e.value.code == "slot_held"
            other.register("10.0.0.2", 6001)
            assert holder.await_cluster(30).cluster == {"worker": ["10.0.0.1:6000", "10.0.0.2:6001"]}
        d.stop(job)


# -- 9: log injection -------------------------------------------------------------------------

FORGED = "2026-12-04 12:00:00,000 ERROR tfcoord.coordinator: job forged: SUCCEEDED"


def test_newlines_in_node_supplied_text_cannot_forge_log_lines(served: Served):
    with DriverClient(served.address, served.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
        with _node(served, d, job, 0) as n:
            n.register("10.0.0.1", 6000, task_id="t1\n" + FORGED)
            n.await_cluster(30)
            n.report("running")
            n.report("failed", error="Traceback\n" + FORGED + "\r\n" + FORGED)
    log = served.log
    assert "t1\\n" + FORGED in log  # the text is there, escaped, on the line it belongs to
    assert not [line for line in log.splitlines() if line.startswith(FORGED[:23])]


# -- 11: /healthz -----------------------------------------------------------------------------


def test_healthz_without_a_token_discloses_nothing(served: Served):
    with urllib.request.urlopen(f"http://127.0.0.1:{served.http_port}/healthz", timeout=10) as r:
        body = r.read()
    assert body == b'{"status":"ok"}'
    assert not re.search(rb"jobs|version|\d+\.\d+", body)


# -- 7: any driver acting on any job ------------------------------------------------------------


def test_a_driver_sees_and_stops_only_its_own_jobs(served: Served):
    """Drivers share one secret; any of them could stop any job and read every job's
    tracebacks and cluster spec. Now a job is its submitter's (and the admin's)."""
    with (
        DriverClient(served.address, served.secret) as alice,
        DriverClient(served.address, served.secret) as mallory,
    ):
        job = alice.submit(JobSpec(roles=make_roles(1)))
        assert job not in {j["job"] for j in mallory.status()["jobs"]}
        for attempt in (
            lambda: mallory.status(job),
            lambda: mallory.stop(job),
            lambda: mallory.await_job(job, 1),
        ):
            with pytest.raises(RequestRejected) as e:
                attempt()
            assert e.value.code == "unknown_job"  # the same answer as for a job that does not exist
        with pytest.raises(RequestRejected) as e:  # nor can it take the id over
            mallory.submit(JobSpec(roles=make_roles(1)), job)
        assert e.value.code == "job_exists"
        # The secret does not make node tokens of other drivers' jobs either.
        with pytest.raises(AuthenticationFailed):
            NodeClient(served.address, mallory.job_token(job), job, 0).connect()
        assert alice.status(job)["state"] == "SUBMITTED"
        # The secret is not the admin credential...
        with pytest.raises(AuthenticationFailed):
            DriverClient(served.address, served.secret, role="admin").connect()
    # ...which sees and stops every job.
    admin_secret = auth.read_secret(str(served.secret_file) + ".admin")
    with DriverClient(served.address, admin_secret, role="admin") as admin:
        assert job in {j["job"] for j in admin.status()["jobs"]}
        assert admin.stop(job, "by the operator")["state"] == "STOPPED"


# -- 8 (the wire): the embedded coordinator speaks TLS by default -------------------------------


def test_the_python_api_serves_tls_unless_told_plaintext_with_a_warning(caplog):
    """start_embedded() and EmbeddedCoordinator() used to serve plaintext unless asked for TLS:
    now TLS is the default everywhere, plaintext only by plaintext=True, logged as a warning."""
    import logging

    from tfcoord.client import TlsError
    from tfcoord.coordinator.embedded import start_embedded

    with caplog.at_level(logging.WARNING, logger="tfcoord.coordinator"):
        with start_embedded() as coord:
            assert coord.ca_pem is not None
            with pytest.raises(TlsError, match="TLS"):
                DriverClient(coord.address, coord.secret, challenge_timeout_s=1).connect()
            with DriverClient(coord.address, coord.secret, ssl_context=coord.client_context()) as d:
                assert d.jobs() == ()
        assert "PLAINTEXT" not in caplog.text
        with start_embedded(plaintext=True) as coord:
            assert coord.ca_pem is None and coord.client_context() is None
            with DriverClient(coord.address, coord.secret) as d:
                assert d.jobs() == ()
        assert "the embedded coordinator serves PLAINTEXT (plaintext=True" in caplog.text
    with pytest.raises(ValueError, match="plaintext=True contradicts ssl_context"):
        EmbeddedCoordinator(plaintext=True, ssl_context=ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))


def test_an_ephemeral_tls_coordinator_is_pinned_by_its_nodes_and_refuses_plaintext():
    """The default Spark path (an embedded coordinator on 0.0.0.0) could not use TLS, so
    anyone on the path could read and inject frames. Now it makes its own CA and
    certificate; its clients pin that CA, and a plaintext peer gets nothing."""
    from tfcoord.client import TlsError, tls
    from tfcoord.node.tlsfiles import TlsFiles

    with EmbeddedCoordinator(host="0.0.0.0") as coord:
        assert coord.ca_pem is not None and "BEGIN CERTIFICATE" in coord.ca_pem
        pinned = TlsFiles(ca_pem=coord.ca_pem).context()
        with DriverClient(coord.address, coord.secret, ssl_context=pinned) as d:
            job = d.submit(JobSpec(roles=make_roles(1)))
            with NodeClient(coord.address, d.job_token(job), job, 0, ssl_context=pinned) as n:
                n.register("127.0.0.1", 6000)
                assert n.await_cluster(30).cluster == {"worker": ["127.0.0.1:6000"]}
        with pytest.raises(TlsError, match="TLS"):
            DriverClient(coord.address, coord.secret, challenge_timeout_s=1).connect()
        # Another embedded coordinator's CA is not this one's: pinning means exactly this one.
        with (
            EmbeddedCoordinator() as other,
            pytest.raises(TlsError, match="does not trust"),
        ):
            DriverClient(
                coord.address, coord.secret, ssl_context=tls.client_context(ca_pem=other.ca_pem)
            ).connect()


def test_sockets_that_never_start_tls_are_counted_in_the_handshake_budgets():
    """Attacks 1 and 6 against a TLS coordinator (the default now): asyncio's
    create_server(ssl=...) ran each TLS handshake before the coordinator saw the connection,
    so idle TCP sockets that never sent a ClientHello sat outside every cap until the
    handshake timeout. Now a connection is counted when it is accepted and TLS starts after."""
    with EmbeddedCoordinator(max_unauthenticated=8, max_unauthenticated_per_source=2) as coord:
        assert coord.ca_pem is not None
        host, port = coord.address.rsplit(":", 1)
        counted = lambda: coord.call(lambda: coord.server.unauthenticated_from.get("127.0.0.2", 0))  # noqa: E731
        idle = [
            socket.create_connection((host, int(port)), source_address=("127.0.0.2", 0)) for _ in range(2)
        ]
        try:
            wait_until(lambda: counted() == 2)
            # A third from that source is closed at once, before any TLS: not held for 10 s.
            third = socket.create_connection((host, int(port)), source_address=("127.0.0.2", 0))
            assert _closed_by_peer(third, within_s=5)
            third.close()
            assert counted() == 2
            # Another source's driver still completes TLS and its handshake.
            with DriverClient(coord.address, coord.secret, ssl_context=coord.client_context()) as d:
                assert d.jobs() == ()
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: counted() == 0)  # closed before TLS: uncounted
        assert coord.call(lambda: coord.server.unauthenticated) == 0


def test_one_client_address_cannot_take_every_http_connection_and_the_503_is_exact():
    """N10: the HTTP cap was shared by all sources, so one client could hold it all; and the
    503's Content-Length said 85 for an 84-byte body. Now each address has its share, the
    others still get in, and every 503 is a whole, exact HTTP answer."""
    with EmbeddedCoordinator(plaintext=True) as coord:
        port = coord.start_http(TOKEN, max_connections=16, max_per_client=3)
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as over:
                answer = b""
                while chunk := over.recv(4096):
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
            assert length == len(body)
            assert json.loads(body)["error"] == "too_many_connections"
            assert b"from this address" in body
            # Another address (a second loopback address) is served meanwhile.
            other = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0))
            with other:
                other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert other.recv(4096).startswith(b"HTTP/1.1 200")
        finally:
            for s in held:
                s.close()
        # Its connections closed, the first address is served again.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert r.status == 200


def test_a_member_of_a_job_cannot_act_as_another_node_of_it():
    """N1: the job token is every member's, so it cannot tell them apart. A second holder of it
    (a compromised executor) tries to report, heartbeat, publish metadata and progress for
    another node's slot over a connection of its own, and to take its registration: each is
    refused (not_slot_holder) and counted; the node itself goes on, and after a reconnect it
    proves itself with its credential."""
    with EmbeddedCoordinator(plaintext=True) as coord, DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2)))
        token = d.job_token(job)
        nodes = [NodeClient(coord.address, token, job, i).connect() for i in range(2)]
        intruder = NodeClient(coord.address, token, job, 1).connect()  # speaks for worker:1's slot
        try:
            for i, n in enumerate(nodes):
                n.register("127.0.0.1", 7300 + i)
            for n in nodes:
                n.await_cluster(10)
                n.report("RUNNING")
            for attack in (
                lambda: intruder.report("SUCCEEDED"),
                lambda: intruder.report("FAILED", error="forged"),
                lambda: intruder.heartbeat(meta={"tensorboard_url": "http://evil.example/"}),
                lambda: intruder.progress({"loss": 0.0}),
                lambda: intruder.register("127.0.0.1", 7301),  # a copy of worker:1's registration
            ):
                with pytest.raises(RequestRejected) as refused:
                    attack()
                assert refused.value.code == "not_slot_holder", refused.value
            st = d.status(job)
            victim = next(n for n in st.nodes if n.index == 1)
            assert (st.state, victim.state, victim.tensorboard_url) == ("RUNNING", "RUNNING", None)
            assert coord.server.state.not_holder == 5
            # The node itself, on a new connection (as after a reconnect), proves itself with
            # the credential its registration returned, and finishes its work there.
            again = NodeClient(coord.address, token, job, 1).connect()
            again.credential = nodes[1].credential
            try:
                assert again.heartbeat().stop is False
                nodes[0].report("SUCCEEDED")
                again.report("SUCCEEDED")
            finally:
                again.close()
            assert d.await_job(job, timeout_s=10).state == "SUCCEEDED"
        finally:
            for c in (*nodes, intruder):
                c.close()
