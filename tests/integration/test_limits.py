"""The coordinator's limits on a live server: slow, silent, greedy and non-reading peers.

Each misbehaving peer must be cut off (or held back) by its own limit, with an error
frame naming that limit, while a well-behaved client keeps working meanwhile.
"""

from __future__ import annotations

import errno
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tfcoord.client import DriverClient, JobSpec, auth, make_roles
from tfcoord.client import messages as m
from tfcoord.client.protocol import NEED_DATA, Connection
from tfcoord.coordinator.embedded import EmbeddedCoordinator
from tfcoord.coordinator.server import MAX_PENDING_PER_CONNECTION

from .rawwire import Raw, wait_until

#: Short limits so each test sees its limit act in well under a second.
HANDSHAKE_S, FRAME_S, IDLE_S = 0.4, 0.6, 0.4
#: A trickling peer sends a byte this often: well inside each limit, so only the
#: per-frame deadline (which bytes do not extend) can cut it off.
TRICKLE_S = 0.05


def _running(**timeouts: float) -> Iterator[EmbeddedCoordinator]:
    """A plaintext coordinator for one test; its state checked valid when the test passed."""
    c = EmbeddedCoordinator(plaintext=True, **timeouts)
    c.start()
    try:
        yield c
        c.call(c.server.state.validate)
    finally:
        c.stop()


@pytest.fixture
def coord() -> Iterator[EmbeddedCoordinator]:
    yield from _running(handshake_timeout_s=HANDSHAKE_S, frame_timeout_s=FRAME_S, idle_timeout_s=IDLE_S)


def _trickle(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send ``data`` a byte at a time until it is all sent or the coordinator hangs up."""

    def run() -> None:
        for b in data:
            try:
                sock.send(bytes([b]))
            except OSError:
                return
            time.sleep(TRICKLE_S)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _driver_works(coord: EmbeddedCoordinator) -> None:
    with DriverClient(coord.address, coord.secret) as d:
        assert "jobs" in d.status()


def _connections(coord: EmbeddedCoordinator) -> int:
    return coord.call(lambda: len(coord.server.peers))


def test_a_hello_trickled_byte_by_byte_is_cut_off_at_the_handshake_deadline(coord):
    raw = Raw(coord.port)
    hello = raw.conn.send(raw.hello(coord.secret, "driver"))
    t0 = time.monotonic()
    _trickle(raw.sock, hello)  # 100+ bytes at 20/s: would take over 5 s
    _driver_works(coord)  # the slow peer costs the others nothing
    replies = raw.until_closed()
    took = time.monotonic() - t0
    assert [r.code for r in replies] == ["handshake_timeout"]  # type: ignore[attr-defined]
    assert took < HANDSHAKE_S + 2, took
    wait_until(lambda: _connections(coord) == 0, what="the slow connection to be gone")


def test_a_frame_trickled_after_the_handshake_is_cut_off_at_the_frame_deadline(coord):
    raw = Raw(coord.port).login(coord.secret, "driver")
    frame = raw.conn.send(m.Status(id=1, job=None)) * 20  # about 200 bytes: 10 s at this pace
    t0 = time.monotonic()
    _trickle(raw.sock, frame)
    replies = raw.until_closed()
    took = time.monotonic() - t0
    # Every byte resets the idle clock, but not the frame's: it is cut off at its deadline.
    assert replies[-1].code == "frame_timeout" and "stayed incomplete" in replies[-1].message  # type: ignore[attr-defined]
    assert took < FRAME_S + 2, took
    assert coord.call(lambda: coord.server.timed_out.get("frame_timeout")) == 1


@pytest.mark.parametrize("partial", [b"\x00\x00", struct.pack(">I", 50) + b"\x81\xa2op"])
def test_a_partial_frame_that_stalls_is_cut_off(coord, partial):
    raw = Raw(coord.port).login(coord.secret, "driver")
    raw.sock.sendall(partial)
    replies = raw.until_closed()
    assert [r.code for r in replies] == ["frame_timeout"]  # type: ignore[attr-defined]
    assert f"({len(partial)} bytes received)" in replies[0].message  # type: ignore[attr-defined]


def test_an_idle_authenticated_connection_is_closed(coord):
    raw = Raw(coord.port).login(coord.admin_secret, "admin")
    replies = raw.until_closed()
    assert [r.code for r in replies] == ["idle_timeout"]  # type: ignore[attr-defined]


def test_a_connection_with_a_pending_wait_is_not_idle(coord):
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
    raw = Raw(coord.port).login(coord.admin_secret, "admin")
    wait_s = IDLE_S * 4
    t0 = time.monotonic()
    raw.send(m.AwaitJob(id=7, job=job, timeout_s=wait_s))
    answer = raw.next()  # the wait's own deadline answers it, not the idle timeout
    assert isinstance(answer, m.Error) and (answer.id, answer.code) == (7, "timeout")
    assert time.monotonic() - t0 >= wait_s - 0.05
    # answered, nothing pending: the idle clock starts from the answer
    assert [r.code for r in raw.until_closed()] == ["idle_timeout"]  # type: ignore[attr-defined]


def test_a_connection_with_a_pending_wait_holds_no_watchdog_timer():
    # Memory per node (issue 28): a node keeps an await_stop pending for its whole run, and
    # its watchdog has no deadline left to judge once it is authenticated with a request
    # pending; its timer used to stay until the handshake's deadline (60 s here).
    c = EmbeddedCoordinator(plaintext=True, handshake_timeout_s=60.0)
    c.start()
    try:
        with DriverClient(c.address, c.secret) as d:
            job = d.submit(JobSpec(roles=make_roles(1)))
        raw = Raw(c.port).login(c.admin_secret, "admin")
        raw.send(m.AwaitJob(id=7, job=job, timeout_s=60.0))

        def waiting() -> list[bool]:
            return [p._watchdog is None for p in c.server.peers.values() if p.role == "admin" and p.pending]

        wait_until(lambda: bool(c.call(waiting)), what="the admin's wait pending")
        assert c.call(waiting) == [True]
        c.call(c.server.state.validate)
        raw.close()
    finally:
        c.stop()


def test_a_blocking_client_reconnects_after_an_idle_close(coord):
    with DriverClient(coord.address, coord.secret) as d:
        wait_until(lambda: d.reconnects >= 1, what="the idle close and a reconnect")
        assert d.status() == {"jobs": []}


def test_pending_requests_per_connection_are_capped(coord):
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
        token = d.job_token(job)
        with_node = Raw(coord.port).login(token, "node", job)
        with_node.send(m.Register(id=1, job=job, executor_id=0, attempt=0, host="127.0.0.1", port=1))
        assert isinstance(with_node.next(), m.Reply)
        extra = 5
        for i in range(MAX_PENDING_PER_CONNECTION + extra):  # waits that stay pending
            with_node.send(m.AwaitStop(id=100 + i, job=job, executor_id=0, attempt=0, timeout_s=60))
        refused = [with_node.next() for _ in range(extra)]
        assert all(isinstance(r, m.Error) and r.code == "too_many_requests" for r in refused)
        assert [r.id for r in refused] == list(
            range(100 + MAX_PENDING_PER_CONNECTION, 100 + MAX_PENDING_PER_CONNECTION + extra)
        )  # type: ignore[attr-defined]
        assert f"{MAX_PENDING_PER_CONNECTION} requests are already pending" in refused[0].message  # type: ignore[attr-defined]
        # the limit is per connection: the driver's own connection is unaffected
        assert d.status(job)["state"] == "READY"
        d.stop(job, "done")  # answers every pending wait: the connection has room again
        answered = {with_node.next().id for _ in range(MAX_PENDING_PER_CONNECTION)}  # type: ignore[attr-defined]
        assert answered == set(range(100, 100 + MAX_PENDING_PER_CONNECTION))
        with_node.send(m.Report(id=2, job=job, executor_id=0, attempt=0, state="stopped"))
        assert with_node.next().result["state"] == "STOPPED"  # type: ignore[attr-defined]
        with_node.close()


@pytest.fixture
def patient_coord() -> Iterator[EmbeddedCoordinator]:
    """A coordinator with its default timeouts: the flood below starves this process's
    threads (the coordinator's loop, the sender, the driver's reader share one GIL) for
    longer than ``coord``'s 0.4 s idle timeout, which would close the driver's connection
    between its welcome and its first request, the driver's own thread being the one late."""
    yield from _running()


def test_a_peer_that_does_not_read_its_replies_is_not_read_either(patient_coord):
    """Replies to a peer that never reads pile up only to a bound, not without end."""
    coord = patient_coord
    size = 2000  # a status of this job is tens of KiB: a few fill any socket buffer
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(size)))
        reply_bytes = len(Connection().send(m.Reply(id=1, result=d.status(job))))
    raw = Raw(coord.port).login(coord.admin_secret, "admin")
    try:
        requests = 20_000
        flood = Connection().send(m.Status(id=1, job=job)) * requests
        sender = threading.Thread(target=raw.sock.sendall, args=(flood,), daemon=True)
        sender.start()  # it may block for good: the coordinator stops reading, which is the point

        def paused() -> bool:
            return coord.call(lambda: any(not p.transport.is_reading() for p in coord.server.peers.values()))

        wait_until(paused, what="the coordinator to stop reading from the peer that does not read")
        buffered = coord.call(
            lambda: max(p.transport.get_write_buffer_size() for p in coord.server.peers.values())
        )
        # Without backpressure every request would leave its reply behind (requests x reply);
        # with it, at most the replies to one read's worth of pending requests wait.
        bound = (MAX_PENDING_PER_CONNECTION + 1) * reply_bytes
        assert requests * reply_bytes > 100 * bound
        assert buffered <= bound, (buffered, bound)
        _driver_works(coord)  # every other connection is served meanwhile
    finally:
        raw.close()  # also when it failed: a socket left to the collector warns in a later test
    wait_until(lambda: _connections(coord) == 0, what="the greedy connection to be gone")


def test_a_client_refused_for_the_connection_limit_backs_off_and_gets_in():
    """Before: the refusal was a protocol error, raised at once; a full coordinator is busy, not broken."""
    with EmbeddedCoordinator(plaintext=True, max_connections=1) as coord:
        held = Raw(coord.port).login(coord.secret, "driver")  # the one authenticated slot
        got_in: list[dict] = []

        def connect() -> None:
            with DriverClient(coord.address, coord.secret, connect_deadline_s=30) as d:
                got_in.append(d.status())

        t = threading.Thread(target=connect, daemon=True)
        t.start()
        wait_until(lambda: coord.call(lambda: coord.server.rejected_connections) >= 1, what="a refusal")
        held.close()
        t.join(30)
        assert got_in == [{"jobs": []}]


def test_a_wrong_hello_proof_still_gets_its_own_error_before_any_limit(coord):
    raw = Raw(coord.port)
    raw.send(raw.hello(auth.new_secret(), "driver"))
    assert [r.code for r in raw.until_closed()] == ["auth_failed"]  # type: ignore[attr-defined]


# -- budgets before authentication (issue 16, attacks 5 and 6) -----------------------------


def test_an_unauthenticated_peer_may_not_announce_more_than_a_hello(coord):
    """Attack 5: before the handshake the frame limit was the 8 MiB post-handshake one, so
    16 strangers could pin 128 MiB until their deadline. Now a few KiB, refused unread."""
    from tfcoord.coordinator.server import PRE_AUTH_MAX_FRAME_BYTES

    raw = Raw(coord.port)
    raw.sock.sendall(struct.pack(">I", 8 * 1024 * 1024) + b"\x80" * 1024)
    [err] = raw.until_closed()
    assert err.code == "protocol_error" and f"{PRE_AUTH_MAX_FRAME_BYTES}-byte limit" in err.message  # type: ignore[attr-defined]
    # After the handshake the full limit applies: a large (valid) frame is read.
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(
            JobSpec(roles=make_roles(1), name="n" * 1000, labels={f"k{i}": "v" * 1000 for i in range(32)})
        )
        assert d.status(job)["name"] == "n" * 1000
    _driver_works(coord)


def _refusal(port: int, source: str) -> m.Error:
    """Connect from ``source`` and read what the coordinator says before it hangs up."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    with sock:
        conn = Connection()
        while data := sock.recv(65536):
            conn.receive_data(data)
        conn.receive_data(b"")
        err = conn.next_event()
    assert isinstance(err, m.Error), err
    return err


def test_idle_strangers_fill_their_own_budget_never_the_one_of_nodes_and_drivers():
    """Attack 6: cap-many idle unauthenticated sockets refused legitimate nodes and drivers.
    Now strangers are held to their own budget, per source: a driver already connected
    keeps working, and a new one from another host gets in."""
    with EmbeddedCoordinator(
        plaintext=True, max_connections=4, max_unauthenticated=16, max_unauthenticated_per_source=8
    ) as coord:
        with DriverClient(coord.address, coord.secret) as before:
            idle = [Raw(coord.port, source="127.0.0.2") for _ in range(8)]
            err = _refusal(coord.port, "127.0.0.2")
            assert (
                err.code == "too_many_connections" and "from 127.0.0.2 are in their handshake" in err.message
            )
            assert coord.call(lambda: (coord.server.authenticated, coord.server.unauthenticated)) == (1, 8)
            assert "jobs" in before.status()
            with DriverClient(coord.address, coord.secret, connect_deadline_s=5) as d:
                job = d.submit(JobSpec(roles=make_roles(1)))
                assert d.status(job)["state"] == "SUBMITTED"
            for r in idle:
                r.close()
        wait_until(lambda: coord.call(lambda: coord.server.unauthenticated) == 0, what="the strangers to go")


def test_one_source_cannot_take_the_whole_unauthenticated_budget():
    with EmbeddedCoordinator(
        plaintext=True, max_unauthenticated=100, max_unauthenticated_per_source=3
    ) as coord:
        idle = [Raw(coord.port) for _ in range(3)]
        err = _refusal(coord.port, "127.0.0.1")
        assert "connections from 127.0.0.1 are in their handshake" in err.message
        assert coord.call(lambda: coord.server.unauthenticated_from) == {"127.0.0.1": 3}
        for r in idle:
            r.close()
        _driver_works(coord)


def test_the_connection_caps_are_checked_against_the_descriptor_limit():
    from tfcoord.coordinator.server import RESERVED_FDS, BudgetError, connection_budget

    assert connection_budget(None, 100, 50, limit=1024) == 1024 - RESERVED_FDS - 150
    assert connection_budget(None, 100, 50, limit=10**6) == 20_000
    assert connection_budget(500, 100, 50, limit=1024) == 500
    with pytest.raises(
        BudgetError, match=r"--max-connections 20000 does not fit the descriptor limit \(RLIMIT_NOFILE 1024\)"
    ):
        connection_budget(20_000, 100, 50, limit=1024)
    with pytest.raises(BudgetError, match="raise the limit"):
        connection_budget(None, 4096, 256, limit=1024)


def _embedded_under(nofile: int, code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python whose descriptor limit (soft and hard) is ``nofile``."""
    prelude = "from tfcoord.coordinator.embedded import EmbeddedCoordinator as E\n"
    return subprocess.run(
        ["prlimit", f"--nofile={nofile}:{nofile}", sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_embedded_coordinator_checks_its_caps_against_the_descriptor_limit_like_serve():
    """A driver process with 512 descriptors: caps that cannot fit are refused with the
    figures; without caps, they are derived to fit, and the coordinator starts and serves."""
    out = _embedded_under(512, "E(max_connections=20000)")
    assert out.returncode == 1 and "BudgetError: --max-connections 20000 does not fit" in out.stderr, (
        out.stderr
    )
    assert "RLIMIT_NOFILE 512" in out.stderr
    out = _embedded_under(
        512,
        "from tfcoord.client import DriverClient\n"
        "with E() as c:\n"
        "    cfg = c.config.server\n"
        "    assert cfg.max_connections + cfg.max_unauthenticated + 256 + 64 <= 512, cfg\n"
        "    with DriverClient(c.address, c.secret, ssl_context=c.client_context()) as d: d.jobs()\n"
        "    print(cfg.max_connections, cfg.max_unauthenticated)\n",
    )
    assert out.returncode == 0, out.stderr
    assert [int(x) for x in out.stdout.split()] == [144, 48]  # 512 - 64 - 256 = 192: a quarter to handshakes


def _worst_frame(maps: int) -> bytes:
    """A frame a token holder may send that decodes to ``maps`` empty dicts (in lists)."""
    per_list = 16_000  # under the per-list limit: the budget of maps is what refuses it
    inner = b"\xdc" + per_list.to_bytes(2, "big") + b"\x80" * per_list
    lists = maps // per_list
    body = b"\xdc" + lists.to_bytes(2, "big") + inner * lists
    return len(body).to_bytes(4, "big") + body


def test_a_frame_of_a_million_empty_maps_is_refused_while_it_decodes(coord):
    """N3: 6 MiB of empty maps from a job's node was six million dicts (hundreds of MiB, most
    of a second of the loop every job shares). Each frame now has a budget of maps, lists and
    entries, enforced while it decodes: this one is a protocol error at once, the connection
    is closed, and another job's nodes are answered as before."""
    with DriverClient(coord.address, coord.secret) as d:
        victim_job = d.submit(JobSpec(roles=make_roles(1)))
        attacker_job = d.submit(JobSpec(roles=make_roles(1)))
        raw = Raw(coord.port).login(d.job_token(attacker_job), "node", attacker_job)
        t0 = time.monotonic()
        raw.sock.sendall(_worst_frame(6_000_000))
        replies = raw.until_closed()
        took = time.monotonic() - t0
        assert [r.code for r in replies] == ["protocol_error"], replies  # type: ignore[attr-defined]
        assert "at most 1024 maps and lists" in replies[0].message  # type: ignore[attr-defined]
        assert took < 5.0, took
        from tfcoord.client import NodeClient

        with NodeClient(coord.address, d.job_token(victim_job), victim_job, 0) as n:
            assert n.register("127.0.0.1", 7400).role == "worker"
        coord.call(lambda: coord.server.state.validate())


def test_hellos_sent_on_time_are_answered_though_they_waited_in_the_coordinators_own_queue():
    # A coordinator starved of CPU past the handshake deadline (here its loop is held: the
    # stand-in for a busy host) then finds many hellos at once. Those beyond one turn's
    # budget for bulk work wait in its own queue for later turns; they were sent on time, so
    # the handshake deadline must not refuse them (it once did: "no hello within 0.4 s").
    peers = 200
    c = EmbeddedCoordinator(
        plaintext=True,
        handshake_timeout_s=HANDSHAKE_S,
        max_unauthenticated=peers,
        max_unauthenticated_per_source=peers,
    )
    c.start()
    raws: list[Raw] = []
    try:
        raws = [Raw(c.port) for _ in range(peers)]  # each read its challenge: its deadline runs
        held = threading.Event()

        def starve() -> None:
            held.set()
            time.sleep(HANDSHAKE_S * 2)  # no turn of the loop runs meanwhile

        c._loop.call_soon_threadsafe(starve)  # type: ignore[union-attr]
        assert held.wait(10)
        hellos = [r.conn.send(r.hello(c.secret, "driver")) for r in raws]
        for r, hello in zip(raws, hellos, strict=True):
            r.sock.sendall(hello)
        answers = [type(r.next()).__name__ for r in raws]
        assert answers == ["Welcome"] * peers, sorted(set(answers))
        assert c.call(lambda: c.server.timed_out.get("handshake_timeout", 0)) == 0
        c.call(c.server.state.validate)
    finally:
        for r in raws:
            r.close()
        c.stop()


def test_connections_queue_in_the_kernel_while_the_coordinator_accepts_a_few_per_turn(tmp_path):
    """asyncio listens with the backlog it accepts per turn (``ACCEPTS_PER_TURN``, kept small so
    a burst's accepts cannot make one long turn); the coordinator lengthens the kernel's queue
    again (``LISTEN_BACKLOG``). With the process stopped, nothing is accepted: every connect
    still completes in the kernel's queue (a short queue drops the SYNs beyond it), and each
    connection is greeted once the process runs again."""
    from tfcoord.coordinator.server import ACCEPTS_PER_TURN, LISTEN_BACKLOG

    from .served import Served

    count = 8 * ACCEPTS_PER_TURN
    assert count < LISTEN_BACKLOG
    served = Served(tmp_path, "--max-unauthenticated-per-source", str(count))
    socks: list[socket.socket] = []
    try:
        served.proc.send_signal(signal.SIGSTOP)
        for _ in range(count):
            s = socket.socket()
            s.setblocking(False)
            assert s.connect_ex(("127.0.0.1", served.port)) in (0, errno.EINPROGRESS)
            socks.append(s)
        pending = set(socks)
        deadline = time.monotonic() + 10.0
        while pending and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(pending), [], deadline - time.monotonic())
            pending -= set(writable)
        assert not pending, (
            f"{len(pending)} of {count} connects did not complete while the coordinator was stopped"
        )
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in socks)
        served.proc.send_signal(signal.SIGCONT)
        for s in socks:
            s.setblocking(True)
            s.settimeout(30)
            conn = Connection()
            while (msg := conn.next_event()) is NEED_DATA:
                data = s.recv(4096)
                assert data, "closed before the challenge"
                conn.receive_data(data)
            assert isinstance(msg, m.Challenge)
    finally:
        served.proc.send_signal(signal.SIGCONT)
        for s in socks:
            s.close()
        served.stop()
