"""Who may talk to the coordinator, and what nobody can read: each refusal has its own clear error.

HMAC handshake (wrong secret, replayed hello, a job token used for another job), TLS
(plaintext against TLS and back, mutual TLS without or with a stranger's certificate,
an untrusted coordinator), the HTTP bearer token, and a sweep of logs, process titles
and every HTTP page for any credential.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfcoord.client import (
    AuthenticationFailed,
    DriverClient,
    JobSpec,
    NodeClient,
    TlsError,
    auth,
    make_roles,
    tls,
)
from tfcoord.client import messages as m
from tfcoord.coordinator.embedded import EmbeddedCoordinator

from .pki import Pki, have_openssl
from .rawwire import Raw
from .served import Served

#: Plaintext clients give up on a silent (TLS) coordinator after this in these tests;
#: the default (client.CHALLENGE_TIMEOUT_S) is longer, for loaded production machines.
CHALLENGE_S = 1.0

needs_openssl = pytest.mark.skipif(
    not have_openssl(), reason="the openssl command makes the test certificates"
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if not have_openssl():
        pytest.skip("the openssl command makes the test certificates")
    return Pki.create(tmp_path_factory.mktemp("pki"))


def _tls_coordinator(pki: Pki, *, mutual: bool) -> EmbeddedCoordinator:
    ctx = tls.server_context(pki.server.cert, pki.server.key, pki.ca.cert if mutual else None)
    return EmbeddedCoordinator(ssl_context=ctx).start()


@pytest.fixture
def tls_coord(pki: Pki) -> Iterator[EmbeddedCoordinator]:
    c = _tls_coordinator(pki, mutual=False)
    yield c
    c.stop()


@pytest.fixture
def mtls_coord(pki: Pki) -> Iterator[EmbeddedCoordinator]:
    c = _tls_coordinator(pki, mutual=True)
    yield c
    c.stop()


def _refused_fast(connect) -> TlsError:
    """Run ``connect``; it must raise TlsError well before any connect deadline."""
    t0 = time.monotonic()
    with pytest.raises(TlsError) as e:
        connect()
    assert time.monotonic() - t0 < CHALLENGE_S + 3, "a TLS mismatch must not wait for the connect deadline"
    return e.value


# -- the HMAC handshake -------------------------------------------------------------------


def test_a_wrong_secret_is_refused(coordinator):
    with pytest.raises(AuthenticationFailed, match="proof does not match the coordinator secret"):
        DriverClient(coordinator.address, auth.new_secret()).connect()


def test_a_replayed_hello_is_refused(coordinator):
    """A hello captured on one connection is worthless on the next: each has its own nonce."""
    first = Raw(coordinator.port)
    captured = first.conn.send(first.hello(coordinator.secret, "driver"))
    first.sock.sendall(captured)
    assert isinstance(first.next(), m.Welcome)
    replay = Raw(coordinator.port)
    assert replay.challenge.nonce != first.challenge.nonce
    replay.sock.sendall(captured)
    refused = replay.until_closed()
    assert [r.code for r in refused] == ["auth_failed"]  # type: ignore[attr-defined]
    assert "the proof does not match the coordinator secret" in refused[0].message  # type: ignore[attr-defined]
    first.close()
    assert coordinator.call(lambda: coordinator.server.auth_failures) == 1


def test_a_proof_is_bound_to_the_role_it_was_made_for(coordinator):
    raw = Raw(coordinator.port)
    driver = raw.hello(coordinator.secret, "driver")
    raw.send(
        m.Hello(version=driver.version, role="admin", job=None, proof=driver.proof, cnonce=driver.cnonce)
    )
    assert [r.code for r in raw.until_closed()] == ["auth_failed"]  # type: ignore[attr-defined]


def test_a_node_token_used_for_another_job_is_refused(coordinator):
    with DriverClient(coordinator.address, coordinator.secret) as d:
        mine = d.submit(JobSpec(roles=make_roles(1)))
        theirs = d.submit(JobSpec(roles=make_roles(1)))
        with pytest.raises(AuthenticationFailed, match=f"does not match the job token of {theirs}") as e:
            NodeClient(coordinator.address, d.job_token(mine), theirs, 0).connect()
        assert "the token belongs to this job" in str(e.value)
        # nor can a node token pass for the coordinator secret
        with pytest.raises(AuthenticationFailed, match="does not match the coordinator secret"):
            DriverClient(coordinator.address, d.job_token(mine)).connect()


# -- TLS ----------------------------------------------------------------------------------


def test_tls_clients_work(pki, tls_coord):
    ctx = tls.client_context(pki.ca.cert)
    with DriverClient(tls_coord.address, tls_coord.secret, ssl_context=ctx) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
        with NodeClient(tls_coord.address, d.job_token(job), job, 0, ssl_context=ctx) as n:
            n.register("127.0.0.1", 1)
            assert n.await_cluster(10).cluster == {"worker": ["127.0.0.1:1"]}
            n.report("succeeded")
        assert d.await_job(job, 10)["state"] == "SUCCEEDED"


def test_a_plaintext_client_against_a_tls_coordinator_is_told_tls(tls_coord):
    err = _refused_fast(
        lambda: DriverClient(tls_coord.address, tls_coord.secret, challenge_timeout_s=CHALLENGE_S).connect()
    )
    assert "sent no challenge" in str(err) and "TLS?" in str(err) and "TFCOORD_TLS_CA" in str(err)


def test_a_tls_client_against_a_plaintext_coordinator_is_told_tls(pki, coordinator):
    ctx = tls.client_context(pki.ca.cert)
    err = _refused_fast(
        lambda: DriverClient(coordinator.address, coordinator.secret, ssl_context=ctx).connect()
    )
    assert "does not speak TLS (TLS?" in str(err)


def test_a_coordinator_certificate_from_an_unknown_ca_is_not_trusted(pki, tls_coord):
    ctx = tls.client_context(pki.other_ca.cert)
    err = _refused_fast(lambda: DriverClient(tls_coord.address, tls_coord.secret, ssl_context=ctx).connect())
    assert "presented a certificate this client does not trust" in str(err)


def test_mutual_tls_admits_a_certificate_from_its_ca(pki, mtls_coord):
    ctx = tls.client_context(pki.ca.cert, pki.client.cert, pki.client.key)
    with DriverClient(mtls_coord.address, mtls_coord.secret, ssl_context=ctx) as d:
        assert d.status() == {"jobs": []}


@pytest.mark.parametrize("who", ["no certificate", "a stranger's certificate"])
def test_mutual_tls_refuses_a_client_without_a_certificate_from_its_ca(pki, mtls_coord, who):
    if who == "no certificate":
        ctx = tls.client_context(pki.ca.cert)
    else:
        ctx = tls.client_context(pki.ca.cert, pki.stranger.cert, pki.stranger.key)
    err = _refused_fast(
        lambda: DriverClient(mtls_coord.address, mtls_coord.secret, ssl_context=ctx).connect()
    )
    assert "demands a client certificate signed by its CA" in str(err) and "TFCOORD_TLS_CERT" in str(err)
    assert mtls_coord.call(lambda: len(mtls_coord.server.peers)) == 0  # refused before the protocol


def test_tls_files_are_checked_with_actionable_errors(pki, tmp_path):
    loose = tmp_path / "loose.key"
    loose.write_bytes(pki.server.key.read_bytes())
    loose.chmod(0o644)
    with pytest.raises(TlsError, match=f"chmod 600 {loose}"):
        tls.server_context(pki.server.cert, loose)
    with pytest.raises(TlsError, match="does not belong to the certificate"):
        tls.server_context(pki.server.cert, pki.client.key)
    with pytest.raises(TlsError, match="does not exist"):
        tls.client_context(tmp_path / "nope.pem")
    with pytest.raises(TlsError, match="holds no PEM certificate"):
        tls.client_context(pki.server.key)
    with pytest.raises(TlsError, match="give both"):
        tls.client_context(pki.ca.cert, pki.client.cert)


# -- HTTP ---------------------------------------------------------------------------------


def _get(url: str, token: str | None = None, ctx: ssl.SSLContext | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_http_without_or_with_a_wrong_token_is_refused(pki, scheme):
    token = auth.new_secret()
    server_ctx = tls.server_context(pki.server.cert, pki.server.key) if scheme == "https" else None
    client_ctx = tls.client_context(pki.ca.cert) if scheme == "https" else None
    with EmbeddedCoordinator(ssl_context=server_ctx, plaintext=server_ctx is None) as coord:
        base = f"{scheme}://127.0.0.1:{coord.start_http(token)}"
        status, body = _get(f"{base}/v1/jobs", ctx=client_ctx)
        assert (status, body["error"]) == (401, "unauthorized") and "no bearer token" in body["message"]
        status, body = _get(f"{base}/v1/jobs", auth.new_secret().decode(), client_ctx)
        assert (status, body["error"]) == (401, "unauthorized") and "a wrong bearer token" in body["message"]
        assert _get(f"{base}/v1/jobs", token.decode(), client_ctx) == (200, {"jobs": []})
        assert _get(f"{base}/healthz", ctx=client_ctx)[0] == 200  # the one public probe


# -- nothing leaks ------------------------------------------------------------------------


def _fetch_text(url: str, token: str | None, ctx: ssl.SSLContext) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            return r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        with e:
            return e.read().decode("utf-8", "replace")


@needs_openssl
def test_no_credential_in_logs_process_titles_or_the_http_api(pki, tmp_path):
    """Run a TLS coordinator at DEBUG, use every credential, then look for them everywhere."""
    tls_flags = (
        "--tls-cert",
        str(pki.server.cert),
        "--tls-key",
        str(pki.server.key),
        "--tls-ca",
        str(pki.ca.cert),
    )
    served = Served(tmp_path, *tls_flags, http=True, log_level="DEBUG")
    ctx = tls.client_context(pki.ca.cert, pki.client.cert, pki.client.key)
    env = dict(
        served.env,
        TFCOORD_TLS_CA=str(pki.ca.cert),
        TFCOORD_TLS_CERT=str(pki.client.cert),
        TFCOORD_TLS_KEY=str(pki.client.key),
    )
    http_token = served.http_token_file.read_text().strip()
    try:
        # A whole job through the CLI: a node process reports its own runner's command line.
        probe = "import os; print(open(f'/proc/{os.getppid()}/cmdline').read().replace(chr(0), ' '))"
        submitted = served.cli(
            "submit", "--engine", "local", "--workers", "1", "--", sys.executable, "-c", probe, env=env
        )
        assert submitted.returncode == 0, submitted.stderr
        runner_cmdline = submitted.stdout
        assert "tfcoord.node" in runner_cmdline
        with DriverClient(served.address, served.secret, ssl_context=ctx) as d:
            job = d.submit(JobSpec(roles=make_roles(1), name="leak-check"))
            token = d.job_token(job)
            with NodeClient(served.address, token, job, 0, ssl_context=ctx) as n:
                n.register("127.0.0.1", 1)
                n.await_cluster(10)
                n.report("failed", error="Traceback (most recent call last):\nValueError: boom")
            with pytest.raises(AuthenticationFailed):
                DriverClient(served.address, auth.new_secret(), ssl_context=ctx).connect()
            with pytest.raises(AuthenticationFailed):
                NodeClient(served.address, token, "someone-elses-job", 0, ssl_context=ctx).connect()
        status = served.cli("status", job, "--json", env=env)
        assert status.returncode == 0, status.stderr
        base = f"https://127.0.0.1:{served.http_port}"
        pages = [
            _fetch_text(f"{base}{path}", http_token, ctx)
            for path in (
                "/",
                "/dashboard",
                "/healthz",
                "/metrics",
                "/v1/openapi.json",
                "/v1/jobs",
                f"/v1/jobs/{job}",
                f"/v1/jobs/{job}/events",
            )
        ]
        pages.append(_fetch_text(f"{base}/v1/jobs?token={http_token}", None, ctx))  # a token in a URL
        pages.append(_fetch_text(f"{base}/v1/jobs", "wrong-" + http_token, ctx))
        serve_cmdline = Path(f"/proc/{served.proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    finally:
        assert served.stop() == 0
    log = served.log
    assert "ValueError: boom" in log or "FAILED" in log  # the log did capture the job's life
    assert "HTTP" in log and "GET" in log  # and the HTTP requests (DEBUG access log)
    key_pem = pki.server.key.read_text() + pki.client.key.read_text()
    key_lines = [ln for ln in key_pem.splitlines() if ln and not ln.startswith("-----")]
    secrets = {
        "coordinator secret": served.secret.decode(),
        "job token": token.hex(),
        "job token (raw)": token.decode("latin-1"),
        "HTTP token": http_token,
        **{f"TLS key line {i}": ln for i, ln in enumerate(key_lines)},
    }
    places = {
        "coordinator log": log,
        "coordinator command line": serve_cmdline,
        "node runner command line": runner_cmdline,
        "submit output": submitted.stdout + submitted.stderr,
        "status output": status.stdout + status.stderr,
        **{f"HTTP page {i}": page for i, page in enumerate(pages)},
    }
    leaks = [
        f"{what} in {where}"
        for what, value in secrets.items()
        for where, text in places.items()
        if value in text
    ]
    assert leaks == []


@needs_openssl
def test_serve_tls_flags_and_client_environment(pki, tmp_path):
    flags = ("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key))
    served = Served(tmp_path, *flags)
    try:
        plain = served.cli("status")
        assert plain.returncode == 2 and "TLS?" in plain.stderr
        ok = served.cli("status", env=dict(served.env, TFCOORD_TLS_CA=str(pki.ca.cert)))
        assert ok.returncode == 0, ok.stderr
        half = served.cli("status", env=dict(served.env, TFCOORD_TLS_CERT=str(pki.client.cert)))
        assert half.returncode == 2 and "give both" in half.stderr
    finally:
        assert served.stop() == 0
    loose = tmp_path / "loose.key"
    loose.write_bytes(pki.server.key.read_bytes())
    os.chmod(loose, 0o640)
    for bad, expect in [
        (("--tls-cert", str(pki.server.cert), "--tls-key", str(loose)), f"chmod 600 {loose}"),
        (("--tls-cert", str(pki.server.cert)), "--tls-cert and --tls-key go together"),
        (("--tls-ca", str(pki.ca.cert)), "--tls-ca (mutual TLS) needs --tls-cert and --tls-key"),
    ]:
        out = served.cli("serve", "--port", "0", "--secret-file", str(served.secret_file), *bad)
        assert out.returncode == 2 and expect in out.stderr, out.stderr
