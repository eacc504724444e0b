"""The live step table of a running job, what ``numarun top`` draws (rich; pure: a table in, a renderable or text
out; docs/steps.md)."""

from __future__ import annotations

import time

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..tables import render
from ..worker.steps import PHASES, LiveTable, RankRow
from .steps_text import peak_text


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} s" if value >= 0.1 else f"{value * 1000:.3g} ms"


def _share(row: RankRow, phase: str) -> str:
    secs = row.phases.get(phase)
    if secs is None or not row.step_s:
        return "-"
    return f"{100 * secs / row.step_s:.0f}%"


def top_table(live: LiveTable) -> Table:
    """One row per rank, in rank order: where it runs, its pace and each phase's share of its median step."""
    gpus = any(r.place.gpu is not None for r in live.rows)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ["rank", "node", "host", "cpus", "numa", "nic", *(["gpu"] if gpus else []), "pid", "steps", "step"]
    columns += [*PHASES, "peak", "state"]
    for name in columns:
        numeric = name in ("rank", "node", "numa", "pid", "steps", "step", "peak", *PHASES)
        table.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for r in sorted(live.rows, key=lambda r: r.place.rank):
        p = r.place
        cells = [str(p.rank), str(p.node_rank), p.host or "-", p.cpus or "unbound", str(p.numa) if p.numa >= 0 else "-"]
        cells += [p.nic or "-", *([p.gpu or "-"] if gpus else []), str(r.pid), str(r.steps), _seconds(r.step_s)]
        cells += [*(_share(r, phase) for phase in PHASES), peak_text(r.peak_bytes), r.state]
        table.add_row(*cells, style=None if r.state == "running" else "dim")
    return table


def summary_line(live: LiveTable, *, now: float | None = None) -> str:
    """``job: 12.3 steps/s; 4 ranks on 1 node; updated 1 s ago`` under the table."""
    pace = f"{live.steps_per_s:.3g} steps/s" if live.steps_per_s is not None else "no pace yet"
    ranks = f"{len(live.rows)} rank{'s' if len(live.rows) != 1 else ''}"
    nodes = f"{live.nodes} node{'s' if live.nodes != 1 else ''}"
    if live.job_nodes > live.nodes:
        nodes += f" of the job's {live.job_nodes}"
    age = max((time.time() if now is None else now) - live.updated, 0.0)
    return f"job: {pace}; {ranks} on {nodes}; updated {age:.0f} s ago"


def top_view(live: LiveTable, *, title: str = "", now: float | None = None) -> Group:
    """``title`` (the job), the table, the job's pace and the verdict line (``=> ...``) under it."""
    table = top_table(live)
    table.title, table.title_justify = title or None, "left"
    lines = [Text(summary_line(live, now=now))]
    lines.append(Text(live.verdict or "=> no verdict yet", style="bold" if live.verdict else "dim"))
    return Group(table, *lines)


def render_top(
    live: LiveTable, *, title: str = "", width: int = 160, color: bool = False, now: float | None = None
) -> str:
    """The view as text; without colour, plain (no control codes)."""
    return render(top_view(live, title=title, now=now), width=width, color=color)
