"""TensorFlowOnSpark's ``TFManager``: a ``multiprocessing`` manager serving named queues.

tfcoord's nodes are fed over the network (:mod:`tfcoord.node.datafeed`) and need no
manager; this module keeps TensorFlowOnSpark's API for code that builds one itself, as its
DataFeed unit tests do: ``mgr = TFManager.start(authkey, ["input", "output"])``, fill
``mgr.get_queue("input")``, then read it through ``TFNode.DataFeed(mgr)``.
"""

from __future__ import annotations

from multiprocessing import JoinableQueue
from multiprocessing.managers import BaseManager
from typing import Any


class TFManager(BaseManager):
    """A manager serving ``get_queue(name)``, ``get(key)`` and ``set(key, value)``."""


#: The manager this process started last (TensorFlowOnSpark keeps one per Python worker).
mgr: TFManager | None = None
_queues: dict[str, Any] = {}
_values: dict[str, Any] = {}


def _get_queue(qname: str) -> Any:
    return _queues.get(qname)  # None (a proxy of it) for an unknown name, as TensorFlowOnSpark answers


def _get(key: str) -> Any:
    return _values[key]


def _set(key: str, value: Any) -> None:
    _values[key] = value


def _serve_queues(names: list[str]) -> None:
    """In the manager's server process: a queue per name, no values yet."""
    _queues.clear()
    _values.clear()
    for name in names:
        _queues[name] = JoinableQueue()


def _key(authkey: bytes | str) -> bytes:
    # TensorFlowOnSpark's own tests pass a str; multiprocessing wants bytes.
    return authkey.encode("utf-8") if isinstance(authkey, str) else bytes(authkey)


def start(authkey: bytes | str, queues: list[str], mode: str = "local") -> TFManager:
    """Start a manager serving a ``JoinableQueue`` per name in ``queues``.

    Args:
        authkey: what clients must present (``connect``).
        queues: the queue names.
        mode: ``"local"`` (a Unix socket, this host only) or ``"remote"`` (TCP on any address).
    """
    global mgr
    if mode not in ("local", "remote"):
        raise ValueError(f"mode must be 'local' or 'remote', not {mode!r}")
    TFManager.register("get_queue", callable=_get_queue)
    TFManager.register("get", callable=_get)
    TFManager.register("set", callable=_set)
    manager = (
        TFManager(address=("", 0), authkey=_key(authkey))
        if mode == "remote"
        else TFManager(authkey=_key(authkey))
    )
    # The queues are made in the server process, so any start method works (a spawned
    # process inherits nothing).
    manager.start(initializer=_serve_queues, initargs=(list(queues),))
    mgr = manager
    return manager


def connect(address: Any, authkey: bytes | str) -> TFManager:
    """Connect to a manager another process started (its ``address``)."""
    TFManager.register("get_queue")
    TFManager.register("get")
    TFManager.register("set")
    manager = TFManager(address, authkey=_key(authkey))
    manager.connect()
    return manager


__all__ = ["TFManager", "connect", "start"]
