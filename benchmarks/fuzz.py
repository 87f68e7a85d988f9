"""A million hostile frames against a live coordinator, its invariants checked after every batch.

    python benchmarks/fuzz.py [--frames 1000000] [--batch 25000] [--seed 1] [--json]

The frames come from ``tests/fuzzframes.py`` (the fuzz test's generator): per connection a
hello (proper, for a node, driver or admin, or damaged: garbage, bit flips, truncations,
oversized lengths, a wrong key, a request first), then requests of every op with random,
mutated and out-of-range fields, then a hostile tail (garbage, a length lie, a truncated
frame). An embedded coordinator runs in this process with the fuzz test's short limits, so
every connection left hanging is closed within a second. After every batch the
coordinator's ``validate()`` must hold, nothing may have been logged at ERROR (asyncio logs
escaped exceptions there) and the coordinator must still answer.

Figures: frames sent (by kind: hello by role, damaged hello, request by op, undecodable
request, tail), requests answered, connections closed by the coordinator (by its error
code), and the failures: connections neither answered nor closed (hung), replies the
protocol forbids, crashes, invariant violations, ERROR lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzzframes import FUZZ_OWNER_KEY, Generator, Outcome, run_plans  # noqa: E402
from tfcoord.client import DriverClient, JobSpec, make_roles  # noqa: E402
from tfcoord.client.protocol import Connection  # noqa: E402
from tfcoord.coordinator.embedded import EmbeddedCoordinator  # noqa: E402

#: The fuzz test's limits: connections left with a truncated frame or idle close soon.
LIMITS = {"handshake_timeout_s": 1.0, "frame_timeout_s": 0.3, "idle_timeout_s": 0.5}


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage()[:300])


def _jobs(coord: EmbeddedCoordinator, n: int) -> dict[str, int]:
    specs = {
        f"fz-{n}-w": JobSpec(roles=make_roles(3)),
        f"fz-{n}-ps": JobSpec(roles=make_roles(2, 1), heartbeat_timeout_s=0.2, reconnect_grace_s=0.05),
        f"fz-{n}-ce": JobSpec(
            roles=make_roles(2, chief="chief", evaluator=True), tolerate_failure=("evaluator",)
        ),
    }
    with DriverClient(coord.address, coord.secret, owner_key=FUZZ_OWNER_KEY) as d:
        for job, spec in specs.items():
            d.submit(spec, job)
    return {job: spec.size for job, spec in specs.items()}


def _kinds(outcome: Outcome, kinds: Counter[str]) -> None:
    plan = outcome.plan
    kinds["hello:" + (plan.role or "damaged")] += 1
    for frame in plan.requests:
        conn = Connection()
        conn.receive_data(frame)
        try:
            msg = conn.next_event()
            kinds["request:" + getattr(msg, "op", "?")] += 1
        except Exception:
            kinds["request:undecodable"] += 1
    if plan.tail:
        kinds["tail:" + (plan.tail_kind or "?")] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=25_000, help="frames between two invariant checks")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    errors = _Errors()
    logging.getLogger().addHandler(errors)
    logging.getLogger().setLevel(logging.WARNING)
    rng = random.Random(args.seed)
    kinds: Counter[str] = Counter()
    closed: Counter[str] = Counter()
    sent = answered = hung = bad = violations = crashes = batches = 0
    first_failure = ""
    t0 = time.monotonic()
    with EmbeddedCoordinator(plaintext=True, **LIMITS) as coord:
        while sent < args.frames:
            seed = rng.randrange(2**32)
            gen = Generator(random.Random(seed), coord.secret, _jobs(coord, batches), (), coord.admin_secret)
            plans = gen.plans(args.batch)
            outcomes = asyncio.run(run_plans("127.0.0.1", coord.port, gen, plans))
            batches += 1
            for o in outcomes:
                sent += o.plan.frames
                answered += sum(o.answered.values())
                _kinds(o, kinds)
                if o.closed_by_server:
                    closed[o.error_code or "(no error frame)"] += 1
                if o.hung:
                    hung += 1
                if o.bad_reply:
                    bad += 1
                    first_failure = first_failure or f"seed {seed}: {o.bad_reply}"
            try:
                coord.call(coord.server.state.validate)
            except AssertionError as e:
                violations += 1
                first_failure = first_failure or f"seed {seed}: invariant: {e}"
            except Exception as e:  # the coordinator's loop is gone
                crashes += 1
                first_failure = first_failure or f"seed {seed}: coordinator: {e!r}"
                break
            if not args.json:
                print(f"batch {batches}: {sent:,} frames, {time.monotonic() - t0:.0f} s", file=sys.stderr)
        alive = True
        try:
            with DriverClient(coord.address, coord.secret) as d:
                d.submit(JobSpec(roles=make_roles(1), name="after-the-fuzz"))
        except Exception:
            alive = False
            crashes += 1
    wall = time.monotonic() - t0
    result: dict[str, Any] = {
        "phase": "fuzz-invariants", "frames": sent, "seconds": round(wall, 1),
        "frames_per_s": round(sent / wall), "batches": batches,
        "requests_answered": answered, "connections": sum(kinds[k] for k in kinds if k.startswith("hello:")),
        "connections_closed_by_server": sum(closed.values()), "closed_by_code": dict(closed.most_common()),
        "hung": hung, "bad_replies": bad, "crashes": crashes, "invariant_violations": violations,
        "errors_logged": len(errors.lines), "still_serving": alive,
        "frames_by_kind": dict(sorted(kinds.items())), "first_failure": first_failure or None,
    }  # fmt: skip
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    ok = not (hung or bad or crashes or violations or errors.lines) and alive
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
