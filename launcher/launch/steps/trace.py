"""The step report as a Chrome trace (JSON for Perfetto; a placeholder: one event per step)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...worker.steps import RankPlace, StepRecord


def chrome_trace(records: Sequence[StepRecord], places: Mapping[int, RankPlace]) -> dict[str, Any]:
    """``{"traceEvents": [...]}``: each step a complete event on its rank's row."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": r, "args": {"name": p.label()}} for r, p in sorted(places.items())
    ]
    events += [
        {"name": f"step {r.step}", "ph": "X", "pid": r.rank, "tid": 0, "ts": r.start * 1e6, "dur": r.wall_s * 1e6}
        for r in records
    ]
    return {"traceEvents": events, "displayTimeUnit": "ms"}
