"""The node agent (numarun.launch.agent) on a private directory written as ranks write it: one thread serves both
uses (the step report's live table appears while the ranks run, the watchdog samples), a use that fails leaves the
thread and the job alone, the last view goes over before torchrun's exit barrier and the store is left alone after
it, and the end writes the summary."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from helpers import wait_until
from step_records import gone_pid, write_job

from numarun.launch.agent import POLL_S, AgentPolicy, NodeAgent, keep_dir
from numarun.launch.hangs import HangPolicy
from numarun.launch.steps import StepPolicy
from numarun.worker.steps import LIVE, LiveTable


def _agent(state: Path, tmp: Path, said: list[str], store: tuple[str, int] | None = None) -> NodeAgent:
    return NodeAgent(
        AgentPolicy(HangPolicy(timeout_s=30.0), StepPolicy(True, 0.5)),
        state,
        keep=tmp / "keep",
        store=store,
        plan=None,
        request_stop=lambda code, message: None,
        hold=lambda: None,
        say=said.extend,
    )


def test_one_thread_serves_the_step_report_and_the_watchdog_and_the_end_says_the_verdict(tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_job(state, steps=30, slow_input=0.04)
    said: list[str] = []
    agent = _agent(state, tmp_path, said).start()
    try:
        table = wait_until(
            "the live table", lambda: (state / LIVE).exists() and LiveTable.parse((state / LIVE).read_text()), 30
        )
        assert [r.place.rank for r in table.rows] == [0, 1] and table.slowest == 1
        ticks: list[int] = []
        agent.hangs.tick = lambda beats, requests: ticks.append(len(beats))  # type: ignore[method-assign]
        wait_until("a watchdog sample", lambda: ticks, 30)
        assert ticks[0] == 2 and agent.policy.poll_s == POLL_S
    finally:
        agent.close(succeeded=True)
    assert not (state / "stacks.fifo").exists() and not agent._thread.is_alive()  # type: ignore[union-attr]
    assert said[0] == "step report: 30 steps of 2 ranks, 10 steps/s, a step 100 ms"
    assert next(line for line in said if line.startswith("=> ")).startswith("=> rank 1 holds the job back: input")
    assert said[-1].startswith(f"the steps of every rank: {keep_dir('steps', tmp_path / 'keep')}/")


def test_a_use_that_fails_leaves_the_thread_running_and_is_said_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_job(state, steps=30, slow_input=0.0)
    said: list[str] = []
    agent = _agent(state, tmp_path, said)
    calls: list[int] = []

    def broken(*args: Any) -> None:
        calls.append(1)
        raise RuntimeError("a figure the agent did not expect")

    agent.steps.poll = broken  # type: ignore[union-attr,method-assign]
    agent.start()
    try:
        wait_until("three polls", lambda: len(calls) >= 3, 30)
        assert agent._thread is not None and agent._thread.is_alive()
    finally:
        agent.close()
    # said once, however many ticks it failed in, on numarun's stderr (the agent's say)
    assert (
        said[0] == "WARNING: the step report failed (RuntimeError: a figure the agent did not expect); the job runs on"
    )
    assert sum("failed (" in line for line in said) == 1, said


def test_the_last_view_goes_over_before_the_barrier_and_the_store_is_left_alone_after(tmp_path: Path) -> None:
    """Node 1 of two, its ranks ended: in the barrier its last view reaches the store; afterwards nothing of the
    agent's asks the store (the store's host may have left): its end is told from what it has."""
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    state = tmp_path / "state"
    write_job(state, steps=30, slow_input=0.0, node=1, nodes=2, pid=gone_pid())
    said: list[str] = []
    agent = _agent(state, tmp_path, said, ("127.0.0.1", server.port))
    agent.before_exit_barrier()
    assert server.check(["numarun/steps/0/node/1"]) and agent.exchange is not None and agent.exchange.gone
    keys = server.num_keys()
    agent.close(succeeded=True)
    assert server.num_keys() == keys
    kept = keep_dir("steps", tmp_path / "keep")
    assert said == [f"step report of this node's ranks: {kept}/ (steps.jsonl, steps.svg, steps.trace.json)"]
