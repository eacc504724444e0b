"""What a node keeps of its ranks' steps at the end of a job, and the summary the judging node prints."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...worker.steps import LiveTable, RankPlace, StepRecord
from .report import summary_lines
from .views import Verdict

PICTURE_STEPS = 2000
"""The picture and the trace show each rank's latest steps, at most this many."""


def keep_files(
    keep: Path,
    records: Mapping[int, Sequence[StepRecord]],
    places: Mapping[int, RankPlace],
    *,
    verdict: Verdict | None,
    table: LiveTable | None,
    nodes: int,
) -> list[str]:
    """Write this node's ranks' records, the picture and the trace to ``keep`` (and the summary, on the judging node:
    ``verdict`` given); the lines numarun says."""
    from ...view.steps_picture import picture
    from ...view.steps_trace import chrome_trace

    keep.mkdir(parents=True, exist_ok=True)
    (keep / "steps.jsonl").write_text("".join(rec.line() for rank in sorted(records) for rec in records[rank]))
    shown = [rec for rank in sorted(records) for rec in records[rank][-PICTURE_STEPS:]]
    (keep / "steps.svg").write_text(picture(shown, places))
    (keep / "steps.trace.json").write_text(json.dumps(chrome_trace(shown, places)))
    files = f"{keep}/ (steps.jsonl, steps.svg, steps.trace.json)"
    if verdict is None or table is None:
        return [f"step report of this node's ranks: {files}"]
    text = summary_lines(
        verdict.judgement,
        verdict.cause,
        table.rows,
        places={row.place.rank: row.place for row in table.rows},
        pace=pace(records) if nodes == 1 else table.steps_per_s,
        nodes=table.nodes,
    )
    text.append(f"the steps of every rank{' of this node' if nodes > 1 else ''}: {files}")
    (keep / "summary.txt").write_text("".join(f"{line}\n" for line in text))
    return text


def pace(records: Mapping[int, Sequence[StepRecord]]) -> float | None:
    """Steps per second of the whole job after each rank's first step: its slowest rank's."""
    rates = []
    for recs in records.values():
        after = [r for r in recs if r.step > 1]
        if len(after) >= 1 and after[-1].end > after[0].start:
            rates.append(len(after) / (after[-1].end - after[0].start))
    return min(rates) if rates else None
