"""Tables drawn by rich (numarun.tables): columns aligned by rich, plain text off a terminal, colour on one."""

from __future__ import annotations

from numarun import tables


def _table():
    t = tables.table([("name", "left"), ("GB/s", "right")])
    t.add_row("a long name", "1.00")
    t.add_row("b", "123.45")
    return t


def test_plain_text_is_aligned_by_rich_and_lines_are_never_wrapped() -> None:
    long = "x" * 300
    text = tables.render("title", _table(), long, width=40)
    assert text.splitlines() == [
        "title",
        "name            GB/s",
        "────────────────────",
        "a long name     1.00",
        "b             123.45",
        long,  # a line of text as it is, wider than the console
    ]
    assert "\x1b[" not in text


def test_colour_only_when_asked_for_a_terminal() -> None:
    coloured = tables.render(_table(), color=True)
    assert "\x1b[1m" in coloured  # the bold header
    assert tables.render(_table(), color=False) == tables.render(_table())
