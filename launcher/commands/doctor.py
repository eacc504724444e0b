"""``numarun doctor``: check this node (or every node of a job) before spending GPU hours on it.

    numarun doctor [--topology PATH] [--nproc-per-node N] [--binding MODE] [--json]
    numarun doctor --nnodes N --node-rank R --master-addr A --master-port P [...]

Exit codes: 0 when no finding is an error, 1 when one is (on every node of a multi-node
run), 2 for bad input (one line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from .. import argtypes
from ..doctor.diagnose import Settings, diagnose
from ..doctor.render import render
from ..doctor.schedule import LinkSchedule
from ..errors import JobConflict, UsageError
from ..options.launch import PLANNING, LaunchOptions, add_options, from_args

RENDEZVOUS = (
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "rdzv_endpoint",
    "rdzv_backend",
    "rdzv_id",
    "rdzv_conf",
)
"""torchrun's options the doctor takes, in their spellings: with --nnodes, every node reports to node rank 0."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor",
        help="check the node(s) before a job: PCIe links, RDMA ports, modules, cores, GPU health, slow nodes",
        description="Check this node from the same topology 'numarun plan' reads (a recorded tree works "
        "like the live machine); with --nnodes, every node reports to node rank 0, which compares "
        "them and measures the nodes' links in pairs (at most 6 rounds at any node count). Exit 1 when any finding is "
        "an error.",
    )
    add_options(p, (*PLANNING, "detect"))
    add_doctor_options(p)
    p.add_argument("--json", action="store_true", help="print {'findings': [...], ...} as JSON")
    p.add_argument(
        "--nvml-record",
        metavar="FILE",
        default=None,
        help="a recorded NVML answer (JSON) to check instead of asking the driver",
    )
    p.add_argument(
        "--measure", action="store_true", help="also measure memory and host<->device bandwidth (always with --nnodes)"
    )
    p.add_argument("--no-measure", action="store_true", help="with --nnodes: measure only the links")
    add_options(p, RENDEZVOUS, group=p.add_argument_group("multi-node (torchrun's options)"))
    p.set_defaults(func=main)
    return p


def add_doctor_options(p: argparse.ArgumentParser) -> None:
    """The doctor's flags ``numarun run --preflight`` shares (read once by :func:`settings_of`)."""
    d = Settings()
    p.add_argument(
        "--min-link-fraction",
        type=argtypes.typed("--min-link-fraction", argtypes.finite(low=0.0, high=1.0, above=True)),
        default=d.min_link_fraction,
        metavar="F",
        help=f"a node whose best pair, or one pair, below F x the median is slow (default {d.min_link_fraction})",
    )
    p.add_argument(
        "--doctor-timeout",
        type=argtypes.seconds("--doctor-timeout"),
        default=d.doctor_timeout,
        metavar="SECONDS",
        help=f"how long a node waits for the others (default {d.doctor_timeout:g})",
    )
    p.add_argument(
        "--link-schedule",
        type=argtypes.typed("--link-schedule", argtypes.member(LinkSchedule)),
        default=d.link_schedule,
        metavar="NAME",
        help=f"which node pairs measure their link: auto (all-pairs up to 6 nodes, else bounded), bounded (at most 6 "
        f"rounds at any node count), all-pairs (every pair, n-1 rounds); default {d.link_schedule.value}",
    )
    p.add_argument(
        "--link-seconds", type=argtypes.seconds("--link-seconds"), default=d.link_seconds, help=argparse.SUPPRESS
    )


def settings_of(args: argparse.Namespace) -> Settings:
    """The doctor's settings from the flags :func:`add_doctor_options` gave a command, typed, read once."""
    return Settings(
        min_link_fraction=args.min_link_fraction,
        doctor_timeout=args.doctor_timeout,
        link_schedule=args.link_schedule,
        link_seconds=args.link_seconds,
    )


def _detected(args: argparse.Namespace) -> LaunchOptions:
    """The options, and under ``srun`` on every node (one task each) the nodes and node 0's store from the
    step, as for ``numarun run``; the doctor's store takes the job's rendezvous port."""
    from ..jobenv import Mode
    from ..launch.planning import announce, detect_job, refuse, settle

    job, options = detect_job(from_args(args, os.environ))
    if job is not None:
        announce(options, job.describe())
        if job.mode is Mode.PER_RANK:
            raise UsageError(
                f"bad launch of 'numarun doctor': {job.describe()}; the doctor checks a node once: expected one task "
                "per "
                "node (srun --ntasks-per-node=1 numarun doctor)"
            )
        try:
            settled = settle(options, job)
        except JobConflict as e:
            raise SystemExit(refuse(job, e, options)) from None
        if settled.rendezvous is not None and not settled.rendezvous.own_rendezvous:
            options = settled.options
    return options


def main(args: argparse.Namespace) -> int:
    settings = dataclasses.replace(
        settings_of(args), nvml_record=args.nvml_record, measure=args.measure, no_measure=args.no_measure
    )
    result = diagnose(_detected(args).shown(), settings)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    elif result.get("node_rank", 0) == 0:  # one node, or node 0 of several: the report
        sys.stdout.write(render(result))
    else:
        print(
            f"numarun doctor: node rank {result['node_rank']}: reported to node 0; "
            + ("no errors" if result["ok"] else "errors found (see node 0's report)")
        )
    return 0 if result["ok"] else 1
