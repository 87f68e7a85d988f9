"""Fuzzing a live coordinator: structured messages from hypothesis, random and mutated bytes.

Each hypothesis example is one *batch*: a few structured wire maps (valid requests
with arbitrary field values, and maps mutated into invalid ones) plus a seed from
which ``tests/fuzzframes.py`` builds many connections' worth of frames around them,
sent from up to 64 connections at once to a coordinator on port 0. After every batch:
no connection hung (each was answered or closed), nothing was logged at ERROR (an
exception escaping a callback is logged there by asyncio), and ``validate()`` holds
on the coordinator's state. Afterwards a normal client still runs a job.

The always-on test sends a few thousand frames; the ``slow`` one over 100,000.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.fuzzframes import FUZZ_OWNER_KEY, Generator, Outcome, run_plans
from tfcoord.client import DriverClient, JobSpec, NodeClient, make_roles
from tfcoord.client import messages as m
from tfcoord.coordinator.embedded import EmbeddedCoordinator

#: Short limits, so connections left with a truncated frame or idle are closed soon.
FUZZ_LIMITS = {"handshake_timeout_s": 1.0, "frame_timeout_s": 0.3, "idle_timeout_s": 0.5}
QUICK_BATCHES, QUICK_FRAMES = 3, 800
SLOW_BATCHES, SLOW_FRAMES = 20, 5_200
#: Reaching this many frames is the point of the slow test.
SLOW_TOTAL = 100_000

# -- structured messages ------------------------------------------------------------------

_ids = st.integers(0, m.MAX_REQUEST_ID)
_job_ids = st.one_of(
    st.sampled_from(["fz-0", "fz-1", "fz-2"]),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
)
_text = st.text(max_size=40)
_waits = st.floats(0, 0.3)
_scalars = st.one_of(
    st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True)
)
_meta = st.dictionaries(st.text(min_size=1, max_size=12), _scalars, max_size=4)
_slot = {"job": _job_ids, "executor_id": st.integers(0, 8), "attempt": st.integers(0, 3)}
_specs = st.builds(
    m.JobSpec,
    roles=st.sampled_from(
        [(("worker", 2),), (("ps", 1), ("worker", 1)), (("chief", 1), ("evaluator", 1), ("worker", 1))]
    ),
    reservation_timeout_s=st.floats(0.01, 5),
    heartbeat_timeout_s=st.floats(0.01, 5),
    reconnect_grace_s=st.floats(0, 1),
    tolerate_failure=st.sampled_from([(), ("evaluator",)]),
    name=_text,
    labels=st.dictionaries(st.text(min_size=1, max_size=8), _scalars, max_size=3),
)
_requests = st.one_of(
    st.builds(m.Submit, id=_ids, job=_job_ids, spec=_specs),
    st.builds(m.AwaitJob, id=_ids, job=_job_ids, timeout_s=_waits),
    st.builds(m.WatchJob, id=_ids, job=_job_ids, version=st.integers(0, 2**62), timeout_s=_waits),
    st.builds(m.StopJob, id=_ids, job=_job_ids, reason=_text, dry_run=st.booleans()),
    st.builds(m.Status, id=_ids, job=st.none() | _job_ids),
    st.builds(
        m.Register,
        id=_ids,
        host=st.from_regex(r"[A-Za-z0-9.:-]{1,30}", fullmatch=True),
        port=st.integers(1, 65535),
        gpus=st.lists(st.sampled_from(["GPU-0", "GPU-1"]), max_size=2).map(tuple),
        task_id=_text,
        meta=_meta,
        **_slot,
    ),
    st.builds(m.AwaitCluster, id=_ids, timeout_s=_waits, **_slot),
    st.builds(
        m.Report, id=_ids, state=st.sampled_from(m.NODE_REPORT_STATES), error=_text, meta=_meta, **_slot
    ),
    st.builds(m.Heartbeat, id=_ids, meta=_meta, **_slot),
    st.builds(m.AwaitStop, id=_ids, timeout_s=_waits, **_slot),
)
_any_value = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(),
        st.text(max_size=10),
        st.binary(max_size=10),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def _mutated(draw: st.DrawFn) -> Any:
    """A valid request's map, then broken: a key dropped, added or retyped, the op changed."""
    mp = draw(_requests).to_wire()
    how = draw(st.sampled_from(["drop", "add", "retype", "op", "whole"]))
    keys = sorted(k for k in mp if k != "op")
    if how == "drop" and keys:
        del mp[draw(st.sampled_from(keys))]
    elif how == "retype" and keys:
        mp[draw(st.sampled_from(keys))] = draw(_any_value)
    elif how == "op":
        mp["op"] = draw(st.one_of(st.sampled_from(sorted(m.OPS)), _any_value))
    elif how == "whole":
        return draw(_any_value)
    else:
        mp[draw(st.text(max_size=8))] = draw(_any_value)
    return mp


_structured = st.lists(st.one_of(_requests.map(lambda r: r.to_wire()), _mutated()), min_size=1, max_size=12)


# -- the live coordinator ----------------------------------------------------------------


class _Errors(logging.Handler):
    """Every record at ERROR or above, from any thread: asyncio logs escaped exceptions there."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def errors() -> Iterator[_Errors]:
    handler = _Errors()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


@pytest.fixture(scope="module")
def fuzzed(errors: _Errors) -> Iterator[EmbeddedCoordinator]:
    coord = EmbeddedCoordinator(plaintext=True, **FUZZ_LIMITS).start()
    yield coord
    try:
        coord.call(coord.server.state.validate)
        # The coordinator still does its job for a well-behaved client.
        with DriverClient(coord.address, coord.secret) as d:
            job = d.submit(JobSpec(roles=make_roles(1), name="after-the-fuzz"))
            with NodeClient(coord.address, d.job_token(job), job, 0) as n:
                n.register("127.0.0.1", 1)
                assert n.await_cluster(10).cluster == {"worker": ["127.0.0.1:1"]}
                n.report("succeeded")
            assert d.await_job(job, 10)["state"] == "SUCCEEDED"
        assert errors.records == []
    finally:
        coord.stop()


_batch = iter(range(1_000_000))


def _fresh_jobs(coord: EmbeddedCoordinator) -> dict[str, int]:
    """Real jobs for this batch's nodes to act in: a few templates, some with short timeouts."""
    n = next(_batch)
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


def _run_batch(
    coord: EmbeddedCoordinator, errors: _Errors, structured: list[Any], seed: int, frames: int
) -> int:
    gen = Generator(random.Random(seed), coord.secret, _fresh_jobs(coord), structured, coord.admin_secret)
    plans = gen.plans(frames)
    outcomes: list[Outcome] = asyncio.run(run_plans("127.0.0.1", coord.port, gen, plans))
    bad = [o for o in outcomes if not o.ok]
    assert not bad, f"seed {seed}: {len(bad)} connections neither answered nor closed, e.g. {bad[0]}"
    assert errors.records == [], f"seed {seed}: {errors.records[0].getMessage()}"
    coord.call(coord.server.state.validate)
    return sum(p.frames for p in plans)


def _fuzz(coord: EmbeddedCoordinator, errors: _Errors, batches: int, frames: int) -> int:
    """Run ``batches`` hypothesis examples of ``frames`` frames each; returns the frames sent."""
    sent: list[int] = []

    # No shrinking: a batch takes seconds and a failure names its seed, which replays it.
    @settings(
        max_examples=batches,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(structured=_structured, seed=st.integers(0, 2**32 - 1))
    def batch(structured: list[Any], seed: int) -> None:
        sent.append(_run_batch(coord, errors, structured, seed, frames))

    batch()
    return sum(sent)


def test_fuzz_frames_from_many_connections(fuzzed, errors):
    assert _fuzz(fuzzed, errors, QUICK_BATCHES, QUICK_FRAMES) >= QUICK_BATCHES * QUICK_FRAMES


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fuzz_100k_frames(fuzzed, errors):
    rejected_before = fuzzed.call(lambda: fuzzed.server.rejected_frames)
    assert _fuzz(fuzzed, errors, SLOW_BATCHES, SLOW_FRAMES) >= SLOW_TOTAL
    # and a good share of them were refused as broken, not merely answered
    assert fuzzed.call(lambda: fuzzed.server.rejected_frames) - rejected_before > SLOW_TOTAL // 50
