"""``numarun plan``: show each local rank's GPU, CPUs, memory, NIC and env before running."""

from __future__ import annotations

import argparse
import os
import sys

from .. import argtypes
from ..fsutil import write_output
from ..plan.options import add_plan_options, request_for


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan",
        help="show the per-rank binding plan (table, --json, --svg)",
        description="Plan each local rank's GPU, CPU cores, memory nodes, NIC and environment "
        "for this node (or a recorded topology) and print it; runs nothing.",
    )
    add_plan_options(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (what workers read via NUMARUN_PLAN)")
    parser.add_argument("--no-detect", action="store_true",
                        help="plan as if no Slurm step or mpirun had started this process (also NUMARUN_DETECT=0)")
    parser.add_argument(
        "--svg", metavar="FILE", default=None, help="also write the topology picture with each rank's cores coloured"
    )
    parser.add_argument("--jobs", type=argtypes.int_in("--jobs", low=1, high=argtypes.MAX_COUNT), default=None, metavar="N",
                        help="show instead the slots a sweep of N jobs of --nproc-per-node ranks runs on, side by side")
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    from ..jobenv import Mode
    from ..plan.binding import make_plan
    from ..topology.discover import load_topology
    from .detected import announce, detect_job, here, rank_setup

    job, _ = detect_job(args, None)
    topology = load_topology(args.topology)
    if args.jobs:
        from ..sweep.launch import describe

        ranks = args.nproc_per_node if isinstance(args.nproc_per_node, int) else 1
        sys.stdout.write(describe(topology, ranks, [f"#{i}" for i in range(args.jobs)]))
        return 0
    if job is not None:
        # stderr, so that --json output stays the plan alone
        announce(args, job.describe())
    if job is not None and job.mode is Mode.PER_RANK:
        from ..plan.scheduled import task_plan

        setup = rank_setup(args, job)  # the node's plan, as every task of it makes it
        plan = task_plan(setup.plan, setup.binding)
    else:
        from ..plan.scheduled import confine

        node = here(topology, args.topology, job)
        plan = confine(make_plan(topology, request_for(args, os.environ, topology, allowed_gpu_minors=node.gpu_minors)),
                       node.container, node.mem_refused)
    if args.svg:
        from ..view.svg import render_svg

        write_output(args.svg, render_svg(topology, plan), flag="--svg")
    if args.json:
        sys.stdout.write(plan.to_json())
    else:
        from ..view.plan import render_plan

        sys.stdout.write(render_plan(plan, width=160, color=sys.stdout.isatty()))
    return 0
