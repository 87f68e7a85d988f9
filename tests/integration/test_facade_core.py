"""The small public pieces of the core that the compatibility layers stand on: a coordinator
serving on a socket its caller holds, a feed fed from its own process, and the Mesos view of
an embedded coordinator. Real sockets on port 0."""

from __future__ import annotations

import queue
import socket
from collections.abc import Iterator

import pytest

from tfcoord.client import DriverClient, JobSpec, make_roles
from tfcoord.coordinator.embedded import EmbeddedCoordinator
from tfcoord.node.datafeed import DataFeed, FeedServer


def test_an_embedded_coordinator_serves_on_the_socket_its_caller_bound() -> None:
    held = socket.create_server(("127.0.0.1", 0))
    port = held.getsockname()[1]
    coord = EmbeddedCoordinator(sock=held).start()
    try:
        assert coord.port == port and coord.address == f"127.0.0.1:{port}"
        with DriverClient(coord.address, coord.secret, ssl_context=coord.client_context()) as d:
            job = d.submit(JobSpec(roles=make_roles(1)))
            assert d.status(job).size == 1
        assert coord.mesos_view(job) is None  # no Mesos framework runs here
    finally:
        coord.stop()
    assert held.fileno() == -1  # closed with the coordinator
    assert coord.mesos_view("any") is None


@pytest.fixture
def server() -> Iterator[FeedServer]:
    s = FeedServer(socket.create_server(("127.0.0.1", 0)), b"k" * 32, "job-1", "node", queues=None).start()
    yield s
    s.close()


def test_records_fed_from_the_consumers_own_process_are_read_like_any_partition(server: FeedServer) -> None:
    a = server.open_local("input")
    server.put_local(a, [1, 2])
    server.end_local(a)
    b = server.open_local("input")
    server.put_local(b, [3])
    server.end_local(b)
    server.end_queue("input")
    feed = DataFeed(server, train_mode=False)
    assert feed.next_batch(10) == [1, 2]  # inference: a batch stops at its partition's end
    feed.batch_results(["one", "two"])
    assert [server.get_local("output", 1.0), server.get_local("output", 1.0)] == ["one", "two"]
    assert server.local_size("output") == 0
    with pytest.raises(queue.Empty):
        server.get_local("output", 0.05)
    assert feed.next_batch(10) == [3] and feed.should_stop()
    assert server.get_local("input", 0.05) is None  # the queue's feed ended with nothing left


def test_a_record_put_in_this_process_can_be_read_back_and_a_stopped_feed_takes_no_more(
    server: FeedServer,
) -> None:
    p = server.open_local("control")
    server.put_local(p, ["go"])
    assert server.local_size("control") == 1 and server.get_local("control", 1.0) == "go"
    server.stop("stopped")
    server.put_local(p, ["late"])
    assert server.local_size("control") == 0
