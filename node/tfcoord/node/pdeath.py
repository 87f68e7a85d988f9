"""Processes that die with the node supervisor that started them (Linux ``PR_SET_PDEATHSIG``).

The supervisor terminates ``map_fun``'s process and TensorBoard itself whenever it can.
It cannot when it is killed: Spark SIGKILLs a task's Python worker on task cancel
(``cancelJobGroup``), speculation and executor loss, and a SIGKILLed process runs no
clean-up. Without help its children would be re-parented to init and run on, holding
GPUs, ports and memory. ``PR_SET_PDEATHSIG`` asks the kernel to signal a child when its
parent dies; it is set in the child, so there is a window between fork and ``prctl`` in
which the parent may already have died: the child then sees a different ``getppid()``
and exits on its own.

Two caveats shape the callers:

* The signal fires when the *thread* that forked the child exits, not the process. The
  supervisor forks from the thread that runs the node (``run_node``) and that thread
  waits for the children before it returns, so the two lifetimes match; never fork
  through these helpers from a short-lived helper thread.
* The setting survives ``exec`` (except of set-uid programs), so a program we exec is
  covered by running a tiny trampoline that sets it and then execs the program:
  unlike ``preexec_fn``, that is safe in a process with other threads running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, Literal, overload

#: From <linux/prctl.h>.
PR_SET_PDEATHSIG = 1

#: Runs as ``python -S -c TRAMPOLINE PARENT_PID SIGNAL PROGRAM ARGS...``: standard library
#: only (``-S`` skips site-packages: a few milliseconds instead of a few hundred).
TRAMPOLINE = (
    "import ctypes, os, sys\n"
    "parent, sig = int(sys.argv[1]), int(sys.argv[2])\n"
    "if sys.platform.startswith('linux'):\n"
    "    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    if libc.prctl(1, sig, 0, 0, 0) != 0:\n"
    "        sys.exit('tfcoord: prctl(PR_SET_PDEATHSIG) failed: ' + os.strerror(ctypes.get_errno()))\n"
    "    if os.getppid() != parent:\n"
    "        os._exit(1)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def supported() -> bool:
    return sys.platform.startswith("linux")


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Call first thing in a forked child: be sent ``sig`` when the forking thread ends.

    Exits at once if ``parent_pid`` is already gone (we were re-parented before the
    ``prctl``). A no-op where the kernel has no such feature (not Linux).
    """
    if not supported():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent_pid:
        os._exit(1)


@overload
def popen(cmd: Sequence[str], sig: int = ..., *, text: Literal[True], **kw: Any) -> subprocess.Popen[str]: ...
@overload
def popen(
    cmd: Sequence[str], sig: int = ..., *, text: Literal[False] | None = None, **kw: Any
) -> subprocess.Popen[bytes]: ...
def popen(
    cmd: Sequence[str], sig: int = signal.SIGKILL, *, text: bool | None = None, **kw: Any
) -> subprocess.Popen[str] | subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, text=text, **kw)`` for a program that is sent ``sig`` when this thread ends.

    The returned process's pid is the program's own (the trampoline execs it in place).
    Its streams are ``str`` with ``text=True``, else ``bytes`` (what the type says; ask for
    text mode with ``text``, not with ``encoding`` or ``errors`` in ``kw``).
    """
    if not supported():
        return subprocess.Popen(list(cmd), text=text, **kw)
    return subprocess.Popen(
        [sys.executable, "-S", "-c", TRAMPOLINE, str(os.getpid()), str(int(sig)), *cmd], text=text, **kw
    )
