"""ProcessUsage against real processes: a child holding memory, and its own child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tfcoord.node.usage import ProcessUsage

HOLD = 64 << 20
#: Allocates and touches HOLD bytes, starts a grandchild that waits on the same stdin,
#: says so, then waits for its stdin to close.
CHILD = f"""
import subprocess, sys
held = bytearray({HOLD})
for i in range(0, len(held), 4096):
    held[i] = 1
grandchild = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=sys.stdin)
print("ready", flush=True)
sys.stdin.read()
grandchild.wait()
"""


def test_usage_of_a_process_tree_then_of_a_process_gone():
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline() == "ready\n"
        usage = ProcessUsage(p.pid)
        first = usage.sample()
        assert first["rss_bytes"] >= HOLD and "cpu_percent" not in first  # a rate needs two samples
        # The grandchild counts where the kernel lists children (CONFIG_PROC_CHILDREN).
        listed = Path(f"/proc/{p.pid}/task/{p.pid}/children").exists()
        assert first["processes"] == (2 if listed else 1)
        second = usage.sample()
        assert second["cpu_percent"] >= 0 and second["rss_bytes"] >= HOLD
    finally:
        p.stdin.close()
        p.wait(30)
        p.stdout.close()
    assert ProcessUsage(p.pid).sample() == {}
