"""``numarun plan``: show each local rank's GPU, CPUs, memory, NIC and env before running."""

from __future__ import annotations

import argparse
import os
import sys

from .. import argtypes, envvars
from ..fsutil import write_output
from ..options.launch import PLANNING, add_options, from_args


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan",
        help="show the per-rank binding plan (table, --json, --svg)",
        description="Plan each local rank's GPU, CPU cores, memory nodes, NIC and environment "
        "for this node (or a recorded topology) and print it; runs nothing.",
    )
    add_options(
        parser, (*PLANNING, "nnodes", "detect")
    )  # --nnodes: the nodes a --mesh layout spans, this one among them
    parser.add_argument(
        "--json", action="store_true", help=f"print the plan as JSON (what workers read via {envvars.PLAN})"
    )
    parser.add_argument("--svg", metavar="FILE", help="also write the topology picture with each rank's cores coloured")
    parser.add_argument(
        "--jobs",
        type=argtypes.int_in("--jobs", low=1, high=argtypes.MAX_COUNT),
        default=None,
        metavar="N",
        help="show instead the slots a sweep of N jobs of --nproc-per-node ranks runs on, side by side",
    )
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    from ..launch.planning import Planner, announce, detect_job
    from ..topology.discover import load_topology

    job, options = detect_job(from_args(args, os.environ))
    if args.jobs:
        from ..sweep.launch import describe

        ranks = options.nproc_per_node if isinstance(options.nproc_per_node, int) else 1
        jobs = [f"#{i}" for i in range(args.jobs)]
        sys.stdout.write(describe(load_topology(options.topology), ranks, jobs, color=sys.stdout.isatty()))
        return 0
    if job is not None:
        announce(options, job.describe())  # stderr, so that --json output stays the plan alone
    options.shown()
    plan = (
        Planner(job).plan(options).plan
    )  # per-rank mode: the node's plan as every task makes it, with this task's row
    if args.svg:
        from ..view.svg import render_svg

        write_output(args.svg, render_svg(load_topology(options.topology), plan), flag="--svg")
    if args.json:
        sys.stdout.write(plan.to_json())
    else:
        from ..view.plan import render_plan

        sys.stdout.write(render_plan(plan, width=160, color=sys.stdout.isatty()))
    return 0
