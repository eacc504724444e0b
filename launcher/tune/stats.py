"""Per-candidate statistics, the winner, and the table and JSON ``numarun tune`` prints."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import tables
from .candidates import Candidate


@dataclass(frozen=True)
class Run:
    seconds: float  # wall time of the whole command
    throughput: float | None
    unit: str
    peak_mem_mb: float | None = None


@dataclass(frozen=True)
class CandidateSummary:
    candidate: Candidate
    runs: tuple[Run, ...]
    median_s: float
    throughput: float | None  # median; None when a run reported none (then time decides)
    spread: tuple[float, float]  # the lowest and highest run: of the throughput where it decides, else of the time
    unit: str
    peak_mem_mb: float | None
    ratio: float  # speed relative to the default candidate (> 1: faster)


def summarize(cands: Sequence[Candidate], runs: Sequence[Sequence[Run]], default: int) -> list[CandidateSummary]:
    """One CandidateSummary per candidate; throughput is used only when every run of every candidate has one."""
    tps = [[r.throughput for r in rs if r.throughput is not None] for rs in runs]
    with_tp = all(len(t) == len(rs) for t, rs in zip(tps, runs))
    med_s = [statistics.median(r.seconds for r in rs) for rs in runs]
    med_tp = [statistics.median(t) if with_tp else None for t in tps]
    out = []
    for i, (c, rs) in enumerate(zip(cands, runs)):
        tp, base_tp = med_tp[i], med_tp[default]
        if tp is not None and base_tp:
            ratio = tp / base_tp
        else:
            ratio = med_s[default] / med_s[i] if med_s[i] > 0 else float("inf")
        peaks = [r.peak_mem_mb for r in rs if r.peak_mem_mb is not None]
        shown = tps[i] if tp is not None else [r.seconds for r in rs]
        out.append(
            CandidateSummary(
                candidate=c,
                runs=tuple(rs),
                median_s=med_s[i],
                throughput=tp,
                spread=(min(shown), max(shown)),
                unit=rs[0].unit if with_tp else "s",
                peak_mem_mb=max(peaks) if peaks else None,
                ratio=ratio,
            )
        )
    return out


def best(summaries: Sequence[CandidateSummary]) -> int:
    """Index of the fastest candidate (highest ratio); ties go to the earlier candidate."""
    return max(range(len(summaries)), key=lambda i: (summaries[i].ratio, -i))


def _num(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.0f}"


def table(summaries: Sequence[CandidateSummary], *, default: int, winner: int, color: bool = False) -> str:
    """Text table: candidate, median and range (throughput, else seconds), peak memory, ratio."""
    by_tp = summaries[0].throughput is not None
    unit = summaries[0].unit
    numbers = (f"median {unit}", "range", "median s", "peak MiB", "vs default")
    out = tables.table([("candidate", "left"), *((name, "right") for name in numbers)])
    shown = _num if by_tp else "{:.3f}".format
    for i, s in enumerate(summaries):
        mark = " (default)" if i == default else ""
        mark += " *best*" if i == winner else ""
        out.add_row(
            s.candidate.label() + mark,
            shown(s.throughput if s.throughput is not None else s.median_s),
            "-".join(map(shown, s.spread)),
            f"{s.median_s:.3f}",
            f"{s.peak_mem_mb:.0f}" if s.peak_mem_mb is not None else "-",
            f"{s.ratio:.3f}x",
        )
    return tables.render(out, color=color)


def to_json(summaries: Sequence[CandidateSummary], *, default: int, winner: int, trials: int) -> dict[str, Any]:
    """``{"candidates": [{"options", "runs_s", "median_s", "throughput", ...}], "best": {"options"}}``."""
    return {
        "trials": trials,
        "unit": summaries[0].unit,
        "candidates": [
            {
                "options": s.candidate.as_dict(),
                "runs_s": [round(r.seconds, 4) for r in s.runs],
                "median_s": round(s.median_s, 4),
                "throughput": s.throughput,
                "runs_throughput": [r.throughput for r in s.runs] if s.throughput is not None else None,
                "peak_mem_mb": s.peak_mem_mb,
                "ratio_to_default": round(s.ratio, 4),
                "default": i == default,
            }
            for i, s in enumerate(summaries)
        ],
        "best": {
            "options": summaries[winner].candidate.as_dict(),
            "ratio_to_default": round(summaries[winner].ratio, 4),
        },
    }
