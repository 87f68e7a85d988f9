"""One path for every driver: where its coordinator is, and how a job is stopped and cleaned up.

The Spark driver (:mod:`.spark`), the local engine (:mod:`.local`), the Mesos driver
(:mod:`.mesos`) and ``tfcoord submit`` each used to resolve their coordinator, pin its
certificate, stop a job on interrupt and tear down an embedded coordinator in their own way.
They now share this module: a :class:`CoordinatorLink` says where the coordinator is and how
to reach it (an embedded one started for this driver, or a running ``tfcoord serve``),
:func:`stop_and_wait` ends a job within a bound, and :func:`stops_on_interrupt` makes sure
an interrupted driver leaves no job running. Waiting itself is
:func:`tfcoord.client.watcher.watch_until` everywhere (push, never poll).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tfcoord.client import DriverClient, TfcoordError, tls
from tfcoord.client.errors import DeadlineExceeded
from tfcoord.client.jobreplies import JobStatus
from tfcoord.client.vocab import JobState
from tfcoord.client.watcher import ended, watch_until
from tfcoord.coordinator.embedded import EmbeddedCoordinator

#: A stopped job's nodes acknowledge within a second or two (a fed node may first finish its
#: queue); past this the caller moves on with the last status it saw.
STOP_WAIT_S = 30.0


@dataclass
class CoordinatorLink:
    """Where a driver's coordinator is, and what it takes to reach it.

    ``ssl_context`` is the driver's TLS toward it; ``ca_pem`` the CA its nodes pin (an
    embedded coordinator's own, made at start); ``embedded`` the coordinator this driver
    started and must stop (None for a running ``tfcoord serve``).
    """

    address: str
    secret: bytes
    ssl_context: ssl.SSLContext | None = None
    ca_pem: str | None = None
    embedded: EmbeddedCoordinator | None = None

    @classmethod
    def start_embedded(cls, *, quiet: bool = False, **options: Any) -> CoordinatorLink:
        """An embedded coordinator started now (see :class:`EmbeddedCoordinator` for ``options``).

        ``quiet``: its per-event log is lowered to warnings, where the driver prints the job's
        own progress instead (it would drown the job's output).
        """
        if quiet:
            coord_log = logging.getLogger("tfcoord.coordinator")
            coord_log.setLevel(max(logging.WARNING, logging.getLogger().level))
        coord = EmbeddedCoordinator(**options).start()
        return cls.of_embedded(coord)

    @classmethod
    def of_embedded(cls, coord: EmbeddedCoordinator) -> CoordinatorLink:
        """The link to a running embedded coordinator (its CA pinned, unless it serves plaintext)."""
        context = tls.client_context(ca_pem=coord.ca_pem) if coord.ca_pem else None
        return cls(coord.address, coord.secret, context, coord.ca_pem, coord)

    def connect(self, **options: Any) -> DriverClient:
        """A driver client of this coordinator (``options``: :class:`DriverClient`'s)."""
        return DriverClient(self.address, self.secret, ssl_context=self.ssl_context, **options)

    def close(self) -> None:
        """Stop the embedded coordinator, if this driver started one (idempotent)."""
        if self.embedded is not None:
            self.embedded.stop()

    def __enter__(self) -> CoordinatorLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_and_wait(driver: DriverClient, job: str, reason: str, timeout_s: float = STOP_WAIT_S) -> JobStatus:
    """Stop a job and wait (bounded) until it ends; returns its last status."""
    driver.stop(job, reason)
    status = watch_until(driver, job, ended, timeout_s=timeout_s)
    if not status.terminal:
        try:
            return driver.status(job)
        except DeadlineExceeded:
            return status
    return status


#: Ctrl-C stops the job before the driver exits; a person is waiting, so the wait for the
#: nodes to acknowledge is shorter than :data:`STOP_WAIT_S` (a second Ctrl-C cuts it short).
INTERRUPT_STOP_WAIT_S = 15.0
INTERRUPT_REASON = "the submitting command was interrupted (Ctrl-C)"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C reached a driver while its job ran: the job was asked to stop, and ``state``
    is the state it reached within :data:`INTERRUPT_STOP_WAIT_S` (None: the coordinator
    could not be asked). A KeyboardInterrupt still, so whatever only knows Ctrl-C unwinds."""

    def __init__(self, job: str, state: JobState | None) -> None:
        super().__init__(job, state)
        self.job = job
        self.state = state

    def line(self) -> str:
        """The one line a command prints for it."""
        if self.state is None:
            return f"interrupted: could not reach the coordinator to stop job {self.job}"
        if self.state.terminal:
            return f"interrupted: job {self.job} {self.state}"
        return f"interrupted: job {self.job} is {self.state}; its nodes were told to stop"


def stop_interrupted(driver: DriverClient, job: str, reason: str = INTERRUPT_REASON) -> Interrupted:
    """Stop ``job`` after Ctrl-C and wait (bounded) for it to end: the error to raise."""
    try:
        return Interrupted(job, stop_and_wait(driver, job, reason, INTERRUPT_STOP_WAIT_S).state)
    except (TfcoordError, OSError):
        return Interrupted(job, None)


@contextmanager
def stops_on_interrupt(driver: DriverClient, job: str, reason: str) -> Iterator[None]:
    """Within the block, an exception (Ctrl-C included) stops ``job`` before it propagates,
    so an interrupted or failing driver never leaves nodes running. Ctrl-C waits (bounded)
    for the job to end and becomes :class:`Interrupted`; for any other error the stop is
    best effort: a coordinator already gone ends the job by itself (an embedded one with
    the driver)."""
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise stop_interrupted(driver, job, reason) from None
    except BaseException:
        try:
            driver.stop(job, reason)
        except (TfcoordError, OSError):
            pass
        raise
