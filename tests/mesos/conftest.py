"""Fixtures of the Mesos tests: one real ZooKeeper server for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.mesos.zookeeper import ZooKeeperServer


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper server (Debian's package), started once; each test takes a path of its own."""
    if not ZooKeeperServer.available():
        pytest.skip("no ZooKeeper server: apt-get install zookeeper (.ci/run does)")
    server = ZooKeeperServer().start()
    try:
        yield server
    finally:
        server.close()
