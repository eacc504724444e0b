"""SVG bar chart of a tune: one bar per candidate (median), a whisker for the range of its runs.

Element classes: ``bar`` (also ``winner`` for the winner's, else ``default`` for the default's), ``whisker``,
``label``, ``value``; each bar's tooltip gives its candidate and median."""

from __future__ import annotations

from collections.abc import Sequence

from ..view.svg_doc import Canvas
from .stats import CandidateSummary

BAR_H, GAP, LABEL_W, PLOT_W, PAD = 22, 10, 330, 420, 16

_STYLE = """text.title { font-size: 13px; }
rect.bar { fill: #90a4ae; }
rect.bar.default { fill: #1565c0; }
rect.bar.winner { fill: #2e7d32; }
line.whisker { stroke: #000; }
"""


def render_chart(
    summaries: Sequence[CandidateSummary], *, default: int, winner: int, title: str = "numarun tune"
) -> str:
    unit = summaries[0].unit if summaries[0].throughput is not None else "s (wall, lower is better)"
    values = [s.throughput if s.throughput is not None else s.median_s for s in summaries]
    top = max([s.spread[1] for s in summaries] + values + [1e-12])
    out = Canvas()
    heading = f"{title}: median {unit}"
    out.text(PAD, PAD + 12, heading, cls="title")
    y0 = PAD * 2 + 20
    for i, (s, v) in enumerate(zip(summaries, values)):
        lo, hi = s.spread
        y = y0 + i * (BAR_H + GAP)
        role = " winner" if i == winner else (" default" if i == default else "")
        label = s.candidate.label() + (" (default)" if i == default else "")
        out.text(PAD, y + BAR_H * 0.7, label, cls="label")
        out.rect(PAD + LABEL_W, y, PLOT_W * v / top, BAR_H, cls="bar" + role, tip=f"{label}: {v:.4g}")
        x_lo, x_hi, ym = PAD + LABEL_W + PLOT_W * lo / top, PAD + LABEL_W + PLOT_W * hi / top, y + BAR_H / 2
        out.line(x_lo, ym, x_hi, ym, cls="whisker")
        for x in (x_lo, x_hi):
            out.line(x, y + 5, x, y + BAR_H - 5, cls="whisker")
        out.text(PAD + LABEL_W + PLOT_W + 8, y + BAR_H * 0.7, f"{v:.4g} ({s.ratio:.2f}x)", cls="value")
    width = LABEL_W + PLOT_W + 130 + 2 * PAD
    height = PAD * 3 + 20 + len(summaries) * (BAR_H + GAP)
    return out.document(width, height, title=heading, style=_STYLE)
