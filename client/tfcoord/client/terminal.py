"""Text from nodes, made safe to show on a terminal.

Nodes choose their error texts, task ids, host names, results and output lines, and the
driver side prints them: ``tfcoord status``, ``tfcoord logs``, progress lines, the message
of a failed job. A terminal obeys the control characters in what it is given: ESC (C0) and
CSI (C1, ``\\x9b``) start sequences that move the cursor, rewrite the title, recolour or
erase what is on screen, and a carriage return or a line break forges a line that looks
like tfcoord's own. :func:`printable` writes every C0 and C1 control character (and DEL)
as a visible escape, keeping only the line breaks and tabs its caller asks for (a
traceback is many lines). Every place that shows node-supplied text calls it, whatever the
coordinator is believed to have checked: the coordinator may be older, or not tfcoord's.
"""

from __future__ import annotations

import re

#: What a multi-line text (a traceback, a failure message) keeps: its lines and indents.
TRACEBACK = "\n\t"

#: C0 controls, DEL and C1 controls: every code point a terminal may act on.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(mo: re.Match[str]) -> str:
    c = mo.group()
    return _NAMED.get(c) or f"\\x{ord(c):02x}"


def printable(text: str, *, keep: str = "") -> str:
    """``text`` with every control character shown as ``\\xNN`` (``\\n``, ``\\r``, ``\\t``).

    Args:
        text: what a node (or anyone else) supplied.
        keep: the control characters to leave as they are: ``"\\t"`` for one line of a
            program's output, :data:`TRACEBACK` (line breaks and tabs) for a traceback.

    Returns:
        The text unchanged when it holds nothing to escape.

    Raises:
        ValueError: ``keep`` names something other than a line break or a tab.
    """
    if not set(keep) <= set(TRACEBACK):
        raise ValueError(f"only line breaks and tabs may be kept, not {keep!r}")
    if not _CONTROL.search(text):
        return text
    if keep:
        return _CONTROL.sub(lambda mo: mo.group() if mo.group() in keep else _visible(mo), text)
    return _CONTROL.sub(_visible, text)
