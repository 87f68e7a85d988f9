"""The fake Mesos master against a raw v1 scheduler client (aiohttp and sockets, no tfcoord).

Every wait is on an event of the stream or on the master's state; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.mesos.fake_master import AgentSpec, FakeMaster, ThreadedFakeMaster, encode_record

PY = shlex.quote(sys.executable)
FAKE_MASTER_SCRIPT = Path(__file__).with_name("fake_master.py")
FRAMEWORK: dict[str, Any] = {"user": "root", "name": "fake-master-test"}
#: No single wait in these tests should come anywhere near this.
WAIT_S = 5.0


class RecordIODecoder:
    """A strict RecordIO reader: digits, newline, exactly that many bytes, next record at once."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.records: list[bytes] = []

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self.buffer += data
        events = []
        while (newline := self.buffer.find(b"\n")) >= 0:
            header = bytes(self.buffer[:newline])
            assert header.isdigit(), f"record does not start with its length: {bytes(self.buffer[:40])!r}"
            end = newline + 1 + int(header)
            if len(self.buffer) < end:
                break
            body = bytes(self.buffer[newline + 1 : end])
            del self.buffer[:end]
            self.records.append(body)
            events.append(json.loads(body))
        return events


class Scheduler:
    """A bare v1 scheduler: one subscription stream, calls on other connections."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        master: FakeMaster,
        info: dict[str, Any] | None = None,
        auth: tuple[str, str] | None = None,
        **kw: Any,
    ) -> None:
        self.session = session
        self.url = master.url + "/api/v1/scheduler"
        self.info = {**FRAMEWORK, **(info or {})}
        self.kw = kw  # e.g. ssl=...
        self.headers = {"Authorization": basic(*auth)} if auth else {}
        self.framework_id: str | None = None
        self.stream_id: str | None = None
        self.heartbeats = 0
        self.history: list[dict[str, Any]] = []
        self._stash: list[dict[str, Any] | None] = []
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self.response: aiohttp.ClientResponse | None = None

    async def subscribe(self) -> dict[str, Any]:
        await self.close()
        info = dict(self.info)
        body: dict[str, Any] = {"type": "SUBSCRIBE", "subscribe": {"framework_info": info}}
        if self.framework_id is not None:
            info["id"] = body["framework_id"] = {"value": self.framework_id}
        self.response = await self.session.post(
            self.url,
            json=body,
            headers={"Accept": "application/json", **self.headers},
            timeout=aiohttp.ClientTimeout(total=None),
            **self.kw,
        )
        assert self.response.status == 200, await self.response.text()
        assert self.response.headers["Content-Type"] == "application/json"
        assert self.response.headers["Transfer-Encoding"] == "chunked"
        self.stream_id = self.response.headers["Mesos-Stream-Id"]
        self._queue = asyncio.Queue()
        self._stash = []
        self._reader = asyncio.create_task(self._read(self.response, self._queue))
        event = await self.next()
        assert event is not None and event["type"] == "SUBSCRIBED", event
        self.framework_id = event["subscribed"]["framework_id"]["value"]
        return event

    async def _read(self, response: aiohttp.ClientResponse, queue: asyncio.Queue) -> None:
        decoder = RecordIODecoder()
        try:
            async for chunk in response.content.iter_any():
                for event in decoder.feed(chunk):
                    queue.put_nowait(event)
        except aiohttp.ClientError:
            pass  # an aborted stream
        finally:
            queue.put_nowait(None)

    async def next(self) -> dict[str, Any] | None:
        """The next event other than HEARTBEAT; None once the stream has ended."""
        if self._stash:
            return self._stash.pop(0)
        while True:
            async with asyncio.timeout(WAIT_S):
                event = await self._queue.get()
            if event is not None and event["type"] == "HEARTBEAT":
                self.heartbeats += 1
                continue
            if event is not None:
                self.history.append(event)
            return event

    async def expect(self, event_type: str, match: Any = None) -> dict[str, Any]:
        """The next event of a type (and matching ``match(event)``); others are kept for later."""
        skipped: list[dict[str, Any] | None] = []
        try:
            while True:
                event = await self.next()
                if event is None:
                    raise AssertionError(f"stream ended while waiting for {event_type}")
                if event["type"] == event_type and (match is None or match(event)):
                    return event
                skipped.append(event)
        finally:
            self._stash[:0] = skipped

    async def until(self, event_type: str, match: Any = None) -> list[dict[str, Any]]:
        """Every event before the next one of a type, consumed."""
        before = []
        while True:
            event = await self.next()
            assert event is not None, f"stream ended while waiting for {event_type}"
            if event["type"] == event_type and (match is None or match(event)):
                return before
            before.append(event)

    async def offers(self) -> list[dict[str, Any]]:
        return (await self.expect("OFFERS"))["offers"]["offers"]

    async def update(self, task_id: str, *, ack: bool = True) -> dict[str, Any]:
        event = await self.expect("UPDATE", lambda e: e["update"]["status"]["task_id"]["value"] == task_id)
        status = event["update"]["status"]
        if ack and "uuid" in status:
            await self.ack(status)
        return status

    async def states(self, task_id: str, until: str) -> list[str]:
        """Acknowledge the task's updates up to the state ``until``; return the states seen."""
        seen = []
        while not seen or seen[-1] != until:
            seen.append((await self.update(task_id))["state"])
        return seen

    async def end(self) -> None:
        """Wait for the stream to end."""
        while (event := await self.next()) is not None:
            pass
        assert event is None

    async def call(self, call_type: str, stream_id: str | None = None, **fields: Any) -> tuple[int, str]:
        body = {"type": call_type, "framework_id": {"value": self.framework_id}, **fields}
        headers = {"Mesos-Stream-Id": stream_id or self.stream_id or "", **self.headers}
        async with self.session.post(self.url, json=body, headers=headers, **self.kw) as response:
            return response.status, await response.text()

    async def ok(self, call_type: str, **fields: Any) -> None:
        status, text = await self.call(call_type, **fields)
        assert (status, text) == (202, ""), (status, text)

    async def ack(self, status: dict[str, Any]) -> None:
        await self.ok(
            "ACKNOWLEDGE",
            acknowledge={
                "agent_id": status["agent_id"],
                "task_id": status["task_id"],
                "uuid": status["uuid"],
            },
        )

    async def launch(self, offers: list[dict[str, Any]], *task_infos: dict[str, Any], **accept: Any) -> None:
        await self.ok(
            "ACCEPT",
            accept={
                "offer_ids": [o["id"] for o in offers],
                "operations": [{"type": "LAUNCH", "launch": {"task_infos": list(task_infos)}}],
                **accept,
            },
        )

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        if self.response is not None:
            self.response.close()
            self.response = None


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def scalar(name: str, value: float) -> dict[str, Any]:
    return {"name": name, "type": "SCALAR", "scalar": {"value": value}, "role": "*"}


def task_info(
    offer: dict[str, Any], task_id: str, command: str, cpus: float = 1, mem: float = 128, **extra: Any
) -> dict[str, Any]:
    return {
        "name": task_id,
        "task_id": {"value": task_id},
        "agent_id": offer["agent_id"],
        "resources": [scalar("cpus", cpus), scalar("mem", mem)],
        "command": {"shell": True, "value": command},
        **extra,
    }


def by_name(resources: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in resources}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def master():
    async with FakeMaster([AgentSpec(cpus=4, mem=4096)], heartbeat_interval_s=0.5, kill_grace_s=1.0) as m:
        yield m


@pytest.fixture
async def connect(session):
    """``await connect(master, info)``: a subscribed Scheduler, closed at teardown."""
    made: list[Scheduler] = []

    async def make(m: FakeMaster, info: dict[str, Any] | None = None, **kw: Any) -> Scheduler:
        s = Scheduler(session, m, info, **kw)
        made.append(s)
        await s.subscribe()
        return s

    yield make
    for s in made:
        await s.close()


async def no_offers_now(master: FakeMaster, sched: Scheduler) -> None:
    """Assert that the allocator, after everything so far, offers nothing to ``sched``."""
    await master.allocation_round()
    await master.send_error("marker")
    before = await sched.until("ERROR", lambda e: e["error"]["message"] == "marker")
    assert [e["type"] for e in before if e["type"] == "OFFERS"] == []


# ---- plain HTTP -------------------------------------------------------------------


async def test_version_and_state(session):
    async with FakeMaster.uniform(2, cpus=2, gpus=1, gpu_kind="SET", attributes={"rack": "r1"}) as m:
        async with session.get(m.url + "/version") as r:
            assert r.status == 200
            version = await r.json()
        assert version["version"] == "1.11.0"
        assert "build_date" in version
        async with session.get(m.url + "/master/state") as r:
            state = await r.json()
    assert [s["resources"]["ports"] for s in state["slaves"]] == ["[31000-31999]", "[32000-32999]"]
    assert state["slaves"][0]["resources"]["gpus"] == "{0}"
    assert state["slaves"][1]["attributes"] == {"rack": "r1"}


async def test_subscribe_stream_byte_framing_on_a_raw_socket():
    """The exact bytes: HTTP/1.1 chunked, RecordIO inside, heartbeats after events and when idle."""
    async with FakeMaster([AgentSpec(cpus=1, mem=256, ports=())], heartbeat_interval_s=0.2) as m:
        reader, writer = await asyncio.open_connection("127.0.0.1", m.port)
        body = json.dumps({"type": "SUBSCRIBE", "subscribe": {"framework_info": FRAMEWORK}}).encode()
        writer.write(
            b"POST /api/v1/scheduler HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Accept: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)).decode()
        status_line, *lines = head.strip().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        assert status_line == "HTTP/1.1 200 OK"
        assert headers["content-type"] == "application/json"
        assert headers["transfer-encoding"] == "chunked"
        assert "content-length" not in headers
        uuid.UUID(headers["mesos-stream-id"])

        decoder = RecordIODecoder()
        events: list[dict[str, Any]] = []
        chunks: list[bytes] = []
        # SUBSCRIBED, HB, OFFERS, HB, then idle heartbeats; then an ERROR with non-ASCII text.
        while len(events) < 6:
            size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT_S)).strip(), 16)
            assert size > 0, "the stream must stay open"
            chunk = await reader.readexactly(size + 2)
            assert chunk.endswith(b"\r\n")
            chunks.append(chunk[:-2])
            events.extend(decoder.feed(chunk[:-2]))
        await m.send_error("zażółć ✓")
        while not events or events[-1]["type"] != "HEARTBEAT" or events[-2]["type"] != "ERROR":
            size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT_S)).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            chunks.append(chunk[:-2])
            events.extend(decoder.feed(chunk[:-2]))
        writer.close()
        await writer.wait_closed()

    assert [e["type"] for e in events[:5]] == ["SUBSCRIBED", "HEARTBEAT", "OFFERS", "HEARTBEAT", "HEARTBEAT"]
    # One record per chunk, each exactly length + "\n" + compact JSON, and nothing left over.
    assert decoder.buffer == b""
    assert chunks == decoder_records_framed(decoder.records)
    for record, event in zip(decoder.records, events, strict=True):
        assert record == json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
    error_record = decoder.records[-2]
    assert chunks[-2] == str(len(error_record)).encode() + b"\n" + error_record
    assert len(error_record) > len(error_record.decode())  # the length counts bytes, not characters
    assert events[-2] == {"type": "ERROR", "error": {"message": "zażółć ✓"}}
    assert encode_record(events[-2]) == chunks[-2]
    # After every non-heartbeat event comes a heartbeat.
    for i, event in enumerate(events[:-1]):
        if event["type"] != "HEARTBEAT":
            assert events[i + 1]["type"] == "HEARTBEAT"
    subscribed = events[0]["subscribed"]
    assert subscribed["heartbeat_interval_seconds"] == 0.2
    assert subscribed["master_info"]["port"] == m.port
    assert subscribed["master_info"]["ip"] == 16777343  # 127.0.0.1 in network byte order
    assert subscribed["framework_id"]["value"].startswith(subscribed["master_info"]["id"])


def decoder_records_framed(records: list[bytes]) -> list[bytes]:
    return [str(len(r)).encode() + b"\n" + r for r in records]


async def test_calls_are_checked(master, connect, session):
    sched = await connect(master)
    wrong = str(uuid.uuid4())
    assert await sched.call("REVIVE", stream_id=wrong) == (
        400,
        f"The stream ID '{wrong}' included in this request didn't match the stream ID "
        f"currently associated with framework ID {sched.framework_id}",
    )
    async with session.post(
        sched.url, json={"type": "REVIVE", "framework_id": {"value": sched.framework_id}}
    ) as r:
        assert r.status == 400 and "Mesos-Stream-Id" in await r.text()
    headers = {"Mesos-Stream-Id": sched.stream_id, "Content-Type": "application/json"}
    async with session.post(sched.url, data=b"{not json", headers=headers) as r:
        assert r.status == 400 and "JSON" in await r.text()
    async with session.post(sched.url, json={"type": "FROBNICATE"}, headers=headers) as r:
        assert r.status == 400 and "FROBNICATE" in await r.text()
    async with session.post(
        sched.url, data=b"\x08\x01", headers={**headers, "Content-Type": "application/x-protobuf"}
    ) as r:
        assert r.status == 415
    async with session.get(sched.url) as r:
        assert r.status == 405
    assert (await sched.call("KILL"))[0] == 400  # no 'kill' field
    assert (
        await sched.call(
            "ACKNOWLEDGE", acknowledge={"agent_id": {"value": "a"}, "task_id": {"value": "t"}, "uuid": "eA=="}
        )
    )[0] == 400
    assert (await sched.call("REVIVE", framework_id={"value": "nope"}))[0] == 400
    await sched.ok(
        "MESSAGE", message={"agent_id": {"value": "a"}, "executor_id": {"value": "e"}, "data": "aGk="}
    )
    await sched.ok("REQUEST", request={"requests": []})
    assert [t for t, _ in master.calls][:1] == ["SUBSCRIBE"]
    assert "MESSAGE" in [t for t, _ in master.calls]


async def test_basic_auth(session):
    async with FakeMaster(username="alice", password="s3cret", heartbeat_interval_s=0.5) as m:
        anonymous = Scheduler(session, m)
        with pytest.raises(AssertionError, match="Unauthorized"):
            await anonymous.subscribe()
        wrong = Scheduler(session, m, auth=("alice", "wrong"))
        with pytest.raises(AssertionError, match="Unauthorized"):
            await wrong.subscribe()
        good = Scheduler(session, m, auth=("alice", "s3cret"))
        await good.subscribe()
        await good.offers()
        await good.ok("SUPPRESS")
        async with session.post(
            good.url, json={"type": "REVIVE"}, headers={"Mesos-Stream-Id": good.stream_id}
        ) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"].startswith("Basic")
        await good.close()


async def test_redirects_to_the_leader(master, connect, session):
    sched = await connect(master, {"failover_timeout": 60})
    await master.set_leader("10.1.2.3:5050")
    await sched.end()  # a master that loses leadership drops its subscribers
    body = {"type": "SUBSCRIBE", "subscribe": {"framework_info": FRAMEWORK}}
    for path in ("/api/v1/scheduler", "/master/api/v1/scheduler"):
        async with session.post(master.url + path, json=body, allow_redirects=False) as r:
            assert r.status == 307
            assert r.headers["Location"] == f"//10.1.2.3:5050{path}"
    async with session.get(master.url + "/master/state", allow_redirects=False) as r:
        assert r.status == 307
    await master.set_leader(None)
    await sched.subscribe()
    assert await sched.offers()


# ---- offers -----------------------------------------------------------------------


async def test_offers_carry_the_configured_resources(connect):
    agents = [
        AgentSpec(
            "gpu-set",
            cpus=8,
            mem=16384,
            gpus=2,
            gpu_kind="SET",
            ports=((31000, 31010), (32000, 32000)),
            attributes={"rack": "r1", "zone": 3},
        ),
        AgentSpec("gpu-count", cpus=2, mem=1024, gpus=1),
        AgentSpec("no-gpu", cpus=1, mem=512),
    ]
    async with FakeMaster(agents, heartbeat_interval_s=0.5) as m:
        sched = await connect(m, {"capabilities": [{"type": "GPU_RESOURCES"}], "role": "tf"})
        offers = {o["hostname"]: o for o in await sched.offers()}
        ids = [o["id"] for o in offers.values()]
        await sched.ok("DECLINE", decline={"offer_ids": ids, "filters": {"refuse_seconds": 3600}})
        plain = await connect(m, {"name": "no-gpu-capability"})
        plain_offers = await plain.offers()
        await no_offers_now(m, plain)

    assert set(offers) == {"gpu-set", "gpu-count", "no-gpu"}
    first = offers["gpu-set"]
    assert first["framework_id"] == {"value": sched.framework_id}
    assert first["agent_id"]["value"] == m.agents[0].id
    assert first["id"]["value"]
    res = by_name(first["resources"])
    assert res["cpus"] == {
        "name": "cpus",
        "type": "SCALAR",
        "scalar": {"value": 8.0},
        "role": "*",
        "allocation_info": {"role": "tf"},
    }
    assert res["mem"]["scalar"] == {"value": 16384.0}
    assert res["gpus"]["type"] == "SET" and res["gpus"]["set"] == {"item": ["0", "1"]}
    assert res["ports"]["type"] == "RANGES"
    assert res["ports"]["ranges"] == {
        "range": [{"begin": 31000, "end": 31010}, {"begin": 32000, "end": 32000}]
    }
    assert first["attributes"] == [
        {"name": "rack", "type": "TEXT", "text": {"value": "r1"}},
        {"name": "zone", "type": "SCALAR", "scalar": {"value": 3.0}},
    ]
    assert by_name(offers["gpu-count"]["resources"])["gpus"] == {
        "name": "gpus",
        "type": "SCALAR",
        "scalar": {"value": 1.0},
        "role": "*",
        "allocation_info": {"role": "tf"},
    }
    # GPU agents go only to frameworks with the GPU_RESOURCES capability.
    assert [o["hostname"] for o in plain_offers] == ["no-gpu"]


async def test_decline_filters_until_revive_or_expiry(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    await sched.ok("DECLINE", decline={"offer_ids": [offer["id"]], "filters": {"refuse_seconds": 3600}})
    await no_offers_now(master, sched)
    await sched.ok("REVIVE")
    [again] = await sched.offers()
    assert again["id"] != offer["id"]
    assert again["resources"] == offer["resources"]
    # A short filter expires by itself.
    await sched.ok("DECLINE", decline={"offer_ids": [again["id"]], "filters": {"refuse_seconds": 0.2}})
    assert await sched.offers()


async def test_suppress_stops_offers_and_revive_resumes_them(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    await sched.ok("SUPPRESS")
    await sched.ok("DECLINE", decline={"offer_ids": [offer["id"]], "filters": {"refuse_seconds": 0}})
    await no_offers_now(master, sched)
    await sched.ok("REVIVE")
    assert await sched.offers()


async def test_rescind_and_accepting_a_rescinded_offer(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    assert await master.rescind() == [offer["id"]["value"]]
    rescind = await sched.expect("RESCIND")
    assert rescind["rescind"] == {"offer_id": offer["id"]}
    await sched.launch([offer], task_info(offer, "late", "true"))
    status = await sched.update("late")
    assert status["state"] == "TASK_LOST"  # TASK_DROPPED for a PARTITION_AWARE framework
    assert status["reason"] == "REASON_INVALID_OFFERS"
    assert "uuid" not in status and "no longer valid" in status["message"]
    assert await sched.offers()  # the resources come back


# ---- tasks ------------------------------------------------------------------------


async def test_command_task_runs_to_finished(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    script = "import os; print(1); print(os.environ['MESOS_TASK_ID'], os.environ['GREETING'], os.getcwd() == os.environ['MESOS_SANDBOX'])"
    info = task_info(offer, "t1", f"{PY} -c {shlex.quote(script)}")
    info["command"]["environment"] = {"variables": [{"name": "GREETING", "value": "hello"}]}
    await sched.launch([offer], info)

    starting = await sched.update("t1")
    running = await sched.update("t1")
    finished = await sched.update("t1")
    assert [starting["state"], running["state"], finished["state"]] == [
        "TASK_STARTING",
        "TASK_RUNNING",
        "TASK_FINISHED",
    ]
    assert running["container_status"]["network_infos"][0]["ip_addresses"][0]["ip_address"] == "127.0.0.1"
    for status in (starting, running, finished):
        assert status["agent_id"] == offer["agent_id"]
        assert status["task_id"] == {"value": "t1"}
        assert status["source"] == "SOURCE_EXECUTOR"
        assert len(base64.b64decode(status["uuid"])) == 16
        assert isinstance(status["timestamp"], float)
    assert finished["message"] == "Command exited with status 0"
    task = await master.wait_until(lambda: not master.unacknowledged and master.task("t1"))
    assert task.returncode == 0 and task.pid
    assert (task.sandbox / "stdout").read_text() == "1\nt1 hello True\n"
    assert [a.uuid for a in master.acks] == [starting["uuid"], running["uuid"], finished["uuid"]]
    assert master.acks[0].agent_id == offer["agent_id"]["value"]


async def test_next_update_waits_for_the_acknowledgement(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    await sched.launch([offer], task_info(offer, "t", "true"))
    starting = await sched.update("t", ack=False)
    assert starting["state"] == "TASK_STARTING"
    await master.wait_task_state("t", "TASK_FINISHED")  # the task is done, the framework sees only STARTING
    assert [s["state"] for s in master.unacknowledged] == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
    await master.send_error("marker")
    assert [e for e in await sched.until("ERROR") if e["type"] == "UPDATE"] == []
    await sched.ack(starting)
    assert await sched.states("t", "TASK_FINISHED") == ["TASK_RUNNING", "TASK_FINISHED"]
    await master.wait_until(lambda: not master.unacknowledged)


async def test_shell_false_runs_arguments_as_argv(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    info = task_info(offer, "exec", "")
    info["command"] = {
        "shell": False,
        "value": sys.executable,
        "arguments": ["python-argv0", "-c", "import sys; sys.exit(7)"],
    }
    await sched.launch([offer], info)
    assert await sched.states("exec", "TASK_FAILED") == ["TASK_STARTING", "TASK_RUNNING", "TASK_FAILED"]


async def test_failing_command_is_task_failed(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    await sched.launch([offer], task_info(offer, "bad", "echo oops >&2; exit 3"))
    assert await sched.states("bad", "TASK_FAILED") == ["TASK_STARTING", "TASK_RUNNING", "TASK_FAILED"]
    status = sched.history[-1]["update"]["status"]
    assert status["message"] == "Command exited with status 3"
    assert (master.task("bad").sandbox / "stderr").read_text() == "oops\n"


async def test_kill_sends_task_killed(master, connect):
    sched = await connect(master, {"capabilities": [{"type": "TASK_KILLING_STATE"}]})
    [offer] = await sched.offers()
    await sched.launch([offer], task_info(offer, "sleeper", "exec sleep 60"))
    assert await sched.states("sleeper", "TASK_RUNNING") == ["TASK_STARTING", "TASK_RUNNING"]
    pid = master.task("sleeper").pid
    assert pid and process_alive(pid)
    await sched.ok("KILL", kill={"task_id": {"value": "sleeper"}, "agent_id": offer["agent_id"]})
    assert await sched.states("sleeper", "TASK_KILLED") == ["TASK_KILLING", "TASK_KILLED"]
    assert "signal Terminated" in sched.history[-1]["update"]["status"]["message"]
    await master.wait_until(lambda: master.task("sleeper").returncode is not None)
    assert not process_alive(pid)
    # Killing a task the master no longer knows answers like reconciliation.
    await sched.ok("KILL", kill={"task_id": {"value": "sleeper"}})
    assert (await sched.update("sleeper"))["state"] == "TASK_LOST"


async def test_packing_and_overcommit(master, connect):
    sched = await connect(master, {"capabilities": [{"type": "PARTITION_AWARE"}]})
    [offer] = await sched.offers()  # cpus 4, mem 4096
    agent_id = offer["agent_id"]["value"]
    await sched.launch(
        [offer],
        task_info(offer, "a", "exec sleep 60", cpus=1.5, mem=1000),
        task_info(offer, "b", "exec sleep 60", cpus=2, mem=1000),
        task_info(offer, "c", "exec sleep 60", cpus=1, mem=100),  # only 0.5 cpus left
        task_info(offer, "a", "exec sleep 60", cpus=0.1, mem=10),  # duplicate id
        filters={"refuse_seconds": 0},
    )
    error = await sched.update("c")
    assert error["state"] == "TASK_ERROR" and error["reason"] == "REASON_TASK_INVALID"
    assert "more resources" in error["message"] and "uuid" not in error
    duplicate = await sched.expect("UPDATE", lambda e: e["update"]["status"].get("state") == "TASK_ERROR")
    assert "duplicate" in duplicate["update"]["status"]["message"]
    for task_id in ("a", "b"):
        assert await sched.states(task_id, "TASK_RUNNING") == ["TASK_STARTING", "TASK_RUNNING"]
    used = master.used(agent_id)
    assert (used.scalar("cpus"), used.scalar("mem")) == (3.5, 2000.0)
    # What is left comes back as one offer; a task's end frees its share.
    [rest] = await sched.offers()
    assert by_name(rest["resources"])["cpus"]["scalar"]["value"] == 0.5
    await sched.ok("DECLINE", decline={"offer_ids": [rest["id"]], "filters": {"refuse_seconds": 3600}})
    await master.fail_task("b", "TASK_LOST", "agent went away")
    lost = await sched.update("b")
    assert lost["state"] == "TASK_LOST" and lost["source"] == "SOURCE_MASTER" and "uuid" not in lost
    [freed] = await sched.offers()
    assert by_name(freed["resources"])["cpus"]["scalar"]["value"] == 2.5
    # The same offer cannot be used twice: a PARTITION_AWARE framework gets TASK_DROPPED.
    await sched.launch([offer], task_info(offer, "again", "true"))
    assert (await sched.update("again"))["state"] == "TASK_DROPPED"


async def test_launch_group_is_rejected(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    group = {"tasks": [task_info(offer, "g1", "true")]}
    await sched.ok(
        "ACCEPT",
        accept={
            "offer_ids": [offer["id"]],
            "operations": [{"type": "LAUNCH_GROUP", "launch_group": {"executor": {}, "task_group": group}}],
        },
    )
    status = await sched.update("g1")
    assert status["state"] == "TASK_ERROR" and "LAUNCH_GROUP" in status["message"]


async def test_docker_task_runs_as_a_process_and_keeps_its_task_info(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    container = {
        "type": "DOCKER",
        "docker": {
            "image": "tensorflow/tensorflow:latest-gpu",
            "network": "HOST",
            "parameters": [{"key": "gpus", "value": "all"}],
        },
        "volumes": [{"container_path": "/data", "host_path": "/srv/data", "mode": "RO"}],
    }
    await sched.launch([offer], task_info(offer, "docker", "echo in-container", container=container))
    assert await sched.states("docker", "TASK_FINISHED") == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
    task = master.task("docker")
    assert task.container == container
    assert task.container["docker"]["parameters"] == [{"key": "gpus", "value": "all"}]
    assert (task.sandbox / "stdout").read_text() == "in-container\n"


async def test_reconcile(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    await sched.launch([offer], task_info(offer, "r", "exec sleep 60"))
    await sched.states("r", "TASK_RUNNING")
    await sched.ok(
        "RECONCILE",
        reconcile={
            "tasks": [
                {"task_id": {"value": "r"}, "agent_id": offer["agent_id"]},
                {"task_id": {"value": "ghost"}},
            ]
        },
    )
    explicit = await sched.update("r")
    ghost = await sched.update("ghost")
    await sched.ok("RECONCILE", reconcile={"tasks": []})
    implicit = await sched.update("r")
    for status in (explicit, implicit):
        assert status["state"] == "TASK_RUNNING"
        assert status["reason"] == "REASON_RECONCILIATION"
        assert status["source"] == "SOURCE_MASTER"
        assert "uuid" not in status
    assert explicit["container_status"]["network_infos"][0]["ip_addresses"][0]["ip_address"] == "127.0.0.1"
    assert ghost["state"] == "TASK_LOST" and "uuid" not in ghost
    assert master.unacknowledged == []


async def test_injected_failures(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    await sched.launch(
        [offer],
        task_info(offer, "f1", "exec sleep 60"),
        task_info(offer, "f2", "exec sleep 60"),
        filters={"refuse_seconds": 3600},
    )
    for task_id in ("f1", "f2"):
        await sched.states(task_id, "TASK_RUNNING")
    pid = master.task("f1").pid
    await master.fail_task("f1", message="disk on fire")
    failed = await sched.update("f1")
    assert (failed["state"], failed["message"], failed["source"]) == (
        "TASK_FAILED",
        "disk on fire",
        "SOURCE_EXECUTOR",
    )
    assert "uuid" in failed
    assert not process_alive(pid)
    await master.fail_task("f2", "TASK_ERROR", "bad config", reason="REASON_TASK_INVALID")
    error = await sched.update("f2")
    assert (error["state"], error["reason"], "uuid" in error) == ("TASK_ERROR", "REASON_TASK_INVALID", False)
    with pytest.raises(ValueError):
        await master.fail_task("f2")
    await master.send_event({"type": "FAILURE", "failure": {"agent_id": offer["agent_id"]}})
    assert (await sched.expect("FAILURE"))["failure"]["agent_id"] == offer["agent_id"]


async def test_disconnect_and_resubscribe_keeps_tasks(master, connect):
    sched = await connect(master, {"failover_timeout": 60})
    [offer] = await sched.offers()
    await sched.launch([offer], task_info(offer, "keep", "exec sleep 60"))
    await sched.states("keep", "TASK_RUNNING")
    pid = master.task("keep").pid
    old_stream = sched.stream_id

    await master.disconnect(sched.framework_id)
    await sched.end()
    assert not master.frameworks[sched.framework_id].connected
    framework_id = sched.framework_id
    subscribed = await sched.subscribe()
    assert subscribed["subscribed"]["framework_id"]["value"] == framework_id
    assert sched.stream_id != old_stream
    assert (await sched.call("SUPPRESS", stream_id=old_stream))[0] == 400
    assert master.task("keep").state == "TASK_RUNNING" and process_alive(pid)
    await sched.ok("RECONCILE", reconcile={"tasks": []})
    assert (await sched.update("keep"))["state"] == "TASK_RUNNING"


async def test_a_framework_without_failover_timeout_is_torn_down_when_it_disconnects(master, connect):
    sched = await connect(master)
    [offer] = await sched.offers()
    await sched.launch([offer], task_info(offer, "gone", "exec sleep 60"))
    await sched.states("gone", "TASK_RUNNING")
    await sched.close()  # the client hangs up
    task = await master.wait_until(lambda: master.task("gone").returncode is not None and master.task("gone"))
    assert task.state == "TASK_KILLED"
    assert master.frameworks[sched.framework_id].removed


async def test_unacknowledged_updates_are_resent_after_resubscribe(master, connect):
    sched = await connect(master, {"failover_timeout": 60})
    [offer] = await sched.offers()
    await sched.launch([offer], task_info(offer, "u", "true"))
    starting = await sched.update("u", ack=False)
    await master.disconnect()
    await sched.end()
    await sched.subscribe()
    again = await sched.update("u")
    assert again["uuid"] == starting["uuid"]
    assert await sched.states("u", "TASK_FINISHED") == ["TASK_RUNNING", "TASK_FINISHED"]


async def test_teardown_kills_tasks_and_ends_the_stream(master, connect):
    sched = await connect(master, {"failover_timeout": 60})
    [offer] = await sched.offers()
    await sched.launch(
        [offer],
        task_info(offer, "t1", "exec sleep 60", cpus=1),
        task_info(offer, "t2", "exec sleep 60", cpus=1),
    )
    for task_id in ("t1", "t2"):
        await sched.states(task_id, "TASK_RUNNING")
    pids = [master.task(t).pid for t in ("t1", "t2")]
    await sched.ok("TEARDOWN")
    await sched.end()  # a clean end of the chunked response
    await master.wait_until(lambda: all(master.task(t).returncode is not None for t in ("t1", "t2")))
    assert not any(process_alive(p) for p in pids if p)
    assert {master.task(t).state for t in ("t1", "t2")} == {"TASK_KILLED"}
    # A torn-down framework cannot come back.
    with pytest.raises(AssertionError):
        await sched.subscribe()
    assert sched.history[-1] == {"type": "ERROR", "error": {"message": "Framework has been removed"}}


async def test_a_second_subscription_takes_over(master, connect, session):
    first = await connect(master, {"failover_timeout": 60})
    second = Scheduler(session, master, {"failover_timeout": 60})
    second.framework_id = first.framework_id
    await second.subscribe()
    error = await first.expect("ERROR")
    assert error["error"]["message"] == "Framework failed over"
    await first.end()
    assert await second.offers()
    await second.close()


# ---- other ways to run it ---------------------------------------------------------


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_tls(tmp_path, session, connect):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    async with FakeMaster(ssl_context=server, heartbeat_interval_s=0.5) as m:
        assert m.url.startswith("https://")
        sched = await connect(m, ssl=client)
        assert await sched.offers()
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(m.url + "/version")  # an unknown CA is refused
        await sched.close()


def test_threaded_master_serves_blocking_clients():
    with ThreadedFakeMaster(heartbeat_interval_s=0.5) as m:
        with urllib.request.urlopen(m.url + "/version", timeout=WAIT_S) as r:
            assert json.load(r)["version"] == "1.11.0"
        assert m.call(m.master.rescind()) == []


def test_cli_writes_its_port_and_stops_on_sigterm(tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKE_MASTER_SCRIPT),
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--agents",
            "2",
            "--cpus",
            "3",
            "--gpus",
            "1",
            "--username",
            "u",
            "--password",
            "p",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # printed once the port file is in place
        assert "listening on http://127.0.0.1:" in line
        port = int(port_file.read_text())
        assert line.strip().endswith(f":{port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/master/state", timeout=WAIT_S) as r:
            state = json.load(r)
        assert [s["resources"]["cpus"] for s in state["slaves"]] == [3.0, 3.0]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/scheduler", data=b"{}", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=WAIT_S)
        assert info.value.code == 401
        info.value.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
