"""``numarun stacks``: print where every rank of a running job stands, the roll-call of a hung job, on demand.

The job's own numarun (the agent that started the ranks) is asked: its ranks dump every thread's Python stack
in-process (py-spy adds native frames where it is installed and ptrace is allowed), the job keeps running. A
multi-node job's roll-call covers every node. With several jobs of yours on this node, the latest started is
shown unless ``--pid`` names one (numarun's pid or any rank's); ``--list`` lists them (docs/hangs.md).
"""

from __future__ import annotations

import argparse
import sys

from .. import argtypes
from ..errors import UsageError
from ..launch.hangs import ask_stacks, choose_job, describe, running_jobs


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "stacks",
        help="print where every rank of a running job stands (its roll-call)",
        description="Print the roll-call of a numarun job running on this node: ranks grouped by where they stand "
        "(the innermost frame of your code and the library call it is in), the odd ones named, and the "
        "file holding every thread's stack of every rank. Harmless to the job.",
    )
    argtypes.add_job_pid(p)
    p.add_argument("--list", action="store_true", help="list your numarun jobs running on this node and exit")
    p.add_argument("--full", action="store_true", help="print every thread's stack of every rank too")
    p.add_argument(
        "--timeout",
        type=argtypes.seconds("--timeout"),
        default=180.0,
        metavar="SECONDS",
        help="how long to wait for the job's answer (default 180; py-spy's native frames take seconds)",
    )
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    if args.list and (args.pid is not None or args.full):
        given = f"--pid {args.pid}" if args.pid is not None else "--full"
        raise UsageError(f"bad {given} with --list: --list lists every job of yours here; expected one of them")
    if args.list:
        for job in running_jobs():
            sys.stdout.write(describe(job) + "\n")
        return 0
    job, note = choose_job(args.pid)
    if note:
        print(note, file=sys.stderr, flush=True)
    text = ask_stacks(job, full=args.full, timeout_s=args.timeout)
    sys.stdout.write("".join(f"numarun: {line}\n" if not args.full else f"{line}\n" for line in text.splitlines()))
    return 0
