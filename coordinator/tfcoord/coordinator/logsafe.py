"""Log records that untrusted text cannot forge lines in.

Nodes choose their task ids, host names, error texts and metadata, and the coordinator
logs them. In a text log a newline inside such a value starts a new line that looks like
the coordinator's own ("2026-12-04 ... ERROR tfcoord.coordinator: job ... SUCCEEDED"). The
:class:`EscapeControls` filter rewrites every string argument of a record so that line
breaks and other control characters appear escaped (``\\n``), whatever handler or
formatter the application configured; the format string itself is ours and kept as it is.
JSON logs escape on their own, so this costs them nothing but readability of a traceback
argument, which the coordinator never logs as an argument (tracebacks go in ``exc_info``).
"""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape(text: str) -> str:
    """``text`` with every control character (newlines, escapes, NUL) written as ``\\xNN``/``\\n``."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda mo: mo.group().encode("unicode_escape").decode("ascii"), text)


def _clean(arg: object) -> object:
    if isinstance(arg, str):
        return escape(arg)
    if isinstance(arg, (int, float)) or arg is None:
        return arg
    return escape(str(arg))  # whatever it is, it is formatted as its str()


class EscapeControls(logging.Filter):
    """Escape control characters in a record's arguments and structured fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_clean(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _clean(v) for k, v in record.args.items()}
        elif isinstance(record.msg, str) and not record.args:
            record.msg = escape(record.msg)
        for key in ("job", "node", "state"):
            value = getattr(record, key, None)
            if isinstance(value, str):
                setattr(record, key, escape(value))
        return True


def protect(logger: logging.Logger) -> logging.Logger:
    """Attach :class:`EscapeControls` to ``logger`` (once); returns it."""
    if not any(isinstance(f, EscapeControls) for f in logger.filters):
        logger.addFilter(EscapeControls())
    return logger
