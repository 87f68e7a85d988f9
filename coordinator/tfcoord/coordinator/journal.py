"""The journal: every state-changing event, committed before the reply that depends on it.

The coordinator's state is rebuilt by replaying these events through the pure state
machine (see ``state.py``), so the journal stores events, not snapshots. SQLite in
WAL mode: one file under ``--state-dir``, atomic commits, safe against ``kill -9``.
An embedded coordinator lives only as long as its driver, so it journals nothing.

Beside the events, the same database keeps the nodes' output lines (tables ``output`` and
``output_nodes``, written about once a second by :mod:`.keptoutput`), so a ``tfcoord serve``
still shows a job's output after its driver, or the coordinator itself, has restarted.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tfcoord.client import messages as m
from tfcoord.client.protocol import pack, unpack
from tfcoord.client.vocab import FailureReason

from . import state as s

#: Written into every journal; a database without it is not ours and is never touched.
FORMAT = "tfcoord-journal"
#: 2: events carry their job's id, so a forgotten job's records can be deleted.
FORMAT_VERSION = 2
FILENAME = "journal.sqlite3"


class StateDirError(RuntimeError):
    """The state directory cannot be used; the message says why and what to do."""


class Journal(Protocol):
    def append(self, event: s.Event) -> None: ...
    def forget(self, job: str) -> None: ...
    def commit(self) -> float: ...
    def take(self) -> Batch | None: ...
    def write(self, batch: Batch) -> float: ...
    def requeue(self, batch: Batch) -> None: ...
    def replay(self) -> Iterator[s.Event]: ...
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def close(self) -> None: ...


#: What ``append`` and ``forget`` queued, taken as one group commit: (job, kind, body)
#: rows to insert, with ``kind`` None for "delete the job's records".
Batch = list[tuple[str, str | None, bytes | None]]


@dataclass
class OutputBatch:
    """Nodes' output to keep (see :mod:`.keptoutput`)."""

    #: New lines: (job, executor_id, seq, time, stream, text).
    lines: list[tuple[str, int, int, float, str, str]]
    #: Per node: (job, executor_id, the oldest line still held, lines dropped before it);
    #: lines numbered below that are deleted.
    nodes: list[tuple[str, int, int, int]]


class MemoryJournal:
    """No persistence: for an embedded coordinator, whose state dies with its driver."""

    def __init__(self) -> None:
        self._meta: dict[str, str] = {}

    def append(self, event: s.Event) -> None:
        pass

    def forget(self, job: str) -> None:
        pass

    def commit(self) -> float:
        return 0.0

    def take(self) -> Batch | None:
        return None  # nothing to make durable: replies go out at once

    def write(self, batch: Batch) -> float:
        return 0.0

    def requeue(self, batch: Batch) -> None:
        pass

    def replay(self) -> Iterator[s.Event]:
        return iter(())

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self._meta[key] = value

    def close(self) -> None:
        pass


def event_job(ev: s.Event) -> str:
    """The job a journaled event belongs to."""
    req = getattr(ev, "req", None)
    job: str = req.job if req is not None else ev.job  # type: ignore[attr-defined]
    return job


def encode_event(ev: s.Event) -> tuple[str, bytes]:
    body: dict[str, Any]
    if isinstance(ev, s.SubmitJob):
        body = {"job": ev.job, "spec": ev.spec.to_wire(), "owner": ev.owner}
    elif isinstance(ev, (s.RegisterNode, s.ReportNode, s.HeartbeatNode)):
        body = {"req": ev.req.to_wire()}
    elif isinstance(ev, s.StopJobEvent):
        body = {"job": ev.job, "reason": ev.reason, "cause": ev.cause.value}
    elif isinstance(ev, s.NodeLost):
        body = {"job": ev.job, "executor_id": ev.executor_id, "attempt": ev.attempt, "reason": ev.reason}
    elif isinstance(ev, (s.ReservationExpired, s.ServingGraceExpired, s.DeadlineExpired)):
        body = {"job": ev.job}
    elif isinstance(ev, s.FinishJobEvent):
        body = {"job": ev.job, "serving_grace_s": ev.serving_grace_s}
    elif isinstance(ev, s.EngineTaskUpdate):
        body = {
            "job": ev.job,
            "executor_id": ev.executor_id,
            "task_id": ev.task_id,
            "state": ev.state,
            "message": ev.message,
            "ended": ev.ended,
        }
    elif isinstance(ev, s.EngineJobFailed):
        body = {"job": ev.job, "reason": ev.reason}
    elif isinstance(ev, s.CompleteCluster):
        body = {"job": ev.job, "upto": ev.upto}
    else:
        raise TypeError(f"{type(ev).__name__} is not a journaled event")
    body["now"] = ev.now
    return type(ev).__name__, pack(body)


def decode_event(kind: str, data: bytes) -> s.Event:
    b: Any = unpack(data)
    now = b["now"]
    if kind == "SubmitJob":
        return s.SubmitJob(
            now=now, job=b["job"], spec=m.JobSpec.from_wire(b["spec"]), owner=b.get("owner", b"")
        )
    if kind == "RegisterNode":
        return s.RegisterNode(now=now, req=m.decode(b["req"]))  # type: ignore[arg-type]
    if kind == "ReportNode":
        return s.ReportNode(now=now, req=m.decode(b["req"]))  # type: ignore[arg-type]
    if kind == "HeartbeatNode":
        return s.HeartbeatNode(now=now, req=m.decode(b["req"]))  # type: ignore[arg-type]
    if kind == "StopJobEvent":
        # Journals written before stops had a cause hold only requested stops.
        cause = FailureReason(b.get("cause", FailureReason.STOPPED))
        return s.StopJobEvent(now=now, job=b["job"], reason=b["reason"], cause=cause)
    if kind == "NodeLost":
        return s.NodeLost(
            now=now, job=b["job"], executor_id=b["executor_id"], attempt=b["attempt"], reason=b["reason"]
        )
    if kind == "ReservationExpired":
        return s.ReservationExpired(now=now, job=b["job"])
    if kind == "ServingGraceExpired":
        return s.ServingGraceExpired(now=now, job=b["job"])
    if kind == "DeadlineExpired":
        return s.DeadlineExpired(now=now, job=b["job"])
    if kind == "FinishJobEvent":
        return s.FinishJobEvent(now=now, job=b["job"], serving_grace_s=b["serving_grace_s"])
    if kind == "EngineTaskUpdate":
        return s.EngineTaskUpdate(
            now=now,
            job=b["job"],
            executor_id=b["executor_id"],
            task_id=b["task_id"],
            state=b["state"],
            message=b["message"],
            ended=b["ended"],
        )
    if kind == "EngineJobFailed":
        return s.EngineJobFailed(now=now, job=b["job"], reason=b["reason"])
    if kind == "CompleteCluster":
        return s.CompleteCluster(now=now, job=b["job"], upto=b["upto"])
    raise ValueError(f"unknown journal record kind {kind!r}")


class SqliteJournal:
    """The journal in ``<state_dir>/journal.sqlite3``.

    Raises:
        StateDirError: the directory or database is unusable, corrupt or not a tfcoord journal.
    """

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise StateDirError(f"cannot create state directory {self.dir}: {e}") from e
        self.path = self.dir / FILENAME
        foreign = [p.name for p in self.dir.iterdir() if not p.name.startswith(FILENAME)]
        fresh = not self.path.exists()
        wal = self.dir / f"{FILENAME}-wal"
        if fresh and wal.exists() and wal.stat().st_size > 0:
            # SQLite would start a new database and throw the log's changes away.
            raise StateDirError(
                f"{self.path} is missing but {wal.name} is there: the journal's main file was deleted "
                f"or moved, and {wal.name} holds its latest changes. Put {FILENAME} back, or move "
                f"{wal.name} and {FILENAME}-shm aside to start empty"
            )
        if fresh and foreign:
            raise StateDirError(
                f"state directory {self.dir} is not empty and holds no tfcoord journal "
                f"(found {', '.join(sorted(foreign)[:5])}); point --state-dir at an empty or tfcoord directory"
            )
        # The journal holds tracebacks, host names and job specs: owner-only, whatever the
        # umask or the directory's mode (an existing 0755 state dir). SQLite gives the -wal
        # and -shm files the main file's mode, so creating it 0600 covers all three.
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            for extra in (wal, self.dir / f"{FILENAME}-shm"):
                if extra.exists() and not extra.is_symlink():
                    os.chmod(extra, 0o600)
        except OSError as e:
            raise StateDirError(f"cannot create the journal {self.path} (mode 600): {e}") from e
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, one commit per batch.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            if not fresh and self._empty():
                fresh = True  # a first start killed before it created the tables (see below)
            if not fresh:  # make sure it is ours before changing anything (WAL mode is sticky)
                self._check_format()
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit survives power loss, not only a process kill; the commit is
            # batched per event-loop turn, so the fsync cost is shared by many requests.
            self._db.execute("PRAGMA synchronous=FULL")
            self._create_output_tables()
            if fresh:
                # One transaction: a kill during the first start leaves no tables at all
                # (started afresh next time), never a half-made journal refused as foreign.
                self._db.execute("BEGIN")
                self._db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                self._db.execute(
                    "CREATE TABLE events (seq INTEGER PRIMARY KEY, job TEXT NOT NULL, kind TEXT NOT NULL, "
                    "body BLOB NOT NULL)"
                )
                self._db.execute("CREATE INDEX events_job ON events (job)")
                self._db.executemany(
                    "INSERT INTO meta VALUES (?, ?)",
                    [
                        ("format", FORMAT),
                        ("format_version", str(FORMAT_VERSION)),
                        ("created", str(time.time())),
                    ],
                )
                self._db.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise StateDirError(
                f"{self.path} is not a readable tfcoord journal ({e}); it may be corrupt. Move it "
                "aside to start empty, or restore it from a backup"
            ) from e
        except StateDirError:
            self._db.close()
            raise
        self._pending: Batch = []
        self._lock = threading.Lock()

    def _create_output_tables(self) -> None:
        """The nodes' output (see :mod:`.keptoutput`): beside the events, in every journal,
        including one written before output was kept (the tables are only added)."""
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS output (job TEXT NOT NULL, executor_id INTEGER NOT NULL, "
            "seq INTEGER NOT NULL, t REAL NOT NULL, stream TEXT NOT NULL, text TEXT NOT NULL, "
            "PRIMARY KEY (job, executor_id, seq)) WITHOUT ROWID"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS output_nodes (job TEXT NOT NULL, executor_id INTEGER NOT NULL, "
            "dropped INTEGER NOT NULL, PRIMARY KEY (job, executor_id)) WITHOUT ROWID"
        )

    def _empty(self) -> bool:
        """No tables at all: an empty file, or a database whose creation never committed."""
        tables: int = self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        return tables == 0

    def _check_format(self) -> None:
        try:
            rows = self._db.execute("SELECT key, value FROM meta WHERE key LIKE 'format%'").fetchall()
        except sqlite3.OperationalError as e:  # no meta table: another program's database
            raise StateDirError(f"{self.path} is an SQLite database but not a tfcoord journal ({e})") from e
        fmt = dict(rows)
        if fmt.get("format") != FORMAT:
            raise StateDirError(f"{self.path} is an SQLite database but not a tfcoord journal")
        if fmt.get("format_version") != str(FORMAT_VERSION):
            raise StateDirError(
                f"{self.path} has journal format {fmt.get('format_version')}, this tfcoord reads "
                f"{FORMAT_VERSION}; use the tfcoord version that wrote it"
            )

    # Appending only encodes and queues, on the caller's thread; ``write`` puts a taken
    # batch into the database and commits it, and may run on another thread (the server
    # commits on one of its own, so an fsync never stalls its event loop). One lock keeps
    # every use of the connection apart.

    def append(self, event: s.Event) -> None:
        kind, body = encode_event(event)
        self._pending.append((event_job(event), kind, body))

    def forget(self, job: str) -> None:
        """Delete a forgotten job's records, in the transaction of what else is appended."""
        self._pending.append((job, None, None))

    def take(self) -> Batch | None:
        """What was appended since the last take, to be passed to :meth:`write`."""
        batch, self._pending = self._pending, []
        return batch or None

    def requeue(self, batch: Batch) -> None:
        """A batch whose write failed goes back in front of what was appended since."""
        self._pending[:0] = batch

    def write(self, batch: Batch) -> float:
        """Write ``batch`` in one transaction and commit it; returns the seconds it took.

        Raises:
            sqlite3.Error: nothing of the batch was committed.
        """
        t0 = time.perf_counter()
        with self._lock:
            self._db.execute("BEGIN")
            try:
                i = 0
                while i < len(batch):  # runs of inserts in one executemany each, in order
                    j = i
                    while j < len(batch) and batch[j][1] is not None:
                        j += 1
                    if j > i:
                        self._db.executemany(
                            "INSERT INTO events (job, kind, body) VALUES (?, ?, ?)", batch[i:j]
                        )
                    if j < len(batch):  # a forgotten job: its output goes with its events
                        for table in ("events", "output", "output_nodes"):
                            self._db.execute(f"DELETE FROM {table} WHERE job = ?", (batch[j][0],))
                    i = j + 1
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return time.perf_counter() - t0

    def commit(self) -> float:
        """Commit what was appended, here and now; returns the seconds the commit took."""
        batch = self.take()
        return self.write(batch) if batch else 0.0

    def replay(self) -> Iterator[s.Event]:
        try:
            for seq, kind, body in self._db.execute("SELECT seq, kind, body FROM events ORDER BY seq"):
                try:
                    yield decode_event(kind, body)
                except Exception as e:
                    raise StateDirError(f"journal record {seq} in {self.path} is unreadable ({e})") from e
        except sqlite3.DatabaseError as e:
            raise StateDirError(f"{self.path} is corrupt ({e}); move it aside or restore a backup") from e

    def write_output(self, batch: OutputBatch) -> None:
        """Keep new output lines and drop those the coordinator no longer holds, in one
        transaction (see :mod:`.keptoutput`).

        Raises:
            sqlite3.Error: nothing of the batch was written.
        """
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany("INSERT OR REPLACE INTO output VALUES (?, ?, ?, ?, ?, ?)", batch.lines)
                self._db.executemany(
                    "DELETE FROM output WHERE job = ? AND executor_id = ? AND seq < ?",
                    [(job, eid, floor) for job, eid, floor, _ in batch.nodes],
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO output_nodes VALUES (?, ?, ?)",
                    [(job, eid, dropped) for job, eid, _, dropped in batch.nodes],
                )
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def read_output(self) -> OutputBatch:
        """Every kept output line, by job, node and number, and each node's dropped count."""
        try:
            with self._lock:
                lines = self._db.execute("SELECT * FROM output ORDER BY job, executor_id, seq").fetchall()
                nodes = self._db.execute("SELECT job, executor_id, dropped FROM output_nodes").fetchall()
        except sqlite3.DatabaseError as e:
            raise StateDirError(f"{self.path} is corrupt ({e}); move it aside or restore a backup") from e
        return OutputBatch(lines=lines, nodes=[(job, eid, 0, dropped) for job, eid, dropped in nodes])

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def close(self) -> None:
        self.commit()
        with self._lock:
            self._db.close()
