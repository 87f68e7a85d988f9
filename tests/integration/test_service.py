"""The coordinator service: one assembly of server, journal, engines and HTTP, real sockets."""

from __future__ import annotations

import asyncio
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from tfcoord.client import DriverClient, JobSpec, RequestRejected, auth, make_roles
from tfcoord.coordinator.mesos.config import MesosConfig
from tfcoord.coordinator.mesos.errors import MesosError
from tfcoord.coordinator.mesos.plugin import MesosEngineFactory
from tfcoord.coordinator.server import ServerConfig
from tfcoord.coordinator.service import CoordinatorService, HttpConfig, HttpStartError, ServiceConfig

TOKEN = b"t" * 32


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_start_serves_every_part_and_close_frees_every_port(tmp_path: Path):
    secret = auth.new_secret()
    cfg = ServiceConfig(
        server=ServerConfig(secret=secret), state_dir=tmp_path / "state", http=HttpConfig(TOKEN)
    )
    service = await CoordinatorService(cfg).start()
    try:
        assert service.address == f"127.0.0.1:{service.port}" and service.http_port > 0

        def use() -> tuple[str, bytes]:
            with DriverClient(service.address, secret) as d:
                job = d.submit(JobSpec(roles=make_roles(1)))
            with urllib.request.urlopen(f"http://127.0.0.1:{service.http_port}/healthz", timeout=10) as r:
                return job, r.read()

        job, health = await asyncio.to_thread(use)
        assert b"ok" in health.lower()
    finally:
        await service.close()
    await service.close()  # twice is harmless
    assert _refused(service.port) and _refused(service.http_port)
    # The journal was committed and closed: a new service over the same directory has the job.
    again = await CoordinatorService(
        ServiceConfig(server=ServerConfig(secret=secret), state_dir=cfg.state_dir)
    ).start()
    try:
        assert again.replayed > 0 and job in again.server.state.jobs
    finally:
        await again.close()


async def test_a_taken_http_port_fails_the_start_and_leaves_nothing_listening():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        http = HttpConfig(TOKEN, port=taken.getsockname()[1])
        service = CoordinatorService(ServiceConfig(server=ServerConfig(secret=auth.new_secret()), http=http))
        with pytest.raises(HttpStartError, match=r"cannot serve HTTP on 127\.0\.0\.1"):
            await service.start()
    assert service.port and _refused(service.port)


async def test_an_engine_that_cannot_start_unwinds_the_listener():
    with socket.create_server(("127.0.0.1", 0)) as nobody:  # bound, never accepting: no master there
        master = f"http://127.0.0.1:{nobody.getsockname()[1]}"
    mesos = MesosConfig(
        masters=(master,), python=sys.executable, first_subscribe_deadline_s=0.5, connect_timeout_s=0.5
    )
    cfg = ServiceConfig(server=ServerConfig(secret=auth.new_secret()), engines=(MesosEngineFactory(mesos),))
    service = CoordinatorService(cfg)
    with pytest.raises(MesosError):
        await service.start()
    assert service.port and _refused(service.port)


async def test_a_job_of_an_engine_the_service_does_not_run_is_refused():
    secret = auth.new_secret()
    service = await CoordinatorService(ServiceConfig(server=ServerConfig(secret=secret))).start()
    try:

        def submit() -> RequestRejected:
            with DriverClient(service.address, secret) as d, pytest.raises(RequestRejected) as e:
                d.submit(JobSpec(roles=make_roles(1), engine="mesos"))
            return e.value

        refused = await asyncio.to_thread(submit)
    finally:
        await service.close()
    assert refused.code == "no_engine"
