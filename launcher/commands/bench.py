"""``numarun bench NAME``: micro-benchmarks. Each lives in a module listed in BENCHMARKS.

A benchmark module provides ``add_arguments(parser)`` and ``run_and_report(args) -> int``,
and ``DISTRIBUTED = True`` when every rank of a job must run it. Inside a job (RANK set by
numarun/torchrun) the benchmark runs directly; otherwise this command starts the job on
this node (``--nproc-per-node``, ``--nnodes``...) with the benchmark module as the script.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import subprocess
import sys
from typing import Any

from .. import argtypes
from ..errors import UsageError, expected
from ..launch.child import numarun_command

log = logging.getLogger(__name__)

# name -> module; add a benchmark by adding a line here.
BENCHMARKS: dict[str, str] = {
    "allreduce": "numarun.bench.allreduce",
    "h2d": "numarun.bench.h2d",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="micro-benchmarks (allreduce, ...)",
                                   description="Run a micro-benchmark, inside a job or as its own job.")
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", parser_class=type(parser))
    sub.required = True
    for name, modname in BENCHMARKS.items():
        module = importlib.import_module(modname)
        p = sub.add_parser(name, help=(module.__doc__ or name).strip().splitlines()[0])
        if getattr(module, "DISTRIBUTED", True):
            g = p.add_argument_group("job (ignored inside a numarun/torchrun job)")
            g.add_argument("--nproc-per-node", type=argtypes.int_in("--nproc-per-node", low=1, high=argtypes.MAX_LOCAL_RANKS),
                           default=None, help="ranks on this node (default 2)")
            g.add_argument("--nnodes", type=argtypes.int_in("--nnodes", low=1, high=argtypes.MAX_NODES), default=1,
                           help="number of nodes (default 1)")
            g.add_argument("--node-rank", type=argtypes.int_in("--node-rank", low=0, high=argtypes.MAX_NODES - 1), default=0,
                           help="this node's rank (default 0)")
            g.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (default 127.0.0.1)")
            g.add_argument("--master-port", type=argtypes.port("--master-port"), default=29500,
                           help="port on node 0 (default 29500)")
            g.add_argument("--binding", default=None, metavar="MODE",
                           help="CPU binding of the ranks, as 'numarun run --binding' (default: run's default)")
            g.add_argument("--launcher", choices=("numarun", "torchrun"), default="numarun",
                           help="start the ranks with 'numarun run' (bound, default) or plain torchrun")
        own = argparse.ArgumentParser(add_help=False)
        module.add_arguments(own)
        module.add_arguments(p)
        p.set_defaults(func=main, bench_module=modname, bench_actions=tuple(own._actions))
    return parser


def _inside_job() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch_argv(args: argparse.Namespace, bench_argv: list[str]) -> list[str]:
    """The command that runs the benchmark as a job on this node (a value: printed with --log-level INFO)."""
    nproc = args.nproc_per_node if args.nproc_per_node is not None else 2
    if nproc < 1:
        raise UsageError(expected(nproc, "a positive number of ranks", "--nproc-per-node"))
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise UsageError(expected(f"--nnodes {args.nnodes} --node-rank {args.node_rank}",
                                  "nnodes >= 1 and 0 <= node-rank < nnodes", "job shape"))
    job = [f"--nproc-per-node={nproc}", f"--nnodes={args.nnodes}", f"--node-rank={args.node_rank}",
           f"--master-addr={args.master_addr}", f"--master-port={args.master_port}"]
    if args.launcher == "torchrun":
        if args.binding is not None:
            raise UsageError(expected(f"--binding {args.binding}", "no --binding with --launcher torchrun", "option"))
        head = [sys.executable, "-m", "torch.distributed.run"]
    else:
        head = numarun_command("run")
        if args.binding is not None:
            job.append(f"--binding={args.binding}")
    return [*head, *job, "-m", args.bench_module, *bench_argv]


def bench_argv(args: argparse.Namespace) -> list[str]:
    """The benchmark's own options, rebuilt from the parsed values, for the job's ranks."""
    out: list[str] = []
    for action in args.bench_actions:
        if not action.option_strings:
            continue
        value = getattr(args, action.dest, None)
        if value is None or value is False:
            continue
        flag = max(action.option_strings, key=len)
        if value is True:
            out.append(flag)
        else:
            out.append(f"{flag}={value}")
    return out


def main(args: argparse.Namespace) -> int:
    module = importlib.import_module(args.bench_module)
    if not getattr(module, "DISTRIBUTED", True) or _inside_job():
        return int(module.run_and_report(args))
    check = getattr(module, "check_options", None)
    if check is not None:
        check(args)  # every option refused here, before any rank starts
    cmd = launch_argv(args, bench_argv(args))
    log.info("launching: %s", " ".join(cmd))
    env = dict(os.environ)
    if args.launcher == "torchrun":
        # torchrun would set 1 and warn; numarun sets each rank's own value (so never here:
        # a value set here would look like the user's own and be kept)
        env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.call(cmd, env=env)
