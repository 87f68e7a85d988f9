"""Shared fixtures: a real coordinator on port 0, and helpers to run threads in tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

from tfcoord.coordinator.embedded import EmbeddedCoordinator

# Property tests are deterministic (the same examples every run, no example database on
# disk) and have no per-example deadline: a loaded CI machine must not turn a slow example
# into a failure. Tests that need other settings pass their own.
settings.register_profile("tfcoord", derandomize=True, database=None, deadline=None)
settings.load_profile("tfcoord")


@pytest.fixture(scope="session", autouse=True)
def _runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Connection files of the session's embedded coordinators (Spark drivers) go to a directory
    of its own, and `tfcoord stop/status` run by tests look only there: never at the user's
    own coordinators, nor at those of test sessions running beside this one."""
    import os

    run = tmp_path_factory.mktemp("run")
    run.chmod(0o700)
    before = os.environ.get("TFCOORD_RUNTIME_DIR")
    os.environ["TFCOORD_RUNTIME_DIR"] = str(run)
    yield
    if before is None:
        os.environ.pop("TFCOORD_RUNTIME_DIR", None)
    else:
        os.environ["TFCOORD_RUNTIME_DIR"] = before


@pytest.fixture
def coordinator() -> Iterator[EmbeddedCoordinator]:
    """A real coordinator serving on 127.0.0.1:0 in a background thread; validated at teardown."""
    coord = EmbeddedCoordinator(plaintext=True).start()
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
