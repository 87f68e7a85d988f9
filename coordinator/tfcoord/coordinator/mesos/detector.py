"""Finding the leading Mesos master in ZooKeeper (``MESOS_MASTER=zk://host:2181,host2:2181/mesos``).

Mesos masters elect their leader in ZooKeeper: each master, at start, creates an ephemeral
sequential znode ``<path>/json.info_<10-digit sequence>`` holding its ``MasterInfo`` as JSON
(``{"id", "ip", "port", "pid": "master@ip:port", "hostname", "version", "address":
{"hostname", "ip", "port"}}``), and the master whose znode has the **lowest sequence** leads.
A master that dies or loses its ZooKeeper session loses its znode with it, and the next in
line leads. (Masters before Mesos 1.0 also wrote ``info_<seq>`` znodes in protobuf binary;
those are ignored here: every Mesos that speaks the v1 HTTP API writes ``json.info_``.)

:func:`leader_znode` and :func:`master_url` are the pure rules; :class:`LeaderDetector`
keeps a kazoo session and a watch on the path, and hands each change of leader to the event
loop. It only reads: it never creates a znode in the masters' ZooKeeper.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .config import ZooKeeperUrl
from .errors import MesosConfigError, MesosProtocolError

log = logging.getLogger("tfcoord.mesos")

#: The label Mesos masters give their znodes (``MASTER_INFO_JSON_LABEL``); ZooKeeper appends
#: the sequence.
MASTER_INFO_LABEL = "json.info_"
_ZNODE = re.compile(re.escape(MASTER_INFO_LABEL) + r"(\d+)")
#: kazoo's session timeout: a detector cut off from ZooKeeper longer than this starts a new
#: session (and reads the leader afresh).
SESSION_TIMEOUT_S = 10.0


def leader_znode(children: Iterable[str]) -> str | None:
    """The leading master's znode among a path's children: the lowest ``json.info_`` sequence."""
    best: tuple[int, str] | None = None
    for name in children:
        m = _ZNODE.fullmatch(name)
        if m is not None and (best is None or int(m.group(1)) < best[0]):
            best = (int(m.group(1)), name)
    return best[1] if best is not None else None


def master_url(data: bytes, scheme: str) -> str:
    """The base URL of the master whose ``MasterInfo`` JSON is ``data``.

    ``address.hostname`` is preferred (a master started with ``--hostname`` advertises a name
    its certificate holds), then ``address.ip``, then the host of ``pid`` (``master@ip:port``,
    the only address masters before 1.0 wrote).

    Raises:
        MesosProtocolError: not JSON, or a MasterInfo naming no address.
    """
    try:
        info: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise MesosProtocolError(f"a master's znode does not hold MasterInfo JSON: {e}") from None
    if not isinstance(info, dict):
        raise MesosProtocolError("a master's znode does not hold a MasterInfo JSON object")
    raw_address = info.get("address")
    address: dict[str, Any] = raw_address if isinstance(raw_address, dict) else {}
    host: Any = address.get("hostname") or address.get("ip")
    port: Any = address.get("port") or info.get("port")
    pid = info.get("pid")
    if (not host or not port) and isinstance(pid, str) and "@" in pid:
        pid_host, _, pid_port = pid.partition("@")[2].rpartition(":")
        host, port = host or pid_host, port or pid_port
    if not isinstance(host, str) or not host or not str(port).isdigit():
        raise MesosProtocolError(f"a master's MasterInfo names no address: {json.dumps(info)[:300]}")
    name = f"[{host}]" if ":" in host else host
    return f"{scheme}://{name}:{int(port)}"


class LeaderDetector:
    """Watches ``url.path`` in ZooKeeper; :attr:`leader` is the leading master's base URL.

    kazoo runs its own threads; every change is handed to the event loop, where ``on_change``
    (if given) hears each new leader (None while no master leads). Waiting for a leader is an
    event, never a poll.
    """

    def __init__(
        self, url: ZooKeeperUrl, scheme: str, on_change: Callable[[str | None], None] | None = None
    ) -> None:
        try:
            from kazoo.client import KazooClient
            from kazoo.protocol.states import KazooState
            from kazoo.retry import KazooRetry
        except ImportError:
            raise MesosConfigError(
                f"MESOS_MASTER={url} needs the ZooKeeper client kazoo: pip install 'tfcoord-coordinator[zookeeper]'"
            ) from None
        self.url = url
        self.scheme = scheme
        self.leader: str | None = None
        #: Why there is no leader now (ZooKeeper unreachable, no master registered, bad data).
        self.why = "ZooKeeper not reached yet"
        self._on_change = on_change
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        auth = [("digest", url.credentials)] if url.credentials else None
        self._zk = KazooClient(
            hosts=url.servers,
            timeout=SESSION_TIMEOUT_S,
            connection_retry=KazooRetry(max_tries=-1, max_delay=5.0),
            auth_data=auth,
        )
        self._connected, self._lost = KazooState.CONNECTED, KazooState.LOST
        self._zk.add_listener(self._on_state)
        self._closed = False
        self._reading = threading.Lock()  # one read at a time: a later read sees later state

    async def start(self) -> None:
        """Start connecting (in kazoo's threads); the first read follows once connected."""
        self._loop = asyncio.get_running_loop()
        self._zk.start_async()

    async def close(self) -> None:
        self._closed = True
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        self._zk.stop()
        self._zk.close()

    async def wait_leader(self, timeout_s: float | None, *, besides: str | None = None) -> str | None:
        """The leader's base URL once one (other than ``besides``) is known; None if none
        within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while self.leader is None or self.leader == besides:
                    changed = self._changed
                    await changed.wait()
        except TimeoutError:
            return None
        return self.leader

    # -- kazoo's threads ------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        # Called in kazoo's connection thread, which must not block: read in a worker.
        if state == self._connected and not self._closed:
            self._zk.handler.spawn(self._read)
        elif state == self._lost and not self._closed:
            self._hand_over(None, f"the ZooKeeper session at {self.url} expired")

    def _watch(self, _event: object) -> None:
        # Watches fire in kazoo's callback thread: read in a worker, never block it.
        if not self._closed:
            self._zk.handler.spawn(self._read)

    def _read(self) -> None:
        with self._reading:
            self._read_leader()

    def _read_leader(self) -> None:
        """Read the children (re-arming the watch) and the leader's MasterInfo."""
        from kazoo.exceptions import KazooException, NoNodeError

        if self._closed:
            return
        try:
            try:
                children = self._zk.get_children(self.url.path, watch=self._watch)
            except NoNodeError:
                # No master ever registered: watch for the path to appear.
                if self._zk.exists(self.url.path, watch=self._watch) is None:
                    self._hand_over(
                        None, f"no znode {self.url.path} in ZooKeeper (no master registered there)"
                    )
                    return
                children = self._zk.get_children(self.url.path, watch=self._watch)
            name = leader_znode(children)
            if name is None:
                self._hand_over(
                    None, f"no master has registered under {self.url.path} (no {MASTER_INFO_LABEL} znode)"
                )
                return
            try:
                data, _ = self._zk.get(f"{self.url.path}/{name}")
            except NoNodeError:  # gone between the listing and the read: the watch fires again
                return
            try:
                self._hand_over(master_url(data, self.scheme), "")
            except MesosProtocolError as e:
                self._hand_over(None, f"{self.url.path}/{name}: {e}")
        except KazooException as e:
            # Connection loss mid-read: the state listener reads again once reconnected.
            log.warning("reading the leading Mesos master from %s failed: %s", self.url, e)
        except Exception:  # a bug here must not silence leader changes for good
            log.exception("reading the leading Mesos master from %s failed", self.url)

    def _hand_over(self, leader: str | None, why: str) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._set, leader, why)
            except RuntimeError:  # the loop closed meanwhile
                pass

    # -- the event loop ---------------------------------------------------------------------

    def _set(self, leader: str | None, why: str) -> None:
        if self._closed:
            return
        self.why = why
        if leader == self.leader:
            return
        if leader is not None:
            log.info("ZooKeeper %s names %s the leading Mesos master", self.url, leader)
        else:
            log.warning("no leading Mesos master in ZooKeeper %s: %s", self.url, why)
        self.leader = leader
        self._changed.set()
        self._changed = asyncio.Event()
        if self._on_change is not None:
            try:
                self._on_change(leader)
            except Exception:
                log.exception("handling a new leading Mesos master failed")
