"""tfcoord.driver.nodeoutput.executors_print_here: when following the nodes' output would
print each line twice (the executors already write to the driver's stderr)."""

from __future__ import annotations

import io
import sys

import pytest

from tfcoord.driver.nodeoutput import executors_print_here


class _Fd2(io.StringIO):
    """sys.stderr as a terminal, pipe or file leaves it: a stream on descriptor 2."""

    def fileno(self) -> int:
        return 2


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", " local[4,3] "])
def test_a_local_masters_executors_write_to_the_drivers_stderr(monkeypatch, master: str) -> None:
    # Set in the test itself: pytest's capture puts its own sys.stderr back between phases.
    monkeypatch.setattr(sys, "stderr", _Fd2())
    assert executors_print_here(master)


@pytest.mark.parametrize(
    "master", ["local-cluster[2,1,1024]", "spark://h:7077", "yarn", "k8s://https://h:6443", "localhost"]
)
def test_executors_of_their_own_write_elsewhere(monkeypatch, master: str) -> None:
    monkeypatch.setattr(sys, "stderr", _Fd2())
    assert not executors_print_here(master)


def test_a_notebooks_stderr_is_not_the_jvms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # ipykernel's cell stream has no descriptor either
    assert not executors_print_here("local[2]")
