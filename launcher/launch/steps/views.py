"""What a node tells the judge, and the job's table made of every node's view (pure).

Each node's agent makes a :class:`NodeView` of its ranks at every report (their rows, their latest steps, the kernel's
figures) and hands it to the judging node (the one with group rank 0) through the store. The judge judges every
rank of the job (:func:`judge_views`) and hands the job's table back; the other nodes show it with their own ranks'
rows, which are newer (:func:`merge_table`). At the end of the job the judge decides on every node's last view
(:attr:`NodeView.final`): a node whose last view has not come is named, never judged on what it said earlier
(:func:`missing_nodes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...worker.steps import LiveTable, RankRow
from .cause import Cause, explain
from .evidence import Evidence
from .judge import Judgement, Point, judge, without_nodes
from .live import steps_per_s
from .report import verdict_lines


@dataclass(frozen=True)
class RankView:
    """One rank as its node tells the judge (JSON through the store)."""

    row: RankRow
    window: tuple[tuple[float | None, ...], ...]
    """Its latest steps as :meth:`Point.row` lists."""
    evidence: Evidence | None = None
    workers: int = -1
    """Its DataLoader workers as its records say (-1: unknown)."""


@dataclass(frozen=True)
class NodeView:
    node: int
    host: str
    bound: bool
    ranks: tuple[RankView, ...]
    final: bool = False
    """Every rank of the node had ended when it was made: its last view."""
    pace: float | None = None
    """Steps per second of its slowest rank over its whole run (None before a rank's second step)."""


@dataclass(frozen=True)
class Verdict:
    """The judge's answer on the views it has: the judgement, its cause, the job's table."""

    judgement: Judgement
    cause: Cause | None
    table: LiveTable


def missing_nodes(views: Mapping[int, NodeView], nodes: int) -> list[str]:
    """Why the views of ``nodes`` nodes are not the job's last: ``node 1 last reported at step 40``, ``node 2 was
    never heard from``; [] when every node's last view is in."""
    out = []
    for n in range(nodes):
        v = views.get(n)
        if v is None:
            out.append(f"node {n} was never heard from")
        elif not v.final:
            out.append(f"node {n} last reported at step {min((rv.row.steps for rv in v.ranks), default=0)}")
    return out


def judge_views(views: Mapping[int, NodeView], *, nodes: int, now: float, missing: Sequence[str] = ()) -> Verdict:
    """The verdict on every rank of ``views`` and the job's table. ``missing``: nodes whose last view the judge
    waited for in vain (:func:`missing_nodes`): then no rank is named, and the verdict says why."""
    ranks = [rv for v in views.values() for rv in v.ranks]
    points = {rv.row.place.rank: [Point.of_row(p) for p in rv.window] for rv in ranks}
    j = judge(points)
    if missing:
        j = without_nodes(j, missing)
    cause = None
    if j.culprit is not None:
        evidence = {rv.row.place.rank: rv.evidence for rv in ranks if rv.evidence is not None}
        workers = {rv.row.place.rank: rv.workers for rv in ranks}
        cause = explain(j, evidence, workers=workers, bound=all(v.bound for v in views.values()))
    rows = tuple(sorted((rv.row for rv in ranks), key=lambda row: row.place.rank))
    places = {row.place.rank: row.place for row in rows}
    verdict = verdict_lines(j, cause, places, multi_node=nodes > 1)[0] if j.steps or j.spans or missing else None
    table = LiveTable(now, rows, steps_per_s(rows), verdict, len(views), nodes, j.slowest if j.steps else None)
    return Verdict(j, cause, table)


def merge_table(shared: LiveTable | None, mine: Sequence[RankRow], *, nodes: int, now: float) -> LiveTable:
    """The job's table on a node that does not judge: the judge's (``shared``, None before it came) with this node's
    own rows in place of the judge's copies of them (they are newer)."""
    own = {row.place.rank: row for row in mine}
    rows = tuple(own.pop(row.place.rank, row) for row in (shared.rows if shared else ())) + tuple(own.values())
    rows = tuple(sorted(rows, key=lambda row: row.place.rank))
    if shared is None:
        return LiveTable(now, rows, steps_per_s(rows), None, 1, nodes, None)
    return LiveTable(now, rows, shared.steps_per_s, shared.verdict, shared.nodes, nodes, shared.slowest)
