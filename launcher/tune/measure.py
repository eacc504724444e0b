"""What one run measured, from the text of the files it left (pure; the sources and their order: docs/tune.md)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from .. import jsonable


@dataclass(frozen=True)
class Measured:
    throughput: float | None
    unit: str  # tokens/s, samples/s or s (wall time only)
    peak_mem_mb: float | None = None


def _rows(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        try:
            row = jsonable.loads(line)
        except json.JSONDecodeError:
            continue  # a blank line, or one cut short by a killed run
        if isinstance(row, dict):
            rows.append(row)
    return rows


def from_metrics(text: str) -> Measured | None:
    """tokens/s (or samples/s) and peak memory from a trainer's ``metrics.jsonl``."""
    rows = _rows(text)
    for key, unit in (("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s")):
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if values:
            steady = values[1:] if len(values) > 1 else values
            peaks = [float(p) for r in rows for p in (r.get("peak_mem_mb") or []) if isinstance(p, (int, float))]
            return Measured(statistics.median(steady), unit, max(peaks) if peaks else None)
    return None


def from_reports(text: str) -> Measured | None:
    """samples/s of the job: per rank, its samples over its seconds; summed over ranks."""
    per_rank: dict[object, tuple[float, float]] = {}
    for r in _rows(text):
        samples, seconds = r.get("samples"), r.get("seconds")
        if not isinstance(samples, (int, float)) or not isinstance(seconds, (int, float)) or seconds <= 0:
            continue
        s, t = per_rank.get(r.get("rank"), (0.0, 0.0))
        per_rank[r.get("rank")] = (s + samples, t + seconds)
    if not per_rank:
        return None
    return Measured(sum(s / t for s, t in per_rank.values()), "samples/s")
