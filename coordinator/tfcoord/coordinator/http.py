"""The coordinator's HTTP side: a JSON API, Prometheus metrics and the dashboard page.

It runs on its own port in the coordinator's event loop, beside the TCP server, and
*reads* the state (a snapshot per request, taken on the loop, so always consistent).
Operators use it to watch jobs they did not start, so it is authenticated with a bearer
token of its own, separate from the coordinator secret: holding it lets you look, never
act. One action is offered, to holders of a second token (the HTTP admin token, when the
coordinator has one): stopping a job, as ``tfcoord stop`` does. The token travels in the
``Authorization`` header, never a cookie, so another site's page cannot make a browser
send it (no cross-site request forgery), and no CORS header ever lets one read an answer.

Routes (``openapi.json`` beside this file describes them; a test keeps the two equal):

- ``/healthz``: no authentication, for load balancers and systemd watchdogs; it says
  only ``ok`` unless the request carries the token (then also the job count and version).
- ``/`` and ``/dashboard``: the dashboard page, static and holding no data or
  credentials, so it needs no token to load; its own API calls send the token.
- ``/v1/...`` (jobs, one job, its events, progress and logs, the OpenAPI document,
  ``/v1/session``) and ``/metrics``: ``Authorization: Bearer <token>`` (the admin token
  too), compared in constant time.
- ``POST /v1/jobs/{job}/stop``: the admin token only; the viewing token gets 403.
- ``/v1/node-archive/NAME``: the node runtime Mesos tasks fetch (``coordinator.nodearchive``),
  for the bearer token or HTTP Basic with the archive's own download credential, which is all
  the Mesos fetcher can send (it takes it from the URI's ``user:password@``). That credential
  opens this route only: the archive is tfcoord's public code, and tasks check its SHA-256.

Every error is a small JSON object (``{"error": code, "message": text}``): unknown ids
and paths are 404, malformed input 400, and anything unexpected is logged here and
answered as a JSON 500 without a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import math
import re
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_protocol import RequestHandler

from tfcoord.client import __version__, auth
from tfcoord.client import messages as m
from tfcoord.client.vocab import ErrorCode, JobState

from . import state as s
from .logsafe import protect
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import CoordinatorMetrics
from .nodearchive import ROUTE_PREFIX, node_archive
from .server import DEFAULT_MAX_HTTP_CONNECTIONS, CoordinatorServer

log = protect(logging.getLogger("tfcoord.coordinator.http"))

_HERE = Path(__file__).parent
OPENAPI_PATH = _HERE / "openapi.json"
DASHBOARD_PATH = _HERE / "dashboard.html"

#: Routes anyone may fetch: a health probe, and a page that holds no data.
PUBLIC_PATHS = frozenset({"/healthz", "/", "/dashboard"})
#: The node archive Mesos tasks fetch (see ``coordinator.nodearchive``).
ARCHIVE_ROUTE = ROUTE_PREFIX + "{name}"
#: A job's snapshot is rebuilt at most this often per job, however many dashboards poll
#: it (a 10,000-node job's snapshot is megabytes of JSON, built on the coordinator's
#: loop). Changes that bump the job's version show at once; only heartbeat times and
#: connection flags can be this much behind.
STATUS_CACHE_S = 1.0
#: In-flight requests get this long to finish when the HTTP server stops; every
#: handler answers from memory in milliseconds.
SHUTDOWN_TIMEOUT_S = 5.0
#: Requests here are GETs without a body and a stop with a reason; refuse anything bigger
#: than a small form.
MAX_REQUEST_BODY_BYTES = 64 * 1024
#: The reason a stop from the dashboard gives when its request names none.
DASHBOARD_STOP_REASON = "stopped from the dashboard"
#: An HTTP connection must send a complete request within this of connecting or of its
#: previous answer, else it is closed (aiohttp's own default is an hour: 1,100 idle
#: sockets then held every descriptor the coordinator had). Dashboards poll every few
#: seconds and so keep their connection; a probe reconnects in a millisecond.
KEEPALIVE_TIMEOUT_S = 15.0

_JOB_STATES = {st.value for st in JobState}

SERVER_KEY = web.AppKey("server", CoordinatorServer)
#: Whether the request carried the admin token (set by the authentication middleware).
ADMIN = web.RequestKey("admin", bool)
METRICS_KEY = web.AppKey("metrics", CoordinatorMetrics)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """A request the API refuses: an HTTP status, a stable code and a message for people."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


# -- responses ----------------------------------------------------------------------------


def _finite(value: Any) -> Any:
    """Replace NaN and infinities (possible in node metadata) by null: JSON has neither."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _dumps(body: Any) -> bytes:
    try:
        text = json.dumps(body, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(body), separators=(",", ":"), allow_nan=False)
    return text.encode()


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=_dumps(body), status=status, content_type="application/json", headers=headers)


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return _json({"error": code, "message": message}, status, headers)


# -- middlewares --------------------------------------------------------------------------

#: Reasons for aiohttp's own HTTP exceptions (routing, methods, sizes), as stable codes.
_HTTP_CODES = {
    400: ErrorCode.BAD_REQUEST,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.TOO_LARGE,
}


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes a JSON error; nothing ever answers with a traceback."""
    try:
        return await handler(request)
    except ApiError as e:
        return _error(e.status, e.code, e.message)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = _HTTP_CODES.get(e.status, ErrorCode.HTTP_ERROR)
        if e.status == 404:
            message = f"no such path: {request.path} (the API is described at /v1/openapi.json)"
        elif e.status == 405:
            message = (
                f"{request.method} is not allowed on {request.path}; use {e.headers.get('Allow', 'GET')}"
            )
        else:
            message = e.reason
        keep = {k: v for k, v in e.headers.items() if k in ("Allow", "WWW-Authenticate")}
        return _error(e.status, code, message, keep)
    except Exception:
        log.exception("HTTP %s %s failed", request.method, request.path)
        return _error(
            500, ErrorCode.INTERNAL_ERROR, "the coordinator failed to answer this request; see its log"
        )


def _bearer_ok(request: web.Request, token: bytes) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8", "replace"), token)


def _basic_ok(given: str, expected: tuple[str, str] | None) -> bool:
    """``given`` is the Basic credential (base64 of ``user:password``) that ``expected`` holds."""
    if expected is None:
        return False
    try:
        user, sep, password = base64.b64decode(given.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return False
    # Both compared, always: the time taken says nothing about which one was wrong.
    ok_user = hmac.compare_digest(user.encode(), expected[0].encode())
    ok_password = hmac.compare_digest(password.encode(), expected[1].encode())
    return bool(sep) and ok_user and ok_password


def _auth_middleware(
    token: bytes, admin_token: bytes | None, metrics: CoordinatorMetrics, archive_auth: tuple[str, str] | None
) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        request[ADMIN] = False
        if resource is not None and resource.canonical in PUBLIC_PATHS:
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given_b = given.strip().encode("utf-8", "replace")
            # Both compared, whichever matches, so the time taken tells nothing.
            viewer = hmac.compare_digest(given_b, token)
            admin = admin_token is not None and hmac.compare_digest(given_b, admin_token)
            if viewer or admin:
                request[ADMIN] = admin
                return await handler(request)
        if (
            resource is not None
            and resource.canonical == ARCHIVE_ROUTE
            and scheme.lower() == "basic"
            and _basic_ok(given, archive_auth)
        ):
            return await handler(request)
        metrics.http_auth_failures += 1
        why = "a wrong bearer token" if scheme.lower() == "bearer" else "no bearer token"
        return _error(
            401,
            ErrorCode.UNAUTHORIZED,
            f"this request carries {why}; send 'Authorization: Bearer "
            "<token>' with the token from the coordinator's --http-token-file "
            "(or --http-admin-token-file)",
            {"WWW-Authenticate": 'Bearer realm="tfcoord"'},
        )

    return check


class _AccessLogger(AbstractAccessLogger):
    """One DEBUG line per request, without the query string: a dashboard URL may carry
    ``?token=`` once, and tokens do not belong in logs."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.debug(
            "%s %s %s -> %d in %.1f ms",
            request.remote,
            request.method,
            request.path,
            response.status,
            time * 1e3,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.DEBUG)


# -- input --------------------------------------------------------------------------------


def _query(request: web.Request, allowed: frozenset[str]) -> dict[str, str]:
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        expect = ", ".join(sorted(allowed)) or "none"
        raise ApiError(
            400, ErrorCode.BAD_REQUEST, f"unknown query parameter(s) {', '.join(unknown)}; expected: {expect}"
        )
    for key in request.query:
        if len(request.query.getall(key)) > 1:
            raise ApiError(400, ErrorCode.BAD_REQUEST, f"query parameter {key} is given more than once")
    return dict(request.query)


def _job_id(request: web.Request) -> str:
    job = request.match_info["job"]
    if len(job) > m.MAX_ID_LEN or not m.ID_RE.fullmatch(job):
        raise ApiError(
            400,
            ErrorCode.BAD_REQUEST,
            f"{job[: m.MAX_ID_LEN]!r} is not a job id: job ids are letters, "
            f"digits, '.', '_' or '-', at most {m.MAX_ID_LEN} characters",
        )
    return job


def _job(server: CoordinatorServer, job_id: str) -> s.Job:
    job = server.state.jobs.get(job_id)
    if job is None:
        raise ApiError(
            404, ErrorCode.UNKNOWN_JOB, f"no job {job_id!r} on this coordinator; GET /v1/jobs lists them"
        )
    return job


# -- handlers -----------------------------------------------------------------------------


def _node_view(node: dict[str, Any]) -> dict[str, Any]:
    """A node snapshot plus the fields the API names explicitly."""
    url = node["meta"].get("tensorboard_url")
    node["last_heartbeat"] = node["last_seen"]
    node["tensorboard_url"] = url if isinstance(url, str) and url else None
    return node


class _Api:
    """The handlers, over one server; every one runs on the server's loop."""

    def __init__(self, server: CoordinatorServer, metrics: CoordinatorMetrics, token: bytes) -> None:
        self.server = server
        self._token = token
        self.metrics = metrics
        self._status_cache: dict[str, tuple[tuple[int, int], float, bytes]] = {}
        self._openapi = OPENAPI_PATH.read_bytes()
        self._dashboard = DASHBOARD_PATH.read_bytes()
        self._dashboard_headers = _page_headers(self._dashboard.decode())

    async def healthz(self, request: web.Request) -> web.Response:
        # Anyone may ask whether the coordinator is up; only a token holder learns more
        # (how busy it is, which version to aim an exploit at).
        if not _bearer_ok(request, self._token):
            return _json({"status": "ok"})
        return _json({"status": "ok", "jobs": len(self.server.state.jobs), "version": __version__})

    async def dashboard(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self._dashboard, content_type="text/html", charset="utf-8", headers=self._dashboard_headers
        )

    async def session(self, request: web.Request) -> web.Response:
        _query(request, frozenset())
        return _json({"admin": bool(request[ADMIN]), "version": __version__})

    async def stop(self, request: web.Request) -> web.Response:
        _query(request, frozenset())
        job_id = _job_id(request)
        if not request[ADMIN]:
            raise ApiError(
                403,
                ErrorCode.FORBIDDEN,
                "stopping a job takes the coordinator's HTTP admin token (--http-admin-token-file); "
                "this token may only look",
            )
        reason = DASHBOARD_STOP_REASON
        if request.can_read_body:
            try:
                body = json.loads(await request.read() or b"{}")
            except (ValueError, UnicodeDecodeError):
                body = None
            given = body.get("reason", reason) if isinstance(body, dict) else None
            if not isinstance(given, str) or len(given) > m.MAX_TEXT_LEN or set(body) - {"reason"}:
                raise ApiError(
                    400,
                    ErrorCode.BAD_REQUEST,
                    f'the body must be JSON {{"reason": "..."}} (at most {m.MAX_TEXT_LEN} characters) or empty',
                )
            reason = given.strip() or reason
        job = _job(self.server, job_id)
        before = job.state
        self.server.apply(s.StopJobEvent(now=time.time(), job=job.id, reason=reason))
        # Committed before the answer, as every stop is (a rare path: an operator's click).
        self.server.flush_now()
        log.info("job %s: stop requested over HTTP by an admin: %s", job.id, reason)
        return _json({"job": job.id, "state": job.state.value, "was": before.value})

    async def openapi(self, request: web.Request) -> web.Response:
        _query(request, frozenset())
        return web.Response(body=self._openapi, content_type="application/json")

    async def node_archive(self, request: web.Request) -> web.Response:
        _query(request, frozenset())
        archive = node_archive()
        if request.match_info["name"] != archive.name:
            raise ApiError(
                404,
                ErrorCode.NOT_FOUND,
                f"this coordinator serves the node archive {archive.name} (tfcoord {__version__}), "
                f"not {request.match_info['name'][:100]!r}",
            )
        return web.Response(
            body=archive.data,
            content_type="application/zip",
            headers={"Cache-Control": "no-store", "X-Content-SHA256": archive.sha256},
        )

    async def metrics_text(self, request: web.Request) -> web.Response:
        _query(request, frozenset())
        resp = web.Response(body=self.metrics.exposition())
        resp.headers["Content-Type"] = METRICS_CONTENT_TYPE
        return resp

    async def jobs(self, request: web.Request) -> web.Response:
        q = _query(request, frozenset({"state"}))
        wanted: set[str] | None = None
        if "state" in q:
            wanted = {v.strip().upper() for v in q["state"].split(",") if v.strip()}
            bad = sorted(wanted - _JOB_STATES)
            if bad or not wanted:
                raise ApiError(
                    400,
                    ErrorCode.BAD_REQUEST,
                    f"unknown job state(s) {', '.join(bad) or '(empty)'}; "
                    f"expected one or more of {', '.join(st.value for st in JobState)}",
                )
        jobs = self.server.state.summary()
        if wanted is not None:
            jobs = [j for j in jobs if j["state"] in wanted]
        return _json({"jobs": jobs})

    async def job(self, request: web.Request) -> web.Response:
        _query(request, frozenset())
        job = _job(self.server, _job_id(request))
        now = time.monotonic()
        cached = self._status_cache.get(job.id)
        if (
            cached is not None
            and cached[0] == (job.version, job.reports)
            and now - cached[1] < STATUS_CACHE_S
        ):
            body = cached[2]
        else:
            status = self.server.state.status(job.id)
            for key in ("nodes", "history"):
                status[key] = [_node_view(n) for n in status[key]]
            status["events"] = [{"time": t, "text": text} for t, text in status["events"]]
            body = _dumps(status)
            # Expired entries are of no use (and may be of forgotten jobs): keep only fresh ones,
            # so the cache holds what was asked for in the last second, not every job ever seen.
            self._status_cache = {k: v for k, v in self._status_cache.items() if now - v[1] < STATUS_CACHE_S}
            self._status_cache[job.id] = ((job.version, job.reports), now, body)
        return web.Response(body=body, content_type="application/json")

    async def events(self, request: web.Request) -> web.Response:
        q = _query(request, frozenset({"since"}))
        job_id = _job_id(request)
        since = 0
        if "since" in q:  # malformed input is a 400 whether or not the job exists
            if not q["since"].isdigit() or len(q["since"]) > 12:
                raise ApiError(
                    400,
                    ErrorCode.BAD_REQUEST,
                    f"since must be a non-negative event number, not {q['since'][:40]!r}",
                )
            since = int(q["since"])
        job = _job(self.server, job_id)
        # The timeline is bounded: its oldest lines go first, and sequence numbers stay put.
        base = job.events_dropped
        start = max(since, base)
        events = [
            {"seq": i, "time": t, "text": text}
            for i, (t, text) in enumerate(job.events[start - base :], start)
        ]
        return _json(
            {"job": job.id, "state": job.state.value, "events": events, "next": base + len(job.events)}
        )

    async def progress(self, request: web.Request) -> web.Response:
        q = _query(request, frozenset({"since"}))
        job_id = _job_id(request)
        since = 0.0
        if "since" in q:
            try:
                since = float(q["since"]) if len(q["since"]) <= 32 else -1.0
            except ValueError:
                since = -1.0
            if not (math.isfinite(since) and since >= 0):
                raise ApiError(
                    400,
                    ErrorCode.BAD_REQUEST,
                    f"since must be a time in seconds since the epoch (the last point's), not {q['since'][:40]!r}",
                )
        job = _job(self.server, job_id)
        return _json(self.server.state.series(job.id, since=since))

    async def logs(self, request: web.Request) -> web.Response:
        q = _query(request, frozenset({"since", "node", "limit"}))
        job_id = _job_id(request)
        since, limit, eid = 0, m.MAX_LOGS_REPLY, -1
        for key in ("since", "limit", "node"):
            if key in q:
                v = q[key]
                if not v.isdigit() or len(v) > 12 or (key == "limit" and not 1 <= int(v) <= m.MAX_LOGS_REPLY):
                    what = {
                        "since": "a line number (the previous answer's next)",
                        "limit": f"a number from 1 to {m.MAX_LOGS_REPLY}",
                        "node": "an executor id",
                    }[key]
                    raise ApiError(400, ErrorCode.BAD_REQUEST, f"{key} must be {what}, not {v[:40]!r}")
        since = int(q.get("since", 0))
        limit = int(q.get("limit", m.MAX_LOGS_REPLY))
        job = _job(self.server, job_id)
        if "node" in q:
            eid = int(q["node"])
            if eid >= len(job.slots):
                raise ApiError(
                    400,
                    ErrorCode.BAD_REQUEST,
                    f"job {job.id} has executors 0 to {len(job.slots) - 1}, not {eid}",
                )
        return _json(self.server.state.logs(job.id, eid, since, limit))


def _csp_hashes(html: str, tag: str) -> str:
    bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
    return " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in bodies
    )


def _page_headers(html: str) -> dict[str, str]:
    """Lock the page to its own inline code and its own API; leak nothing in Referer."""
    csp = (
        "default-src 'none'; "
        f"script-src {_csp_hashes(html, 'script')}; style-src {_csp_hashes(html, 'style')}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }


# -- the application ----------------------------------------------------------------------


def make_app(
    server: CoordinatorServer,
    token: bytes,
    archive_auth: tuple[str, str] | None = None,
    admin_token: bytes | None = None,
) -> web.Application:
    """The aiohttp application over ``server``; its metrics attach on startup.

    ``archive_auth`` is the (user, password) that HTTP Basic must carry to fetch the node
    archive without the bearer token; None: only the bearer token fetches it.
    ``admin_token`` (None: no one) may also stop jobs (``POST /v1/jobs/{job}/stop``).

    Raises:
        ValueError: a token is shorter than :data:`tfcoord.client.auth.MIN_SECRET_BYTES`, or
            the admin token is the viewing token.
    """
    if len(token) < auth.MIN_SECRET_BYTES:
        raise ValueError(f"the HTTP bearer token must be at least {auth.MIN_SECRET_BYTES} bytes")
    if admin_token is not None:
        if len(admin_token) < auth.MIN_SECRET_BYTES:
            raise ValueError(f"the HTTP admin token must be at least {auth.MIN_SECRET_BYTES} bytes")
        if hmac.compare_digest(admin_token, token):
            raise ValueError("the HTTP admin token must differ from the viewing token")
    metrics = CoordinatorMetrics(server)
    api = _Api(server, metrics, token)
    app = web.Application(
        middlewares=[_errors, _auth_middleware(token, admin_token, metrics, archive_auth)],
        client_max_size=MAX_REQUEST_BODY_BYTES,
    )
    app[SERVER_KEY] = server
    app[METRICS_KEY] = metrics
    app.router.add_get("/healthz", api.healthz)
    app.router.add_get("/", api.dashboard)
    app.router.add_get("/dashboard", api.dashboard)
    app.router.add_get("/metrics", api.metrics_text)
    app.router.add_get("/v1/openapi.json", api.openapi)
    app.router.add_get("/v1/session", api.session)
    app.router.add_get("/v1/jobs", api.jobs)
    app.router.add_get("/v1/jobs/{job}", api.job)
    app.router.add_get("/v1/jobs/{job}/events", api.events)
    app.router.add_get("/v1/jobs/{job}/progress", api.progress)
    app.router.add_get("/v1/jobs/{job}/logs", api.logs)
    app.router.add_get(ARCHIVE_ROUTE, api.node_archive)
    app.router.add_post("/v1/jobs/{job}/stop", api.stop)

    async def attach(app: web.Application) -> None:
        metrics.attach()

    async def detach(app: web.Application) -> None:
        metrics.detach()

    app.on_startup.append(attach)
    app.on_cleanup.append(detach)
    return app


#: HTTP connections one client address may hold at once: a browser opens six per host, a
#: Prometheus scraper or a script a few; a client past it is answered 503 while others still
#: get in, so no one client can take the whole ``max_connections`` budget.
DEFAULT_MAX_HTTP_CONNECTIONS_PER_CLIENT = 32


def _busy_reply(message: str) -> bytes:
    """A whole 503 answer (its Content-Length counted from the body it sends)."""
    body = json.dumps({"error": ErrorCode.TOO_MANY_CONNECTIONS.value, "message": message}).encode() + b"\n"
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        + b"Connection: close\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


_BUSY = _busy_reply("too many HTTP connections; retry later")
_BUSY_CLIENT = _busy_reply("too many HTTP connections from this address; close some, then retry")


class _Busy(asyncio.Protocol):
    """What a connection over the HTTP cap gets: a 503 and a close, costing no handler."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_BUSY)
        transport.close()


class _CountedHandler(RequestHandler):
    """aiohttp's handler, counted from creation to loss (see :class:`_CappedSite`)."""

    __slots__ = ("__weakref__", "lost", "peer", "site")

    def __init__(self, manager: web.Server, site: _CappedSite, **kw: Any) -> None:
        super().__init__(manager, **kw)
        self.lost = False
        self.site = site
        self.peer: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if host is not None and not self.site.admit(host):
            # Over its address's share: answered and closed before any request is read.
            self.lost = True
            self.site.refused += 1
            assert isinstance(transport, asyncio.Transport)
            transport.write(_BUSY_CLIENT)
            transport.close()
            return
        self.peer = host
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.lost and self.peer is not None:
            self.site.release(self.peer)
        self.lost = True
        super().connection_lost(exc)


class _CappedSite(web.TCPSite):
    """A TCP site that serves at most ``max_connections`` HTTP connections at once.

    Counted from when the protocol is created, not from ``connection_made``: asyncio
    accepts a whole backlog before it runs any ``connection_made``, so a count taken there
    lets a burst of connections past the cap. A handler whose TLS handshake failed never
    sees ``connection_made`` nor ``connection_lost``; it leaves the (weak) set when it is
    freed, so such failures cannot wear the cap down.
    """

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        max_connections: int,
        max_per_client: int = DEFAULT_MAX_HTTP_CONNECTIONS_PER_CLIENT,
        **kw: Any,
    ) -> None:
        super().__init__(runner, host, port, **kw)
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self._handlers: weakref.WeakSet[_CountedHandler] = weakref.WeakSet()
        #: Connections held per client address (bounded: at most ``max_connections`` keys).
        self._per_client: dict[str, int] = {}
        self.refused = 0

    def admit(self, host: str) -> bool:
        """Count a connection from ``host`` unless it holds its share already."""
        held = self._per_client.get(host, 0)
        if held >= self.max_per_client:
            return False
        self._per_client[host] = held + 1
        return True

    def release(self, host: str) -> None:
        held = self._per_client.get(host, 0) - 1
        if held > 0:
            self._per_client[host] = held
        else:
            self._per_client.pop(host, None)

    @property
    def open(self) -> int:
        """HTTP connections accepted and not yet lost."""
        return sum(1 for h in self._handlers if not h.lost)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # What web.Server.__call__ passes to its handlers (keep-alive and parser limits).
        handler_kw = dict(getattr(server, "_kwargs", {}))

        def factory() -> asyncio.Protocol:
            if self.open >= self.max_connections:
                self.refused += 1
                return _Busy()
            handler = _CountedHandler(server, self, loop=loop, **handler_kw)
            self._handlers.add(handler)
            return handler

        self._server = await loop.create_server(
            factory,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
        )


async def start_http(
    server: CoordinatorServer,
    host: str,
    port: int,
    token: bytes,
    ssl_context: ssl.SSLContext | None = None,
    max_connections: int = DEFAULT_MAX_HTTP_CONNECTIONS,
    max_per_client: int = DEFAULT_MAX_HTTP_CONNECTIONS_PER_CLIENT,
    keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
    archive_auth: tuple[str, str] | None = None,
    admin_token: bytes | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve the HTTP API for ``server`` on the running loop; returns the runner and bound port.

    Port 0 picks a free port. At most ``max_connections`` connections are served at once,
    at most ``max_per_client`` of them from one client address, and each must send a whole request within ``keepalive_timeout_s``. ``admin_token``
    holders may also stop jobs. Stop it with ``await runner.cleanup()`` before closing the
    server.
    """
    runner = web.AppRunner(
        make_app(server, token, archive_auth, admin_token),
        access_log_class=_AccessLogger,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        keepalive_timeout=keepalive_timeout_s,
    )
    await runner.setup()
    try:
        site = _CappedSite(
            runner, host, port, max_connections, max_per_client, ssl_context=ssl_context, reuse_address=True
        )
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    log.info("HTTP API and dashboard on %s://%s:%d/", "https" if ssl_context else "http", host, bound)
    return runner, bound
