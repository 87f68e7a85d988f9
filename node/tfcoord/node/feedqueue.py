"""One named input queue of a node (TensorFlowOnSpark's ``input`` queue), without I/O or threads.

Theory of operation. Every partition being fed to this queue is one connection, known by
an integer id. For inference, partitions are consumed whole and in the order they were
opened, so a batch never mixes two partitions and results go back in order. Training
takes from the oldest partition that has records, so one slow feeder (a partition whose
upstream computation is slow) does not hold up the others. Records
arrive in batches (``put``); ``end`` marks the partition's end; ``eof`` the end of the
whole feed (the driver's ``shutdown``, or a stop). ``take(n, ...)`` hands the consumer
up to ``n`` records at once and says what that means for the feeders: credits to grant
back (one per batch consumed whole) and partitions finished (their end was reached).

The caller (``datafeed.FeedServer``) holds a lock around every call and carries out the
effects on the sockets outside it. Memory is bounded by the feeders' credit windows:
a partition never has more than its window of batches here.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Partition:
    batches: deque[Sequence[Any]] = field(default_factory=deque)
    #: Records of ``batches[0]`` already taken.
    offset: int = 0
    ended: bool = False
    records_in: int = 0


@dataclass
class Take:
    """What one ``take`` returned, and its effects."""

    records: list[Any] = field(default_factory=list)
    #: (partition, count) for each run of records in ``records``, in order.
    segments: list[tuple[int, int]] = field(default_factory=list)
    #: partition → batches consumed whole: send that many credits back.
    credits: dict[int, int] = field(default_factory=dict)
    #: partitions whose end was consumed: tell their feeders ``done``.
    finished: list[int] = field(default_factory=list)
    #: the feed is over: no partition is left and ``eof`` was set.
    eof: bool = False


class FeedQueue:
    """The partitions fed to one queue, consumed in the order they were opened."""

    def __init__(self, name: str = "input") -> None:
        self.name = name
        self._parts: OrderedDict[int, _Partition] = OrderedDict()
        self.eof = False
        #: Records taken by the consumer since the start (for status and tests).
        self.taken = 0

    def __contains__(self, pid: int) -> bool:
        return pid in self._parts

    @property
    def partitions(self) -> list[int]:
        return list(self._parts)

    @property
    def buffered(self) -> int:
        """Records waiting to be taken."""
        return sum(sum(len(b) for b in p.batches) - p.offset for p in self._parts.values())

    def open(self, pid: int) -> None:
        if pid in self._parts:
            raise ValueError(f"partition connection {pid} is already open on queue {self.name!r}")
        self._parts[pid] = _Partition()

    def put(self, pid: int, records: Sequence[Any]) -> None:
        p = self._part(pid)
        if p.ended:
            raise ValueError(f"partition connection {pid} sent records after its end")
        if records:
            p.batches.append(records)
            p.records_in += len(records)

    def end(self, pid: int) -> None:
        self._part(pid).ended = True

    def drop(self, pid: int) -> int:
        """Forget a partition whose feeder went away; returns the records discarded.

        Spark retries a failed feeding task from the start of its partition, so what the
        consumer had not taken yet is dropped rather than fed twice.
        """
        p = self._parts.pop(pid, None)
        if p is None:
            return 0
        return sum(len(b) for b in p.batches) - p.offset

    def clear(self) -> list[int]:
        """Drop everything (a terminated feed); returns the partitions that were open."""
        pids = list(self._parts)
        self._parts.clear()
        return pids

    def set_eof(self) -> None:
        self.eof = True

    def _part(self, pid: int) -> _Partition:
        p = self._parts.get(pid)
        if p is None:
            raise KeyError(f"partition connection {pid} is not open on queue {self.name!r}")
        return p

    def _ready(self, head_only: bool) -> tuple[int, _Partition] | None:
        """The partition to take from next: the oldest (inference), or the oldest with records or its end."""
        for pid, p in self._parts.items():
            if p.batches or p.ended or head_only:
                return pid, p
        return None

    def take(self, n: int, *, partition_bound: bool, have: int = 0) -> Take:
        """Up to ``n`` records available now, from the oldest partition on.

        Args:
            n: at most this many records.
            partition_bound: take from the oldest partition only, and stop at its end once
                any record is in the batch (``have`` + taken so far), as inference needs;
                else take from any partition with records, oldest first (training).
            have: records the caller already holds for this batch.

        An end marker reached is consumed in the same call (so ``finished`` names it).
        ``eof`` is set when no partition is left and the feed was ended.
        """
        t = Take()
        while len(t.records) < n and self._parts:
            ready = self._ready(head_only=partition_bound)
            if ready is None:
                break
            pid, p = ready
            while p.batches and len(t.records) < n:
                batch = p.batches[0]
                k = min(n - len(t.records), len(batch) - p.offset)
                t.records.extend(batch[p.offset : p.offset + k] if (p.offset or k < len(batch)) else batch)
                if t.segments and t.segments[-1][0] == pid:
                    t.segments[-1] = (pid, t.segments[-1][1] + k)
                else:
                    t.segments.append((pid, k))
                p.offset += k
                if p.offset == len(batch):
                    p.batches.popleft()
                    p.offset = 0
                    t.credits[pid] = t.credits.get(pid, 0) + 1
            if p.batches or not p.ended:
                if partition_bound or p.batches:
                    break  # inference waits for this partition's rest; or the batch is full
                continue  # training: take from another partition meanwhile
            del self._parts[pid]
            t.finished.append(pid)
            if partition_bound and (have or t.records):
                break
        self.taken += len(t.records)
        t.eof = self.eof and not self._parts
        return t
