"""The HTTP API: a real coordinator with its HTTP server on port 0, real HTTP requests.

Every JSON answer is checked against coordinator/openapi.json (the status code must be
documented, the body must validate against the documented schema), and the routes of
the aiohttp application are checked against the document's paths, both ways.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from prometheus_client.parser import text_string_to_metric_families

from tfcoord.client import AuthenticationFailed, DriverClient, JobSpec, NodeClient, auth, make_roles
from tfcoord.coordinator.embedded import EmbeddedCoordinator
from tfcoord.coordinator.http import OPENAPI_PATH, make_app
from tfcoord.coordinator.nodearchive import node_archive
from tfcoord.coordinator.server import CoordinatorServer, ServerConfig
from tfcoord.coordinator.service import ARCHIVE_USER, archive_password

from .served import Served

TOKEN = b"http-token-" + b"x" * 32
DOC = json.loads(OPENAPI_PATH.read_text())


# -- helpers ------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: Any
    body: bytes

    @property
    def json(self) -> Any:
        assert self.headers["Content-Type"].startswith("application/json"), self.headers["Content-Type"]
        return json.loads(self.body)


def fetch(
    base: str,
    path: str,
    token: bytes | None = TOKEN,
    method: str = "GET",
    authorization: str | None = None,
    data: bytes | None = None,
) -> Answer:
    headers = {}
    if authorization is not None:
        headers["Authorization"] = authorization
    elif token is not None:
        headers["Authorization"] = "Bearer " + token.decode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(base + path, method=method, headers=headers, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return Answer(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        with e:
            return Answer(e.code, e.headers, e.read())


def _schema_of(template: str, method: str, status: int, content_type: str) -> dict[str, Any]:
    responses = DOC["paths"][template][method.lower()]["responses"]
    resp = responses.get(str(status)) or responses.get("default")
    assert resp is not None, f"{method} {template} answered {status}, which the document does not list"
    if "$ref" in resp:
        resp = DOC["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
    return resp["content"][content_type]["schema"]


def conforms(answer: Answer, template: str, method: str = "GET") -> Any:
    """Check a JSON answer against the document; returns the decoded body."""
    body = answer.json
    schema = _schema_of(template, method, answer.status, "application/json")
    Draft202012Validator({"components": DOC["components"], **schema}).validate(body)
    return body


def metrics(base: str, token: bytes = TOKEN) -> dict[str, float]:
    """Every sample of /metrics as {'name{label="v",...}': value}."""
    answer = fetch(base, "/metrics", token=token)
    assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(answer.body.decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


@pytest.fixture
def http_coord() -> Iterator[tuple[EmbeddedCoordinator, str]]:
    coord = EmbeddedCoordinator(plaintext=True).start()
    try:
        port = coord.start_http(TOKEN)
        yield coord, f"http://127.0.0.1:{port}"
        coord.call(coord.server.state.validate)
    finally:
        coord.stop()


def test_a_second_start_http_returns_the_same_server_or_says_why_it_cannot(http_coord):
    coord, base = http_coord
    port = int(base.rsplit(":", 1)[1])
    assert coord.start_http(TOKEN) == port and coord.start_http(TOKEN, port=port) == port
    other = b"another-token-" + b"y" * 32
    with pytest.raises(ValueError, match=f"already serves on port {port} with another bearer token"):
        coord.start_http(other)
    with pytest.raises(ValueError, match=f"already serves on 127.0.0.1:{port}, not 0.0.0.0:0"):
        coord.start_http(TOKEN, host="0.0.0.0")
    # The first token still opens the API, and the refused one does not.
    assert fetch(base, "/v1/jobs").status == 200 and fetch(base, "/v1/jobs", token=other).status == 401


# -- the document -------------------------------------------------------------------------


def test_every_route_is_documented_and_every_documented_route_exists():
    app = make_app(CoordinatorServer(ServerConfig(secret=b"s" * 32)), TOKEN)
    served = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {(method.upper(), path) for path, ops in DOC["paths"].items() for method in ops}
    assert served == documented
    assert DOC["openapi"].startswith("3.")
    for schema in DOC["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            assert op["responses"] and op["operationId"], (method, path)
            public = op.get("security") == []
            assert public == (path in ("/healthz", "/", "/dashboard")), (method, path)
            if not public:
                assert "401" in op["responses"], (method, path)


def test_openapi_document_is_served(http_coord):
    _, base = http_coord
    answer = fetch(base, "/v1/openapi.json")
    assert answer.status == 200 and answer.json == DOC


# -- authentication -----------------------------------------------------------------------


def test_healthz_and_the_page_need_no_token_and_everything_else_does(http_coord):
    coord, base = http_coord
    health = fetch(base, "/healthz", token=None)
    assert health.status == 200
    # Attack 11: without a token the probe discloses nothing (no job count, no version).
    assert conforms(health, "/healthz") == {"status": "ok"}
    health = fetch(base, "/healthz")
    assert conforms(health, "/healthz") == {"status": "ok", "jobs": 0, "version": health.json["version"]}

    for path in ("/", "/dashboard"):
        page = fetch(base, path, token=None)
        assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
        assert TOKEN not in page.body and coord.secret not in page.body
        assert "script-src 'sha256-" in page.headers["Content-Security-Policy"]
        assert page.headers["Referrer-Policy"] == "no-referrer"

    before = metrics(base)['tfcoord_auth_failures_total{interface="http"}']
    attempts = [
        dict(token=None),
        dict(token=b"y" * len(TOKEN)),  # same length, wrong
        dict(token=TOKEN[:-1]),  # a prefix
        dict(authorization="Basic " + TOKEN.decode()),
        dict(authorization="Bearer"),
    ]
    paths = [
        ("/v1/jobs", "/v1/jobs"),
        ("/v1/jobs/j1", "/v1/jobs/{job}"),
        ("/v1/jobs/j1/events", "/v1/jobs/{job}/events"),
        ("/metrics", "/metrics"),
        ("/v1/openapi.json", "/v1/openapi.json"),
    ]
    for path, template in paths:
        for kw in attempts:
            answer = fetch(base, path, **kw)
            assert answer.status == 401, (path, kw)
            assert answer.headers["WWW-Authenticate"] == 'Bearer realm="tfcoord"'
            assert conforms(answer, template)["error"] == "unauthorized"
    # An unknown path does not tell a stranger whether it exists.
    assert fetch(base, "/no/such/path", token=None).status == 401
    after = metrics(base)['tfcoord_auth_failures_total{interface="http"}']
    assert after - before == len(paths) * len(attempts) + 1


def test_the_node_archive_answers_the_bearer_token_or_its_own_basic_credential(http_coord):
    coord, base = http_coord
    archive = node_archive()
    path = f"/v1/node-archive/{archive.name}"
    by_token = fetch(base, path)
    assert by_token.status == 200 and by_token.body == archive.data
    assert by_token.headers["Content-Type"] == "application/zip"
    assert by_token.headers["X-Content-SHA256"] == hashlib.sha256(by_token.body).hexdigest() == archive.sha256
    password = archive_password(coord.secret)
    basic = "Basic " + base64.b64encode(f"{ARCHIVE_USER}:{password}".encode()).decode()
    assert fetch(base, path, authorization=basic).body == archive.data
    # The archive's credential opens nothing else, and a wrong one opens nothing.
    assert fetch(base, "/v1/jobs", authorization=basic).status == 401
    wrong = "Basic " + base64.b64encode(f"{ARCHIVE_USER}:{password[:-1]}x".encode()).decode()
    for auth_header in (wrong, "Basic !!not-base64!!", "Basic " + base64.b64encode(b"no-colon").decode()):
        answer = fetch(base, path, authorization=auth_header)
        assert answer.status == 401 and conforms(answer, "/v1/node-archive/{name}")["error"] == "unauthorized"
    other = fetch(base, "/v1/node-archive/tfcoord-node-0.0.0-000000000000.pyz", authorization=basic)
    assert other.status == 404
    assert archive.name in conforms(other, "/v1/node-archive/{name}")["message"]


# -- the JSON API -------------------------------------------------------------------------


ADMIN_TOKEN = b"http-admin-" + b"q" * 32


def test_only_the_admin_token_stops_a_job_and_the_stop_is_committed(http_coord):
    """The viewing token may look, never act; a coordinator without an admin token has no
    one who may stop over HTTP; the admin token stops a running job, as tfcoord stop does."""
    coord, base = http_coord
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(1)))
        # This coordinator has no admin token: the viewing token is refused, and says how.
        refused = fetch(base, f"/v1/jobs/{job}/stop", method="POST")
        assert refused.status == 403
        assert "--http-admin-token-file" in conforms(refused, "/v1/jobs/{job}/stop", "POST")["message"]
        assert conforms(fetch(base, "/v1/session"), "/v1/session") == {
            "admin": False,
            "version": fetch(base, "/v1/session").json["version"],
        }
    admin_coord = EmbeddedCoordinator(plaintext=True).start()
    try:
        admin_base = f"http://127.0.0.1:{admin_coord.start_http(TOKEN, admin_token=ADMIN_TOKEN)}"
        with DriverClient(admin_coord.address, admin_coord.secret) as d:
            job = d.submit(JobSpec(roles=make_roles(1)))
            with NodeClient(admin_coord.address, d.job_token(job), job, 0).connect() as n:
                n.register("127.0.0.1", 7001)
                n.start_heartbeats(0.2)
                n.await_cluster(30)
                n.report("running")
                stop = f"/v1/jobs/{job}/stop"
                for kw, status in (
                    (dict(token=None), 401),
                    (dict(token=TOKEN), 403),  # the viewing token of this coordinator
                    (dict(token=ADMIN_TOKEN, data=b"{not json"), 400),
                    (dict(token=ADMIN_TOKEN, data=b'{"reason": 5}'), 400),
                    (dict(token=ADMIN_TOKEN, data=b'{"reason": "x", "more": 1}'), 400),
                ):
                    answer = fetch(admin_base, stop, method="POST", **kw)
                    assert answer.status == status, (kw, answer.body)
                    conforms(answer, "/v1/jobs/{job}/stop", "POST")
                assert fetch(admin_base, stop, method="GET", token=ADMIN_TOKEN).status == 405
                assert fetch(admin_base, "/v1/jobs/nope/stop", method="POST", token=ADMIN_TOKEN).status == 404
                assert d.status(job)["state"] == "RUNNING"  # nothing refused changed anything
                session = fetch(admin_base, "/v1/session", token=ADMIN_TOKEN)
                assert conforms(session, "/v1/session")["admin"] is True
                assert fetch(admin_base, "/v1/jobs", token=ADMIN_TOKEN).status == 200  # it reads too

                answer = fetch(
                    admin_base, stop, method="POST", token=ADMIN_TOKEN, data=b'{"reason": "maintenance"}'
                )
                got = conforms(answer, "/v1/jobs/{job}/stop", "POST")
                assert answer.status == 200 and got == {"job": job, "state": "STOPPING", "was": "RUNNING"}
                assert n.stop_event.wait(30)  # told by push, as for any stop
                n.report("stopped")
            final = d.await_job(job, 30, raise_on_failure=False)
            assert final.state == "STOPPED" and final.stop_reason == "maintenance"
            again = fetch(admin_base, stop, method="POST", token=ADMIN_TOKEN)
            assert conforms(again, "/v1/jobs/{job}/stop", "POST") == {
                "job": job,
                "state": "STOPPED",
                "was": "STOPPED",
            }
    finally:
        admin_coord.stop()
    with pytest.raises(ValueError, match="must differ"):
        make_app(CoordinatorServer(ServerConfig(secret=b"s" * 32)), TOKEN, admin_token=TOKEN)


def test_jobs_one_job_and_its_events(http_coord):
    coord, base = http_coord
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2, 1), name="nightly", labels={"user": "ana"}))
        other = d.submit(JobSpec(roles=make_roles(1)))
        token = d.job_token(job)
        with (
            NodeClient(coord.address, token, job, 0).connect() as ps,
            NodeClient(coord.address, token, job, 1).connect() as w0,
        ):
            ps.register("10.0.0.5", 2222)
            w0.register(
                "10.0.0.6",
                2223,
                gpus=["GPU-aaaa"],
                task_id="task-7",
                meta={"tensorboard_url": "http://10.0.0.6:6006", "pid": 4242, "odd": float("nan")},
            )

            listing = conforms(fetch(base, "/v1/jobs"), "/v1/jobs")
            assert [j["job"] for j in listing["jobs"]] == [job, other]
            assert listing["jobs"][0]["registered"] == 2 and listing["jobs"][0]["size"] == 3
            reserving = conforms(fetch(base, "/v1/jobs?state=reserving"), "/v1/jobs")
            assert [j["job"] for j in reserving["jobs"]] == [job]
            both = conforms(fetch(base, "/v1/jobs?state=SUBMITTED,RESERVING"), "/v1/jobs")
            assert len(both["jobs"]) == 2
            assert conforms(fetch(base, "/v1/jobs?state=RUNNING"), "/v1/jobs") == {"jobs": []}

            status = conforms(fetch(base, f"/v1/jobs/{job}"), "/v1/jobs/{job}")
            assert status["state"] == "RESERVING" and status["name"] == "nightly"
            assert status["labels"] == {"user": "ana"}
            assert status["missing"] == ["worker:1 (executor 2): never registered"]
            nodes = {f"{n['role']}:{n['index']}": n for n in status["nodes"]}
            assert set(nodes) == {"ps:0", "worker:0"}
            w = nodes["worker:0"]
            assert (w["host"], w["port"], w["gpus"], w["task_id"], w["attempt"]) == (
                "10.0.0.6",
                2223,
                ["GPU-aaaa"],
                "task-7",
                0,
            )
            assert w["tensorboard_url"] == "http://10.0.0.6:6006" and nodes["ps:0"]["tensorboard_url"] is None
            assert w["meta"]["odd"] is None  # NaN is not JSON
            assert w["state"] == "REGISTERED" and w["error"] == "" and w["connected"] is True
            assert abs(w["last_heartbeat"] - time.time()) < 60

            w0.progress({"step": 10, "loss": 0.75})
            w0.progress({"step": 20, "loss": 0.5})
            w = next(
                n
                for n in conforms(fetch(base, f"/v1/jobs/{job}"), "/v1/jobs/{job}")["nodes"]
                if n["index"] == 0 and n["role"] == "worker"
            )
            assert w["figures"] == {"step": 20, "loss": 0.5}
            progress = conforms(fetch(base, f"/v1/jobs/{job}/progress"), "/v1/jobs/{job}/progress")
            assert [(n["role"], n["index"]) for n in progress["nodes"]] == [("worker", 0)]
            points = progress["nodes"][0]["points"]
            assert [f for _, f in points] == [{"step": 10, "loss": 0.75}, {"step": 20, "loss": 0.5}]
            later = fetch(base, f"/v1/jobs/{job}/progress?since={points[0][0]}").json["nodes"][0]["points"]
            assert later == points[1:] or points[0][0] == points[1][0]  # same-instant points both go

            w0.send_logs("stderr", ["epoch 1 \\x1b[0m", "epoch 2"], dropped=4)
            logs = conforms(fetch(base, f"/v1/jobs/{job}/logs?node=1"), "/v1/jobs/{job}/logs")
            assert [x[3:] for x in logs["lines"]] == [["stderr", "epoch 1 \\x1b[0m"], ["stderr", "epoch 2"]]
            assert logs["nodes"] == [{"executor_id": 1, "role": "worker", "index": 0, "dropped": 4}]
            assert fetch(base, f"/v1/jobs/{job}/logs?since={logs['next']}").json["lines"] == []

            w0.report("failed", error="Traceback (most recent call last):\nValueError: loss is NaN")
            failed = conforms(fetch(base, f"/v1/jobs/{job}"), "/v1/jobs/{job}")
            assert failed["state"] == "FAILED" and "loss is NaN" in failed["error"]
            w = next(n for n in failed["nodes"] if n["role"] == "worker")
            assert w["state"] == "FAILED" and w["error"].endswith("ValueError: loss is NaN")

            events = conforms(fetch(base, f"/v1/jobs/{job}/events"), "/v1/jobs/{job}/events")
            texts = [e["text"] for e in events["events"]]
            assert texts[0].startswith("submitted") and "job RESERVING -> FAILED" in texts
            assert [e["seq"] for e in events["events"]] == list(range(len(texts)))
            assert events["next"] == len(texts) and events["state"] == "FAILED"
            tail = conforms(fetch(base, f"/v1/jobs/{job}/events?since=2"), "/v1/jobs/{job}/events")
            assert [e["text"] for e in tail["events"]] == texts[2:]
            assert fetch(base, f"/v1/jobs/{job}/events?since={len(texts)}").json["events"] == []


def test_malformed_input_is_400_and_unknown_ids_and_paths_are_404(http_coord):
    _, base = http_coord
    cases = [
        ("/v1/jobs?state=BOGUS", "/v1/jobs", 400),
        ("/v1/jobs?state=", "/v1/jobs", 400),
        ("/v1/jobs?status=RUNNING", "/v1/jobs", 400),
        ("/v1/jobs?state=RUNNING&state=FAILED", "/v1/jobs", 400),
        ("/v1/jobs/bad%20id", "/v1/jobs/{job}", 400),
        ("/v1/jobs/-leading-dash", "/v1/jobs/{job}", 400),
        ("/v1/jobs/" + "a" * 129, "/v1/jobs/{job}", 400),
        ("/v1/jobs/no-such-job", "/v1/jobs/{job}", 404),
        ("/v1/jobs/no-such-job?x=1", "/v1/jobs/{job}", 400),
        ("/v1/jobs/no-such-job/events", "/v1/jobs/{job}/events", 404),
        ("/v1/jobs/no-such-job/events?since=-1", "/v1/jobs/{job}/events", 400),
        ("/v1/jobs/no-such-job/events?since=abc", "/v1/jobs/{job}/events", 400),
        ("/v1/jobs/no-such-job/progress", "/v1/jobs/{job}/progress", 404),
        ("/v1/jobs/no-such-job/logs", "/v1/jobs/{job}/logs", 404),
        ("/v1/jobs/no-such-job/logs?since=x", "/v1/jobs/{job}/logs", 400),
        ("/v1/jobs/no-such-job/logs?limit=0", "/v1/jobs/{job}/logs", 400),
        ("/v1/jobs/no-such-job/logs?node=-1", "/v1/jobs/{job}/logs", 400),
        ("/v1/jobs/no-such-job/progress?since=nan", "/v1/jobs/{job}/progress", 400),
        ("/v1/jobs/no-such-job/progress?since=-5", "/v1/jobs/{job}/progress", 400),
        ("/v1/jobs/no-such-job/progress?until=1", "/v1/jobs/{job}/progress", 400),
        ("/metrics?x=1", "/metrics", 400),
    ]
    for path, template, status in cases:
        answer = fetch(base, path)
        assert answer.status == status, (path, answer.body)
        body = conforms(answer, template)
        assert body["message"] and "Traceback" not in body["message"], path
    for path in ("/v1/nothing", "/v1/jobs/a/b/c", "/static/../etc/passwd"):
        answer = fetch(base, path)
        assert answer.status == 404 and answer.json["error"] == "not_found", path
    answer = fetch(base, "/v1/jobs", method="POST")
    assert answer.status == 405 and answer.json["error"] == "method_not_allowed"
    assert "GET" in answer.headers["Allow"]
    conforms(answer, "/v1/jobs", "GET")  # the default error response


def test_an_unexpected_exception_is_a_json_500_without_a_traceback(http_coord, caplog, monkeypatch):
    coord, base = http_coord

    def broken() -> list:
        raise RuntimeError("internal detail that must not leak")

    monkeypatch.setattr(coord.server.state, "summary", broken)
    answer = fetch(base, "/v1/jobs")
    assert answer.status == 500
    assert conforms(answer, "/v1/jobs") == {
        "error": "internal_error",
        "message": "the coordinator failed to answer this request; see its log",
    }
    assert b"Traceback" not in answer.body and b"internal detail" not in answer.body
    logged = [r for r in caplog.records if r.name == "tfcoord.coordinator.http" and r.exc_info]
    assert logged and "internal detail" in str(logged[0].exc_info[1])
    assert fetch(base, "/healthz").status == 200  # the server goes on


# -- metrics ------------------------------------------------------------------------------


def test_metrics_follow_registrations_readiness_and_failures(http_coord):
    coord, base = http_coord
    m0 = metrics(base)
    assert m0['tfcoord_jobs{state="RUNNING"}'] == 0 and m0["tfcoord_registrations_total"] == 0
    assert m0['tfcoord_failures_total{reason="node_failed"}'] == 0
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2)))
        nodes = [NodeClient(coord.address, d.job_token(job), job, i).connect() for i in range(2)]
        for i, n in enumerate(nodes):
            n.register("127.0.0.1", 7000 + i)
        m1 = metrics(base)
        assert m1["tfcoord_registrations_total"] == 2
        assert m1["tfcoord_reservation_duration_seconds_count"] == 1
        assert m1['tfcoord_jobs{state="READY"}'] == 1 and m1['tfcoord_nodes{state="READY"}'] == 2
        assert m1["tfcoord_connections"] == 3  # the driver and two nodes: HTTP is not counted
        for n in nodes:
            n.await_cluster(10)
            n.report("running")
        m2 = metrics(base)
        assert m2["tfcoord_readiness_duration_seconds_count"] == 1
        assert m2['tfcoord_jobs{state="RUNNING"}'] == 1 and m2['tfcoord_nodes{state="RUNNING"}'] == 2
        nodes[1].report("failed", error="boom")
        m3 = metrics(base)
        assert m3['tfcoord_failures_total{reason="node_failed"}'] == 1
        assert m3['tfcoord_jobs{state="FAILED"}'] == 1 and m3['tfcoord_jobs{state="RUNNING"}'] == 0
        for n in nodes:
            n.close()

        # A node whose connection drops and does not come back is lost, and fails its job.
        lost = d.submit(JobSpec(roles=make_roles(1), reconnect_grace_s=0.0))
        gone = NodeClient(coord.address, d.job_token(lost), lost, 0).connect()
        gone.register("127.0.0.1", 7100)
        gone.close()
        assert d.await_job(lost, 30, raise_on_failure=False)["state"] == "FAILED"
        # Nobody registers: the reservation deadline fails the job.
        late = d.submit(JobSpec(roles=make_roles(1), reservation_timeout_s=0.05))
        assert d.await_job(late, 30, raise_on_failure=False)["state"] == "FAILED"
        m4 = metrics(base)
        assert m4['tfcoord_failures_total{reason="node_lost"}'] == 1
        assert m4['tfcoord_failures_total{reason="reservation_timeout"}'] == 1

        # Protocol-level counters: a garbage frame, a wrong secret.
        host, port = coord.address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as raw:
            raw.recv(1024)  # the challenge
            raw.sendall(b"\xff\xff\xff\xff" + b"x" * 16)
            raw.settimeout(10)
            while raw.recv(1024):
                pass
        with pytest.raises(AuthenticationFailed):
            DriverClient(coord.address, b"w" * 32, connect_deadline_s=5).connect()
        m5 = metrics(base)
        assert m5["tfcoord_rejected_frames_total"] == m0["tfcoord_rejected_frames_total"] + 1
        assert m5['tfcoord_auth_failures_total{interface="tcp"}'] == 1


def test_two_coordinators_in_one_process_keep_their_own_metrics():
    with EmbeddedCoordinator(plaintext=True) as a, EmbeddedCoordinator(plaintext=True) as b:
        base_a = f"http://127.0.0.1:{a.start_http(TOKEN)}"
        base_b = f"http://127.0.0.1:{b.start_http(TOKEN)}"
        with DriverClient(a.address, a.secret) as d:
            job = d.submit(JobSpec(roles=make_roles(2)))
            with NodeClient(a.address, d.job_token(job), job, 0).connect() as n:
                n.register("127.0.0.1", 7200)
                assert metrics(base_a)["tfcoord_registrations_total"] == 1
                assert metrics(base_b)["tfcoord_registrations_total"] == 0
                assert metrics(base_b)['tfcoord_jobs{state="RESERVING"}'] == 0


# -- tfcoord serve with HTTP --------------------------------------------------------------


def test_serve_with_http_journal_metrics_and_json_logs(tmp_path):
    """`tfcoord serve --http-port 0`: port and token files, journal commit latency, one
    JSON log line per job and node state change carrying the job id."""
    token_file = tmp_path / "conf" / "http-token"  # its directory is created too
    served = Served(
        tmp_path, state_dir=tmp_path / "state", http=True, http_token_file=token_file, log_format="json"
    )
    try:
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        token = auth.read_secret(token_file)
        base = f"http://127.0.0.1:{served.http_port}"
        with DriverClient(served.address, served.secret) as d:
            job = d.submit(JobSpec(roles=make_roles(1)))
            with NodeClient(served.address, d.job_token(job), job, 0).connect() as n:
                n.register("127.0.0.1", 7300)
                n.await_cluster(10)
                n.report("running")
                n.report("succeeded")
            d.await_job(job, 10)
        assert metrics(base, token)["tfcoord_journal_commit_duration_seconds_count"] >= 1
        assert fetch(base, f"/v1/jobs/{job}", token=token).json["state"] == "SUCCEEDED"
        assert fetch(base, "/v1/jobs", token=TOKEN).status == 401
    finally:
        assert served.stop() == 0
    logged = served.log
    lines = [json.loads(line) for line in logged.splitlines() if line.startswith("{")]
    changes = [ln for ln in lines if ln.get("job") == job]
    states = [(ln.get("node"), ln.get("state")) for ln in changes]
    assert states == [
        (None, "SUBMITTED"),
        (None, "RESERVING"),
        ("worker:0", "REGISTERED"),
        (None, "READY"),
        ("worker:0", "READY"),
        ("worker:0", "RUNNING"),
        (None, "RUNNING"),
        ("worker:0", "SUCCEEDED"),
        (None, "SUCCEEDED"),
    ], states
    assert all(ln["message"].startswith(f"job {job}: ") for ln in changes)
    assert str(token) not in logged and token.decode() not in logged


def test_serve_refuses_http_without_a_token_file_and_a_readable_token_file(tmp_path):
    base = [
        sys.executable,
        "-m",
        "tfcoord",
        "serve",
        "--plaintext",
        "--port",
        "0",
        "--secret-file",
        str(tmp_path / "s"),
    ]
    out = subprocess.run([*base, "--http-port", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--http-token-file" in out.stderr
    loose = tmp_path / "loose-token"
    loose.write_text("t" * 40)
    loose.chmod(0o644)
    out = subprocess.run(
        [*base, "--http-port", "0", "--http-token-file", str(loose)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and f"chmod 600 {loose}" in out.stderr


def test_a_restart_shows_in_metrics_and_in_the_jobs_status(http_coord):
    """A node killed by a signal in a job with ``max_restarts``: ``tfcoord_restarts_total``
    counts it, and ``/v1/jobs/{job}`` shows the generation and the restart's cause."""
    coord, base = http_coord
    assert metrics(base)["tfcoord_restarts_total"] == 0
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2), max_restarts=1))
        nodes = [NodeClient(coord.address, d.job_token(job), job, i).connect() for i in range(2)]
        try:
            for i, n in enumerate(nodes):
                n.register("127.0.0.1", 7100 + i)
            for n in nodes:
                n.await_cluster(10)
                n.report("RUNNING")
            nodes[1].report("FAILED", error="Killed", exit_code=-9)
            assert metrics(base)["tfcoord_restarts_total"] == 1
            answer = fetch(base, f"/v1/jobs/{job}")
            st = conforms(answer, "/v1/jobs/{job}")
            assert (st["state"], st["generation"], st["max_restarts"]) == ("RESERVING", 1, 1)
            [restart] = st["restarts"]
            assert restart["cause"] == "was killed by SIGKILL" and restart["exit_code"] == -9
            assert [n["generation"] for n in st["history"]] == [0, 0]
        finally:
            for n in nodes:
                n.close()
