"""The step report's agent thread on a private directory written as the ranks write it (their heartbeats and step
records; this process stands in for both ranks): the live table, the summary at the end, the files kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

from numarun.launch.steps import StepPolicy, StepWatch
from numarun.worker.progress import HEARTBEAT
from numarun.worker.steps import LIVE, RECORDS, LiveTable, StepRecord, read_records


def _job(state: Path, *, steps: int, slow_input: float) -> None:
    """Two ranks of one node; rank 1 waits ``slow_input`` longer for each batch, rank 0 waits that long in comm."""
    for rank in (0, 1):
        beat = {"v": 1, "pid": os.getpid(), "rank": rank, "local_rank": rank, "node_rank": 0, "nodes": 1, "group": 0}
        (state / HEARTBEAT.format(local_rank=rank)).write_text(json.dumps(beat))
        lines = []
        for step in range(1, steps + 1):
            start = 100.0 + step * 0.1
            late = slow_input if rank == 1 else 0.0
            lines.append(
                StepRecord(
                    rank,
                    step,
                    start,
                    start + 0.1,
                    input_s=0.001 + late,
                    comm_s=0.01 + slow_input - late,
                    optim_s=0.001,
                    compute_s=0.088 - slow_input,
                    peak_bytes=300 << 20,
                    extra={"loader_workers": 0.0},
                ).line()
            )
        (state / RECORDS.format(local_rank=rank)).write_text("".join(lines))


def test_the_live_table_then_the_summary_and_the_files(tmp_path: Path) -> None:
    state, keep = tmp_path / "state", tmp_path / "keep"
    state.mkdir()
    _job(state, steps=30, slow_input=0.04)
    said: list[str] = []
    watch = StepWatch(StepPolicy(True, 0.5), state, keep=keep, store=None, plan=None, say=said.extend)
    watch.tick()
    table = LiveTable.parse((state / LIVE).read_text())
    assert [r.place.rank for r in table.rows] == [0, 1] and all(r.steps == 30 for r in table.rows)
    assert table.rows[1].phases["input"] > 0.04 and table.slowest == 1 and table.job_nodes == 1
    assert table.verdict is not None and table.verdict.startswith("=> rank 1 holds the job back: input")
    watch.close()
    assert said[0] == "step report: 30 steps of 2 ranks, 10 steps/s, a step 100 ms"
    verdict = next(line for line in said if line.startswith("=> "))
    assert verdict.startswith("=> rank 1 holds the job back: input, 40 ms a step above the other ranks"), said
    assert said[-1] == f"the steps of every rank: {keep}/ (steps.jsonl, steps.svg, steps.trace.json)"
    kept = list(read_records((keep / "steps.jsonl").read_text().splitlines()))
    assert len(kept) == 60 and (keep / "summary.txt").read_text().splitlines() == said
    assert (keep / "steps.svg").exists() and json.loads((keep / "steps.trace.json").read_text())["traceEvents"]


def test_a_balanced_job_and_a_job_without_steps(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    _job(state, steps=30, slow_input=0.0)
    said: list[str] = []
    StepWatch(StepPolicy(True, 0.5), state, keep=tmp_path / "keep", store=None, plan=None, say=said.extend).close()
    assert [line for line in said if line.startswith("=> ")] == [
        "=> no rank holds the job back (the slowest, rank 0, costs 0 % of a step)"
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    quiet: list[str] = []
    StepWatch(StepPolicy(True, 0.5), empty, keep=tmp_path / "none", store=None, plan=None, say=quiet.extend).close()
    assert quiet == [] and not (tmp_path / "none").exists()  # no rank ever ran: nothing to say
