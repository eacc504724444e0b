"""Tables drawn by rich, as the text a command prints: columns aligned by rich, never padded by hand; plain text
unless ``color`` (a terminal), at a fixed width so that the same data gives the same text (golden files)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # rich is imported where a table is drawn, not where this module is
    from rich.console import RenderableType
    from rich.table import Table

Justify = Literal["left", "right"]


def table(columns: Sequence[tuple[str, Justify]], *, header: bool = True) -> Table:
    """A table of ``(name, justify)`` columns: the header ruled off below it, no frame, two spaces between columns;
    a cell never wraps (a long one widens its column)."""
    from rich import box
    from rich.table import Table

    out = Table(box=box.SIMPLE_HEAD, show_edge=False, show_header=header, pad_edge=False, padding=(0, 1))
    for name, justify in columns:
        out.add_column(name, justify=justify, no_wrap=True)
    return out


def render(*items: RenderableType, width: int = 160, color: bool = False) -> str:
    """``items`` (tables, other renderables, or lines of text printed as they are, unwrapped) as text, one after
    the other; trailing spaces left out."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=color,
        color_system="standard" if color else None,
        no_color=not color,
        highlight=False,
        emoji=False,
    )
    for item in items:
        if isinstance(item, str):
            console.print(item, markup=False, soft_wrap=True)
        else:
            console.print(item)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
