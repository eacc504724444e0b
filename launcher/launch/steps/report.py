"""The step report's words (pure): the verdict in the roll-call's style and the summary printed at the end of a job,
whose figures and table :mod:`numarun.view.steps_text` draws. The verdict and the choice of the summary's columns
stay beside the judge whose findings they state: the view sits below launch."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from ...view.steps_text import ShareColumn, ms, pct, summary_text
from ...worker.steps import PHASES, RankPlace, RankRow
from .cause import Cause
from .judge import OWN_PHASES, Judgement, Unjudged


def who(rank: int, places: Mapping[int, RankPlace], multi_node: bool) -> str:
    p = places.get(rank)
    return f"rank {rank} (node {p.node_rank}, {p.host})" if multi_node and p is not None else f"rank {rank}"


def verdict_lines(
    j: Judgement, cause: Cause | None, places: Mapping[int, RankPlace], *, multi_node: bool = False
) -> list[str]:
    """``=> rank 3 holds the job back: ...`` and its ``why``/``fix`` lines, or why no rank is named."""
    if j.culprit is None:
        if j.unjudged is Unjudged.NODES_MISSING:
            return [f"=> no verdict on the job: {j.reason} (its last view did not come; nothing is judged on less)"]
        if j.unjudged in (Unjudged.NOT_STEPPING, Unjudged.APART):
            return [f"=> no verdict on the job: {j.reason} (the ranks are compared step by step)"]
        if j.unjudged in (Unjudged.NO_STEPS, Unjudged.TOO_FEW):
            return [f"=> too few steps to judge which rank holds the job back ({j.reason})"]
        if j.slowest is None or j.unjudged is Unjudged.ONE_RANK:
            return [f"=> no rank holds the job back ({j.reason})"]
        if j.unjudged is Unjudged.UNSTEADY:
            return [
                f"=> no rank holds the job back steadily (the slowest, {who(j.slowest, places, multi_node)}, costs "
                f"{pct(j.share)} of a step; it was behind the others in {pct(j.behind)} of the steps, {j.unsteady})"
            ]
        return [
            f"=> no rank holds the job back (the slowest, {who(j.slowest, places, multi_node)}, costs "
            f"{pct(j.share)} of a step)"
        ]
    if j.phase is not None:
        what = f"{j.phase}, {ms(j.lost_s)} a step above the other ranks"
    else:
        spread = ", ".join(f"{p} {ms(j.excess[p])}" for p in OWN_PHASES if j.excess.get(p, 0.0) >= j.lost_s / 10)
        what = f"its own time, {ms(j.lost_s)} a step above the other ranks ({spread})"
    out = [
        f"=> {who(j.culprit, places, multi_node)} holds the job back: {what}; the job's step, {ms(j.step_s)}, would be "
        f"{pct(j.share)} shorter at their pace"
    ]
    if cause is not None:
        out.append(f"   why: {cause.why}")
        if cause.fix:
            out.append(f"   fix: {cause.fix}")
    return out


def summary_lines(
    j: Judgement,
    cause: Cause | None,
    rows: Sequence[RankRow],
    *,
    places: Mapping[int, RankPlace],
    pace: float | None,
    nodes: int = 1,
    restart: int = 0,
) -> list[str]:
    """The end-of-job summary (without the ``numarun:`` prefix): the job's pace (``pace``: its whole run's), each
    phase's share of a step for the median rank and the slowest, peak memory, the verdict. The step count is the
    fewest steps of a rank, and the most where the ranks took different counts; ``restart``: the worker group's
    restarts (the records are its last attempt's)."""
    shares = {r: _shares(ph) for r, ph in j.phases.items()}
    slow = j.culprit if j.culprit is not None else j.slowest
    peaks = {r.place.rank: r.peak_bytes for r in rows if r.peak_bytes}
    columns: list[ShareColumn] = []  # none where no step is shared out: the verdict says why
    if j.steps and (slow is None or len(rows) < 2 or slow not in shares):  # one rank: its own shares
        columns = [_median_column(f"rank {next(iter(shares), 0)}", list(shares.values()), list(peaks.values()))]
    elif j.steps and slow is not None:
        others = [shares[r] for r in shares if r != slow]
        columns = [
            ShareColumn(f"rank {slow} (slowest)", shares[slow], peaks.get(slow)),
            _median_column("the others (median)", others, [v for r, v in peaks.items() if r != slow]),
        ]
    steps = min((r.steps for r in rows), default=0)
    text = summary_text(
        steps=steps,
        ranks=len(rows),
        nodes=nodes,
        pace=pace,
        step_s=j.step_s if j.steps else None,
        columns=columns,
        most=max((r.steps for r in rows), default=0),
        restart=restart,
    )
    return text + verdict_lines(j, cause, places, multi_node=nodes > 1)


def _median_column(name: str, shares: Sequence[Mapping[str, float]], peaks: Sequence[int]) -> ShareColumn:
    """The median of several ranks' shares and peaks (no rank: no share, no peak)."""
    medians = {p: statistics.median(s[p] for s in shares) for p in PHASES} if shares else {}
    return ShareColumn(name, medians, statistics.median(peaks) if peaks else None)


def _shares(phases: Mapping[str, float]) -> dict[str, float]:
    total = sum(phases.values())
    return {p: (phases.get(p, 0.0) / total if total > 0 else 0.0) for p in PHASES}
