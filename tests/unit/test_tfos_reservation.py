"""TensorFlowOnSpark's ``reservation`` module over tfcoord's coordinator: real sockets and threads."""

from __future__ import annotations

import pickle
import socket
import threading
from pathlib import Path

import pytest

from tfcoord.client import AuthenticationFailed, NodeClient, connfile
from tfcoord.compat.tensorflowonspark import util
from tfcoord.compat.tensorflowonspark.reservation import (
    META_KEY,
    Client,
    ReservationAddress,
    Reservations,
    Server,
)


@pytest.fixture(autouse=True)
def _runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Connection files of this test's servers only."""
    d = tmp_path / "run"
    monkeypatch.setenv(connfile.RUNTIME_DIR_ENV, str(d))
    return d


def _free_ports(n: int) -> list[int]:
    """``n`` consecutive ports free now on this host's address (bind-probe; the tests bind them at once)."""
    host = util.get_ip_address()
    for low in range(42000, 60000, 7):
        probes = []
        try:
            for p in range(low, low + n):
                s = socket.socket()
                probes.append(s)
                s.bind((host, p))
            return list(range(low, low + n))
        except OSError:
            continue
        finally:
            for s in probes:
                s.close()
    raise RuntimeError("no free consecutive ports")


def test_reservations_are_done_once_every_node_arrived_and_upsert_replaces_by_primary_key() -> None:
    r = Reservations(required=2, primary_keys=["node"])
    assert not r.done() and r.remaining() == 2
    r.add({"node": 1})
    assert not r.done() and r.remaining() == 1
    r.add({"node": 2})
    assert r.done() and r.remaining() == 0
    r.upsert({"node": 1, "data": "foo"})
    assert r.remaining() == 0
    assert sorted(r.get(), key=lambda x: x["node"]) == [{"node": 1, "data": "foo"}, {"node": 2}]
    with pytest.raises(ValueError, match="all 2 reservations already arrived"):
        r.add({"node": 3})
    with pytest.raises(ValueError, match="required must be a count"):
        Reservations(-1)


def test_reservations_are_a_coordinator_job_and_a_stop_request_stops_the_server() -> None:
    s = Server(1)
    addr = s.start()
    assert addr == (util.get_ip_address(), addr[1]) and isinstance(addr, tuple)
    host, port = addr  # TensorFlowOnSpark's programs unpack it
    assert repr(addr) == repr((host, port))  # the credentials are never shown
    c = Client(addr)
    assert c.register({"node": 1, "authkey": b"\x00\x01", "addr": ("h", 5)}) == "OK"
    assert c.get_reservations() == [{"node": 1, "authkey": b"\x00\x01", "addr": ["h", 5]}]
    assert c.await_reservations() == c.get_reservations()  # done: answered at once
    status = s.status()
    assert status is not None and [n.meta[META_KEY] for n in status.nodes]  # a node of the job
    c.request_stop()
    assert s.wait(10) and s.done  # the server stops once the coordinator says so
    with pytest.raises(ConnectionError, match=f"nothing answers at {host}:{port}"):
        Client(addr)
    s.stop()  # idempotent


def test_the_address_pickles_with_its_credentials() -> None:
    from pyspark import cloudpickle

    s = Server(1)
    addr = s.start()
    for dumps in (pickle.dumps, cloudpickle.dumps):
        back = pickle.loads(dumps({"server_addr": addr}))["server_addr"]
        assert isinstance(back, ReservationAddress) and back == addr
        assert (back.job, back.size, back.token, back.reader, back.ca_pem) == (
            addr.job,
            1,
            addr.token,
            addr.reader,
            addr.ca_pem,
        )
    with Client(back) as c:
        assert c.register({"node": 0}) == "OK"
    s.stop()


def test_await_reservations_blocks_each_client_until_the_last_node_registers() -> None:
    n = 4
    s = Server(count=n, primary_keys=["node"])
    addr = s.start()
    got: dict[int, int] = {}

    def reserve(i: int) -> None:
        c = Client(addr)
        assert c.register({"node": i}) == "OK"
        got[i] = len(c.await_reservations())
        c.close()

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    assert sorted(r["node"] for r in s.await_reservations(timeout=30)) == list(range(n))
    for t in threads:
        t.join()
    assert got == dict.fromkeys(range(n), n)
    with Client(addr) as late:
        assert len(late.get_reservations()) == n  # a client that left keeps its reservation
        with pytest.raises(RuntimeError, match=f"all {n} reservations already arrived"):
            late.register({"node": n})
    s.stop()


def test_the_server_side_wait_names_how_many_nodes_are_missing() -> None:
    s = Server(3)
    addr = s.start()
    with Client(addr) as c:
        c.register({"node": 0})
    with pytest.raises(TimeoutError, match=r"after 0.2 s: 1 of 3 nodes registered \(2 missing\)"):
        s.await_reservations(timeout=0.2)
    with pytest.raises(RuntimeError, match="reservations failed: executor lost"):
        s.await_reservations(status={"error": "executor lost"}, timeout=5)
    s.stop()
    with pytest.raises(RuntimeError, match="start\\(\\) the reservation server first"):
        s.await_reservations(timeout=1)


def test_tfos_server_host_and_port_choose_the_address_and_a_full_range_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TFOS_SERVER_HOST", "my_host_ip")
    assert Server(1).get_server_ip() == "my_host_ip"
    monkeypatch.delenv("TFOS_SERVER_HOST")
    low, high = _free_ports(2)
    monkeypatch.setenv("TFOS_SERVER_PORT", f"{low}-{high}")
    assert Server(1).get_server_ports() == [low, high]
    s1, s2, s3 = Server(1), Server(1), Server(1)
    assert s1.start_listening_socket().getsockname() == (util.get_ip_address(), low)
    assert s2.start_listening_socket().getsockname()[1] == high
    with pytest.raises(OSError, match=f"every port TFOS_SERVER_PORT='{low}-{high}' allows is in use"):
        s3.start_listening_socket()
    assert s1.start()[1] == low  # served on the socket it holds
    s1.stop()
    s2.stop()
    for bad in ("http", "9999-", "0", "70000"):
        monkeypatch.setenv("TFOS_SERVER_PORT", bad)
        with pytest.raises(ValueError, match="TFOS_SERVER_PORT must be a port"):
            Server(1).get_server_ports()
    monkeypatch.delenv("TFOS_SERVER_PORT")
    assert Server(1).get_server_ports() == [0]
    monkeypatch.setenv("TFOS_SERVER_HOST", "192.0.2.77")  # TEST-NET-1: not this host's
    with pytest.raises(OSError, match="not an address of this host; set TFOS_SERVER_HOST"):
        Server(1).start_listening_socket()


@pytest.mark.skipif(util.get_ip_address() == "127.0.0.1", reason="this host has no address but loopback")
def test_the_server_listens_on_the_drivers_address_only() -> None:
    s = Server(1)
    _, port = s.start()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    s.stop()


def test_without_the_jobs_credentials_nothing_is_taken() -> None:
    s = Server(2)
    addr = s.start()
    forged = ReservationAddress(
        *addr,
        job=addr.job,
        size=2,
        token=b"0" * 64,
        reader=b"0" * 64,
        ca_pem=addr.ca_pem,
    )
    with pytest.raises(ConnectionError, match="admin secret"):
        Client(forged)
    with pytest.raises(AuthenticationFailed, match="job token"):
        NodeClient(addr.address, b"1" * 64, addr.job, 0, ssl_context=addr.context(), fail_fast=True).connect()
    # Without TLS (the pinned CA) nothing is spoken at all.
    with socket.create_connection(addr, timeout=10) as raw:
        raw.sendall(b"\x00\x00\x00\x04\xc1\xc1\xc1\xc1")
        raw.settimeout(10)
        assert raw.recv(65536)[:1] in (b"", b"\x15")  # closed, or a TLS alert
    with Client(addr) as c:
        c.register({"node": 1})
        with pytest.raises(ValueError, match="cannot send reg to the reservation server: object cannot"):
            c.register({"node": object()})
        with pytest.raises(ValueError, match="the limit is 1024"):
            c.register({"node": "x" * 2000})
    assert len(Client(addr).get_reservations()) == 1
    s.stop()


def test_a_plain_host_and_port_finds_a_coordinator_of_this_user_by_host_and_port() -> None:
    s = Server(1)
    host, port = s.start()
    with pytest.raises(ConnectionError, match=r"no tfcoord coordinator of yours listens at 10\.9\.9\.9"):
        Client(("10.9.9.9", port))  # the right port is not enough
    c = Client((host, port))  # stop_streaming.py HOST PORT
    with pytest.raises(RuntimeError, match=r"takes only request_stop\(\); register\(\) needs"):
        c.register({"node": 0})
    status = s.status()
    assert status is not None and c.request_stop() == [status.job]
    assert s.wait(10)
    assert s.status() is None  # stopped: the coordinator is gone
