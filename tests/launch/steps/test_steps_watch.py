"""The step report's use of the node agent on a private directory written as the ranks write it (their heartbeats
and step records; this process stands in for both ranks): the live table, the summary at the end, the files kept,
the views of several nodes and the store gone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from step_records import gone_pid, write_job

from numarun.launch.exchange import Exchange
from numarun.launch.steps import StepPolicy, StepWatch
from numarun.launch.steps.exchange import ViewKeys
from numarun.worker.steps import LIVE, LiveTable, read_records


def _watch(state: Path, keep: Path, say: Any, exchange: Exchange | None = None) -> StepWatch:
    def keys(restart: int) -> ViewKeys | None:
        return ViewKeys(exchange.keys("steps", restart)) if exchange is not None else None

    return StepWatch(StepPolicy(True, 0.5), state, keep=keep, keys=keys, plan=None, say=say)


def test_the_live_table_then_the_summary_and_the_files(tmp_path: Path) -> None:
    state, keep = tmp_path / "state", tmp_path / "keep"
    write_job(state, steps=30, slow_input=0.04)
    said: list[str] = []
    watch = _watch(state, keep, said.extend)
    watch.tick()
    table = LiveTable.parse((state / LIVE).read_text())
    assert [r.place.rank for r in table.rows] == [0, 1] and all(r.steps == 30 for r in table.rows)
    assert table.rows[1].phases["input"] > 0.04 and table.slowest == 1 and table.job_nodes == 1
    assert table.verdict is not None and table.verdict.startswith("=> rank 1 holds the job back: input")
    watch.finish()
    assert said[0] == "step report: 30 steps of 2 ranks, 10 steps/s, a step 100 ms"
    verdict = next(line for line in said if line.startswith("=> "))
    assert verdict.startswith("=> rank 1 holds the job back: input, 40 ms a step above the other ranks"), said
    assert said[-1] == f"the steps of every rank: {keep}/ (steps.jsonl, steps.svg, steps.trace.json)"
    kept = list(read_records((keep / "steps.jsonl").read_text().splitlines()))
    assert len(kept) == 60 and (keep / "summary.txt").read_text().splitlines() == said
    assert (keep / "steps.svg").exists() and json.loads((keep / "steps.trace.json").read_text())["traceEvents"]


def test_a_balanced_job_and_a_job_without_steps(tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_job(state, steps=30, slow_input=0.0)
    said: list[str] = []
    _watch(state, tmp_path / "keep", said.extend).finish()
    assert [line for line in said if line.startswith("=> ")] == [
        "=> no rank holds the job back (the slowest, rank 0, costs 0 % of a step)"
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    quiet: list[str] = []
    _watch(empty, tmp_path / "none", quiet.extend).finish()
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
            write_job(
                state, steps=steps, slow_input=0.0, node=1, nodes=2
            )  # node 1: the judge and the store are elsewhere
            watch = _watch(state, tmp_path / "keep", print, Exchange(*address))
            del tries[:]
            watch.tick()
            assert bool(tries) is expect_tries, (steps, len(tries))
            first = len(tries)
            watch.tick()
            watch.finish()
            assert len(tries) == first, (steps, first, len(tries))  # never again after the first failure
            assert [r.place.rank for r in LiveTable.parse((state / LIVE).read_text()).rows] == [2, 3]
    finally:
        done.set()
        server.close()


def test_the_judge_decides_on_every_nodes_last_view_or_names_the_node_it_lacks(tmp_path: Path) -> None:
    """Two nodes' step reports meet in a real store (torch's TCPStore, in this process); rank 3, on node 1, loads
    slowly. While node 1 runs on, the judge's wait for its last view ends in the verdict naming node 1 and where it
    last reported, no rank; once node 1 has handed its last view over, the judge names rank 3 on the whole job."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    address = ("127.0.0.1", server.port)
    gone = gone_pid()
    said: dict[int, list[str]] = {0: [], 1: []}
    watches = {}
    for node, pid in ((0, gone), (1, 0)):  # node 1's ranks still run
        write_job(tmp_path / f"node{node}", steps=40, slow_input=0.04, node=node, nodes=2, slow=3, pid=pid)
        watches[node] = _watch(
            tmp_path / f"node{node}", tmp_path / f"keep{node}", said[node].extend, Exchange(*address)
        )
    watches[1].tick()
    watches[0].hand_over(wait_s=0.3)
    assert watches[0].missing == ["node 1 last reported at step 40"]
    watches[0].finish()
    verdict = next(line for line in said[0] if line.startswith("=> "))
    assert verdict == (
        "=> no verdict on the job: node 1 last reported at step 40 (its last view did not come; nothing is judged "
        "on less)"
    )
    assert said[0][0].startswith("step report: 40 steps of 4 ranks on 2 nodes")

    for node in (0, 1):  # the same job once node 1's ranks have ended too
        write_job(tmp_path / f"again{node}", steps=40, slow_input=0.04, node=node, nodes=2, slow=3, pid=gone)
    exchange = Exchange(*address)
    exchange.call("delete_key", "numarun/steps/0/node/1")
    again = {n: _watch(tmp_path / f"again{n}", tmp_path / f"kept{n}", said[n].extend, exchange) for n in (0, 1)}
    again[1].hand_over()
    again[0].hand_over(wait_s=5)
    assert again[0].missing == [] and again[1].missing == []
    exchange.close()
    said[0].clear()
    again[0].finish()
    assert next(line for line in said[0] if line.startswith("=> ")).startswith(
        "=> rank 3 (node 1, " + os.uname().nodename
    )


def test_a_log_dir_that_cannot_be_written_keeps_no_file_and_the_summary_is_still_said(tmp_path: Path) -> None:
    """The kept files' directory cannot be made (a file stands where the log dir should be): no file is kept, one
    line names the file and the error, and the summary is said as ever."""
    state = tmp_path / "state"
    write_job(state, steps=30, slow_input=0.04)
    (tmp_path / "logs").write_text("a file, not a directory")
    keep = tmp_path / "logs" / "numarun_steps"
    said: list[str] = []
    _watch(state, keep, said.extend).finish()
    assert said[0] == "step report: 30 steps of 2 ranks, 10 steps/s, a step 100 ms"
    assert next(line for line in said if line.startswith("=> ")).startswith("=> rank 1 holds the job back: input")
    assert (
        said[-1] == f"WARNING: the step report's files are not kept: cannot write {keep}/steps.jsonl: Not a directory"
    )
    assert sum("cannot write" in line for line in said) == 1


def test_a_view_that_cannot_be_drawn_is_left_out_and_the_others_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The picture's drawing fails on what it was given: one line says so, the records, the trace and the summary
    are kept, and the summary names what was kept."""
    from numarun.view import steps_picture

    def broken(*args: Any, **kwargs: Any) -> str:
        raise ZeroDivisionError("a step of no width")

    monkeypatch.setattr(steps_picture, "picture", broken)
    state, keep = tmp_path / "state", tmp_path / "keep"
    write_job(state, steps=30, slow_input=0.04)
    said: list[str] = []
    _watch(state, keep, said.extend).finish()
    assert said[0] == (
        "WARNING: the step report's steps.svg failed (ZeroDivisionError: a step of no width); the job runs on"
    )
    assert said[1].startswith("step report: 30 steps of 2 ranks")
    assert said[-1] == f"the steps of every rank: {keep}/ (steps.jsonl, steps.trace.json)"
    assert sorted(p.name for p in keep.iterdir()) == ["steps.jsonl", "steps.trace.json", "summary.txt"]


def test_a_live_table_that_cannot_be_written_is_said_once_and_the_report_goes_on(tmp_path: Path) -> None:
    """The live table's place is taken (a directory where ``numarun top`` reads it): every tick fails to write it,
    one line says so, the report goes on to its summary."""
    state = tmp_path / "state"
    write_job(state, steps=30, slow_input=0.04)
    (state / LIVE).mkdir()
    said: list[str] = []
    watch = _watch(state, tmp_path / "keep", said.extend)
    for _ in range(3):
        watch.tick()
    watch.finish()
    assert said[0] == f"WARNING: cannot write {state / LIVE}: Is a directory (numarun top shows nothing newer)"
    assert sum("cannot write" in line for line in said) == 1 and said[1].startswith("step report: 30 steps")


def test_records_rotated_away_leave_the_files_bounded_and_the_summary_the_whole_jobs(tmp_path: Path) -> None:
    """Two ranks' real recorders write 1000 steps each into files that move aside past 4 KiB (the one before
    dropped); the agent reads as they come. The rank files and the kept steps.jsonl hold the latest steps only, and
    the summary's step count and pace are the whole job's: steps 2-500 took 0.2 s, steps 501-1000 0.1 s."""
    import threading

    from numarun.worker import phases, progress
    from numarun.worker.steps import RECORDS

    state, keep = tmp_path / "state", tmp_path / "keep"
    write_job(state, steps=0, slow_input=0.0)  # the heartbeats
    now = [1000.0]
    recs = []
    for local in (0, 1):
        path = state / RECORDS.format(local_rank=local)
        counters = progress.Counters()
        counters.clock = lambda: now[0]
        recs.append(
            phases.Recorder(
                open(path, "w"),
                rank=local,
                counters=counters,
                flush_s=0.0,
                main=threading.get_ident(),
                clock=lambda: now[0],
                path=path,
                rotate=4096,
            )
        )
    said: list[str] = []
    watch = _watch(state, keep, said.extend)
    opts = [object(), object()]
    for step in range(1, 1001):
        now[0] += 0.2 if step <= 500 else 0.1
        for rec, opt in zip(recs, opts, strict=True):
            rec.before_step(opt, (), {})
            rec.after_step(opt, (), {})
            rec.close()
            rec.flush()
        if step % 10 == 0:  # the agent's look comes more often than a file moves aside (16 records)
            watch.tick()
    for rec in recs:
        rec.finish()
    watch.finish()
    for local in (0, 1):
        files = [state / RECORDS.format(local_rank=local), state / (RECORDS.format(local_rank=local) + ".1")]
        assert sum(f.stat().st_size for f in files) <= 2 * (4096 + 512)
    kept = list(read_records((keep / "steps.jsonl").read_text().splitlines()))
    assert len(kept) < 100 and max(r.step for r in kept) == 1000
    assert said[0] == "step report: 1000 steps of 2 ranks, 6.67 steps/s, a step 100 ms", said


def test_a_last_report_that_fails_leaves_the_summary_of_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's figures raise at the job's end: one line says so, and the summary comes from the report made
    before."""
    state = tmp_path / "state"
    write_job(state, steps=30, slow_input=0.04)
    said: list[str] = []
    watch = _watch(state, tmp_path / "keep", said.extend)
    watch.tick()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(watch, "_view", broken)
    watch.finish()
    assert said[0] == "WARNING: the step report failed (OSError: [Errno 5] Input/output error); the job runs on"
    assert said[1] == "step report: 30 steps of 2 ranks, 10 steps/s, a step 100 ms"
    assert next(line for line in said if line.startswith("=> ")).startswith("=> rank 1 holds the job back: input")
