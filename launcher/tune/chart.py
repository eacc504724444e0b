"""SVG bar chart of a tune: one bar per candidate (median), a whisker for the range of its runs."""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from .stats import Summary

BAR_H, GAP, LABEL_W, PLOT_W, PAD = 22, 10, 330, 420, 16


def render_chart(summaries: Sequence[Summary], *, default: int, winner: int, title: str = "numarun tune") -> str:
    by_tp = summaries[0].throughput is not None
    unit = summaries[0].unit if by_tp else "s (wall, lower is better)"
    values, ranges = [], []
    for s in summaries:
        if by_tp and s.throughput_range is not None:
            values.append(float(s.throughput))  # type: ignore[arg-type]
            ranges.append(s.throughput_range)
        else:
            times = [r.seconds for r in s.runs]
            values.append(s.median_s)
            ranges.append((min(times), max(times)))
    top = max([hi for _, hi in ranges] + values + [1e-12])
    width = LABEL_W + PLOT_W + 130 + 2 * PAD
    height = PAD * 3 + 20 + len(summaries) * (BAR_H + GAP)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{PAD}" y="{PAD + 12}" font-size="14" font-weight="bold">{escape(title)}: median '
        f"{escape(unit)}</text>",
    ]
    y0 = PAD * 2 + 20
    for i, (s, v, (lo, hi)) in enumerate(zip(summaries, values, ranges)):
        y = y0 + i * (BAR_H + GAP)
        w = PLOT_W * v / top
        colour = "#2e7d32" if i == winner else ("#1565c0" if i == default else "#90a4ae")
        label = s.candidate.label() + (" (default)" if i == default else "")
        out.append(f'<text x="{PAD}" y="{y + BAR_H * 0.7:.1f}">{escape(label)}</text>')
        out.append(
            f'<rect x="{PAD + LABEL_W}" y="{y}" width="{w:.1f}" height="{BAR_H}" '
            f'fill="{colour}"><title>{escape(label)}: {v:.4g}</title></rect>'
        )
        x_lo, x_hi, ym = PAD + LABEL_W + PLOT_W * lo / top, PAD + LABEL_W + PLOT_W * hi / top, y + BAR_H / 2
        out.append(f'<line x1="{x_lo:.1f}" y1="{ym}" x2="{x_hi:.1f}" y2="{ym}" stroke="black"/>')
        for x in (x_lo, x_hi):
            out.append(f'<line x1="{x:.1f}" y1="{y + 5}" x2="{x:.1f}" y2="{y + BAR_H - 5}" stroke="black"/>')
        out.append(f'<text x="{PAD + LABEL_W + PLOT_W + 8}" y="{y + BAR_H * 0.7:.1f}">{v:.4g} ({s.ratio:.2f}x)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
