"""The step report's record format round-trips, and a torn line is skipped (numarun.worker.steps)."""

from __future__ import annotations

import pytest

from numarun.errors import SchemaError
from numarun.worker.steps import PHASES, LiveTable, RankPlace, RankRow, StepRecord, read_records


def test_a_record_round_trips_and_names_its_phases() -> None:
    r = StepRecord(
        rank=3,
        step=7,
        start=10.0,
        end=10.5,
        input_s=0.1,
        comm_s=0.2,
        optim_s=0.05,
        compute_s=0.15,
        peak_bytes=1 << 20,
        extra={"ddp_backward_comm_s": 0.01},
    )
    assert StepRecord.parse(r.line()) == r
    assert r.wall_s == pytest.approx(0.5)
    assert [r.phase_s(p) for p in PHASES] == [0.1, 0.15, 0.2, 0.05]


def test_torn_and_foreign_lines_are_skipped() -> None:
    good = StepRecord(rank=0, step=1, start=0.0, end=1.0).line()
    got = list(read_records([good, good[:20], "\n", '{"v": 99}', "[1]", good]))
    assert len(got) == 2
    with pytest.raises(SchemaError):
        StepRecord.parse('{"v": 99, "rank": 0}')


def test_the_live_table_round_trips_and_labels_ranks() -> None:
    place = RankPlace(rank=1, local_rank=1, node_rank=0, host="h", cpus="4-7", numa=1, nic="mlx5_1", gpu="1")
    table = LiveTable(
        updated=1.5,
        rows=(RankRow(place, pid=42, steps=9, step_s=0.25, phases={"input": 0.1}),),
        steps_per_s=4.0,
        verdict="=> no rank holds the job back",
    )
    assert LiveTable.parse(table.text()) == table
    assert place.label() == "rank 1  node 0  cpus 4-7  numa 1  nic mlx5_1  gpu 1"
    assert RankPlace(rank=0, local_rank=0, node_rank=0, host="h", cpus="").label() == "rank 0  node 0  cpus unbound"
