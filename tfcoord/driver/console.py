"""The driver's progress on stderr when the program did not configure logging.

A driver program run by a plain ``spark-submit``, by ``python prog.py`` or in a notebook
configures no logging, so the progress the Spark driver logs (reservation waits naming who
is missing, readiness, each node's end, the outcome) would go nowhere: Python's last-resort
handler shows warnings only, and the user cannot tell a reservation wait from a hang.

:func:`show_progress` puts one handler on the ``tfcoord`` logger that writes the driver's
progress (INFO of the driver loggers, and every warning of tfcoord's) to ``sys.stderr``,
read at each line (a notebook replaces it per cell). It does so only while the program
configured nothing itself: a root logger with handlers, or a ``tfcoord`` logger with a level
or handlers of its own, means the program chose where and what to log, and tfcoord's records
follow that choice. A program that configures logging after the handler went in takes over
from then on: the handler stands aside while the root logger has handlers.

Quiet: ``run(..., quiet=True)``, the Spark setting ``spark.tfcoord.quiet=true`` or the
environment variable ``TFCOORD_QUIET=1`` keep it off (warnings still reach Python's
last-resort handler).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TextIO

#: The environment variable that silences the driver's progress (``1``, ``true``, ``yes``).
QUIET_ENV = "TFCOORD_QUIET"
#: The Spark setting that does the same (``spark-submit --conf spark.tfcoord.quiet=true``).
QUIET_CONF = "spark.tfcoord.quiet"
#: The loggers whose INFO records are the driver's progress; the rest of tfcoord (an embedded
#: coordinator's per-event log) shows only warnings, or it would drown the job's own output.
PROGRESS_LOGGERS = ("tfcoord.spark", "tfcoord.mesos")
#: Every line starts with this, so the user tells tfcoord's lines from their program's.
PREFIX = "tfcoord: "

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def parse_quiet(value: str, where: str) -> bool:
    """A quiet switch's text as a bool.

    Raises:
        ValueError: neither true nor false; the message names ``where`` it was set.
    """
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(
        f"{where}={value!r} is not valid: use 1/true to silence tfcoord's progress, 0/false to show it"
    )


def quiet_from(env: Mapping[str, str], conf_value: str | None) -> bool:
    """Whether the driver is quiet, from the Spark setting (first) or the environment."""
    if conf_value is not None and conf_value.strip():
        return parse_quiet(conf_value, QUIET_CONF)
    return parse_quiet(env.get(QUIET_ENV, ""), QUIET_ENV)


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """tfcoord's progress lines on the current ``sys.stderr``, while the program logs nothing itself."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(PREFIX + "%(message)s"))

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        """StreamHandler's constructor assigns a stream; the current sys.stderr wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().handlers:
            return False  # the program configured logging since: its handlers show tfcoord's records
        return record.levelno >= logging.WARNING or record.name in PROGRESS_LOGGERS


def _installed(log: logging.Logger) -> ConsoleHandler | None:
    return next((h for h in log.handlers if isinstance(h, ConsoleHandler)), None)


def configured_by_program() -> bool:
    """The program chose where tfcoord's records go (root handlers, or tfcoord's own level or
    handlers), not counting what :func:`show_progress` itself set."""
    log = logging.getLogger("tfcoord")
    if logging.getLogger().handlers:
        return True
    if _installed(log) is not None:
        return False
    return bool(log.handlers) or log.level != logging.NOTSET


def show_progress(quiet: bool) -> bool:
    """Print the driver's progress on stderr from now on, unless ``quiet`` or the program
    configured logging itself; ``quiet`` also removes a handler an earlier call put in.

    Returns whether tfcoord's handler is in place.
    """
    log = logging.getLogger("tfcoord")
    handler = _installed(log)
    if quiet:
        if handler is not None:
            log.removeHandler(handler)
        return False
    if handler is not None:
        return True
    if configured_by_program():
        return False
    log.addHandler(ConsoleHandler())
    for name in PROGRESS_LOGGERS:
        progress = logging.getLogger(name)
        if progress.level == logging.NOTSET:
            progress.setLevel(logging.INFO)
    return True
