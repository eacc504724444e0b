"""``numarun top``: show a running job's ranks live: each one's step time, its phases' shares and the verdict.

The job is found as ``numarun stacks`` finds it (the latest started of yours on this node, or ``--pid``: numarun's
pid or any rank's); the table is the step report's live view (``steps.live.json``), which the job's numarun
rewrites in its private directory. Exit codes: 0 shown (the live view ends with the job or Ctrl-C, 130); 1 no
job runs here; 2 a bad flag or a ``--pid`` that is no numarun job's; 3 the job has no step report yet
(docs/steps.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

from .. import argtypes
from ..errors import NoStepReport, UsageError
from ..launch.hangs import RunningJob, choose_job, describe
from ..topology.procfs import alive
from ..worker.steps import LIVE, LiveTable

DEFAULT_INTERVAL_S = 2.0
"""How often the table is redrawn without ``--interval``."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "top",
        help="show a running job's ranks live: step time, phases, the rank that holds it back",
        description="Show the step report of a numarun job running on this node, one row per rank: where it runs "
        "(host, cores, NUMA node, NIC), its steps, its median step time, each phase's share of it (input, compute, "
        "comm, optim), its peak memory, with the job's steps/s and the verdict under the table. Redrawn every "
        "--interval seconds until the job ends or Ctrl-C. Harmless to the job.",
    )
    argtypes.add_job_pid(p)
    p.add_argument(
        "--interval",
        type=argtypes.seconds("--interval", low=0.1, above=False),
        default=None,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2)",
    )
    p.add_argument("--once", action="store_true", help="print the table once and exit (plain text when piped)")
    p.add_argument("--json", action="store_true", help="print the table once as JSON (the step report's live view)")
    p.set_defaults(func=main)
    return p


def _read(job: RunningJob) -> LiveTable | None:
    """The job's live view; None while there is none (or it is being replaced)."""
    try:
        return LiveTable.parse((job.state / LIVE).read_text())
    except (OSError, ValueError):
        return None


def _first(job: RunningJob) -> LiveTable:
    live = _read(job)
    if live is not None:
        return live
    path = job.state / LIVE
    if path.exists():
        raise NoStepReport(f"cannot read the step report {path}: expected a live table of this numarun's format", 1)
    raise NoStepReport(
        f"numarun {job.pid} has no step report yet ({path} is not there): it writes one after its ranks' first "
        "steps, unless the step report is off"
    )


def _width() -> int:
    return max(shutil.get_terminal_size((160, 24)).columns, 80) if sys.stdout.isatty() else 200


def _watch(job: RunningJob, live: LiveTable, interval: float) -> None:
    """Redraw until the job ends: in place on a terminal, one table after another when piped or on a terminal that
    cannot redraw (``TERM=dumb``: rich's Live would show nothing until the end)."""
    from rich.console import Console
    from rich.live import Live

    from ..view.top import render_top, top_view

    console = Console()
    if not sys.stdout.isatty() or console.is_dumb_terminal:
        while True:
            sys.stdout.write(render_top(live, title=describe(job), width=_width()) + "\n")
            sys.stdout.flush()
            if not _sleep_while_alive(job, interval):
                return
            live = _read(job) or live
    with Live(top_view(live, title=describe(job)), console=console, auto_refresh=False) as screen:
        while _sleep_while_alive(job, interval):
            live = _read(job) or live
            screen.update(top_view(live, title=describe(job)), refresh=True)


def _sleep_while_alive(job: RunningJob, interval: float) -> bool:
    deadline = time.monotonic() + interval
    while time.monotonic() < deadline:
        if not alive(job.pid):
            return False
        time.sleep(min(0.2, interval))
    return alive(job.pid)


def main(args: argparse.Namespace) -> int:
    once = "--json" if args.json else "--once" if args.once else ""
    if once and args.interval is not None:
        raise UsageError(f"bad --interval {args.interval:g} with {once}: {once} prints one table; expected one of them")
    job, note = choose_job(args.pid)
    if note:
        print(note, file=sys.stderr, flush=True)
    live = _first(job)
    if args.json:
        sys.stdout.write(live.text() + "\n")
        return 0
    if args.once:
        from ..view.top import render_top

        sys.stdout.write(render_top(live, title=describe(job), width=_width(), color=sys.stdout.isatty()))
        return 0
    _watch(job, live, DEFAULT_INTERVAL_S if args.interval is None else args.interval)
    print(f"numarun: job {job.pid} ended", file=sys.stderr)
    return 0
