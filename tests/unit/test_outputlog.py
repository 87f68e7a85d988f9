"""tfcoord.node.outputlog.ShownLine: a node's output kept as a terminal shows it."""

from __future__ import annotations

import pytest

from tfcoord.node.outputlog import ShownLine, escape


def _progbar(steps: int) -> str:
    """What Keras's Progbar writes for one epoch on a terminal: each step erases the last
    bar with backspaces and a carriage return, then draws the next one; a line break ends it."""
    text, last = "", ""
    for i in range(1, steps + 1):
        bar = f"{i}/{steps} [{'=' * (i - 1)}>{'.' * (steps - i)}] - 0s 13ms/step - loss: {1 / i:.4f}"
        text += "\b" * len(last) + "\r" + bar
        last = bar
    return text + "\n"


def test_a_progress_bar_redrawn_in_place_is_kept_as_its_last_state():
    shown = ShownLine()
    epoch = _progbar(450)
    assert len(epoch) > 64 * 1024  # byte for byte, it would have been cut at MAX_READ_LINE
    lines = [line for i in range(0, len(epoch), 4096) for line in shown.feed(epoch[i : i + 4096])]
    assert lines == ["450/450 [" + "=" * 449 + ">] - 0s 13ms/step - loss: 0.0022"]


@pytest.mark.parametrize(
    ("written", "lines"),
    [
        ("plain\n", ["plain"]),
        ("windows\r\n", ["windows"]),  # a CRLF line end comes out bare
        ("10%\r20%\r100%\n", ["100%"]),  # tqdm's redraw: a carriage return only
        ("abcdef\rXY\n", ["XYcdef"]),  # a shorter redraw leaves the rest, as on a terminal
        ("ab\b\bcd\n", ["cd"]),
        ("\b\b\bx\n", ["x"]),  # backspaces stop at the line's start
        ("one\n\ntwo\n", ["one", "", "two"]),  # an empty line is a line
        ("\x1b[1mbold\x1b[0m\n", ["\x1b[1mbold\x1b[0m"]),  # other controls are escape()'s
    ],
)
def test_lines_come_out_as_a_terminal_shows_them(written, lines):
    shown = ShownLine()
    assert shown.feed(written) == lines
    assert shown.end() is None


def test_a_line_is_the_same_however_the_writes_split_it():
    written = "abc\rX\b\bYZ\nsecond\r\n"
    for size in range(1, len(written) + 1):
        shown = ShownLine()
        got = [line for i in range(0, len(written), size) for line in shown.feed(written[i : i + size])]
        assert got == ["YZc", "second"], size


def test_a_line_past_the_limit_is_cut_once_and_the_rest_of_it_dropped():
    shown = ShownLine(limit=50)
    assert shown.feed("x" * 30) == []
    assert shown.feed("x" * 40) == ["x" * 50]  # sent when it reached the limit
    assert shown.feed("y" * 100) == []  # the rest of that line
    assert shown.feed("yy\nnext\n" + "z" * 60 + "\n") == ["next", "z" * 50]


def test_output_without_a_final_line_break_ends_as_its_last_line():
    shown = ShownLine()
    assert shown.feed("done 1/2\rdone 2/2") == []
    assert shown.end() == "done 2/2"
    assert shown.end() is None


def test_escape_shows_the_controls_a_shown_line_still_holds_and_keeps_tabs():
    assert escape("\x1b[2Jcleared?\tok") == "\\x1b[2Jcleared?\tok"
