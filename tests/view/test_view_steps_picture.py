"""The step report's picture (numarun.view.steps_picture): known records in, an SVG out, read back with ElementTree.

A slow rank's row is the longest; each step is split by phase in proportion to its phase seconds; labels are the
places' and escaped; each node has its own axis; thousands of steps are merged into a bounded number of buckets,
every step in exactly one.
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET

import pytest

from numarun.view.steps_picture import BUCKETS, MAX_STEPS, PLOT_W, picture
from numarun.worker.steps import PHASES, RankPlace, StepRecord

NS = {"s": "http://www.w3.org/2000/svg"}
PHASE_S = {"input": 0.01, "compute": 0.05, "comm": 0.03, "optim": 0.01}


def _records(steps: int, ranks: int, *, slow: int | None = None, clock=lambda rank: 100.0) -> list[StepRecord]:
    """``ranks`` ranks of ``steps`` steps each, back to back; rank ``slow`` computes twice as long."""
    out = []
    for rank in range(ranks):
        t = clock(rank)
        for step in range(1, steps + 1):
            phases = dict(PHASE_S, compute=PHASE_S["compute"] * (2 if rank == slow else 1))
            wall = sum(phases.values())
            out.append(
                StepRecord(
                    rank=rank,
                    step=step,
                    start=t,
                    end=t + wall,
                    **{f"{p}_s": s for p, s in phases.items()},
                    peak_bytes=2**30 + step,
                )
            )
            t += wall
    return out


def _places(ranks: int, *, per_node: int = 8, host: str = "node-a") -> dict[int, RankPlace]:
    return {
        r: RankPlace(
            rank=r,
            local_rank=r % per_node,
            node_rank=r // per_node,
            host=f"{host}{r // per_node}",
            cpus=f"{4 * r}-{4 * r + 3}",
            numa=r % 2,
            nic="mlx5_0",
            gpu=str(r % per_node),
        )
        for r in range(ranks)
    }


def _rows(svg: str) -> dict[int, ET.Element]:
    root = ET.fromstring(svg)
    return {
        int(g.get("data-rank", "")): g
        for g in root.iter("{http://www.w3.org/2000/svg}g")
        if g.get("class") == "rank-row"
    }


def _steps(row: ET.Element) -> list[ET.Element]:
    return row.findall("s:rect[@class='step']", NS)


def _right(row: ET.Element) -> float:
    return max(float(r.get("x", "")) + float(r.get("width", "")) for r in _steps(row))


def _path(row: ET.Element, phase: str) -> ET.Element:
    (path,) = row.findall(f"s:path[@class='phase-{phase}']", NS)
    return path


def _widths(path: ET.Element) -> list[float]:
    return [float(w) for w in re.findall(r"h([\d.]+)v", path.get("d", ""))]


def _span(steps: str) -> tuple[int, int]:
    """``17`` -> (17, 17), ``101-150`` -> (101, 150)."""
    lo, _, hi = steps.partition("-")
    return int(lo), int(hi or lo)


def test_a_slow_ranks_row_is_the_longest_and_each_step_is_split_by_phase() -> None:
    records = _records(20, 4, slow=2)
    svg = picture(records, _places(4), title="=> rank 2 holds the job back")
    rows = _rows(svg)
    assert sorted(rows) == [0, 1, 2, 3]
    rights = {rank: _right(row) for rank, row in rows.items()}
    assert max(rights, key=lambda r: rights[r]) == 2 and rights[2] > max(rights[r] for r in (0, 1, 3)) + PLOT_W / 4
    assert float(rows[2].get("data-end", "")) == pytest.approx(20 * (sum(PHASE_S.values()) + PHASE_S["compute"]))
    for rank, row in rows.items():
        assert [s.get("data-steps") for s in _steps(row)] == [str(i) for i in range(1, 21)]
        # one path per phase, one box per step, each as wide as that phase's seconds on the shared scale
        scale = PLOT_W / float(rows[2].get("data-end", ""))
        for p in PHASES:
            expected = PHASE_S[p] * (2 if rank == 2 and p == "compute" else 1) * scale
            assert _widths(_path(row, p)) == pytest.approx([expected] * 20, abs=0.01), (rank, p)
    # each step's phases lie back to back in PHASES order from its start
    lefts = [float(_path(rows[0], p).get("d", "")[1:].split()[0]) for p in PHASES]
    assert lefts == sorted(lefts) and lefts[0] == float(_steps(rows[0])[0].get("x", ""))
    assert ET.fromstring(svg).find("s:title", NS).text == "=> rank 2 holds the job back"  # type: ignore[union-attr]


def test_labels_are_the_places_and_are_escaped() -> None:
    places = {r: dataclasses.replace(p, nic="<mlx5&0>") for r, p in _places(2, host="<h&1>").items()}
    svg = picture(_records(3, 3), places, title='a "title" & <more>')
    root = ET.fromstring(svg)  # parses: everything is escaped
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == "rank-label"]
    assert labels == [places[0].label(), places[1].label(), "rank 2"]  # a rank without a place: its number
    assert "nic &lt;mlx5&amp;0&gt;" in svg and "node 0 (&lt;h&amp;1&gt;0)" in svg and "<h&" not in svg
    assert root.find("s:title", NS).text == 'a "title" & <more>'  # type: ignore[union-attr]
    stats = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == "rank-stats"]
    assert stats[0].startswith("median 0.1 s of 3 steps: input 10% compute 50% comm 30% optim 10%; peak 1.0 GiB")


def test_each_node_has_its_own_axis_starting_at_zero() -> None:
    """Node 1's clock reads 5,000 s more (another host's monotonic clock): both nodes' rows start at the axis."""
    records = _records(5, 4, clock=lambda rank: 100.0 + 5000 * (rank // 2))
    svg = picture(records, _places(4, per_node=2))
    root = ET.fromstring(svg)
    nodes = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "node"]
    assert [n.get("data-node") for n in nodes] == ["0", "1"]
    starts = {rank: float(_steps(row)[0].get("x", "")) for rank, row in _rows(svg).items()}
    assert len(set(starts.values())) == 1, starts
    assert [float(r.get("data-end", "")) for r in _rows(svg).values()] == pytest.approx([0.5] * 4)
    assert "node-a0" in svg and "node-a1" in svg


def test_ten_thousand_steps_of_eight_ranks_stay_small_every_step_in_one_bucket() -> None:
    small = picture(_records(MAX_STEPS + 1, 8, slow=5), _places(8))
    svg = picture(_records(10_000, 8, slow=5), _places(8))
    assert len(svg) < 700_000, len(svg)
    assert len(svg) < 1.5 * len(small)  # bounded by the buckets, not the steps
    assert "steps merged into 200 time buckets" in svg
    rows = _rows(svg)
    for rank, row in rows.items():
        spans = [_span(s.get("data-steps", "")) for s in _steps(row)]
        assert len(spans) <= BUCKETS
        covered = [i for lo, hi in spans for i in range(lo, hi + 1)]
        assert covered == list(range(1, 10_001)), rank
    assert max(rows, key=lambda r: _right(rows[r])) == 5
    # a bucket's tooltip says what it holds
    title = _steps(rows[0])[0].find("s:title", NS).text or ""  # type: ignore[union-attr]
    assert re.match(r"rank 0 steps 1-\d+ \(\d+\), 0-[\d.]+ s: mean 0\.1 s a step \(input 0\.01 ", title), title


def test_a_few_steps_are_not_merged_and_no_steps_is_a_picture_too() -> None:
    svg = picture(_records(MAX_STEPS, 2), _places(2))
    assert "buckets" not in svg and all(len(_steps(r)) == MAX_STEPS for r in _rows(svg).values())
    empty = picture([], {})
    ET.fromstring(empty)
    assert "no steps recorded" in empty and not _rows(empty)
