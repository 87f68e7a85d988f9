"""How a node names the signal that ended its work."""

from __future__ import annotations

import pytest

from tfcoord.node.supervisor import killed_by


@pytest.mark.parametrize(
    ("signum", "says"),
    [
        (9, "killed by signal 9 (SIGKILL: the kernel's out-of-memory killer, or a kill -9)"),
        (11, "killed by signal 11 (SIGSEGV: a crash in native code such as TensorFlow's"),
        (6, "killed by signal 6 (SIGABRT: native code aborted"),
        (10, "killed by signal 10 (SIGUSR1)"),  # a signal with no usual cause: its name only
        (200, "killed by signal 200"),  # not a signal this system names
    ],
)
def test_a_signal_is_named_with_its_likely_cause(signum: int, says: str) -> None:
    assert killed_by(signum).startswith(says)
    assert killed_by(signum).count("(") <= 1  # one parenthesis: the line stays one line to read
