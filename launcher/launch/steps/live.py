"""The live table's model (pure): where each rank runs, its row of the table from its latest records, the job's pace,
and a record as the judge takes it."""

from __future__ import annotations

from collections.abc import Sequence

from ...cpuset import format_list
from ...plan.model import RankBinding
from ...worker.steps import PHASES, RankPlace, RankRow, StepRecord
from .judge import WINDOW, Point, median


def place_of(b: RankBinding | None, local_rank: int, *, bound: bool, rank: int, node_rank: int, host: str) -> RankPlace:
    """Where the plan put a rank (``b``, its row of the plan; its cores only when numarun ``bound`` it)."""
    if b is None:
        return RankPlace(rank, local_rank, node_rank, host, "")
    return RankPlace(
        rank,
        local_rank,
        node_rank,
        host,
        format_list(b.cpus) if bound else "",
        b.numa_node if bound else -1,
        b.nic,
        str(b.gpu.index) if b.gpu is not None else None,
    )


def point(r: StepRecord) -> Point:
    """A record as the judge takes it: on a GPU, its own time from the stream's view (the step's GPU time less the
    stream's waits), so that a host spinning in a synchronise while its stream waits is not taken for work."""
    gpu_own = None if r.gpu_s is None else max(0.0, r.gpu_s - float(r.extra.get("gpu_comm_s", 0.0)))
    return Point(r.step, r.wall_s, r.input_s, r.compute_s, r.comm_s, r.optim_s, gpu_own)


def recent(records: Sequence[StepRecord], size: int = WINDOW) -> list[StepRecord]:
    """The latest ``size`` records, step 1 (the rank's start) left out."""
    return [r for r in records if r.step > 1][-size:]


def row_of(place: RankPlace, pid: int, records: Sequence[StepRecord], *, state: str = "running") -> RankRow:
    """A rank's row of the live table from its records."""
    win = recent(records)
    last = records[-1] if records else None
    return RankRow(
        place=place,
        pid=pid,
        steps=last.step if last else 0,
        step_s=median([r.wall_s for r in win]) if win else None,
        phases={p: round(median([r.phase_s(p) for r in win]), 6) for p in PHASES} if win else {},
        peak_bytes=last.peak_bytes if last else None,
        state=state,
    )


def steps_per_s(rows: Sequence[RankRow]) -> float | None:
    """The job's pace: that of its slowest rank over the recent window."""
    slowest = max((r.step_s for r in rows if r.step_s), default=None)
    return 1 / slowest if slowest else None
