"""Private directories written as ranks write them (their heartbeats and step records), for the step report's and
the node agent's tests: this process stands in for the ranks."""

from __future__ import annotations

import json
import os
from pathlib import Path

from numarun.worker.progress import HEARTBEAT
from numarun.worker.steps import RECORDS, StepRecord


def write_job(
    state: Path, *, steps: int, slow_input: float, node: int = 0, nodes: int = 1, slow: int = 1, pid: int = 0
) -> None:
    """Two ranks of node ``node`` (of ``nodes``, two ranks each); rank ``slow`` waits ``slow_input`` longer for each
    batch, the others wait that long in comm (and each rank's comm varies by a few microseconds from step to step, as
    a measured wait does). ``pid``: the ranks' (this process's: they run; a gone one's: they have ended)."""
    state.mkdir(exist_ok=True)
    for local in (0, 1):
        rank = node * 2 + local
        beat = {
            "v": 1,
            "pid": pid or os.getpid(),
            "rank": rank,
            "local_rank": local,
            "node_rank": node,
            "nodes": nodes,
            "group": 0,
        }
        (state / HEARTBEAT.format(local_rank=local)).write_text(json.dumps(beat))
        lines = []
        for step in range(1, steps + 1):
            start = 100.0 + step * 0.1
            late = slow_input if rank == slow else 0.0
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
        (state / RECORDS.format(local_rank=local)).write_text("".join(lines))


def gone_pid() -> int:
    """A pid no process has now (ranks that have ended)."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid
