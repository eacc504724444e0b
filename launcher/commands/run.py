"""``numarun [run] [torchrun options] SCRIPT|-m MODULE [args...]``: torchrun with each rank bound.

Accepts every torchrun option in torchrun's spellings, plus the planning options
(``--topology``, ``--binding``, ``--mem-policy``; ``--nproc-per-node`` defaults to one
rank per visible GPU, or 1 without GPUs) and ``--dry-run``, ``--strict-binding``,
``--plan-file``.

Exit codes: 0 when every rank succeeded; 2 for a usage or planning mistake (one line);
when a rank fails, the exit code of the lowest global rank that exited non-zero (1 when
every failed rank was killed by a signal), after one line naming every failed rank;
128 + N when numarun itself got signal N (SIGTERM, SIGINT...), after torchrun has ended
all workers, or 0 when every worker then exited 0 on its own (a clean checkpoint-and-stop).
SIGUSR1/SIGUSR2 are sent on to the workers (see :func:`numarun.launch.torchrun.run_torchrun`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..launch.torchrun import (
    Target,
    add_run_options,
    build_torchrun_argv,
    command_line,
    run_torchrun,
    target_from_args,
    torchrun_parser,
    worker_env,
    write_plan_file,
)
from ..errors import UsageError
from ..plan.model import LaunchPlan
from ..plan.options import add_plan_options, request_from_args

log = logging.getLogger(__name__)


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run",
        parents=[torchrun_parser()],
        add_help=False,
        # the planning options take over torchrun's --nproc-per-node and --numa-binding
        conflict_handler="resolve",
        help="run a training script like torchrun, each local rank bound (default when the first argument is a script)",
        description="torchrun with each local rank bound to its GPU, CPU cores, memory and NIC.",
    )
    add_plan_options(parser)
    add_run_options(parser)
    from .doctor import add_doctor_options

    parser.add_argument("--preflight", action="store_true",
                        help="run 'numarun doctor' on every node first and stop on errors")
    add_doctor_options(parser)
    parser.add_argument("--watch-interval", type=float, default=None, metavar="SECONDS",
                        help="seconds between the binding watcher's checks in every rank (default 30)")
    parser.add_argument("--no-watch", action="store_true", help="do not watch the binding while the job runs")
    pet = os.environ.get("PET_NPROC_PER_NODE")  # torchrun reads its options from PET_* too
    if pet:
        parser.set_defaults(nproc_per_node=pet)  # a string default goes through parse_nproc
    parser.set_defaults(func=main)
    return parser


def _load_plan(args: argparse.Namespace) -> tuple[LaunchPlan, str]:
    """(plan, path) from --plan-file, or a fresh plan written to a private file."""
    if args.plan_file:
        try:
            with open(args.plan_file) as f:
                text = f.read()
        except OSError as e:
            raise UsageError(f"bad --plan-file {args.plan_file!r}: {e.strerror}; expected a file from 'numarun plan --json'") from None
        plan = LaunchPlan.from_json(text, origin=args.plan_file)
        if args.nproc_per_node is not None and args.nproc_per_node != plan.nproc_per_node:
            raise UsageError(
                f"bad --nproc-per-node {args.nproc_per_node!r}: the plan file {args.plan_file!r} has "
                f"{plan.nproc_per_node} ranks; expected {plan.nproc_per_node} or no --nproc-per-node"
            )
        return plan, os.path.abspath(args.plan_file)
    from ..plan.binding import make_plan
    from ..topology.discover import load_topology

    plan = make_plan(load_topology(args.topology), request_from_args(args, os.environ))
    return plan, ""


def main(args: argparse.Namespace) -> int:
    target: Target = target_from_args(args)
    if getattr(args, "preflight", False) and not args.dry_run:
        from ..doctor.preflight import preflight

        if preflight(args):
            return 1
    # Composed without writing first: every job's plan is checked before any run dir exists,
    # so a planning mistake leaves no half-written run dir behind.
    jobs = _hydra_jobs(args, target, dry_run=True)
    if jobs is None:
        return _run(args, target, {})
    # a Hydra app: each job (several with -m) composed once, run one after another
    import copy

    from ..config.compose import apply_launcher_settings

    defaults = {**vars(torchrun_parser().parse_args(["x"])), **_plan_defaults()}

    def settled(job: object) -> argparse.Namespace:
        job_args = copy.copy(args)
        apply_launcher_settings(job_args, job.launcher, defaults)  # type: ignore[attr-defined]
        return job_args

    for job in jobs:
        job_args = settled(job)
        plan, _ = _load_plan(job_args)
        build_torchrun_argv(vars(job_args), nproc_per_node=plan.nproc_per_node, target=target)
    if not args.dry_run:
        jobs = _hydra_jobs(args, target, dry_run=False) or []
    for job in jobs:
        job_args = settled(job)
        print(f"numarun: run dir {job.run_dir}", file=sys.stderr, flush=True)
        _run(job_args, Target(target.kind, target.name, job.script_args), dict(job.env), run_dir=job.run_dir)
    return 0


def _hydra_jobs(args: argparse.Namespace, target: Target, *, dry_run: bool) -> list | None:
    """The jobs of a Hydra app (config composed, and saved unless ``dry_run``); None for any other program."""
    if target.kind == "exec":
        return None
    from ..config.compose import prepare_sweep

    return prepare_sweep(target.name, list(target.args), is_module=target.kind == "module", dry_run=dry_run)


def _watch_env(args: argparse.Namespace) -> dict[str, str]:
    from .. import envvars

    if getattr(args, "no_watch", False):
        return {envvars.WATCH_INTERVAL: "0"}
    interval = getattr(args, "watch_interval", None)
    if interval is None:
        return {}
    if interval < 0:
        raise UsageError(f"bad --watch-interval {interval!r}: expected seconds >= 0 (0 turns the watcher off)")
    return {envvars.WATCH_INTERVAL: f"{interval:g}"}


def _plan_defaults() -> dict[str, object]:
    parser = argparse.ArgumentParser(add_help=False)
    add_plan_options(parser)
    add_run_options(parser)
    return {a.dest: a.default for a in parser._actions}  # noqa: SLF001


def _run(args: argparse.Namespace, target: Target, job_env: dict[str, str], run_dir: "os.PathLike[str] | None" = None) -> int:
    plan, plan_path = _load_plan(args)
    for w in plan.warnings:
        log.warning("%s", w)
    argv = build_torchrun_argv(vars(args), nproc_per_node=plan.nproc_per_node, target=target)
    if args.dry_run:
        from ..view.plan import render_plan

        env = {**worker_env(plan, os.environ, plan_path=plan_path or "plan.json", strict=args.strict_binding), **job_env, **_watch_env(args)}
        sys.stdout.write(render_plan(plan, width=160))
        if not plan_path:
            sys.stdout.write("\n# plan.json: the output of 'numarun plan --json' with the same options\n")
        sys.stdout.write(command_line(env, argv) + "\n")
        return 0
    if not plan_path:
        plan_path = str(write_plan_file(plan, run_dir))
    env = {**worker_env(plan, os.environ, plan_path=plan_path, strict=args.strict_binding), **job_env, **_watch_env(args)}
    log.info("running: %s", command_line(env, argv))
    run_torchrun(argv, env)
    return 0
