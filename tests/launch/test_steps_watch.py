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
    """Two ranks of one node; rank 1 waits ``slow_input`` longer for each batch, rank 0 waits that long in comm (and
    each rank's comm varies by a few microseconds from step to step, as a measured wait does)."""
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
                    comm_s=0.01 + slow_input - late + step * 1e-6,
                    optim_s=0.001,
                    compute_s=0.088 - slow_input - step * 1e-6,
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


def test_a_store_gone_is_tried_once_and_a_node_without_steps_never_asks_it(tmp_path: Path) -> None:
    """At the end of a multi-node job the node hosting the rendezvous store may leave first: the other nodes' last
    reports must not wait on it again and again (each try is a connect timeout), and a job that took no optimizer
    step has nothing to exchange at all. Counted on a real socket that takes connections and closes them."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    tries: list[int] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            tries.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    address = server.getsockname()
    try:
        for steps, expect_tries in ((0, False), (30, True)):
            state = tmp_path / f"state{steps}"
            state.mkdir()
            _job(state, steps=steps, slow_input=0.0)
            for rank in (0, 1):  # node 1 of two: the judge and the store are elsewhere
                beat = json.loads((state / HEARTBEAT.format(local_rank=rank)).read_text())
                beat.update(node_rank=1, nodes=2, rank=rank + 2)
                (state / HEARTBEAT.format(local_rank=rank)).write_text(json.dumps(beat))
            watch = StepWatch(StepPolicy(True, 0.5), state, keep=tmp_path / "keep", store=address, plan=None, say=print)
            del tries[:]
            watch.tick()
            assert bool(tries) is expect_tries, (steps, len(tries))
            first = len(tries)
            watch.tick()
            watch.close()
            assert len(tries) == first, (steps, first, len(tries))  # never again after the first failure
            assert [r.place.rank for r in LiveTable.parse((state / LIVE).read_text()).rows] == [2, 3]
    finally:
        done.set()
        server.close()
