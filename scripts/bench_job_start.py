#!/usr/bin/env python3
"""What each node's numarun does at the start of a Slurm job of N nodes, timed with the product's code.

A job of ``numarun submit`` asks slurmctld twice for the whole job (the batch script) and hands the
answers to every node (``NUMARUN_SLURM_INFO``). Each node then: reads the step from its
environment (``numarun.jobenv.detect``), parses the handed-over ``scontrol -o show node`` and
``scontrol show topology`` text (``numarun.launch.slurmctld.handed_over``), orders the nodes by
leaf switch and settles its rendezvous (``numarun.jobenv.settle.settle_node``). This script builds
those inputs for N nodes under N/32 leaf switches and times the whole per-node path (median of
--runs), for the node with the last SLURM_NODEID.

    .venv/bin/python scripts/bench_job_start.py [--nodes 8,64,1024,4096] [--runs 21]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from numarun.jobenv import detect
from numarun.jobenv.settle import settle_node
from numarun.launch import slurmctld

CALLS: list[tuple[str, ...]] = []  # every controller call the per-node path makes (scontrol, counted where it runs)


def _counted(*args: str, **kwargs: float) -> str | None:
    CALLS.append(args)
    return None


slurmctld.scontrol = _counted


def inputs(n: int, directory: Path) -> dict[str, str]:
    names = [f"gpu{i:05d}" for i in range(n)]
    (directory / "nodes").write_text(
        "".join(
            f"NodeName={name} Arch=x86_64 CoresPerSocket=48 CPUAlloc=96 CPUEfctv=96 CPUTot=96 Gres=gpu:8 "
            f"NodeAddr=10.{i // 65536}.{i // 256 % 256}.{i % 256} NodeHostName={name} Version=23.02.7\n"
            for i, name in enumerate(names)
        )
    )
    leaves = [
        f"SwitchName=leaf{s} Level=0 LinkSpeed=1 Nodes=gpu[{s * 32:05d}-{min(n, s * 32 + 32) - 1:05d}]\n"
        for s in range((n + 31) // 32)
    ]
    (directory / "topology").write_text(
        "".join(leaves) + f"SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu[00000-{n - 1:05d}]\n"
    )
    me = n - 1
    return {
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": f"gpu[00000-{n - 1:05d}]",
        "SLURM_STEP_NUM_NODES": str(n),
        "SLURM_STEP_NUM_TASKS": str(n),
        "SLURM_STEP_TASKS_PER_NODE": f"1(x{n})",
        "SLURM_NODEID": str(me),
        "SLURMD_NODENAME": names[me],
        "SLURM_PROCID": str(me),
        "SLURM_LOCALID": "0",
        "NUMARUN_SLURM_INFO": str(directory),
    }


def per_node(env: dict[str, str]) -> tuple[int, str]:
    job = detect(env)
    assert job is not None
    facts = slurmctld.handed_over(env)
    assert facts is not None
    rdv = settle_node(job, {}, leaf_switch=facts.leaf_switch)
    return rdv.node_rank, facts.addrs[rdv.head]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,64,1024,4096")
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    print(f"{'nodes':>6}  {'per node (median)':>18}  {'min':>8}  controller calls per node")
    for n in (int(x) for x in args.nodes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            env = inputs(n, Path(tmp))
            CALLS.clear()
            rank, head = per_node(env)
            assert head == "10.0.0.0" and 0 <= rank < n
            calls = len(CALLS)
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                per_node(env)
                times.append(time.perf_counter() - t0)
        print(
            f"{n:>6}  {statistics.median(times) * 1000:>15.2f} ms  {min(times) * 1000:>5.2f} ms  "
            f"{calls} (2 for the whole job)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
