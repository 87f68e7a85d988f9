"""Shared fixtures: a real coordinator on port 0, and helpers to run threads in tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tfcoord.coordinator.embedded import EmbeddedCoordinator


@pytest.fixture
def coordinator() -> Iterator[EmbeddedCoordinator]:
    """A real coordinator serving on 127.0.0.1:0 in a background thread; validated at teardown."""
    coord = EmbeddedCoordinator().start()
    try:
        yield coord
        coord.call(coord.server.state.validate)
    finally:
        coord.stop()


class Background:
    """Run callables in threads; ``results()`` re-raises the first exception."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._out: dict[int, Any] = {}
        self._errors: list[BaseException] = []

    def start(self, fn: Callable[..., Any], *args: Any) -> int:
        i = len(self._threads)

        def run() -> None:
            try:
                self._out[i] = fn(*args)
            except BaseException as e:
                self._errors.append(e)
                self._out[i] = e

        t = threading.Thread(target=run, daemon=True)
        self._threads.append(t)
        t.start()
        return i

    def results(self, timeout_s: float = 60.0) -> list[Any]:
        for t in self._threads:
            t.join(timeout_s)
            assert not t.is_alive(), "a background thread did not finish in time"
        return [self._out[i] for i in range(len(self._threads))]


@pytest.fixture
def background() -> Background:
    return Background()
