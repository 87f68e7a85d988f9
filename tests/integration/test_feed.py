"""A node's feed server on port 0 and real feeders in threads: the feed wire end to end, without Spark."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tfcoord.client import feedmessages as fm
from tfcoord.node import feedtls
from tfcoord.node import feedwire as fw
from tfcoord.node.datafeed import DataFeed, FeedServer
from tfcoord.node.feeder import FeedPlan, FeedTarget, _handshake, control, feed

TOKEN = b"t" * 32
JOB = "job-feed"


#: Each node's TLS identity is made once per test module (a key pair and certificate).
_IDENTITY = feedtls.new_identity(JOB)


@pytest.fixture(params=["tls", "plaintext"])
def server(request) -> Iterator[tuple[FeedServer, FeedTarget, list[str]]]:
    """A feed server, over TLS (a TLS job's) and in plaintext (an explicitly plaintext job's)."""
    identity = _IDENTITY if request.param == "tls" else None
    listener = socket.create_server(("127.0.0.1", 0))
    terminated: list[str] = []
    srv = FeedServer(
        listener, TOKEN, JOB, "worker:0 (executor 0, host test)", terminated.append, tls=identity
    ).start()
    pin = identity.fingerprint if identity is not None else ""
    yield srv, FeedTarget("worker:0", f"127.0.0.1:{listener.getsockname()[1]}", pin), terminated
    srv.close()


def _plan(target: FeedTarget, train: bool = True, timeout: float = 10.0, token: bytes = TOKEN) -> FeedPlan:
    return FeedPlan(JOB, token, (target,), "input", train, timeout, tls=bool(target.tls))


class _Feeder(threading.Thread):
    """A feeder in a thread that keeps its outcome, so no error escapes the test that started it."""

    def __init__(self, fn) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self.result: list = []
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = list(self._fn() or ())
        except BaseException as e:
            self.error = e

    def outcome(self, timeout: float = 20.0) -> list:
        self.join(timeout)
        assert not self.is_alive(), "the feeder did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def _consume(srv: FeedServer, train: bool, out: list, square: bool = False) -> threading.Thread:
    def run() -> None:
        df = DataFeed(srv, train_mode=train)
        while not df.should_stop():
            batch = df.next_batch(64)
            out.append(batch)
            if square and batch:
                df.batch_results([x * x for x in batch])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_training_feeds_every_record_once(server):
    srv, target, _ = server
    batches: list = []
    consumer = _consume(srv, True, batches)
    for p in range(3):
        list(feed(_plan(target), p, range(p * 10_000, (p + 1) * 10_000)))
    control(_plan(target), target, "eof")
    consumer.join(10)
    got = [r for b in batches for r in b]
    assert sorted(got) == list(range(30_000))


def test_concurrent_inference_partitions_get_their_own_results_in_order(server):
    srv, target, _ = server
    batches: list = []
    consumer = _consume(srv, False, batches, square=True)
    feeders = [
        _Feeder(lambda p=p: feed(_plan(target, train=False), p, range(p * 1000, p * 1000 + 500 + p)))
        for p in range(4)
    ]
    for p, f in enumerate(feeders):
        assert f.outcome() == [x * x for x in range(p * 1000, p * 1000 + 500 + p)]
    # an inference batch never spans two partitions: each holds values of one thousand only
    assert all(len({x // 1000 for x in b}) <= 1 for b in batches)
    control(_plan(target), target, "eof")
    consumer.join(10)


def test_a_wrong_token_is_refused(server):
    _, target, _ = server
    with pytest.raises(fw.FeedError, match="proof does not match"):
        list(feed(_plan(target, token=b"x" * 32), 0, [1]))


def test_a_consumer_that_stops_reading_times_out_naming_node_and_queue(server):
    _, target, _ = server
    t0 = time.monotonic()
    with pytest.raises(
        fw.FeedTimeout, match=r"worker:0 \(executor 0, host test\) took no records from queue 'input'"
    ):
        list(feed(_plan(target, timeout=1.0), 0, range(200_000)))
    assert time.monotonic() - t0 < 5


def test_a_stalled_training_queue_is_reported_before_its_feeders_hear_of_it():
    # The node stops its job (reason feed_timeout) through on_stall; the driver decides on
    # that reason once the feeding Spark job fails, so the report must come first.
    listener = socket.create_server(("127.0.0.1", 0))
    feeder_raised = threading.Event()
    reports: list[tuple[str, bool]] = []

    def on_stall(message: str) -> None:
        # Had the feeder heard of the stall already, it would raise (and set the event) meanwhile.
        reports.append((message, feeder_raised.wait(0.5)))

    srv = FeedServer(listener, TOKEN, JOB, "worker:0 (executor 0, host test)", on_stall=on_stall).start()
    try:
        target = FeedTarget("worker:0", f"127.0.0.1:{listener.getsockname()[1]}")
        with pytest.raises(fw.FeedTimeout, match="took no records from queue 'input'"):
            try:
                list(feed(_plan(target, timeout=1.0), 0, range(200_000)))
            finally:
                feeder_raised.set()
        assert len(reports) == 1
        message, heard_first = reports[0]
        assert "worker:0 (executor 0, host test) took no records from queue 'input'" in message
        assert not heard_first, "the feeder heard of the stall before the node reported it"
    finally:
        srv.close()


def test_a_failed_map_fun_fails_its_feeders_with_the_traceback(server):
    srv, target, _ = server
    errors: list[BaseException] = []

    def feeder() -> None:
        try:
            list(feed(_plan(target), 0, range(1_000_000)))
        except fw.FeedError as e:
            errors.append(e)

    t = _Feeder(feeder)
    df = DataFeed(srv)
    assert df.next_batch(10) == list(range(10))
    srv.fail("Traceback (most recent call last):\nValueError: injected")
    t.outcome()
    assert errors and "ValueError: injected" in str(errors[0]) and "worker:0" in str(errors[0])
    with pytest.raises(fw.FeedError, match="injected"):  # a feeder arriving later hears it too
        list(feed(_plan(target), 1, [1]))


def test_a_stop_ends_feeding_after_what_was_handed_over(server):
    srv, target, _ = server
    df = DataFeed(srv)
    done = threading.Event()

    def feeder() -> list:
        out = list(feed(_plan(target), 0, range(1_000_000)))  # returns quietly when told to stop
        done.set()
        return out

    t = _Feeder(feeder)
    first = df.next_batch(5)
    control(_plan(target), target, "stop", "the job is stopping")
    assert done.wait(10) and t.outcome() == []
    rest = []
    while not df.should_stop():
        rest += df.next_batch(10_000)
    got = first + rest
    assert got == list(range(len(got))) and len(got) < 1_000_000  # a prefix, then nothing
    assert fw.FeederState  # the next feeder is told to stop at once
    assert list(feed(_plan(target), 1, [1])) == []
    with pytest.raises(fw.FeedStopped):  # a stopping job owes an inference its results: an error
        list(feed(_plan(target, train=False), 2, [1]))


def test_terminate_drops_the_queue_and_tells_the_supervisor(server):
    srv, target, terminated = server
    df = DataFeed(srv)
    t = _Feeder(lambda: feed(_plan(target), 0, range(100_000)))
    df.next_batch(3)
    df.terminate()
    assert t.outcome() == []  # told to stop: the training feeder ends quietly
    assert df.should_stop() and terminated == ["DataFeed.terminate() on worker:0 (executor 0, host test)"]
    # The node wants no more: an inference feeder skips its partition too, without error
    # (TensorFlowOnSpark's feeders skip the partitions of a terminating node).
    assert list(feed(_plan(target, train=False), 1, [1])) == []


@pytest.mark.parametrize("ending", ["terminate", "fail"])
def test_a_feeder_in_its_handshake_when_the_node_process_ends_hears_why(ending):
    """map_fun's process ends right after map_fun terminates its feed (or fails): a feeder whose
    connection it had accepted but not yet answered gets that answer, not a reset (before,
    its Spark task failed "dropped the feed connection during the handshake" and was retried)."""
    listener = socket.create_server(("127.0.0.1", 0))
    target = FeedTarget("worker:0", f"127.0.0.1:{listener.getsockname()[1]}")
    go_r, go_w = os.pipe()
    ending_r, ending_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # map_fun's process, ending as tfcoord.node.executor's _child ends it
        code = 1
        try:
            srv = FeedServer(listener, TOKEN, JOB, "worker:0").start()
            os.read(go_r, 1)
            if ending == "terminate":
                DataFeed(srv).terminate()
                srv.stop("map_fun on worker:0 returned")
            else:
                srv.fail("Traceback (most recent call last):\nValueError: injected")
            srv.close()
            os.write(ending_w, b"x")  # without settle() the process was gone from here on
            code = 0 if srv.settle() else 2
        finally:
            os._exit(code)
    listener.close()
    try:
        sock = fw.connect(target.address)
        assert sock.recv(1, socket.MSG_PEEK)  # the challenge: the node is in our handshake
        os.write(go_w, b"x")
        assert os.read(ending_r, 1) == b"x"  # the node's map_fun has ended
        opening = fm.Open(kind="feed", partition=0, qname="input", train=True, feed_timeout_s=10.0)
        if ending == "terminate":
            answer = _handshake(fw.FeedStream(sock), _plan(target), target, opening)
            assert isinstance(answer, fm.Stop) and answer.terminated, answer
        else:
            with pytest.raises(fw.FeedError, match="ValueError: injected"):
                _handshake(fw.FeedStream(sock), _plan(target), target, opening)
        sock.close()
    finally:
        _, status = os.waitpid(pid, 0)
        for fd in (go_r, go_w, ending_r, ending_w):
            os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0  # settle() saw every connection answered


def test_batch_results_must_match_the_batch(server):
    srv, target, _ = server
    t = _Feeder(lambda: feed(_plan(target, train=False), 0, range(5)))
    df = DataFeed(srv, train_mode=False)
    assert df.next_batch(10) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="got 4 results for a batch of 5 records"):
        df.batch_results([0, 1, 2, 3])
    df.batch_results([0, 1, 4, 9, 16])
    assert t.outcome() == [0, 1, 4, 9, 16]


def test_results_go_to_the_queue_named_qname_out_which_the_feeder_reads():
    listener = socket.create_server(("127.0.0.1", 0))
    queues = ("input", "output", "scores", "error")
    srv = FeedServer(listener, TOKEN, JOB, "worker:0 (executor 0, host test)", queues=queues).start()
    target = FeedTarget("worker:0", f"127.0.0.1:{listener.getsockname()[1]}")
    try:
        plan = FeedPlan(JOB, TOKEN, (target,), "input", False, 10.0, qname_out="scores")
        t = _Feeder(lambda: feed(plan, 0, range(4)))
        df = DataFeed(srv, train_mode=False, qname_out="scores")
        df.batch_results([x * 10 for x in df.next_batch(10)])
        assert t.outcome() == [0, 10, 20, 30]
        # A node answering on another queue than its feeder reads is told so, not left hanging.
        t = _Feeder(lambda: feed(plan, 1, range(2)))
        wrong = DataFeed(srv, train_mode=False)  # qname_out="output"
        batch = wrong.next_batch(10)
        with pytest.raises(ValueError, match=r"queue 'output' .*read queue 'scores'.*same queue"):
            wrong.batch_results(batch)
        df._segments = wrong._segments
        df.batch_results(batch)
        assert t.outcome() == [0, 1]
        for bad in ({"qname_in": "inputs"}, {"qname_out": "results"}):
            with pytest.raises(
                ValueError, match=r"unknown queue '[a-z]+' \(qname_(in|out)\): this cluster's queues are"
            ):
                DataFeed(srv, train_mode=False, **bad)
    finally:
        srv.close()


def test_input_mapping_returns_columns_by_tensor_name(server):
    srv, target, _ = server
    t = _Feeder(lambda: feed(_plan(target), 0, [(1, "a"), (2, "b")]))
    df = DataFeed(srv, input_mapping={"y": "label", "x": "image"})
    assert df.next_batch(2) == {"image": [1, 2], "label": ["a", "b"]}
    control(_plan(target), target, "eof")
    assert df.next_batch(2) == {"image": [], "label": []} and df.should_stop()
    assert t.outcome() == []  # the end of its partition was reached


def test_a_node_without_a_feed_says_how_to_get_one():
    with pytest.raises(RuntimeError, match=r"InputMode\.SPARK"):
        DataFeed(None)  # type: ignore[arg-type]


def test_a_node_may_stop_its_own_job_and_no_other(coordinator):
    """A node whose feed stalled asks the coordinator to stop its job, with the job token."""
    from tfcoord.client import DriverClient, JobSpec, NodeClient, RequestRejected, make_roles
    from tfcoord.client import messages as m
    from tfcoord.node.executor import NodeSpec, _request_stop

    with DriverClient(coordinator.address, coordinator.secret).connect() as d:
        job, other = d.submit(JobSpec(roles=make_roles(1))), d.submit(JobSpec(roles=make_roles(1)))
        with NodeClient(coordinator.address, d.job_token(job), job, 0).connect() as n:
            n.register("127.0.0.1", 1)
            spec = NodeSpec(coordinator.address, d.job_token(job), job, print, None, (("worker", 0),))
            _request_stop(spec, "feed_timeout on worker:0")
            st = d.status(job)
            assert st["state"] == "STOPPING" and st["stop_reason"] == "feed_timeout on worker:0"
            with pytest.raises(RequestRejected, match="forbidden"):
                n.request(lambda i: m.StopJob(id=i, job=other, reason="not mine"))
        assert d.status(other)["state"] != "STOPPING"


def test_results_larger_than_a_frame_go_back_in_several(server):
    srv, target, _ = server
    big = b"r" * (fw.MAX_FRAME_BYTES // 3)
    t = _Feeder(lambda: feed(_plan(target, train=False), 0, range(5)))
    df = DataFeed(srv, train_mode=False)
    assert df.next_batch(10) == [0, 1, 2, 3, 4]
    df.batch_results([big] * 5)
    assert t.outcome() == [big] * 5


def test_partitions_spread_round_robin_over_the_fed_nodes():
    servers, targets = [], []
    for i in range(2):
        listener = socket.create_server(("127.0.0.1", 0))
        servers.append(FeedServer(listener, TOKEN, JOB, f"worker:{i}").start())
        targets.append(FeedTarget(f"worker:{i}", f"127.0.0.1:{listener.getsockname()[1]}"))
    plan = FeedPlan(JOB, TOKEN, tuple(targets), "input", True, 10.0)
    got: list[list] = [[], []]
    consumers = [_consume(srv, True, got[i]) for i, srv in enumerate(servers)]
    for p in range(5):
        list(feed(plan, p, [p] * 3))
    for t in targets:
        control(plan, t, "eof")
    for c in consumers:
        c.join(10)
    assert sorted(r for b in got[0] for r in b) == [0, 0, 0, 2, 2, 2, 4, 4, 4]
    assert sorted(r for b in got[1] for r in b) == [1, 1, 1, 3, 3, 3]
    for srv in servers:
        srv.close()


# -- TLS: a TLS job's feed refuses plaintext peers and nodes that do not hold the pinned key --------


@pytest.fixture
def tls_server() -> Iterator[tuple[FeedServer, FeedTarget, list]]:
    listener = socket.create_server(("127.0.0.1", 0))
    srv = FeedServer(listener, TOKEN, JOB, "worker:0", tls=_IDENTITY).start()
    batches: list = []
    consumer = _consume(srv, True, batches)
    target = FeedTarget("worker:0", f"127.0.0.1:{listener.getsockname()[1]}", _IDENTITY.fingerprint)
    yield srv, target, batches
    control(_plan(target), target, "eof")
    consumer.join(10)
    srv.close()


def _fed(srv: FeedServer) -> int:
    return srv.queue("input").taken + srv.queue("input").buffered


def test_a_tls_feed_is_encrypted_on_the_wire(tls_server):
    """What crosses the wire is TLS 1.3 records: no frame of the feed protocol, no record, in the clear."""
    srv, target, _ = tls_server
    host, port = target.address.rsplit(":", 1)
    # A relay between feeder and node records every byte both ways, as someone on the path would.
    relay = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                seen.append(data)
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # one side hung up first

    def run_relay() -> None:
        client, _ = relay.accept()
        upstream = socket.create_connection((host, int(port)))
        t = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        t.start()
        pump(client, upstream)
        t.join(10)
        client.close()
        upstream.close()

    r = threading.Thread(target=run_relay, daemon=True)
    r.start()
    via = FeedTarget(target.node, f"127.0.0.1:{relay.getsockname()[1]}", target.tls)
    marker = "plaintext-marker-" * 4
    list(feed(_plan(via), 0, [marker] * 100))
    r.join(10)
    relay.close()
    wire = b"".join(seen)
    assert wire[:1] == b"\x16"  # a TLS handshake record, where a plaintext feed starts with a challenge
    assert marker.encode() not in wire and b"challenge" not in wire and b"records" not in wire
    assert _fed(srv) == 100  # and the node's consumer took every record (before it said done)


def test_a_plaintext_peer_is_refused_by_a_tls_feed_port(tls_server):
    srv, target, _ = tls_server
    host, port = target.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # A plaintext feeder's first bytes (a frame of the feed protocol) are not a ClientHello.
        sock.sendall(fw.frame(fm.Open(kind="eof")))
        got = b""
        try:
            while data := sock.recv(65536):
                got += data
        except ConnectionResetError:
            pass
    assert b"challenge" not in got  # the node never spoke the feed protocol to it
    # A feeder of a TLS job never falls back to plaintext: a node that registered no
    # certificate is not fed at all.
    unpinned = FeedPlan(JOB, TOKEN, (FeedTarget("worker:0", target.address),), tls=True)
    with pytest.raises(
        fw.FeedError, match="registered no feed certificate: refusing to feed it in plaintext"
    ):
        list(feed(unpinned, 0, [1]))
    list(feed(_plan(target), 0, [1, 2, 3]))  # and the node still serves its own job's feeders
    assert _fed(srv) == 3


def test_a_node_that_presents_another_certificate_is_not_fed(tls_server):
    """Another node (of this job or any other) at the registered address, or someone on the
    path with a certificate of their own, fails the pin before a byte of the feed is sent."""
    srv, target, _ = tls_server
    impostor_identity = feedtls.new_identity(JOB)  # issued for the same job, but not the registered key
    listener = socket.create_server(("127.0.0.1", 0))
    impostor = FeedServer(listener, TOKEN, JOB, "impostor", tls=impostor_identity).start()
    try:
        wrong = FeedTarget("worker:0", f"127.0.0.1:{listener.getsockname()[1]}", target.tls)
        with pytest.raises(
            fw.FeedError, match="presented a certificate other than the one the node registered"
        ):
            list(feed(_plan(wrong), 0, [1, 2, 3]))
        assert _fed(impostor) == 0
        # The real node, pinned right, is fed.
        list(feed(_plan(target), 0, [1, 2, 3]))
        assert _fed(srv) == 3
    finally:
        impostor.close()


def test_a_tls_feeder_refuses_a_plaintext_node():
    """The reverse downgrade: a feeder pinning a certificate reaches a node that answers in plaintext."""
    listener = socket.create_server(("127.0.0.1", 0))
    srv = FeedServer(listener, TOKEN, JOB, "worker:0").start()
    try:
        pinned = FeedTarget("worker:0", f"127.0.0.1:{listener.getsockname()[1]}", _IDENTITY.fingerprint)
        with pytest.raises(fw.FeedError, match=r"TLS handshake with the feed port of worker:0 .* failed"):
            list(feed(_plan(pinned), 0, [1, 2, 3]))
        assert _fed(srv) == 0
    finally:
        srv.close()


# -- before authentication (issue 26, N2) -----------------------------------------------------


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Does the node close ``sock`` within ``seconds`` (whatever it sent first)?"""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:  # reset: closed too
        return True


@pytest.fixture
def bare() -> Iterator[tuple[FeedServer, int]]:
    """A plaintext feed server with a short handshake deadline and small caps, for attacks."""
    listener = socket.create_server(("127.0.0.1", 0))
    srv = FeedServer(
        listener, TOKEN, JOB, "worker:0", handshake_timeout_s=1.0, max_unauthenticated=3, max_feeders=5
    ).start()
    yield srv, listener.getsockname()[1]
    srv.close()


def test_an_oversized_frame_before_authentication_is_refused_at_its_header(bare):
    """An unauthenticated peer announces an 8 MiB frame: the node refuses at the 4-byte header,
    reading nothing of the body, and closes."""
    _, port = bare
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.recv(4096)  # the challenge
        sock.sendall((8 * 1024 * 1024).to_bytes(4, "big") + b"\x80" * 1024)
        assert _closed_within(sock, 5.0)
    assert fw.PRE_AUTH_FRAME_BYTES == 4096


def test_an_extension_type_before_authentication_is_refused(bare):
    _, port = bare
    body = b"\x81\xa2op\xd4\x01\x00"  # {"op": ext(1, b"\x00")}: an ext value in a would-be hello
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.recv(4096)
        sock.sendall(len(body).to_bytes(4, "big") + body)
        assert _closed_within(sock, 5.0)


def test_a_trickled_handshake_is_cut_at_its_deadline_whatever_it_sends(bare):
    """One byte every 0.2 s would reset a per-read timeout for ever; the whole handshake has
    one deadline (1 s here) and the node closes the connection there."""
    _, port = bare
    # From before the connection: the deadline runs from the node's accept, so however long
    # the challenge takes to arrive the cut cannot come sooner than the deadline after t0.
    t0 = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.recv(4096)
    closed = threading.Event()

    def trickle() -> None:
        for b in (300).to_bytes(4, "big") + b"\x80" * 200:  # a frame it never finishes
            if closed.is_set():
                return
            try:
                sock.send(bytes([b]))
            except OSError:
                return
            closed.wait(0.2)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        assert _closed_within(sock, 5.0)
        took = time.monotonic() - t0
    finally:
        closed.set()
        t.join(5)
        sock.close()
    assert 0.8 <= took < 3.0, took


def test_idle_unauthenticated_connections_are_capped_without_a_thread_each(bare):
    """Connections that never say hello take at most ``max_unauthenticated`` threads; more are
    closed at once, and once the idle ones are cut at their deadline a feeder gets in."""
    srv, port = bare
    threads = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        for s in idle:
            s.recv(4096)  # each got its challenge: being served
        over = socket.create_connection(("127.0.0.1", port), timeout=5)
        with over:
            assert over.recv(4096) == b""  # closed at once, no challenge
        assert srv.refused >= 1
        assert threading.active_count() - threads <= 3 + 3  # a thread and a deadline timer each
        for s in idle:
            assert _closed_within(s, 5.0)  # cut at the handshake deadline
    finally:
        for s in idle:
            s.close()
    out: list = []
    consumer = _consume(srv, True, out)
    target = FeedTarget("worker:0", f"127.0.0.1:{port}", "")
    list(feed(_plan(target), 0, range(100)))
    control(_plan(target), target, "eof")
    consumer.join(10)
    assert sorted(x for batch in out for x in batch) == list(range(100))


def test_the_feed_port_listens_on_the_nodes_address_unless_widened():
    """N2: the feed port bound every interface; it now listens on the address the node
    registers (the one feeders dial), and ``feed_bind`` widens it on request."""
    from tfcoord.node.executor import ForkedFunction, NodeSpec

    def bound(**kw: object) -> str:
        spec = NodeSpec(
            address="127.0.0.1:1",
            token=TOKEN,
            job=JOB,
            map_fun=print,
            tf_args=None,
            slots=(("worker", 0),),
            feed=True,
            **kw,  # type: ignore[arg-type]
        )
        child = ForkedFunction(spec, 0)
        child.prepare("127.0.0.1", None)  # type: ignore[arg-type]
        try:
            assert child._feed_sock is not None
            return str(child._feed_sock.getsockname()[0])
        finally:
            child.close()

    assert bound() == "127.0.0.1"
    assert bound(feed_bind="0.0.0.0") == "0.0.0.0"
