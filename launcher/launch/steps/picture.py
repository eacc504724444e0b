"""The step report's picture: ranks x steps, coloured by phase (a placeholder: one line per rank)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from ...worker.steps import RankPlace, StepRecord


def picture(records: Sequence[StepRecord], places: Mapping[int, RankPlace]) -> str:
    """An SVG document of ``records``, each rank labelled with its place."""
    ranks = sorted({r.rank for r in records} | set(places))
    lines = [
        f'<text x="4" y="{16 * (i + 1)}">{escape(places[r].label() if r in places else f"rank {r}")}</text>'
        for i, r in enumerate(ranks)
    ]
    height = 16 * (len(ranks) + 1)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="640" height="{height}" font-family="monospace" '
        f'font-size="12">{"".join(lines)}</svg>\n'
    )
