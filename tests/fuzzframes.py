"""Hostile input for a live coordinator: many connections, each a plan of frames to send.

Used by ``tests/integration/test_fuzz.py`` (with hypothesis supplying structured maps)
and by ``benchmarks/load.py`` (fuzz frames per second survived).

A plan is one connection. Most plans authenticate (as a driver, an admin or a node of
a real job) and send a stream of requests that are valid on the wire but random in
every field (unknown jobs, wrong slots, forbidden ops, bad states, tiny timeouts),
then end with at most one *hostile tail*: random bytes, a valid frame with bits
flipped, a truncated frame, a length prefix that lies, an oversized length, a map
that is not a valid message, or a message a client may not send. Some plans are
hostile from the start (garbage or a damaged hello instead of a proper one). The
tail comes last because the coordinator closes a connection at its first bad frame;
putting it last means nearly every frame sent is one the coordinator really reads.

The verdict per connection: every request before the tail answered exactly once, or
the connection closed by the coordinator; never neither (a hang). Random fields come
from a seeded ``random.Random``, so a failing batch replays from its seed.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfcoord.client import auth
from tfcoord.client import messages as m
from tfcoord.client.errors import ProtocolError
from tfcoord.client.protocol import DEFAULT_MAX_FRAME_BYTES, NEED_DATA, Connection, pack
from tfcoord.coordinator.server import PRE_AUTH_MAX_FRAME_BYTES

#: Waits in fuzzed requests end within this, so every connection finishes quickly.
MAX_WAIT_S = 0.3
#: A connection's replies and close must come within this (waits above, a frame or idle
#: timeout of the fuzz coordinator, and a loaded machine); past it, it hung.
VERDICT_TIMEOUT_S = 15.0

#: The id of the request hostile tails are made from: eleven bits set in its top half.
TAIL_ID = 0xCAFE0000
_HOSTS = ("127.0.0.1", "10.0.0.1", "node-a.example", "h")
_GPUS = ("GPU-0", "GPU-1", "GPU-x")
_TEXT = ("", "x", "boom", "Traceback (most recent call last):\nValueError: bad", "ünïcødé ✓", "a" * 300)
_TEMPLATES = (
    (("worker", 1),),
    (("worker", 3),),
    (("ps", 1), ("worker", 2)),
    (("chief", 1), ("evaluator", 1), ("worker", 2)),
    (("master", 1), ("worker", 1)),
)


@dataclass
class Plan:
    """One connection's frames. ``role`` None: the hello itself is the hostile part."""

    role: str | None
    job: str | None
    requests: list[bytes] = field(default_factory=list)
    ids: set[int] = field(default_factory=set)
    tail: bytes = b""
    tail_kind: str = ""
    #: Pre-auth plans damage the proper hello, which needs the connection's nonce.
    damage: Callable[[bytes, random.Random], bytes] | None = None

    @property
    def frames(self) -> int:
        return len(self.requests) + 1 + (1 if self.tail else 0)


@dataclass
class Outcome:
    plan: Plan
    answered: dict[int, int] = field(default_factory=dict)
    closed_by_server: bool = False
    #: The connection-level error frame the coordinator sent before closing, if any.
    error_code: str | None = None
    hung: bool = False
    #: Something the coordinator sent that the protocol forbids (it must never happen).
    bad_reply: str = ""

    @property
    def ok(self) -> bool:
        if self.hung or self.bad_reply or any(n != 1 for n in self.answered.values()):
            return False
        return self.closed_by_server or set(self.answered) >= self.plan.ids


#: The owner key of the fuzzer's drivers: submit the jobs in ``Generator.jobs`` with it
#: (``DriverClient(..., owner_key=FUZZ_OWNER_KEY)``), so fuzzed drivers see them and the
#: fuzzed nodes' job tokens are theirs.
FUZZ_OWNER_KEY = b"fuzz-owner-key-".ljust(32, b".")


class Generator:
    """Builds plans from a seed, over a coordinator's real jobs.

    Args:
        secret: the coordinator secret (drivers; job tokens derive from it).
        jobs: job id → slot count, for jobs that exist (nodes act within them), submitted
            by a driver with :data:`FUZZ_OWNER_KEY`.
        structured: extra wire maps (from hypothesis) to place into plans as they fit.
        admin_secret: the admin credential; None: admin hellos carry the secret (refused).
    """

    def __init__(
        self,
        rng: random.Random,
        secret: bytes,
        jobs: dict[str, int],
        structured: Sequence[dict[str, Any]] = (),
        admin_secret: bytes | None = None,
    ) -> None:
        self.rng = rng
        self.secret = secret
        self.admin_secret = admin_secret or secret
        self.owner = auth.owner_digest(FUZZ_OWNER_KEY)
        self.jobs = dict(jobs)
        self.pool = [*jobs, "fz-new-0", "fz-new-1", "fz-missing"]
        self._valid_maps: list[dict[str, Any]] = []
        self._bad_maps: list[dict[str, Any] | Any] = []
        for mp in structured:
            try:
                msg = m.decode(mp)
            except ProtocolError:
                self._bad_maps.append(mp)
                continue
            (self._valid_maps if isinstance(msg, m.Request) else self._bad_maps).append(mp)

    # -- random values -------------------------------------------------------------------

    def _text(self, limit: int = m.MAX_TEXT_LEN) -> str:
        return self.rng.choice(_TEXT)[:limit]

    def _wait(self) -> float:
        return self.rng.choice((0.0, 0.001, self.rng.uniform(0, MAX_WAIT_S)))

    def _meta(self) -> dict[str, Any]:
        r = self.rng
        choices: list[Any] = ["", "v", 7, -1, 2**40, 1.5, float("nan"), float("inf"), "ü" * 10]
        return {
            r.choice(("pid", "tensorboard_url", "child_pid", "k", "ü")): r.choice(choices)
            for _ in range(r.randrange(0, 4))
        }

    def _spec(self) -> m.JobSpec:
        r = self.rng
        roles = r.choice(_TEMPLATES)
        tolerate = ("evaluator",) if r.random() < 0.3 else ()
        return m.JobSpec(
            roles=roles,
            reservation_timeout_s=r.choice((0.05, 0.5, 30.0)),
            heartbeat_timeout_s=r.choice((0.05, 1.0, 30.0)),
            reconnect_grace_s=r.choice((0.0, 0.1, 3.0)),
            tolerate_failure=tolerate,
            name=self._text(40),
            engine="fuzz",
            labels={"n": r.randrange(100)},
        )

    def request(self, role: str, job: str | None, rid: int) -> m.Request:
        """A valid request with random fields: mostly ops the role may send, sometimes not."""
        r = self.rng
        own = job if job is not None and r.random() < 0.9 else r.choice(self.pool)
        ops = m.NODE_OPS if role == "node" else m.ALLOWED_OPS[role]
        op = (
            r.choice(sorted(ops, key=lambda c: c.op))
            if r.random() < 0.9
            else r.choice(sorted(m.DRIVER_OPS | m.NODE_OPS, key=lambda c: c.op))
        )
        slot = {"job": own, "executor_id": r.randrange(0, 7), "attempt": r.choice((0, 0, 0, 1, 2))}
        if op is m.Submit:
            return m.Submit(id=rid, job=r.choice(self.pool), spec=self._spec())
        if op is m.AwaitJob:
            return m.AwaitJob(id=rid, job=own, timeout_s=self._wait())
        if op is m.WatchJob:
            return m.WatchJob(id=rid, job=own, version=r.randrange(0, 60), timeout_s=self._wait())
        if op is m.StopJob:
            return m.StopJob(id=rid, job=own, reason=self._text(), dry_run=r.random() < 0.5)
        if op is m.Status:
            return m.Status(id=rid, job=own if r.random() < 0.7 else None)
        if op is m.Register:
            return m.Register(
                id=rid,
                host=r.choice(_HOSTS),
                port=r.randrange(1, 65536),
                gpus=tuple(r.sample(_GPUS, r.randrange(0, 3))),
                task_id=self._text(40),
                meta=self._meta(),
                **slot,
            )
        if op is m.AwaitCluster:
            return m.AwaitCluster(id=rid, timeout_s=self._wait(), **slot)
        if op is m.Report:
            state = r.choice(m.NODE_REPORT_STATES)
            return m.Report(id=rid, state=state, error=self._text(), meta=self._meta(), **slot)
        if op is m.Heartbeat:
            return m.Heartbeat(id=rid, meta=self._meta() if r.random() < 0.2 else {}, **slot)
        return m.AwaitStop(id=rid, timeout_s=self._wait(), **slot)

    # -- hostile bytes -------------------------------------------------------------------

    def hostile(self, sample: bytes) -> tuple[str, bytes]:
        """A hostile frame (kind, bytes), some made from ``sample``, a valid frame."""
        r = self.rng
        kind = r.choice(
            (
                "garbage",
                "bitflip",
                "bitflip",
                "truncated",
                "short_length",
                "long_length",
                "oversize",
                "bad_map",
                "bad_map",
                "non_request",
                "trailing_garbage",
            )
        )
        if kind == "garbage":
            return kind, r.randbytes(r.randrange(1, 80))
        if kind == "bitflip":
            data = bytearray(sample)
            for _ in range(r.randrange(1, 5)):
                i = r.randrange(len(data))
                data[i] ^= 1 << r.randrange(8)
            return kind, bytes(data)
        if kind == "truncated":
            return kind, sample[: r.randrange(1, len(sample))]
        body = sample[4:]
        if kind == "short_length":
            return kind, struct.pack(">I", r.randrange(0, max(1, len(body)))) + body
        if kind == "long_length":
            return kind, struct.pack(">I", len(body) + r.randrange(1, 1 << 16)) + body
        if kind == "oversize":
            return kind, struct.pack(">I", r.randrange(DEFAULT_MAX_FRAME_BYTES + 1, 1 << 32)) + body[:8]
        if kind == "bad_map":
            mp = self._bad_maps.pop() if self._bad_maps and r.random() < 0.7 else self._break_map(body)
            data = pack(mp)
            return kind, struct.pack(">I", len(data)) + data
        if kind == "non_request":
            msg = r.choice(
                (
                    m.Challenge(version=1, nonce=auth.new_nonce()),
                    m.Welcome(proof=bytes(32)),
                    m.Reply(id=1, result={}),
                    m.Error(id=None, code="x", message="y"),
                )
            )
            return kind, Connection().send(msg)
        return kind, sample + r.randbytes(r.randrange(1, 40))  # trailing_garbage

    def _break_map(self, body: bytes) -> Any:
        from tfcoord.client.protocol import unpack

        r = self.rng
        mp = dict(unpack(body))  # type: ignore[arg-type]
        how = r.choice(("drop", "extra", "retype", "op", "not_a_map"))
        keys = [k for k in mp if k != "op"]
        if how == "drop" and keys:
            del mp[r.choice(keys)]
        elif how == "retype" and keys:
            mp[r.choice(keys)] = r.choice((None, True, -1, 2**63, 1.5e300, "", b"\x00" * 3, [1], {"a": 1}))
        elif how == "op":
            mp["op"] = r.choice(("", "nope", "register ", 7, None, "HELLO"))
        elif how == "not_a_map":
            return r.choice(([mp], "text", 42, None, b"bytes"))
        else:
            mp["surprise"] = 1
        return mp

    def _damage_hello(self, frame: bytes, rng: random.Random) -> bytes:
        kind = rng.choice(("garbage", "bitflip", "truncated", "oversize", "wrong_key", "request_first"))
        if kind == "garbage":
            return rng.randbytes(rng.randrange(1, 80))
        if kind == "bitflip":
            data = bytearray(frame)
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
            return bytes(data)
        if kind == "truncated":
            return frame[: rng.randrange(1, len(frame))]
        if kind == "oversize":  # past the pre-handshake limit (a few KiB), or past every limit
            size = rng.choice(
                (PRE_AUTH_MAX_FRAME_BYTES + 1, rng.randrange(PRE_AUTH_MAX_FRAME_BYTES, 1 << 32))
            )
            return struct.pack(">I", size) + frame[4:]
        if kind == "request_first":
            return Connection().send(m.Status(id=1))
        return b""  # wrong_key: run() sends a hello with a wrong key instead

    # -- plans ---------------------------------------------------------------------------

    def plan(self, max_requests: int = 30) -> Plan:
        r = self.rng
        roll = r.random()
        if roll < 0.1:
            return Plan(role=None, job=None, damage=self._damage_hello, tail_kind="hello")
        role = "node" if roll < 0.6 else ("driver" if roll < 0.9 else "admin")
        job = r.choice(list(self.jobs)) if role == "node" else None
        plan = Plan(role=role, job=job)
        conn = Connection()
        for rid in range(1, r.randrange(0, max_requests) + 1):
            if self._valid_maps and r.random() < 0.2:
                mp = dict(self._valid_maps.pop())
                mp["id"] = rid
                frame = struct.pack(">I", len(pack(mp))) + pack(mp)
            else:
                frame = conn.send(self.request(role, job, rid))
            plan.requests.append(frame)
            plan.ids.add(rid)
        if r.random() < 0.8:
            # Its id is far from the plan's: a bit flip can never make it answer one of them.
            sample = conn.send(self.request(role, job, TAIL_ID))
            plan.tail_kind, plan.tail = self.hostile(sample)
        return plan

    def plans(self, frames: int) -> list[Plan]:
        """Plans adding up to at least ``frames`` frames; every structured map is used."""
        out: list[Plan] = []
        total = 0
        while total < frames or self._valid_maps or self._bad_maps:
            p = self.plan()
            out.append(p)
            total += p.frames
        return out


# -- running plans against a live coordinator -----------------------------------------------


async def _read(reader: asyncio.StreamReader, conn: Connection) -> m.Message | None:
    """The next message, or None once the peer closed (cleanly or with a reset)."""
    while True:
        try:
            ev = conn.next_event()
        except ProtocolError:
            return None  # a reset mid-frame
        if isinstance(ev, m.Message):
            return ev
        if ev is not NEED_DATA:
            return None
        try:
            data = await reader.read(1 << 16)
        except ConnectionError:
            data = b""
        conn.receive_data(data)


async def run_plan(
    host: str, port: int, gen: Generator, plan: Plan, close_wait_s: float | None = None
) -> Outcome:
    """Send one plan and judge the coordinator's answer.

    With ``close_wait_s`` set, a connection whose requests are all answered waits only
    that long for the coordinator to close it over its hostile tail, then hangs up
    itself: for a coordinator with production limits (a 30 s frame deadline) where
    the point is throughput, not watching every deadline expire.
    """
    out = Outcome(plan)
    lingering = False
    reader, writer = await asyncio.open_connection(host, port)
    conn = Connection()
    try:
        async with asyncio.timeout(VERDICT_TIMEOUT_S) as verdict:
            challenge = await _read(reader, conn)
            if not isinstance(challenge, m.Challenge):
                out.bad_reply = f"expected a challenge, got {challenge}"
                return out
            role = plan.role or gen.rng.choice(m.CLIENT_ROLES)
            job = plan.job if plan.role is not None else gen.rng.choice(list(gen.jobs))
            owner = FUZZ_OWNER_KEY if role == "driver" else b""
            if role == "node":
                key = auth.job_token(gen.secret, job, gen.owner)  # type: ignore[arg-type]
            else:
                key = gen.admin_secret if role == "admin" else gen.secret
            hello = m.Hello(
                version=m.PROTOCOL_VERSION,
                role=role,
                job=job,
                owner=owner,
                proof=auth.client_proof(key, challenge.nonce, role, job, owner),
                cnonce=auth.new_nonce(),
            )
            frame = conn.send(hello)
            if plan.damage is not None:
                damaged = plan.damage(frame, gen.rng)
                if not damaged:  # a proper hello, with the wrong key
                    wrong = auth.client_proof(auth.new_secret(), challenge.nonce, role, job, owner)
                    damaged = conn.send(
                        m.Hello(
                            version=m.PROTOCOL_VERSION,
                            role=role,
                            job=job,
                            proof=wrong,
                            cnonce=auth.new_nonce(),
                            owner=owner,
                        )
                    )
                writer.write(damaged)
            else:
                writer.write(frame + b"".join(plan.requests) + plan.tail)
            msg: m.Message | None = None
            while True:
                if set(out.answered) >= plan.ids:
                    if not plan.tail and plan.damage is None and msg is not None:
                        return out  # everything answered (after the welcome): we hang up
                    if close_wait_s is not None and not lingering:
                        lingering = True
                        when = asyncio.get_running_loop().time() + close_wait_s
                        verdict.reschedule(min(verdict.when() or when, when))
                msg = await _read(reader, conn)
                if msg is None:
                    out.closed_by_server = True
                    return out
                if isinstance(msg, m.Error) and msg.id is None:
                    out.error_code = msg.code
                elif isinstance(msg, m.Welcome):
                    pass
                elif isinstance(msg, (m.Reply, m.ClusterReply, m.Error)):
                    if msg.id in plan.ids:
                        out.answered[msg.id] = out.answered.get(msg.id, 0) + 1  # type: ignore[index]
                else:
                    out.bad_reply = f"the coordinator sent a {msg.op} frame"
                    return out
    except TimeoutError:
        out.hung = not lingering  # past the verdict deadline, not merely done waiting for a close
        return out
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


async def run_plans(
    host: str,
    port: int,
    gen: Generator,
    plans: Sequence[Plan],
    concurrency: int = 64,
    close_wait_s: float | None = None,
) -> list[Outcome]:
    """Run every plan, ``concurrency`` connections at a time (see :func:`run_plan`)."""
    sem = asyncio.Semaphore(concurrency)

    async def one(p: Plan) -> Outcome:
        async with sem:
            return await run_plan(host, port, gen, p, close_wait_s)

    return await asyncio.gather(*(one(p) for p in plans))
