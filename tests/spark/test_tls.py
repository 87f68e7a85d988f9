"""Nodes on real Spark executors reach a coordinator that serves TLS (mutual TLS here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.pki import Pki, have_openssl
from tfcoord.client import TlsError, tls
from tfcoord.coordinator.embedded import EmbeddedCoordinator
from tfcoord.driver import spark as tfs
from tfcoord.node.tlsfiles import TlsFiles

from . import mapfuns
from .mapfuns import args_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not have_openssl(), reason="the openssl command makes the test certificates"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def coordinator(pki: Pki):
    # Mutual TLS: every client, executors included, must show a certificate our CA signed.
    ctx = tls.server_context(pki.server.cert, pki.server.key, pki.ca.cert)
    coord = EmbeddedCoordinator(host="127.0.0.1", ssl_context=ctx).start()
    try:
        yield coord
    finally:
        coord.stop()


def test_nodes_reach_a_mutual_tls_coordinator(sc, tmp_path: Path, pki: Pki, coordinator) -> None:
    files = TlsFiles.of(str(pki.ca.cert), str(pki.client.cert), str(pki.client.key))
    cluster = tfs.run(
        sc,
        mapfuns.report_context,
        args_for(tmp_path),
        num_executors=2,
        num_ps=0,
        coordinator=coordinator.address,
        secret=coordinator.secret,
        tls=files,
    )
    status = cluster.shutdown()
    assert status["state"] == "SUCCEEDED"
    assert [n["state"] for n in status["nodes"]] == ["SUCCEEDED", "SUCCEEDED"]
    recs = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert [r["task_index"] for r in recs] == [0, 1]


def test_without_the_client_certificate_the_driver_is_refused_before_spark_runs(
    sc, tmp_path, pki, coordinator
):
    with pytest.raises(TlsError, match="TFCOORD_TLS_CERT and TFCOORD_TLS_KEY"):
        tfs.run(
            sc,
            mapfuns.report_context,
            args_for(tmp_path),
            num_executors=2,
            num_ps=0,
            coordinator=coordinator.address,
            secret=coordinator.secret,
            tls=TlsFiles.of(str(pki.ca.cert)),
        )


def test_tls_needs_a_running_coordinator(sc, tmp_path, pki) -> None:
    with pytest.raises(ValueError, match="the embedded coordinator makes its own certificate"):
        tfs.run(sc, mapfuns.report_context, args_for(tmp_path), 2, 0, tls=TlsFiles.of(str(pki.ca.cert)))
