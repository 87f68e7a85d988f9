"""The v1 scheduler client (coordinator/mesos/scheduler.py) against masters that misbehave.

A small aiohttp app plays each master: one that falls silent after SUBSCRIBED (the heartbeat
watchdog must resubscribe, keeping the framework id), one that forgets the framework, one
that rejects the subscription, and none at all. The fake master covers the well-behaved
paths in test_framework.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.integration.pki import Authority
from tests.mesos.fake_master import FakeMaster
from tfcoord.coordinator.mesos.config import MesosConfig
from tfcoord.coordinator.mesos.errors import MesosError, MesosUnreachable
from tfcoord.coordinator.mesos.recordio import encode_record
from tfcoord.coordinator.mesos.scheduler import Call, SchedulerClient, basic_auth, resolve_redirect

WAIT_S = 10.0


class Recorder:
    """A SchedulerListener that queues what it hears."""

    def __init__(self) -> None:
        self.heard: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def framework_info(self) -> dict[str, Any]:
        return {"user": "tester", "name": "scheduler-test", "failover_timeout": 60.0}

    def suppressed_roles(self) -> list[str]:
        return []

    def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        self.heard.put_nowait(("subscribed", (framework_id, resubscribed)))

    def on_event(self, event: dict[str, Any]) -> None:
        self.heard.put_nowait(("event", event))

    def on_disconnected(self, reason: str) -> None:
        self.heard.put_nowait(("disconnected", reason))

    def on_framework_removed(self, reason: str) -> None:
        self.heard.put_nowait(("removed", reason))

    def on_fatal(self, error: MesosError) -> None:
        self.heard.put_nowait(("fatal", error))

    def on_call_failed(self, call: Call, reason: str) -> None:
        self.heard.put_nowait(("call_failed", (call, reason)))

    async def next(self, kind: str) -> Any:
        """The next thing heard of ``kind`` (others are skipped)."""
        async with asyncio.timeout(WAIT_S):
            while True:
                got, value = await self.heard.get()
                if got == kind:
                    return value


Handler = Callable[[web.Request, dict[str, Any], int], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """``url = await serve(handler)``: a master played by ``handler(request, body, n)``."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        count = 0

        async def scheduler(request: web.Request) -> web.StreamResponse:
            nonlocal count
            count += 1
            return await handler(request, await request.json(), count)

        app = web.Application()
        app.router.add_post("/api/v1/scheduler", scheduler)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def stream(request: web.Request, *events: dict[str, Any], hold: bool = True) -> web.StreamResponse:
    """Answer a SUBSCRIBE with these events; then stay silent (``hold``) or end the stream."""
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "application/json", "Mesos-Stream-Id": "s"}
    )
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    for event in events:
        await resp.write(encode_record(event))
    if hold:
        await asyncio.Event().wait()  # silent until the client hangs up (the handler is cancelled)
    await resp.write_eof()
    return resp


def subscribed(framework_id: str, heartbeat_s: float) -> dict[str, Any]:
    return {
        "type": "SUBSCRIBED",
        "subscribed": {"framework_id": {"value": framework_id}, "heartbeat_interval_seconds": heartbeat_s},
    }


def config(url: str, **kw: Any) -> MesosConfig:
    return MesosConfig(masters=(url,), **kw)


async def test_a_silent_stream_is_resubscribed_keeping_the_framework_id(serve: Any) -> None:
    bodies: list[dict[str, Any]] = []

    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        bodies.append(body)
        return await stream(request, subscribed("fw-1", 0.05))  # then not even a heartbeat

    listener = Recorder()
    client = SchedulerClient(config(await serve(master), heartbeat_misses=3), listener)
    await client.start()
    try:
        assert await listener.next("subscribed") == ("fw-1", False)
        reason = await listener.next("disconnected")
        assert "no event, not even a heartbeat, for 0.15 s" in reason
        assert await listener.next("subscribed") == ("fw-1", True)
    finally:
        await client.close(teardown=False)
    assert "framework_id" not in bodies[0]
    assert bodies[1]["framework_id"] == {"value": "fw-1"}
    assert bodies[1]["subscribe"]["framework_info"]["id"] == {"value": "fw-1"}
    assert bodies[1]["subscribe"]["framework_info"]["failover_timeout"] == 60.0


async def test_a_removed_framework_subscribes_anew_without_its_old_id(serve: Any) -> None:
    bodies: list[dict[str, Any]] = []

    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        bodies.append(body)
        if n == 1:
            return await stream(
                request, {"type": "ERROR", "error": {"message": "Framework has been removed"}}, hold=False
            )
        return await stream(request, subscribed("fw-new", 15))

    listener = Recorder()
    client = SchedulerClient(config(await serve(master)), listener, framework_id="fw-old")
    await client.start()
    try:
        assert "Framework has been removed" in await listener.next("removed")
        assert await listener.next("subscribed") == ("fw-new", False)
    finally:
        await client.close(teardown=False)
    assert bodies[0]["framework_id"] == {"value": "fw-old"} and "framework_id" not in bodies[1]


async def test_a_rejected_subscribe_is_fatal_with_the_masters_reason(serve: Any) -> None:
    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        return web.Response(status=400, text="Failed to validate scheduler::Call: role 'x y' is invalid")

    client = SchedulerClient(config(await serve(master)), Recorder())
    with pytest.raises(MesosError, match=r"rejected SUBSCRIBE \(HTTP 400\): .*role 'x y' is invalid"):
        await client.start()


async def test_a_master_error_that_is_not_fatal_reaches_the_framework(serve: Any) -> None:
    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        return await stream(
            request, subscribed("fw", 15), {"type": "ERROR", "error": {"message": "slow down"}}
        )

    listener = Recorder()
    client = SchedulerClient(config(await serve(master)), listener)
    await client.start()
    try:
        assert (await listener.next("event"))["error"]["message"] == "slow down"
    finally:
        await client.close(teardown=False)


# -- protocol errors are retried, never fatal -------------------------------------------------


async def raw_stream(request: web.Request, *chunks: bytes, stream_id: str | None = "s") -> web.StreamResponse:
    """Answer a SUBSCRIBE 200 with these bytes as they are, then stay silent."""
    headers = {"Content-Type": "application/json"}
    if stream_id is not None:
        headers["Mesos-Stream-Id"] = stream_id
    resp = web.StreamResponse(status=200, headers=headers)
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    for chunk in chunks:
        await resp.write(chunk)
    await asyncio.Event().wait()
    return resp


async def test_a_master_answering_without_a_stream_id_is_passed_over_for_the_next(serve: Any) -> None:
    async def proxy(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        return await raw_stream(request, encode_record(subscribed("fw-proxy", 15)), stream_id=None)

    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        return await stream(request, subscribed("fw-1", 15))

    listener = Recorder()
    client = SchedulerClient(MesosConfig(masters=(await serve(proxy), await serve(master))), listener)
    await client.start()  # raised "answered SUBSCRIBE without a Mesos-Stream-Id header" before
    try:
        assert await listener.next("subscribed") == ("fw-1", False)
        assert client.error is None
    finally:
        await client.close(teardown=False)


@pytest.mark.parametrize(
    ("garbage", "why"),
    [(b"x1\n{}", "bad record length"), (b"8\nnot json", "an event is not JSON")],
)
async def test_a_broken_record_mid_stream_resubscribes(serve: Any, garbage: bytes, why: str) -> None:
    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        if n == 1:
            return await raw_stream(request, encode_record(subscribed("fw-1", 15)), garbage)
        return await stream(request, subscribed("fw-1", 15))

    listener = Recorder()
    client = SchedulerClient(config(await serve(master)), listener)
    await client.start()
    try:
        assert await listener.next("subscribed") == ("fw-1", False)
        assert why in await listener.next("disconnected")
        assert await listener.next("subscribed") == ("fw-1", True)
    finally:
        await client.close(teardown=False)


async def test_subscribed_without_a_framework_id_is_retried(serve: Any) -> None:
    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        if n == 1:
            return await stream(request, {"type": "SUBSCRIBED", "subscribed": {}})
        return await stream(request, subscribed("fw-2", 15))

    listener = Recorder()
    client = SchedulerClient(config(await serve(master)), listener)
    await client.start()
    try:
        assert await listener.next("subscribed") == ("fw-2", False)
    finally:
        await client.close(teardown=False)


async def test_protocol_errors_until_the_deadline_name_what_each_master_did(serve: Any) -> None:
    async def no_stream_id(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        return web.Response(status=200, content_type="application/json", text="{}")

    async def hostless(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": "/api/v1/scheduler"})

    async def loop(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": f"//{request.host}/api/v1/scheduler"})

    urls = (await serve(no_stream_id), await serve(hostless), await serve(loop))
    client = SchedulerClient(MesosConfig(masters=urls, first_subscribe_deadline_s=1.0), Recorder())
    with pytest.raises(MesosUnreachable) as info:
        await client.start()
    message = str(info.value)
    assert message.startswith("no Mesos master accepted the subscription within 1 s (")
    assert f"{urls[0]}: {urls[0]} answered SUBSCRIBE without a Mesos-Stream-Id header" in message
    assert f"{urls[1]}: a master redirected to '/api/v1/scheduler', which names no host" in message
    assert f"{urls[2]}: more than 5 redirects starting at {urls[2]}" in message


# -- the calls' sender -----------------------------------------------------------------------


class CallLog:
    """A master's side of the calls: each one as received, with the stream id it carried."""

    def __init__(self) -> None:
        self.calls: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    async def next(self, call_type: str) -> str:
        """The stream id of the next call of ``call_type`` (others are skipped)."""
        async with asyncio.timeout(WAIT_S):
            while True:
                got, stream_id = await self.calls.get()
                if got == call_type:
                    return stream_id


async def test_an_unexpected_error_in_one_call_does_not_stop_the_calls_after_it(serve: Any) -> None:
    received = CallLog()

    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        if body["type"] == "SUBSCRIBE":
            return await stream(request, subscribed("fw", 15))
        received.calls.put_nowait((body["type"], request.headers.get("Mesos-Stream-Id", "")))
        return web.Response(status=202)

    listener = Recorder()
    client = SchedulerClient(config(await serve(master)), listener)
    await client.start()
    try:
        client.call("MESSAGE", message={"data": object()})  # cannot be encoded: a TypeError in the sender
        client.call("REVIVE")
        call, reason = await listener.next("call_failed")
        assert call.type == "MESSAGE" and "TypeError" in reason
        assert await received.next("REVIVE") == "s"  # the sender goes on
    finally:
        await client.close(teardown=False)


async def test_a_call_refused_as_not_subscribed_resubscribes_and_goes_out_on_the_new_stream(
    serve: Any,
) -> None:
    received = CallLog()
    streams = iter(["s1", "s2"])

    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        if body["type"] == "SUBSCRIBE":
            resp = web.StreamResponse(
                status=200, headers={"Content-Type": "application/json", "Mesos-Stream-Id": next(streams)}
            )
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(encode_record(subscribed("fw", 15)))
            await asyncio.Event().wait()
        stream_id = request.headers.get("Mesos-Stream-Id", "")
        received.calls.put_nowait((body["type"], stream_id))
        if stream_id == "s1":
            return web.Response(status=403, text="Framework is not subscribed")
        return web.Response(status=202)

    listener = Recorder()
    client = SchedulerClient(config(await serve(master)), listener)
    await client.start()
    try:
        client.call("KILL", kill={"task_id": {"value": "t1"}})
        assert await received.next("KILL") == "s1"
        assert "says this framework is not subscribed on our stream (HTTP 403" in await listener.next(
            "disconnected"
        )
        assert await listener.next("subscribed") == ("fw", True)
        assert await received.next("KILL") == "s2"  # sent again, on the new stream
    finally:
        await client.close(teardown=False)


def sockets_to(port: int) -> int:
    """How many of this process's TCP sockets are connected to ``port`` on 127.0.0.1."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since listdir
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in list(table)[1:]]
    return sum(1 for row in rows if int(row[2].split(":")[1], 16) == port and row[9] in inodes)


async def test_closing_a_tls_subscription_leaks_no_socket_when_the_master_stops_reading(
    tmp_path: Path,
) -> None:
    # Python before 3.12.8 keeps an SSL socket open after close() until the peer answers
    # close_notify; a master that never does must not leave our socket behind (CI once
    # saw it as an unclosed-transport ResourceWarning after the loop had closed).
    ca = Authority.create(tmp_path)
    leaf = ca.issue("master", server=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(leaf.cert, leaf.key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    release = threading.Event()

    def master() -> None:
        conn, _ = listener.accept()
        with tls.wrap_socket(conn, server_side=True) as peer:
            request = b""
            while b"\r\n\r\n" not in request:
                request += peer.recv(65536)
            record = encode_record(subscribed("fw-tls", 15))
            peer.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMesos-Stream-Id: s\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(record):x}\r\n".encode() + record + b"\r\n"
            )
            release.wait(WAIT_S)  # reads nothing more: our close_notify goes unanswered

    thread = threading.Thread(target=master, daemon=True)
    thread.start()
    heard = Recorder()
    client = SchedulerClient(config(f"https://127.0.0.1:{port}", ca_file=str(ca.cert)), heard)
    try:
        await client.start()
        assert await heard.next("subscribed") == ("fw-tls", False)
        assert sockets_to(port) == 1
        await client.close(teardown=False)
        await asyncio.sleep(0)  # one loop turn: the transport closes its socket in a callback
        assert sockets_to(port) == 0
    finally:
        release.set()
        thread.join(WAIT_S)
        listener.close()


async def test_no_master_at_all_fails_the_first_subscription_naming_them() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = SchedulerClient(config(f"http://127.0.0.1:{port}", first_subscribe_deadline_s=0.5), Recorder())
    with pytest.raises(
        MesosUnreachable,
        match=rf"no Mesos master accepted the subscription within 0.5 s \(http://127.0.0.1:{port}: ",
    ):
        await client.start()


async def test_mesos_ssl_against_a_plain_http_master_fails_at_once_saying_so(serve: Any) -> None:
    async def master(request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        return await stream(request, subscribed("fw", 15))

    url = await serve(master)
    client = SchedulerClient(config(url.replace("http://", "https://")), Recorder())  # MESOS_SSL=true
    t0 = time.monotonic()
    with pytest.raises(MesosError, match=r"speaks plain HTTP, not HTTPS \(.*\): check MESOS_SSL") as info:
        await client.start()
    assert not isinstance(info.value, MesosUnreachable)
    assert time.monotonic() - t0 < 5  # not retried until the 60 s deadline


async def test_plain_http_against_a_tls_master_fails_at_once_saying_so(tmp_path: Path) -> None:
    ca = Authority.create(tmp_path)
    leaf = ca.issue("master", server=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(leaf.cert, leaf.key)
    async with FakeMaster(ssl_context=tls, heartbeat_interval_s=0.5) as fm:
        client = SchedulerClient(config(f"http://{fm.address}"), Recorder())  # MESOS_SSL unset
        t0 = time.monotonic()
        with pytest.raises(MesosError, match="speaks HTTPS and hung up on plain HTTP: set MESOS_SSL=true"):
            await client.start()
        assert time.monotonic() - t0 < 5
        assert fm.frameworks == {}


@pytest.mark.parametrize(
    ("current", "location", "expected"),
    [
        ("http://m1:5050", "//m2:5050/api/v1/scheduler", "http://m2:5050"),
        ("https://m1:5050", "//m2:5050/master/api/v1/scheduler", "https://m2:5050"),
        ("http://m1:5050", "https://m3:5443/api/v1/scheduler", "https://m3:5443"),
    ],
)
def test_redirects_resolve_scheme_relative_locations(current: str, location: str, expected: str) -> None:
    assert resolve_redirect(current, location) == expected


def test_basic_auth_header() -> None:
    assert basic_auth("alice", "s3cret") == "Basic YWxpY2U6czNjcmV0"
