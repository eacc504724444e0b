"""``numarun bench NAME``: micro-benchmarks. Each lives in a module listed in BENCHMARKS.

A benchmark module provides ``add_arguments(parser)`` and ``run_and_report(args) -> int``,
and ``DISTRIBUTED = True`` when every rank of a job must run it (then also ``check_options(args)``,
which refuses bad options before any rank starts). Inside a job (RANK set by numarun/torchrun)
the benchmark runs directly; otherwise this command starts the job on this node
(``--nproc-per-node``, ``--nnodes``...) with the benchmark module as the script.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import subprocess
import sys
from typing import Any

from ..errors import UsageError, expected
from ..launch.child import numarun_command
from ..options.launch import LaunchOptions, Source, add_options, from_args

log = logging.getLogger(__name__)

JOB = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "binding")
"""The launch options a benchmark's job takes (run's own; the environment's are read by the job itself)."""
BENCH_RANKS = 2
"""A benchmark's ranks on this node when nothing says: one rank measures no collective."""

# name -> module; add a benchmark by adding a line here.
BENCHMARKS: dict[str, str] = {"allreduce": "numarun.bench.allreduce", "h2d": "numarun.bench.h2d"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench",
        help="micro-benchmarks (allreduce, ...)",
        description="Run a micro-benchmark, inside a job or as its own job.",
    )
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", parser_class=type(parser))
    sub.required = True
    for name, modname in BENCHMARKS.items():
        module = importlib.import_module(modname)
        p = sub.add_parser(name, help=(module.__doc__ or name).strip().splitlines()[0])
        if getattr(module, "DISTRIBUTED", True):
            g = p.add_argument_group(
                f"job, as 'numarun run' takes it ({BENCH_RANKS} ranks unless told; "
                "ignored inside a numarun/torchrun job)"
            )
            add_options(p, JOB, group=g)
            g.add_argument(
                "--launcher",
                choices=("numarun", "torchrun"),
                default="numarun",
                help="start the ranks with 'numarun run' (bound, default) or plain torchrun",
            )
        job_actions = len(p._actions)
        module.add_arguments(p)
        p.set_defaults(func=main, bench_module=modname, bench_actions=tuple(p._actions[job_actions:]))
    return parser


def job_options(args: argparse.Namespace) -> LaunchOptions:
    """The job's launch options: typed, from the environment, :data:`BENCH_RANKS` ranks, else run's defaults."""
    return from_args(args, os.environ).with_defaults("numarun bench", nproc_per_node=BENCH_RANKS)


def launch_argv(args: argparse.Namespace, options: LaunchOptions, bench_argv: list[str]) -> list[str]:
    """The command that runs the benchmark as a job on this node (a value: printed with --log-level INFO): the
    options typed here on its command line (the job reads the environment's itself), and the rank count."""
    from ..launch.torchrun import check_torchrun_options

    typed = {d: s.value for d, s in options.stated().items() if s.source is Source.COMMAND_LINE}
    if args.launcher == "torchrun" and "binding" in typed:
        raise UsageError(
            expected(f"--binding {typed['binding'].value}", "no --binding with --launcher torchrun", "option")
        )
    check_torchrun_options(typed)  # --node-rank below --nnodes...: refused here, before any rank starts
    job = options.flags(Source.COMMAND_LINE, leave_out=("nproc_per_node",))
    head = [sys.executable, "-m", "torch.distributed.run"] if args.launcher == "torchrun" else numarun_command("run")
    return [*head, f"--nproc-per-node={options.nproc_per_node}", *job, "-m", args.bench_module, *bench_argv]


def bench_argv(args: argparse.Namespace) -> list[str]:
    """The benchmark's own options, rebuilt from the parsed values, for the job's ranks."""
    out: list[str] = []
    for action in args.bench_actions:
        value = getattr(args, action.dest, None)
        if action.option_strings and value is not None and value is not False:
            flag = max(action.option_strings, key=len)
            out.append(flag if value is True else f"{flag}={value}")
    return out


def main(args: argparse.Namespace) -> int:
    module = importlib.import_module(args.bench_module)
    if not getattr(module, "DISTRIBUTED", True) or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return int(module.run_and_report(args))
    module.check_options(args)  # every option refused here, before any rank starts
    cmd = launch_argv(args, job_options(args).shown(), bench_argv(args))
    log.info("launching: %s", " ".join(cmd))
    env = dict(os.environ)
    if args.launcher == "torchrun":
        # torchrun would set 1 and warn; numarun sets each rank's own value (so never here:
        # a value set here would look like the user's own and be kept)
        env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.call(cmd, env=env)
