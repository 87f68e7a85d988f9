"""TensorFlowOnSpark's ``reservation`` module as its own tests use it: real sockets and threads."""

from __future__ import annotations

import socket
import struct
import threading

import msgpack
import pytest

from tfcoord.compat.tensorflowonspark import util
from tfcoord.compat.tensorflowonspark.reservation import Client, Reservations, Server


def _free_ports(n: int) -> list[int]:
    """``n`` consecutive ports free now (bind-probe; the tests bind them at once)."""
    for low in range(42000, 60000, 7):
        probes = []
        try:
            for p in range(low, low + n):
                s = socket.socket()
                probes.append(s)
                s.bind(("", p))
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


def test_a_server_takes_registrations_answers_queries_and_stops_on_request() -> None:
    s = Server(1)
    addr = s.start()
    assert addr[0] == util.get_ip_address() and isinstance(addr[1], int)
    c = Client(addr)
    assert c.register({"node": 1, "authkey": b"\x00\x01", "addr": ("h", 5)}) == "OK"
    assert c.get_reservations() == [{"node": 1, "authkey": b"\x00\x01", "addr": ["h", 5]}]
    assert c.await_reservations() == c.get_reservations()  # done: answered at once
    c.request_stop()
    assert s.done  # set before request_stop returns
    s.stop()  # idempotent; the server's own stop may still be closing the listener
    with pytest.raises(ConnectionError, match="nothing answers at"):
        Client(addr)


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
    assert len(s.await_reservations(timeout=30)) == n
    for t in threads:
        t.join()
    assert got == dict.fromkeys(range(n), n)
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


def test_tfos_server_host_and_port_choose_the_address_and_a_full_range_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TFOS_SERVER_HOST", "my_host_ip")
    assert Server(1).get_server_ip() == "my_host_ip"
    low, high = _free_ports(2)
    monkeypatch.setenv("TFOS_SERVER_PORT", f"{low}-{high}")
    assert Server(1).get_server_ports() == [low, high]
    s1, s2, s3 = Server(1), Server(1), Server(1)
    assert s1.start_listening_socket().getsockname()[1] == low
    assert s2.start_listening_socket().getsockname()[1] == high
    with pytest.raises(OSError, match=f"every port TFOS_SERVER_PORT='{low}-{high}' allows is in use"):
        s3.start_listening_socket()
    s1.stop()
    s2.stop()
    for bad in ("http", "9999-", "0", "70000"):
        monkeypatch.setenv("TFOS_SERVER_PORT", bad)
        with pytest.raises(ValueError, match="TFOS_SERVER_PORT must be a port"):
            Server(1).get_server_ports()
    monkeypatch.delenv("TFOS_SERVER_PORT")
    assert Server(1).get_server_ports() == [0]


def test_a_malformed_frame_is_refused_and_the_server_keeps_serving() -> None:
    s = Server(2)
    addr = s.start()
    with socket.create_connection(addr) as raw:
        raw.sendall(struct.pack(">I", 4) + b"\xc1\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
        (size,) = struct.unpack(">I", raw.recv(4))
        reply = msgpack.unpackb(raw.recv(size))
        assert reply["code"] == "protocol_error" and "undecodable" in reply["message"]
    with socket.create_connection(addr) as raw:
        raw.sendall(struct.pack(">I", 1 << 30))  # a 1 GiB frame is refused before any body
        (size,) = struct.unpack(">I", raw.recv(4))
        assert "exceeds" in msgpack.unpackb(raw.recv(size))["message"]
    c = Client(addr)
    with pytest.raises(ValueError, match="cannot send reg"):
        c.register({"node": object()})
    assert c.register({"node": 1}) == "OK" and len(c.get_reservations()) == 1
    c.register({"node": 2})
    with (
        Client(addr) as late,
        pytest.raises(RuntimeError, match="refused reg: all 2 reservations already arrived"),
    ):
        late.register({"node": 3})
    assert len(s.reservations.get()) == 2
    c.close()
    s.stop()
