"""TensorFlowOnSpark's ``TFManager``: named queues, served by a tfcoord feed server.

tfcoord's nodes are fed over the network (:mod:`tfcoord.node.datafeed`) and need no
manager; this module keeps TensorFlowOnSpark's API for code that builds one itself, as its
DataFeed unit tests do: ``mgr = TFManager.start(authkey, ["input", "output"])``, fill
``mgr.get_queue("input")``, then read it through ``TFNode.DataFeed(mgr)``. The manager is a
:class:`~tfcoord.node.datafeed.FeedServer` (the one feed: its queues, partitions, end
markers and results) and a listening socket for feeders in other processes:

* ``get_queue(name).put(item)`` in the manager's process feeds ``item`` into queue ``name``;
  TensorFlowOnSpark's ``marker.EndPartition()`` ends a partition (inference batches stop
  there), ``None`` ends the queue's feed. ``get()`` takes what ``batch_results`` sent back
  to such items (``output``), else a record of the queue.
* ``connect(mgr.address, authkey)`` in another process gives a manager whose queues' ``put``
  feeds over the feed protocol (authenticated with ``authkey``, TLS pinned in ``"remote"``
  mode): each partition is sent at its ``EndPartition`` (or the final ``None``), and returns
  once the consumer has taken it, as TensorFlowOnSpark's feeders ``join`` the queue.
* ``mode="local"`` listens on the loopback interface; ``"remote"`` on this host's own address
  (never every interface) with TLS. An empty ``authkey`` is replaced by a random one
  (``mgr.authkey``). Nothing received is unpickled: records travel as msgpack.

``get(key)`` and ``set(key, value)`` keep small values in the manager's process; ``state``
is the feed's: ``"terminating"`` once ``DataFeed.terminate()`` ran, ``"stopped"`` once
stopped, and ``set("state", "terminating" | "stopped")`` (also from a connected manager)
terminates or stops the feed.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tfcoord.node import feedtls
from tfcoord.node.datafeed import FeedServer
from tfcoord.node.feeder import FeedPlan, FeedTarget, control, feed

from . import marker, util

#: A random authkey when the caller gives none (remote mode): as long as a job token.
AUTHKEY_BYTES = 32
#: How the feed's stop says who stopped it.
STOP_REASON = "TFManager state set to 'stopped'"


class ManagerAddress(tuple[str, int]):
    """``(host, port)`` of a manager's feed port, carrying what a feeder needs besides the
    authkey: the feed's name and, in remote mode, the TLS certificate's fingerprint to pin."""

    feed: str
    pin: str

    def __new__(cls, host: str, port: int, *, feed: str, pin: str = "") -> ManagerAddress:
        self = super().__new__(cls, (host, int(port)))
        self.feed, self.pin = feed, pin
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_address, (self[0], self[1], self.feed, self.pin))


def _address(host: str, port: int, feed: str, pin: str) -> ManagerAddress:
    return ManagerAddress(host, port, feed=feed, pin=pin)


def _key(authkey: bytes | str | None) -> bytes:
    # TensorFlowOnSpark's own tests pass a str.
    if authkey is None:
        return b""
    return authkey.encode("utf-8") if isinstance(authkey, str) else bytes(authkey)


class Queue:
    """One named queue of a manager in this process (TensorFlowOnSpark's queue proxy)."""

    def __init__(self, server: FeedServer, name: str) -> None:
        self._server = server
        self.name = name
        self._partition: int | None = None
        self._lock = threading.Lock()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Feed ``item``; ``EndPartition()`` ends a partition, ``None`` the queue's feed."""
        with self._lock:
            if item is None or isinstance(item, marker.EndPartition):
                if self._partition is not None:
                    self._server.end_local(self._partition)
                    self._partition = None
                if item is None:
                    self._server.end_queue(self.name)
                return
            if self._partition is None:
                self._partition = self._server.open_local(self.name)
            self._server.put_local(self._partition, [item])

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next result sent back to this process on this queue, else its next record;
        None once its feed ended.

        Raises:
            queue.Empty: nothing within ``timeout`` (at once unless ``block``).
        """
        return self._server.get_local(self.name, timeout if block else 0.0)

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def task_done(self) -> None:
        """Accepted for TensorFlowOnSpark's queue API: the feed counts what its consumer took."""

    def join(self) -> None:
        """Accepted for TensorFlowOnSpark's queue API (a feeder in another process waits in ``put``)."""

    def qsize(self) -> int:
        return self._server.local_size(self.name)

    def empty(self) -> bool:
        return self.qsize() == 0


class TFManager:
    """A manager serving ``get_queue(name)``, ``get(key)`` and ``set(key, value)`` (see the module's docstring).

    Attributes:
        address: where feeders in other processes connect (:class:`ManagerAddress`).
        authkey: what they must present.
        server: the feed server holding the queues (what ``TFNode.DataFeed`` reads).
    """

    def __init__(
        self, server: FeedServer, address: ManagerAddress, authkey: bytes, queues: Sequence[str]
    ) -> None:
        self.server = server
        self.address = address
        self.authkey = authkey
        #: The queue names it serves (the feed server takes any: TensorFlowOnSpark's manager
        #: refuses an unknown name only where it is used).
        self.queues = tuple(queues)
        self._values: dict[str, Any] = {}
        self._queues: dict[str, Queue] = {}

    def get_queue(self, qname: str) -> Queue | None:
        """The queue named ``qname``; None for a name this manager does not serve (as
        TensorFlowOnSpark's manager answers)."""
        if qname not in self.queues:
            return None
        return self._queues.setdefault(qname, Queue(self.server, qname))

    def get(self, key: str) -> Any:
        if key == "state":
            if self.server.terminated:
                return "terminating"
            return self._values.get("state", "running")
        return self._values[key]

    def set(self, key: str, value: Any) -> None:
        if key == "state":
            _set_state(self.server, value)
        self._values[key] = value

    def shutdown(self) -> None:
        """Stop serving: feeders are refused, the queues end."""
        self.server.stop("the TFManager was shut down")
        self.server.close()


def _set_state(server: FeedServer, value: Any) -> None:
    if value == "terminating":
        server.terminate()
    elif value == "stopped":
        server.stop(STOP_REASON)


#: The manager this process started last (TensorFlowOnSpark keeps one per Python worker).
mgr: TFManager | None = None


def start(authkey: bytes | str | None, queues: Sequence[str], mode: str = "local") -> TFManager:
    """Start a manager serving the queues named in ``queues``.

    Args:
        authkey: what feeders in other processes must present; an empty one is replaced by
            ``AUTHKEY_BYTES`` random bytes (``mgr.authkey``).
        queues: the queue names.
        mode: ``"local"`` (the loopback interface, this host only) or ``"remote"`` (this
            host's address, TLS).

    Raises:
        ValueError: an unknown mode.
    """
    global mgr
    if mode not in ("local", "remote"):
        raise ValueError(f"mode must be 'local' or 'remote', not {mode!r}")
    key = _key(authkey) or secrets.token_bytes(AUTHKEY_BYTES)
    name = f"tfmanager-{os.getpid()}-{secrets.token_hex(4)}"
    host = util.get_ip_address() if mode == "remote" else "127.0.0.1"
    listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    identity = feedtls.new_identity(name) if mode == "remote" else None
    server = FeedServer(
        listener,
        key,
        name,
        f"TFManager {host}:{listener.getsockname()[1]}",
        tls=identity,
    ).start()
    address = ManagerAddress(
        host, listener.getsockname()[1], feed=name, pin=identity.fingerprint if identity else ""
    )
    mgr = TFManager(server, address, key, queues)
    return mgr


class RemoteQueue:
    """A queue of a manager in another process: ``put`` feeds it over the feed protocol."""

    def __init__(self, plan: FeedPlan) -> None:
        self._plan = plan
        self._items: list[Any] = []
        self._partitions = 0

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Collect ``item``; ``EndPartition()`` sends the partition and returns once it was
        consumed, ``None`` also ends the manager's feed.

        Raises:
            FeedError: the manager refused, went away, or its consumer stalled.
        """
        if item is None or isinstance(item, marker.EndPartition):
            if self._items:
                items, self._items = self._items, []
                for _ in feed(self._plan, self._partitions, items):
                    pass
                self._partitions += 1
            if item is None:
                control(self._plan, self._plan.targets[0], "eof")
            return
        self._items.append(item)

    def task_done(self) -> None:
        """Accepted for TensorFlowOnSpark's queue API."""

    def join(self) -> None:
        """Accepted for TensorFlowOnSpark's queue API (``put`` of a partition's end waits)."""


class RemoteManager:
    """A manager another process started, as ``connect`` returns it."""

    def __init__(self, plan: FeedPlan) -> None:
        self._plan = plan

    def get_queue(self, qname: str) -> RemoteQueue:
        return RemoteQueue(replace(self._plan, qname=qname))

    def set(self, key: str, value: Any) -> None:
        """Only ``state``: ``"stopped"`` or ``"terminating"`` stops the manager's feed."""
        if key != "state" or value not in ("stopped", "terminating"):
            raise ValueError(
                "a connected TFManager sets only 'state' to 'stopped' or 'terminating' (its feed stops); "
                "keep other values in the manager's own process"
            )
        control(self._plan, self._plan.targets[0], "stop", f"TFManager state set to {value!r}")

    def get(self, key: str) -> Any:
        raise ValueError("a connected TFManager cannot read values; read them in the manager's own process")


def connect(address: Any, authkey: bytes | str) -> RemoteManager:
    """A manager another process started, at its ``address``.

    Raises:
        ValueError: ``address`` is not a manager's address (``mgr.address``).
    """
    if not isinstance(address, ManagerAddress):
        raise ValueError(f"{address!r} is not a TFManager address: pass the manager's own mgr.address")
    host, port = address
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    target = FeedTarget(f"TFManager {where}", where, address.pin)
    return RemoteManager(FeedPlan(address.feed, _key(authkey), (target,), tls=bool(address.pin)))


__all__ = ["TFManager", "connect", "start"]
