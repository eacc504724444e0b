"""The step report's words (pure; docs/steps.md): its figures (``48 ms``, ``76 %``, ``1.2 GiB``) and the summary
printed at the end of a job, its table drawn by :func:`numarun.tables.render`.

The verdict's lines and the choice of the summary's columns stay beside the judge whose findings they state
(:mod:`numarun.launch.steps.report`): this package sits below launch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import tables
from ..worker.steps import PHASES


def ms(seconds: float) -> str:
    """``48 ms``, ``0.4 ms``, ``2.1 s``."""
    if abs(seconds) >= 10:
        return f"{seconds:.0f} s"
    if abs(seconds) >= 1:
        return f"{seconds:.1f} s"
    value = seconds * 1e3
    return f"{value:.0f} ms" if abs(value) >= 10 else f"{value:.1f} ms"


def pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def peak_text(peak_bytes: float | None) -> str:
    """``1.2 GiB``, ``640 MiB``; ``-`` when unknown."""
    if peak_bytes is None or peak_bytes < 0:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak_bytes >= size:
            value = peak_bytes / size
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{peak_bytes:.0f} B"


@dataclass(frozen=True)
class ShareColumn:
    """A column of the summary's table: whose figures (``rank 1 (slowest)``), each phase's share of their step, and
    their peak memory (None: unknown)."""

    name: str
    shares: Mapping[str, float]
    peak_bytes: float | None = None


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def summary_text(
    *,
    steps: int,
    ranks: int,
    nodes: int,
    pace: float | None,
    step_s: float | None,
    columns: Sequence[ShareColumn],
    most: int | None = None,
    restart: int = 0,
) -> list[str]:
    """``step report: 40 steps of 2 ranks, 9.8 steps/s, a step 103 ms``, then the table: a ``share of a step`` header,
    a row per phase and, where a column knows it, the ``peak memory`` row. ``most``: the most steps a rank took,
    where the ranks took different counts (``30 to 40 steps``); ``restart``: the worker group's restarts, whose last
    attempt the records are of (``after restart 1``); ``step_s`` None and no ``columns``: the head line alone (no step
    to share out)."""
    from rich.padding import Padding

    where = f" on {nodes} nodes" if nodes > 1 else ""
    rate = f", {pace:.3g} steps/s" if pace else ""
    count = f"{steps} to {most} steps" if most is not None and most != steps else f"{steps} step{_s(steps)}"
    again = f" after restart {restart}" if restart else ""
    step = f", a step {ms(step_s)}" if step_s is not None else ""
    head = f"step report: {count} of {ranks} rank{_s(ranks)}{where}{again}{rate}{step}"
    if not columns:
        return [head]
    table = tables.table([("share of a step", "left"), *((c.name, "right") for c in columns)])
    for p in PHASES:
        table.add_row(p, *(pct(c.shares.get(p, 0.0)) for c in columns))
    if any(c.peak_bytes is not None for c in columns):
        table.add_row("peak memory", *(peak_text(c.peak_bytes) for c in columns))
    return [head, *tables.render(Padding(table, (0, 0, 0, 2))).splitlines()]
