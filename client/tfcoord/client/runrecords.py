"""Run records: what an embedded coordinator knew of each job, kept after its driver is gone.

An embedded coordinator lives in its driver's process, so ``tfcoord status`` and ``tfcoord
logs`` used to have nothing once the driver ended (or crashed). While it runs, it writes one
JSON file per job into ``runs/`` of the per-user runtime directory (:mod:`.connfile`: 0700,
owner checked): the job's full status (nodes, errors, results, timeline) and the newest lines
of its nodes' output, rewritten about every second while the job changes (so a driver killed
outright leaves a record at most that old) and once more when the coordinator stops.

Bounded: a record holds at most :data:`RECORD_LOG_LINES` lines of output (each already cut
by the node), and the directory keeps the newest :data:`MAX_RECORDS` records (older ones are
pruned when a new one is written). A record, like a connection file, is this user's alone:
the directory must be theirs and 0700, the file theirs, a regular file, and not writable by
others, or it is refused with a line that says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import connfile
from . import messages as m

#: The records' folder inside the runtime directory.
RUNS = "runs"
#: Output lines a record keeps per job (the newest); a node's lines are each at most a few KB.
RECORD_LOG_LINES = 2000
#: Records kept per user; writing one more prunes the oldest.
MAX_RECORDS = 50
#: A record is at most a few MB (2,000 lines and a status); anything larger is not ours.
MAX_RECORD_BYTES = 32 * 1024 * 1024
VERSION = 1


class RunRecordError(connfile.ConnectionFileError):
    """A run record or its directory is unsafe or unreadable; the message says which and the fix."""


@dataclass(frozen=True)
class RunRecord:
    """One job as its embedded coordinator last saw it."""

    job: str
    #: The driver process that wrote it (its coordinator is gone once this pid is).
    pid: int
    written_at: float
    #: The job's full status, as ``JobStatus.wire``.
    status: dict[str, Any]
    #: The newest output lines, as a ``get_logs`` answer (``Logs.wire``).
    logs: dict[str, Any]
    path: Path

    @property
    def driver_alive(self) -> bool:
        return connfile.alive(self.pid)


def runs_dir(runtime_dir: Path) -> Path:
    return runtime_dir / RUNS


def _name(job: str) -> str:
    # Job ids are [A-Za-z0-9._-] (messages.JOB_RE); refuse anything else rather than build a path from it.
    if not m.ID_RE.fullmatch(job):
        raise RunRecordError(f"{job!r} is not a job id")
    return f"{job}.json"


def write(runtime_dir: Path, job: str, pid: int, written_at: float, status: Any, logs: Any) -> Path:
    """Write (or replace) ``job``'s record atomically, mode 0600; prunes the oldest beyond
    :data:`MAX_RECORDS`.

    Raises:
        RunRecordError: the directory is not this user's alone, or cannot be written.
    """
    directory = runs_dir(runtime_dir)
    try:
        connfile.ensure_dir(runtime_dir)
        connfile.ensure_dir(directory)
    except connfile.ConnectionFileError as e:
        raise RunRecordError(str(e)) from None
    path = directory / _name(job)
    tmp = directory / f".{path.name}.{os.getpid()}.tmp"
    body = {
        "version": VERSION,
        "job": job,
        "pid": pid,
        "written_at": written_at,
        "status": status,
        "logs": logs,
    }
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        os.replace(tmp, path)  # a reader never sees half a record
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise RunRecordError(f"cannot write run record {path}: {e}") from None
    _prune(directory)
    return path


def _prune(directory: Path) -> None:
    records = []
    for p in directory.glob("*.json"):
        with contextlib.suppress(OSError):
            records.append((p.stat().st_mtime, p))
    records.sort()
    for _, p in records[: max(0, len(records) - MAX_RECORDS)]:
        with contextlib.suppress(OSError):
            p.unlink()


def read(runtime_dir: Path, job: str) -> RunRecord | None:
    """``job``'s record in this user's runtime directory; None when there is none.

    Raises:
        RunRecordError: the directory or the file is not this user's alone (another owner,
            open to others, not a regular file), or the file is not a run record.
    """
    directory = runs_dir(runtime_dir)
    try:
        connfile.check_dir(runtime_dir)
        connfile.check_dir(directory)
    except FileNotFoundError:
        return None
    except connfile.ConnectionFileError as e:
        raise RunRecordError(str(e)) from None
    path = directory / _name(job)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RunRecordError(f"cannot read run record {path}: {e}") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
        raise RunRecordError(f"run record {path} is not a file tfcoord wrote: remove it")
    if st.st_uid != os.getuid():
        raise RunRecordError(f"run record {path} belongs to uid {st.st_uid}, not to you: remove it")
    if st.st_mode & 0o022:
        raise RunRecordError(
            f"run record {path} may be written by other users (mode {stat.S_IMODE(st.st_mode):o}): "
            "it cannot be trusted; remove it"
        )
    try:
        d = json.loads(path.read_text())
        if not isinstance(d, dict) or d.get("version") != VERSION or d.get("job") != job:
            raise ValueError("not a run record of this version")
        return RunRecord(
            job=job,
            pid=int(d["pid"]),
            written_at=float(d["written_at"]),
            status=dict(d["status"]),
            logs=dict(d["logs"]),
            path=path,
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RunRecordError(f"run record {path} cannot be read ({e}): remove it") from None


def ended(runtime_dir: Path) -> list[RunRecord]:
    """This user's records whose driver has ended, newest first (``tfcoord status`` without
    a job lists them beside the live coordinator's jobs).

    Raises:
        RunRecordError: as :func:`read`, for the directory or any record in it.
    """
    directory = runs_dir(runtime_dir)
    try:
        connfile.check_dir(runtime_dir)
        connfile.check_dir(directory)
        names = sorted(p.name for p in directory.iterdir())
    except FileNotFoundError:
        return []
    except connfile.ConnectionFileError as e:
        raise RunRecordError(str(e)) from None
    except OSError as e:
        raise RunRecordError(f"cannot list run records in {directory}: {e}") from None
    found = []
    for name in names:
        job = name.removesuffix(".json")
        if name.startswith(".") or job == name or not m.ID_RE.fullmatch(job):
            continue  # a record being written (.NAME.PID.tmp), or no record at all
        record = read(runtime_dir, job)
        if record is not None and not record.driver_alive:
            found.append(record)
    return sorted(found, key=lambda r: r.written_at, reverse=True)
