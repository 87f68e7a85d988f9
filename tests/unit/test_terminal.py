"""tfcoord.client.terminal.printable: the one escape for node text on its way to a terminal."""

from __future__ import annotations

import pytest

from tfcoord.client.terminal import TRACEBACK, printable


def test_plain_text_is_returned_as_it_is():
    text = "worker:0 failed: ValueError: ünïcode — and 日本語 stay"
    assert printable(text) is text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # C0: ESC, the start of every CSI/OSC sequence
        ("\x9b31m", "\\x9b31m"),  # C1: the one-character CSI
        ("\x85", "\\x85"),  # C1: NEL, a line break to some terminals
        ("a\rb", "a\\rb"),  # a carriage return overwrites the line
        ("a\nb", "a\\nb"),  # a line break forges a line
        ("a\tb", "a\\tb"),
        ("\x00\x07\x7f", "\\x00\\x07\\x7f"),  # NUL, BEL, DEL
    ],
)
def test_every_c0_and_c1_control_is_shown_escaped(raw, shown):
    assert printable(raw) == shown


def test_a_traceback_keeps_its_lines_and_tabs_and_nothing_else():
    tb = "Traceback (most recent call last):\n\tline 1\r\x1b]0;title\x07\x9b0m"
    assert printable(tb, keep=TRACEBACK) == (
        "Traceback (most recent call last):\n\tline 1\\r\\x1b]0;title\\x07\\x9b0m"
    )
    assert printable("a\tb\nc", keep="\t") == "a\tb\\nc"


def test_only_line_breaks_and_tabs_may_be_kept():
    with pytest.raises(ValueError, match="only line breaks and tabs"):
        printable("x", keep="\x1b")


def test_everything_escaped_is_printable():
    every = "".join(map(chr, range(0x100)))
    shown = printable(every)
    assert all(c.isprintable() or c == "\xa0" or c == "\xad" for c in shown)
