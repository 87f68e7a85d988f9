"""The Mesos v1 scheduler HTTP API, on aiohttp, in the coordinator's event loop.

Theory of operation. One task keeps a subscription: it POSTs SUBSCRIBE to a master
(``MESOS_MASTER`` lists several; each is tried in turn, and a non-leading master's 307 is
followed to the leader, whose ``Location`` is scheme-relative, ``//host:port/...``; with
``MESOS_MASTER=zk://...`` a :class:`~.detector.LeaderDetector` names the leader, read from
ZooKeeper before each subscription, and a change of leader there ends the current stream
so the framework resubscribes at the new one), then
reads the chunked response through a :class:`~.recordio.RecordIODecoder` and hands each
event to a :class:`SchedulerListener`. A watchdog (``asyncio.timeout``, rescheduled on every
chunk) resubscribes when nothing, not even a HEARTBEAT, arrived for a few heartbeat
intervals; a dropped stream resubscribes at once, then with jittered exponential backoff.
Resubscribing sends the framework id, so the master keeps our tasks (within
``failover_timeout``). A second task sends calls (ACCEPT, DECLINE, KILL, ...) in the order
they were queued, each as its own POST carrying the ``Mesos-Stream-Id``, once a
subscription is up; calls that only make sense on the stream they were made for (ACCEPT
and DECLINE name its offers) are dropped when the stream was replaced meanwhile. A call the
master refuses as "not subscribed" (403, or 400 for a stale stream id) ends our stream so
it resubscribes, and goes out again on the new one, and so does a call a master answers with
a redirect (it no longer leads: the resubscription follows the redirect); any other failure (a timeout, a 5xx, a
bug) is logged and handed to the listener's ``on_call_failed``, which decides how to
recover; nothing ends the sender but close() or a fatal error.

Errors that retrying cannot fix end the client at once with a clear message: 401 (wrong
credentials), a refused TLS certificate, a SUBSCRIBE the master rejects as malformed,
another scheduler taking the framework over. Everything else is retried on the next
master with backoff: connection failures, 5xx, and protocol errors (a reply without
``Mesos-Stream-Id``, a redirect loop or a redirect naming no host, a broken RecordIO record
or a non-JSON event mid-stream, SUBSCRIBED without a framework id), which a proxy or a
master mid-election produces and another master may not. The very first subscription gives
up after ``first_subscribe_deadline_s`` naming what each master tried did.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import ssl
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from .config import MesosConfig
from .detector import LeaderDetector
from .errors import FrameworkRemoved, MesosAuthError, MesosError, MesosProtocolError, MesosUnreachable
from .recordio import RecordIODecoder, decode_event

log = logging.getLogger("tfcoord.mesos")

SCHEDULER_PATH = "/api/v1/scheduler"
#: A leader redirect leads to the leader; a longer chain than this is a loop between masters.
MAX_REDIRECTS = 5
#: Jittered exponential backoff between subscription attempts: quick after a blip, capped so a
#: master coming back is found within seconds.
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 10.0
#: A call is one small POST the master answers (202) before acting on it.
CALL_TIMEOUT_S = 30.0
#: Calls bound to the stream that was current when they were made.
STREAM_BOUND_CALLS = frozenset({"ACCEPT", "DECLINE"})
#: A failed call is sent at most this often in all (see :meth:`SchedulerClient.resend`): a
#: master that keeps refusing one is broken, and the stream's reader finds out soon enough.
MAX_CALL_ATTEMPTS = 5
#: Mesos' default when SUBSCRIBED does not say (a real master always does).
DEFAULT_HEARTBEAT_S = 15.0
#: Before Python 3.12.8 (and in 3.13.0) closing an SSL transport mid-stream sends close_notify
#: and keeps the socket open until the peer answers (cpython#118960): a subscription stream
#: closed just before the loop ends leaked its socket. aiohttp aborts such transports when
#: asked; on fixed Pythons it warns that the option is moot, so ask only where it is needed.
SSL_CLEANUP_NEEDED = sys.version_info < (3, 12, 8) or (3, 13, 0) <= sys.version_info < (3, 13, 1)


@dataclass(frozen=True)
class Call:
    """One queued call: its type and fields, the subscription it was made on, its attempt."""

    type: str
    fields: dict[str, Any] = field(hash=False)
    generation: int
    attempt: int = 0


class SchedulerListener(Protocol):
    """What the framework hears. Called on the event loop; must not block."""

    def framework_info(self) -> dict[str, Any]:
        """The FrameworkInfo to subscribe with (without ``id``; the client adds it)."""

    def suppressed_roles(self) -> list[str]:
        """Roles to subscribe suppressed (no offers wanted yet)."""

    def on_subscribed(self, framework_id: str, resubscribed: bool) -> None: ...

    def on_event(self, event: dict[str, Any]) -> None:
        """OFFERS, RESCIND, UPDATE, MESSAGE, FAILURE, ERROR (HEARTBEAT and SUBSCRIBED are handled here)."""

    def on_disconnected(self, reason: str) -> None: ...

    def on_framework_removed(self, reason: str) -> None:
        """The master forgot our framework and killed its tasks; a fresh one subscribes next."""

    def on_fatal(self, error: MesosError) -> None:
        """The client gave up; it sends nothing more."""

    def on_call_failed(self, call: Call, reason: str) -> None:
        """A call was not taken (timed out, 5xx, refused) while the stream may well be up:
        whatever the call was for did not happen, and the framework decides how to recover
        (:meth:`SchedulerClient.resend` it, reconcile, revive...)."""


def backoff(initial_s: float = BACKOFF_INITIAL_S, cap_s: float = BACKOFF_MAX_S) -> Iterator[float]:
    """Full-jitter exponential backoff."""
    n = 0
    while True:
        yield random.uniform(initial_s / 2, min(cap_s, initial_s * 2**n))
        n += 1


def resolve_redirect(current: str, location: str) -> str:
    """The base URL a 307 points at; ``//host:port/path`` keeps the current scheme."""
    scheme = urlsplit(current).scheme
    target = urlsplit(f"{scheme}:{location}" if location.startswith("//") else location)
    if not target.netloc:
        raise MesosProtocolError(f"a master redirected to {location!r}, which names no host")
    return f"{target.scheme or scheme}://{target.netloc}"


def basic_auth(username: str, password: str) -> str:
    """The ``Authorization`` header value of HTTP Basic auth (RFC 7617, UTF-8)."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def ssl_context(config: MesosConfig) -> ssl.SSLContext | None:
    if not config.ssl:
        return None
    try:
        ctx = ssl.create_default_context(cafile=config.ca_file)
    except (OSError, ssl.SSLError) as e:
        raise MesosError(f"cannot read the CA file MESOS_CA_FILE={config.ca_file}: {e}") from None
    if not config.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class _StreamEnded(Exception):
    """The subscription stream ended; the reason says how."""


class _NotSubscribed(MesosError):
    """A call found no stream to go with, or the master says ours is not its current one."""


class SchedulerClient:
    """One framework's connection to the Mesos masters. See the module docstring."""

    def __init__(
        self, config: MesosConfig, listener: SchedulerListener, framework_id: str | None = None
    ) -> None:
        self.config = config
        self.listener = listener
        self.framework_id = framework_id
        self.heartbeat_interval_s = DEFAULT_HEARTBEAT_S
        #: The leading master's MasterInfo from its SUBSCRIBED event (``version``...).
        self.master_info: dict[str, Any] = {}
        self.subscriptions = 0
        self.error: MesosError | None = None
        self._ssl = ssl_context(config)
        self._headers = (
            {"Authorization": basic_auth(config.username, config.password or "")} if config.username else {}
        )
        self._session: aiohttp.ClientSession | None = None
        self._base: str | None = None  # the master holding our stream
        self._stream_id: str | None = None
        self._generation = 0
        self._up = asyncio.Event()
        self._done = asyncio.Event()  # closing, or fatal
        #: Ends a pause between subscription attempts: closing, fatal, a new leader in ZooKeeper.
        self._poke = asyncio.Event()
        self._calls: deque[Call] = deque()
        self._have_calls = asyncio.Event()
        #: Set, and replaced, whenever a subscription is made or the client ends.
        self._stream_changed = asyncio.Event()
        #: The current stream's watchdog; a call the master refuses as "not subscribed" fires it.
        self._watchdog: asyncio.Timeout | None = None
        self._drop_reason: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._detector = (
            LeaderDetector(config.zookeeper, config.scheme, self._leader_changed)
            if config.zookeeper is not None
            else None
        )

    @property
    def subscribed(self) -> bool:
        return self._up.is_set()

    @property
    def leader(self) -> str | None:
        """The base URL of the master holding our stream (the leader), while subscribed."""
        return self._base if self._up.is_set() else None

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe; return once subscribed.

        Raises:
            MesosError: a fatal error (credentials, TLS, no master reachable in time).
        """
        self._session = aiohttp.ClientSession(
            headers=self._headers, connector=aiohttp.TCPConnector(enable_cleanup_closed=SSL_CLEANUP_NEEDED)
        )
        if self._detector is not None:
            await self._detector.start()
        self._tasks = [
            asyncio.create_task(self._run(), name="mesos-subscription"),
            asyncio.create_task(self._send_loop(), name="mesos-calls"),
        ]
        up = asyncio.create_task(self._up.wait())
        done = asyncio.create_task(self._done.wait())
        try:
            await asyncio.wait({up, done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
            done.cancel()
        if self.error is not None:
            await self.close(teardown=False)
            raise self.error

    async def close(self, teardown: bool) -> None:
        """Stop; with ``teardown`` first tell the master to end the framework (killing its tasks)."""
        if teardown and self._up.is_set() and self.error is None:
            try:
                await self._post("TEARDOWN", {})
                log.info("framework %s torn down", self.framework_id)
            except (aiohttp.ClientError, OSError, TimeoutError, MesosError) as e:
                log.warning("TEARDOWN of framework %s failed: %s", self.framework_id, e)
        self._closing = True
        self._done.set()
        self._poke.set()
        self._changed()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._detector is not None:
            await self._detector.close()

    def call(self, call_type: str, **fields: Any) -> None:
        """Queue a call; it is sent, in order, once a subscription is up."""
        self._enqueue(Call(call_type, fields, self._generation))

    def resend(self, call: Call, delay_s: float) -> bool:
        """Queue a failed call again after ``delay_s``, unless it has had its attempts.

        Returns:
            False when nothing will be sent: :data:`MAX_CALL_ATTEMPTS` reached, or closing.
        """
        if call.attempt + 1 >= MAX_CALL_ATTEMPTS or self._done.is_set():
            log.warning("giving up on Mesos call %s after %d attempts", call.type, call.attempt + 1)
            return False
        again = Call(call.type, call.fields, call.generation, call.attempt + 1)
        asyncio.get_running_loop().call_later(delay_s, self._enqueue, again)
        return True

    def _enqueue(self, call: Call, front: bool = False) -> None:
        if front:
            self._calls.appendleft(call)
        else:
            self._calls.append(call)
        self._have_calls.set()

    def _changed(self) -> None:
        self._stream_changed.set()
        self._stream_changed = asyncio.Event()

    # -- the subscription ---------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        first_deadline = loop.time() + self.config.first_subscribe_deadline_s
        masters = list(self.config.masters)
        i = 0
        delays = backoff()
        errors: dict[str, str] = {}
        while not self._closing:
            if self._detector is not None:
                detected = await self._leader(first_deadline, errors)
                if detected is None:
                    return
                base = detected
            else:
                base = self._base or masters[i % len(masters)]
            try:
                await self._subscribe(base)
            except _StreamEnded as e:
                reason = str(e)
                log.warning("Mesos event stream from %s ended: %s; resubscribing", base, reason)
                delays = backoff()
                if self._detector is not None:
                    self._base = None  # resubscribe where ZooKeeper says the leader is now
                self._disconnected(reason)
                await self._pause(0.0)
                continue
            except FrameworkRemoved as e:
                log.error("framework %s: %s; subscribing a new framework", self.framework_id, e)
                self.framework_id = None
                self._disconnected(str(e))
                self._notify("on_framework_removed", str(e))
                continue
            except MesosProtocolError as e:
                # Before MesosError, which it subclasses: a proxy in front of a master, a
                # master mid-election or one broken record is no reason to end the framework
                # while another master (or this one, a moment later) may answer properly.
                errors[base] = _describe(e)
                log.warning(
                    "Mesos master %s broke the v1 scheduler protocol: %s; trying again", base, errors[base]
                )
                self._base = None
                i += 1
                self._disconnected(errors[base])
            except MesosError as e:  # fatal: credentials, a rejected SUBSCRIBE, a takeover
                self._fatal(e)
                return
            except aiohttp.ClientConnectorCertificateError as e:  # retrying cannot make it trusted
                self._fatal(MesosError(f"cannot subscribe at {base}: {_describe(e)}"))
                return
            except Exception as e:  # a bug here must not end the subscription for good
                if not isinstance(e, (aiohttp.ClientError, OSError, TimeoutError)):
                    log.exception("subscribing at Mesos master %s failed unexpectedly", base)
                plain = _plain_http_answer(e)
                if plain is not None:  # MESOS_SSL=true against a plain listener: no retry helps
                    self._fatal(
                        MesosError(
                            f"the Mesos master at {base} speaks plain HTTP, not HTTPS ({plain}): check MESOS_SSL "
                            "(unset it, or name the master http://host:port in MESOS_MASTER), or enable TLS on the master"
                        )
                    )
                    return
                errors[base] = _describe(e)
                log.warning("cannot subscribe at Mesos master %s: %s", base, errors[base])
                self._base = None
                i += 1
                self._disconnected(errors[base])
            if self.subscriptions == 0 and loop.time() >= first_deadline:
                tried = "; ".join(f"{m}: {why}" for m, why in errors.items())
                self._fatal(
                    MesosUnreachable(
                        f"no Mesos master accepted the subscription within {self.config.first_subscribe_deadline_s:g} s "
                        f"({tried}); check MESOS_MASTER and that the masters are up and reachable from here"
                    )
                )
                return
            await self._pause(next(delays))

    async def _leader(self, first_deadline: float, errors: dict[str, str]) -> str | None:
        """The master to subscribe at: the last one, or where ZooKeeper says the leader is.
        None (the framework failed, saying why) when ZooKeeper names none before the first
        subscription's deadline."""
        assert self._detector is not None
        detected = self._base or await self._detector.wait_leader(
            None if self.subscriptions else max(0.0, first_deadline - asyncio.get_running_loop().time())
        )
        if detected is None:  # only before the first subscription: past its deadline
            self._fatal(
                MesosUnreachable(
                    f"no leading Mesos master found in ZooKeeper {self.config.zookeeper} within "
                    f"{self.config.first_subscribe_deadline_s:g} s ({self._detector.why}"
                    + "".join(f"; {m}: {why}" for m, why in errors.items())
                    + "); check MESOS_MASTER and that ZooKeeper and the masters are up and reachable from here"
                )
            )
        return detected

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, less if closing, or if ZooKeeper names a new leader meanwhile."""
        try:
            async with asyncio.timeout(seconds):
                await self._poke.wait()
        except TimeoutError:
            pass
        self._poke.clear()

    def _ssl_for(self, url: str) -> ssl.SSLContext | bool:
        """aiohttp's ``ssl`` argument for a request to ``url``: :func:`ssl_context`'s context for
        an https master, else True (aiohttp's default, which ssl=None also meant; a plain http
        URL ignores it)."""
        return self._ssl if self._ssl is not None and url.startswith("https://") else True

    def _subscribe_body(self) -> dict[str, Any]:
        info = dict(self.listener.framework_info())
        body: dict[str, Any] = {"type": "SUBSCRIBE", "subscribe": {"framework_info": info}}
        suppressed = self.listener.suppressed_roles()
        if suppressed:
            body["subscribe"]["suppressed_roles"] = suppressed
        if self.framework_id:
            info["id"] = {"value": self.framework_id}
            body["framework_id"] = {"value": self.framework_id}
        return body

    async def _subscribe(self, base: str) -> None:
        assert self._session is not None
        url = base
        for _ in range(MAX_REDIRECTS + 1):
            try:
                async with asyncio.timeout(self.config.connect_timeout_s):
                    resp = await self._session.post(
                        url + SCHEDULER_PATH,
                        json=self._subscribe_body(),
                        headers={"Accept": "application/json"},
                        allow_redirects=False,
                        ssl=self._ssl_for(url),
                        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
                    )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                # A TLS listener drops a plain HTTP request without a word: ask it for a handshake.
                hung_up = not isinstance(e, aiohttp.ClientConnectorError)
                if (
                    hung_up
                    and url.startswith("http://")
                    and await _speaks_tls(url, self.config.connect_timeout_s)
                ):
                    raise MesosError(
                        f"the Mesos master at {url} speaks HTTPS and hung up on plain HTTP: set MESOS_SSL=true "
                        "(and MESOS_CA_FILE to the CA that signed its certificate)"
                    ) from e
                raise
            if resp.status not in (301, 302, 303, 307, 308):
                break
            location = resp.headers.get("Location", "")
            resp.release()
            new = resolve_redirect(url, location)
            log.info("Mesos master %s is not the leader; following its redirect to %s", url, new)
            url = new
        else:
            raise MesosProtocolError(
                f"more than {MAX_REDIRECTS} redirects starting at {base}; masters disagree on the leader"
            )
        try:
            await self._check_subscribe(url, resp)
            self._base = url
            await self._read(url, resp)
        finally:
            resp.close()

    async def _check_subscribe(self, url: str, resp: aiohttp.ClientResponse) -> None:
        if resp.status == 200:
            if "Mesos-Stream-Id" not in resp.headers:
                raise MesosProtocolError(
                    f"{url} answered SUBSCRIBE without a Mesos-Stream-Id header; is it a Mesos master?"
                )
            return
        text = (await resp.text(errors="replace")).strip()[:500]
        if resp.status == 401:
            who = f"user {self.config.username!r}" if self.config.username else "no credentials"
            raise MesosAuthError(
                f"the Mesos master at {url} refused our credentials (HTTP 401, {who}): set MESOS_USERNAME "
                "and MESOS_PASSWORD to a principal and secret the master accepts"
            )
        if resp.status >= 500:  # 503: no leader elected yet, or the master is recovering
            raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status, message=text)
        raise MesosError(f"the Mesos master at {url} rejected SUBSCRIBE (HTTP {resp.status}): {text}")

    async def _read(self, url: str, resp: aiohttp.ClientResponse) -> None:
        loop = asyncio.get_running_loop()
        decoder = RecordIODecoder()
        grace = self.config.connect_timeout_s  # until SUBSCRIBED tells the heartbeat interval
        self._stream_id = resp.headers["Mesos-Stream-Id"]
        try:
            async with asyncio.timeout(grace) as watchdog:
                self._watchdog = watchdog
                while True:
                    chunk = await resp.content.readany()
                    if not chunk:
                        raise _StreamEnded("the master closed it")
                    for record in decoder.feed(chunk):
                        self._dispatch(url, decode_event(record))
                        if self._up.is_set():
                            grace = self.heartbeat_interval_s * self.config.heartbeat_misses
                    if decoder.broken is not None:  # bad bytes after good records in this chunk
                        raise decoder.broken
                    watchdog.reschedule(loop.time() + grace)
        except TimeoutError:
            reason, self._drop_reason = self._drop_reason, None
            raise _StreamEnded(reason or f"no event, not even a heartbeat, for {grace:g} s") from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError) as e:
            raise _StreamEnded(f"the connection broke ({_describe(e)})") from None
        finally:
            self._watchdog = None

    def _dispatch(self, url: str, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "HEARTBEAT":
            return
        if kind == "SUBSCRIBED":
            sub = event.get("subscribed") or {}
            fid = (sub.get("framework_id") or {}).get("value")
            if not isinstance(fid, str) or not fid:
                raise MesosProtocolError(f"SUBSCRIBED without a framework id from {url}")
            resubscribed = fid == self.framework_id
            self.framework_id = fid
            self.heartbeat_interval_s = float(sub.get("heartbeat_interval_seconds") or DEFAULT_HEARTBEAT_S)
            self.master_info = sub.get("master_info") or {}
            self.subscriptions += 1
            self._generation += 1
            self._up.set()
            self._changed()
            log.info(
                "framework %s %s at %s (heartbeat every %g s)",
                fid,
                "resubscribed" if resubscribed else "subscribed",
                url,
                self.heartbeat_interval_s,
            )
            self._notify("on_subscribed", fid, resubscribed)
            return
        if kind == "ERROR":
            message = str((event.get("error") or {}).get("message", ""))
            if "removed" in message.lower():
                raise FrameworkRemoved(f"the master says: {message}")
            if "failed over" in message.lower():
                raise MesosError(
                    f"another scheduler took over framework {self.framework_id} ({message}); this one stops"
                )
            log.error("Mesos master %s sent an error: %s", url, message)
        self._notify("on_event", event)

    def _leader_changed(self, leader: str | None) -> None:
        """ZooKeeper names a new leader: a stream held by another master is ended, and the
        framework resubscribes at the new leader (a master that lost its leadership may
        keep a stream open for a while, or hang)."""
        base = self._base
        if leader is not None:
            self._poke.set()  # between attempts: try the new leader now, not after the backoff
        if leader is None or base is None or not self._up.is_set():
            return
        if urlsplit(leader).netloc != urlsplit(base).netloc:
            self._drop_stream(self._generation, f"ZooKeeper names {leader} the leading master now")

    def _notify(self, method: str, *args: Any) -> None:
        try:
            getattr(self.listener, method)(*args)
        except Exception:  # a bug in the framework must not kill the subscription
            log.exception("Mesos framework failed handling %s", method)

    def _disconnected(self, reason: str) -> None:
        was_up = self._up.is_set()
        self._up.clear()
        self._stream_id = None
        if was_up:
            self._notify("on_disconnected", reason)

    def _fatal(self, error: MesosError) -> None:
        log.error("Mesos framework stops: %s", error)
        self.error = error
        self._up.clear()
        self._done.set()
        self._poke.set()
        self._changed()
        self._notify("on_fatal", error)

    # -- calls --------------------------------------------------------------------------

    async def _next_call(self) -> Call:
        while not self._calls:
            self._have_calls.clear()
            await self._have_calls.wait()
        return self._calls.popleft()

    async def _send_loop(self) -> None:
        # Nothing may end this loop but close() or a fatal error: every later call (KILL,
        # ACKNOWLEDGE, ...) would be lost without a word.
        while True:
            call = await self._next_call()
            await self._up.wait()
            if call.type in STREAM_BOUND_CALLS and call.generation != self._generation:
                log.debug("dropping %s made for an earlier subscription", call.type)
                continue
            generation = self._generation
            try:
                await self._post(call.type, call.fields)
            except MesosAuthError as e:
                self._fatal(e)
                return
            except _NotSubscribed as e:
                # Our stream is not (or no longer) the master's: resubscribe, and send the
                # call on the next stream (ACCEPT and DECLINE named this stream's offers).
                log.warning("Mesos call %s: %s; resubscribing", call.type, e)
                if call.type in STREAM_BOUND_CALLS or call.attempt + 1 >= MAX_CALL_ATTEMPTS:
                    self._notify("on_call_failed", call, str(e))
                else:
                    self._enqueue(replace(call, attempt=call.attempt + 1), front=True)
                self._drop_stream(generation, str(e))
                await self._until_resubscribed(generation)
            except (aiohttp.ClientError, OSError, TimeoutError, MesosError) as e:
                log.warning("Mesos call %s failed: %s", call.type, _describe(e))
                self._notify("on_call_failed", call, _describe(e))
            except Exception as e:  # a bug here must not silence every call after this one
                log.exception("Mesos call %s failed unexpectedly", call.type)
                self._notify("on_call_failed", call, f"{type(e).__name__}: {e}")

    def _drop_stream(self, generation: int, reason: str) -> None:
        """End the current stream (if it is still ``generation``'s): the reader resubscribes."""
        if self._generation == generation and self._watchdog is not None:
            self._drop_reason = reason
            self._watchdog.reschedule(asyncio.get_running_loop().time())

    async def _until_resubscribed(self, generation: int) -> None:
        while self._generation == generation and not self._done.is_set():
            await self._stream_changed.wait()

    async def _post(self, call_type: str, fields: dict[str, Any]) -> None:
        if self._session is None or self._base is None or self._stream_id is None:
            raise _NotSubscribed("no subscription is up to send it on")
        body = {"type": call_type, "framework_id": {"value": self.framework_id}, **fields}
        headers = {"Mesos-Stream-Id": self._stream_id}
        url = self._base
        async with asyncio.timeout(CALL_TIMEOUT_S):
            async with self._session.post(
                url + SCHEDULER_PATH,
                json=body,
                headers=headers,
                allow_redirects=False,
                ssl=self._ssl_for(url),
            ) as resp:
                if resp.status == 202:
                    return
                text = (await resp.text(errors="replace")).strip()[:500]
        if resp.status == 401:
            raise MesosAuthError(
                f"the Mesos master at {url} refused our credentials for {call_type} (HTTP 401)"
            )
        if resp.status in (301, 302, 303, 307, 308):
            # Our master no longer leads: resubscribing follows its redirect to the leader.
            raise _NotSubscribed(
                f"the master at {url} no longer leads (HTTP {resp.status} to {resp.headers.get('Location', '?')})"
            )
        # 403 "Framework is not subscribed"; 400 "The stream ID ... didn't match": our stream is stale.
        if resp.status == 403 or (resp.status == 400 and "stream id" in text.lower()):
            raise _NotSubscribed(
                f"the master at {url} says this framework is not subscribed on our stream "
                f"(HTTP {resp.status}: {text})"
            )
        raise MesosError(f"{call_type} answered HTTP {resp.status}: {text}")


#: OpenSSL's reasons for a TLS handshake answered by something that is not TLS: an HTTP
#: reply ("HTTP/1.1 400") read as a TLS record header (WRONG_VERSION_NUMBER before OpenSSL 3.2,
#: RECORD_LAYER_FAILURE since).
_NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL"})


def _plain_http_answer(e: BaseException) -> ssl.SSLError | None:
    """The TLS error of a handshake the peer answered in plain text, if that is what ``e`` is."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, ssl.SSLError):
            reason = getattr(x, "reason", None) or ""
            if reason in _NOT_TLS_REASONS or any(
                r.lower().replace("_", " ") in str(x).lower() for r in _NOT_TLS_REASONS
            ):
                return x
        todo += [x.__cause__, x.__context__, getattr(x, "os_error", None)]
    return None


async def _speaks_tls(url: str, timeout_s: float) -> bool:
    """Whether ``url``'s host:port completes a TLS handshake (certificates not checked)."""
    parts = urlsplit(url)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(parts.hostname, parts.port, ssl=ctx)
    except (OSError, TimeoutError):  # ssl.SSLError is an OSError
        return False
    writer.transport.abort()  # no close_notify exchange: nothing more is said on it
    return True


def _describe(e: BaseException) -> str:
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return (
            f"its TLS certificate is not trusted ({e.certificate_error}); give the CA that signed it with "
            "MESOS_CA_FILE (MESOS_VERIFY_SSL=false only in a controlled test environment)"
        )
    if isinstance(e, TimeoutError):
        return "timed out"
    return str(e) or type(e).__name__
