"""The step report as a picture: ranks × steps on a time axis, each step split by phase (pure; docs/steps.md).

One row per rank, in rank order, grouped by node. Each step is a segment as wide as its wall time, placed at its
start; inside it the step's phases (:data:`~numarun.worker.steps.PHASES`) lie back to back in that order, coloured
by phase. A record holds each phase's total for the step, not when it happened: the split shows shares, not order.
Each node's ranks share one axis starting at 0 at the node's first step (``time.monotonic()`` is one host's clock;
nodes are never compared by it); all nodes share one scale (pixels per second), so a node that ran longer is wider.
A rank that holds the job back shows at a glance: its row's steps are longer, or its colours differ from its
neighbours' (less ``comm``: the others wait for it there), and its label's second line gives its median step.

Bounded size: a node whose rows hold more than :data:`MAX_STEPS` steps has its time axis cut into
:data:`BUCKETS` equal buckets and each rank's steps merged per bucket (a step belongs to the bucket its start lies
in): one segment from the bucket's first step's start to its last step's end, split by the bucket's summed phase
seconds, its tooltip naming the steps it holds and their mean. The document is O(ranks × min(steps, BUCKETS)), a few
hundred kB for 8 ranks, however long the job ran. Each phase of a row is one ``<path>``; each segment one
transparent ``<rect class="step">`` carrying its tooltip.

Stable element classes for tools and tests: ``node`` (``data-node``), ``rank-row`` (``data-rank``, ``data-end``:
the seconds of its last step's end on its node's axis), ``phase-<name>`` (a row's path of one phase), ``step``
(``data-steps``: ``17`` or ``101-150``), ``rank-label``, ``rank-stats``, ``legend``, ``axis``.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..worker.steps import PHASES, RankPlace, StepRecord
from .steps_text import peak_text
from .steps_trace import by_node, node_hosts
from .svg_doc import Canvas, clip, num

MAX_STEPS = 300
"""Beyond this many steps in one row, the node's steps are merged into :data:`BUCKETS` time buckets."""
BUCKETS = 200
PLOT_W = 960
ROW_H = 30  # a row: the bar and, beside it, two lines of label
BAR_H = 20
PAD = 10
AXIS_H = 34  # a node's heading and its tick labels
CHAR_W = 6.7  # monospace 11px
MAX_LABEL_CHARS = 84

PHASE_COLOURS: Mapping[str, str] = {
    "input": "#e45756",  # waiting on data: red, the colour of a problem
    "compute": "#4c78a8",
    "comm": "#f2cf5b",
    "optim": "#54a24b",
}

_STYLE = (
    "text { white-space: pre; }\n"
    "text.title { font-size: 13px; }\n"
    "text.rank-stats { fill: #555; font-size: 10px; }\n"
    "text.axis { fill: #555; font-size: 10px; }\n"
    "line.grid { stroke: #ddd; }\n"
    "rect.row-bg { fill: #f4f4f4; }\n"
    "rect.step { fill: #000; fill-opacity: 0; stroke: #fff; stroke-width: 0.4; }\n"
    + "".join(f"path.phase-{p} {{ fill: {c}; }}\n" for p, c in PHASE_COLOURS.items())
)


def _finite(x: float) -> float:
    return x if math.isfinite(x) and x > 0 else 0.0


@dataclass(frozen=True)
class _Segment:
    """One step, or the steps of one bucket, of one rank, on its node's axis (seconds from the node's origin)."""

    start: float
    end: float
    phases: tuple[float, ...]
    """Seconds of each of PHASES, summed over the segment's steps."""
    first: int
    last: int
    count: int
    peak: int | None

    def tooltip(self, rank: int) -> str:
        wall = self.end - self.start
        each = " ".join(f"{p} {s / self.count:.4g}" for p, s in zip(PHASES, self.phases))
        peak = f"; peak {peak_text(self.peak)}" if self.peak is not None else ""
        if self.count == 1:
            return f"rank {rank} step {self.first}: {wall:.4g} s ({each}){peak}"
        mean = sum(self.phases) / self.count
        return (
            f"rank {rank} steps {self.first}-{self.last} ({self.count}), {self.start:.4g}-{self.end:.4g} s: "
            f"mean {mean:.4g} s a step ({each}){peak}"
        )


@dataclass(frozen=True)
class _Row:
    rank: int
    label: str
    stats: str
    segments: tuple[_Segment, ...]
    end: float


def _stats(steps: Sequence[StepRecord]) -> str:
    """``median 0.123 s of 40 steps: input 8% compute 70% comm 20% optim 2%; peak 1.2 GiB``: a rank's steps."""
    walls = [_finite(r.wall_s) for r in steps]
    median = statistics.median(walls)
    total = sum(walls) or 1.0
    shares = " ".join(f"{p} {100 * sum(_finite(r.phase_s(p)) for r in steps) / total:.0f}%" for p in PHASES)
    peaks = [r.peak_bytes for r in steps if r.peak_bytes is not None]
    peak = f"; peak {peak_text(max(peaks))}" if peaks else ""
    return f"median {median:.4g} s of {len(steps)} steps: {shares}{peak}"


def _segments(steps: Sequence[StepRecord], origin: float, span: float, bucketed: bool) -> list[_Segment]:
    """The segments of one rank's steps (sorted by start): one a step, or one a non-empty bucket."""

    def bucket(r: StepRecord) -> int:
        return min(BUCKETS - 1, int((r.start - origin) / span * BUCKETS)) if span > 0 else -1

    # a step on its own, or the run of steps in one bucket
    runs = itertools.groupby(enumerate(steps), key=lambda at: bucket(at[1]) if bucketed else at[0])
    groups = [[r for _, r in run] for _, run in runs]
    return [
        _Segment(
            start=g[0].start - origin,
            end=max(g[0].start, *(r.end for r in g)) - origin,
            phases=tuple(sum(_finite(r.phase_s(p)) for r in g) for p in PHASES),
            first=g[0].step,
            last=g[-1].step,
            count=len(g),
            peak=max((r.peak_bytes for r in g if r.peak_bytes is not None), default=None),
        )
        for g in groups
    ]


@dataclass(frozen=True)
class _Node:
    node_rank: int
    host: str
    rows: tuple[_Row, ...]
    span: float
    bucketed: bool


def _nodes(records: Sequence[StepRecord], places: Mapping[int, RankPlace]) -> list[_Node]:
    nodes = []
    for node_rank, ranks in by_node(records, places).items():
        origin = min(steps[0].start for steps in ranks.values())
        span = max(max(r.end for r in steps) for steps in ranks.values()) - origin
        bucketed = max(len(steps) for steps in ranks.values()) > MAX_STEPS
        rows = []
        for rank, steps in ranks.items():
            place = places.get(rank)
            segments = _segments(steps, origin, span, bucketed)
            label = place.label() if place else f"rank {rank}"
            rows.append(_Row(rank, label, _stats(steps), tuple(segments), max(s.end for s in segments)))
        nodes.append(_Node(node_rank, node_hosts(ranks, places), tuple(rows), max(span, 0.0), bucketed))
    return nodes


def _nice_step(span: float, ticks: int = 8) -> float:
    """A tick interval of 1, 2 or 5 × 10^k giving about ``ticks`` ticks over ``span``."""
    raw = max(span, 1e-9) / ticks
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _fit(text: str) -> str:
    return clip(text, MAX_LABEL_CHARS)


def _row(row: _Row, x0: float, y: float, scale: float, out: Canvas) -> None:
    """One rank's row: its label (place; stats), its background, one path per phase, one hit rect per segment."""
    with out.group(cls="rank-row", data={"rank": row.rank, "end": f"{row.end:.6g}"}):
        out.text(PAD, y + 12, _fit(row.label), cls="rank-label", tip=row.label, preserve=True)
        out.text(PAD, y + 24, _fit(row.stats), cls="rank-stats")
        bar_y = y + (ROW_H - BAR_H) / 2
        out.rect(x0, bar_y, PLOT_W, BAR_H, cls="row-bg")
        paths: dict[str, list[str]] = {p: [] for p in PHASES}
        for s in row.segments:
            left, wall = x0 + s.start * scale, max(s.end - s.start, 0.0)
            total = sum(s.phases)
            # phase totals above the wall (rounding, a clock step) are scaled down to fit, below it the rest stays
            # empty; a bucket's are the sums of its steps, any gaps between them spread over its phases
            fit = wall / total if total > wall or (s.count > 1 and total > 0) else 1.0
            for p, secs in zip(PHASES, s.phases):
                w = secs * fit * scale
                if w >= 0.05:
                    paths[p].append(f"M{num(left)} {num(bar_y)}h{num(w)}v{BAR_H}h{num(-w)}z")
                left += w
        for p in PHASES:
            if paths[p]:
                out.path("".join(paths[p]), cls=f"phase-{p}")
        for s in row.segments:
            steps = str(s.first) if s.count == 1 else f"{s.first}-{s.last}"
            width = max((s.end - s.start) * scale, 0.5)
            out.rect(
                x0 + s.start * scale, bar_y, width, BAR_H, cls="step", data={"steps": steps}, tip=s.tooltip(row.rank)
            )


def _axis(node: _Node, x0: float, y: float, height: float, scale: float, out: Canvas) -> None:
    where = f"node {node.node_rank}" + (f" ({node.host})" if node.host else "")
    merged = f"; steps merged into {BUCKETS} time buckets (see tooltips)" if node.bucketed else ""
    out.text(PAD, y + 14, where + merged, cls="title")
    step = _nice_step(node.span)
    ticks = int(node.span / step + 1e-9) + 1
    for i in range(ticks):
        x = x0 + i * step * scale
        out.line(x, y + AXIS_H - 4, x, y + height, cls="grid")
        out.text(x, y + AXIS_H - 7, f"{i * step:.6g} s", cls="axis", anchor="middle")


def _legend(x: float, y: float, out: Canvas) -> None:
    with out.group(cls="legend"):
        for p in PHASES:
            out.rect(x, y, 12, 12, style=f"fill:{PHASE_COLOURS[p]}")
            out.text(x + 16, y + 10, p)
            x += 16 + len(p) * CHAR_W + 18
        note = "(a step's phase totals, laid back to back; the record keeps no order)"
        out.text(x, y + 10, note, cls="axis")


def picture(records: Sequence[StepRecord], places: Mapping[int, RankPlace], *, title: str = "") -> str:
    """The step report of ``records`` as a standalone SVG document: ranks × steps, split by phase.

    ``places`` labels each rank (:meth:`RankPlace.label`) and puts it on its node; a rank without one is labelled by
    its number, on node 0. ``title`` heads the picture (e.g. the verdict line).
    """
    nodes = _nodes(records, places)
    longest = max(
        [len(_fit(r.label)) for n in nodes for r in n.rows] + [len(_fit(r.stats)) for n in nodes for r in n.rows] + [20]
    )
    x0 = PAD + longest * CHAR_W + PAD
    width = x0 + PLOT_W + 3 * PAD
    span = max([n.span for n in nodes] + [0.0])
    scale = PLOT_W / span if span > 0 else 0.0
    head = title or "numarun step report"
    ranks = sum(len(n.rows) for n in nodes)
    summary = (
        f"{ranks} rank{'s' if ranks != 1 else ''}, {len(records)} steps recorded" if nodes else "no steps recorded"
    )
    out = Canvas()
    out.text(PAD, PAD + 13, head, cls="title")
    out.text(PAD, PAD + 30, summary)
    _legend(PAD, PAD + 40, out)
    y = PAD + 62.0
    for n in nodes:
        section = AXIS_H + len(n.rows) * ROW_H
        with out.group(cls="node", data={"node": n.node_rank}):
            _axis(n, x0, y, section, scale, out)
            for i, row in enumerate(n.rows):
                _row(row, x0, y + AXIS_H + i * ROW_H, scale, out)
        y += section + PAD
    return out.document(width, y + PAD, title=head, style=_STYLE)
