"""tfmesos2's task-side variables on a real node process: TFMESOS2_VERIFY_SSL and
TFMESOS2_REQUEST_TIMEOUT (see docs/src/mesos.md, Configuration)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tfcoord.client import DriverClient, JobSpec, auth, make_roles, tls
from tfcoord.coordinator.embedded import EmbeddedCoordinator


@pytest.fixture
def coord() -> Iterator[EmbeddedCoordinator]:
    c = EmbeddedCoordinator().start()  # TLS with its own CA, the default
    try:
        yield c
    finally:
        c.stop()


def run_node(coord: EmbeddedCoordinator, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Submit a one-worker job and run its node as ``tfcoord node`` with ``extra_env``."""
    assert coord.ca_pem is not None
    with DriverClient(coord.address, coord.secret, ssl_context=tls.client_context(ca_pem=coord.ca_pem)) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
    owner = coord.call(lambda: coord.server.state.jobs[job].owner)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFCOORD_", "TFMESOS2_"))}
    env.update(TFCOORD_TOKEN=auth.job_token(coord.secret, job, owner).hex(), **extra_env)
    argv = [
        sys.executable,
        "-m",
        "tfcoord.node",
        "--address",
        coord.address,
        "--job",
        job,
        "--executor-id",
        "0",
    ]
    return subprocess.run(
        [*argv, "--", sys.executable, "-c", "print('ran')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_verify_ssl_false_without_a_ca_speaks_tls_unverified(coord: EmbeddedCoordinator) -> None:
    done = run_node(coord, {"TFMESOS2_VERIFY_SSL": "false"})
    assert done.returncode == 0, done.stderr
    assert "ran" in done.stdout
    assert "TFMESOS2_VERIFY_SSL=false and no coordinator CA" in done.stderr


def test_a_pinned_ca_is_checked_whatever_verify_ssl_says(coord: EmbeddedCoordinator) -> None:
    assert coord.ca_pem is not None
    done = run_node(coord, {"TFMESOS2_VERIFY_SSL": "false", "TFCOORD_TLS_CA_PEM": coord.ca_pem})
    assert done.returncode == 0, done.stderr
    assert "without checking" not in done.stderr


def test_request_timeout_must_be_seconds(coord: EmbeddedCoordinator) -> None:
    assert coord.ca_pem is not None
    pinned = {"TFCOORD_TLS_CA_PEM": coord.ca_pem}
    done = run_node(coord, {**pinned, "TFMESOS2_REQUEST_TIMEOUT": "soon"})
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("TFMESOS2_REQUEST_TIMEOUT must be a number of seconds > 0, not 'soon'")
    )
    assert "Traceback" not in done.stderr
    ok = run_node(coord, {**pinned, "TFMESOS2_REQUEST_TIMEOUT": "7.5"})
    assert ok.returncode == 0, ok.stderr
