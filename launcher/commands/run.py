"""``numarun [run] [torchrun options] SCRIPT|-m MODULE [args...]``: torchrun with each rank bound.

Accepts every torchrun option in torchrun's spellings, plus the planning options
(``--topology``, ``--binding``, ``--mem-policy``; ``--nproc-per-node`` defaults to one
rank per visible GPU, or 1 without GPUs) and ``--dry-run``, ``--strict-binding``,
``--plan-file``.

Three kinds of program (:mod:`numarun.config.detect`):

* numarun's trainer: Hydra composes each job once, here (:func:`numarun.config.compose.run_hydra`);
  each job's ``launcher`` group fills the flags the user left out, then the job is planned
  once and run; a sweep (``-m``) runs Hydra's sweeper, one job after another;
* a user's ``@hydra.main`` app, or any other script: run as torchrun runs it. For a Hydra
  app numarun fixes Hydra's clock once (``NUMARUN_HYDRA_NOW``) so that every rank's own
  Hydra picks the same run dir (:mod:`numarun.launch.hydra_pin`).

Exit codes: 0 when every rank succeeded; 2 for a usage or planning mistake (one line);
when a rank fails, the exit code of the lowest global rank that exited non-zero (1 when
every failed rank was killed by a signal), after one line naming every failed rank;
128 + N when numarun itself got signal N (SIGTERM, SIGINT...), after torchrun has ended
all workers.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from .. import argtypes, envvars
from ..errors import UsageError
from ..launch.torchrun import (
    Target,
    add_run_options,
    build_torchrun_argv,
    command_line,
    node_label,
    run_torchrun,
    target_from_args,
    torchrun_parser,
    worker_env,
    write_plan_file,
)
from ..plan.model import LaunchPlan
from ..plan.options import add_plan_options, request_for

log = logging.getLogger(__name__)

REFUSED_OPTIONS = ("run_path", "virtual_local_rank")
"""torchrun options numarun refuses (:func:`numarun.launch.torchrun.target_from_args` says why)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
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
    parser.add_argument("--watch-interval", type=argtypes.seconds("--watch-interval", above=False), default=None,
                        metavar="SECONDS",
                        help="seconds between the binding watcher's checks in every rank (default 30)")
    parser.add_argument("--no-watch", action="store_true", help="do not watch the binding while the job runs")
    for action in parser._actions:  # torchrun options numarun refuses are not offered
        if action.dest in REFUSED_OPTIONS:
            action.help = argparse.SUPPRESS
    pet = os.environ.get("PET_NPROC_PER_NODE")  # torchrun reads its options from PET_* too
    if pet:
        parser.set_defaults(nproc_per_node=pet)  # a string default goes through parse_nproc
    parser.set_defaults(func=main)
    return parser


# ----------------------------------------------------------------------------- flags from the config

# the config's launcher keys -> the run command's option dests
_FLAG_DESTS = {
    "nproc_per_node": "nproc_per_node",
    "nnodes": "nnodes",
    "node_rank": "node_rank",
    "binding": "binding",
    "mem_policy": "mem_policy",
    "nic_policy": "nic_policy",
    "master_addr": "master_addr",
    "master_port": "master_port",
    "rdzv_endpoint": "rdzv_endpoint",
    "rdzv_id": "rdzv_id",
    "strict_binding": "strict_binding",
}


def apply_launcher_settings(args: Any, settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """Copy the config's ``launcher`` values into ``args`` where the flag was left at its default.

    A flag given with its default value counts as not given (argparse cannot tell them apart).
    Returns the names set from the config.
    """
    from ..plan.options import parse_binding, parse_mem_policy, parse_nic_policy

    applied = []
    for key, dest in _FLAG_DESTS.items():
        value = settings.get(key)
        if value is None or not hasattr(args, dest):
            continue
        if getattr(args, dest) != defaults.get(dest):
            continue  # the user's flag wins
        if key == "binding":
            value = parse_binding(str(value))
        elif key == "mem_policy":
            value = parse_mem_policy(str(value))
        elif key == "nic_policy":
            value = parse_nic_policy(str(value))
        elif key == "nnodes":
            value = str(value)
        setattr(args, dest, value)
        applied.append(key)
    return applied


def _flag_defaults() -> dict[str, object]:
    parser = argparse.ArgumentParser(add_help=False)
    add_plan_options(parser)
    add_run_options(parser)
    return {**vars(torchrun_parser().parse_args(["x"])), **{a.dest: a.default for a in parser._actions}}


# ----------------------------------------------------------------------------- one run request


class _Planner:
    """Plans from one topology read: a sweep reads the machine once, plans each job once."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._topology: Any = None

    def plan(self, args: argparse.Namespace) -> tuple[LaunchPlan, str]:
        """(plan, path) from --plan-file, or a fresh plan (path '')."""
        if args.plan_file:
            try:
                with open(args.plan_file) as f:
                    text = f.read()
            except OSError as e:
                raise UsageError(
                    f"bad --plan-file {args.plan_file!r}: {e.strerror}; expected a file from 'numarun plan --json'"
                ) from None
            plan = LaunchPlan.from_json(text, origin=args.plan_file)
            if isinstance(args.nproc_per_node, int) and args.nproc_per_node != plan.nproc_per_node:
                raise UsageError(
                    f"bad --nproc-per-node {args.nproc_per_node!r}: the plan file {args.plan_file!r} has "
                    f"{plan.nproc_per_node} rank{'' if plan.nproc_per_node == 1 else 's'}; "
                    f"expected {plan.nproc_per_node} or no --nproc-per-node"
                )
            return plan, os.path.abspath(args.plan_file)
        from ..plan.binding import make_plan
        from ..topology.discover import load_topology

        if self._topology is None:
            self._topology = load_topology(args.topology)
        return make_plan(self._topology, request_for(args, os.environ, self._topology)), ""


def main(args: argparse.Namespace) -> int:
    target: Target = target_from_args(args)
    if getattr(args, "preflight", False) and not args.dry_run:
        from ..doctor.preflight import preflight

        if preflight(args):
            return 1
    planner = _Planner(args)
    if target.kind != "exec":
        from ..config.detect import AppKind, detect_app

        kind = detect_app(target.name, is_module=target.kind == "module")
        if kind is AppKind.TRAINER:
            return _run_trainer(args, target, planner)
        if kind is AppKind.HYDRA_MAIN:
            # Hydra's ${now:} fixed once here: every rank's Hydra picks the same run dir
            when = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
            return _run(args, target, planner, {envvars.HYDRA_NOW: when})
    return _run(args, target, planner, {})


def _run_trainer(args: argparse.Namespace, target: Target, planner: _Planner) -> int:
    """numarun's trainer: Hydra composes each job once; each job is planned once and run."""
    from ..config import compose

    defaults = _flag_defaults()
    script_args = list(target.args)

    def settled(launcher: Mapping[str, Any]) -> argparse.Namespace:
        job_args = copy.copy(args)
        apply_launcher_settings(job_args, launcher, defaults)
        return job_args

    if args.dry_run and not compose.is_info_command(script_args):
        jobs = compose.compose_dry(script_args)
        for run_dir, job in jobs:
            job_args = settled(job.launcher)
            sys.stdout.write(
                f"# a real run would create {run_dir}/ holding .hydra/{{config,hydra,overrides}}.yaml, "
                "config.yaml (below, what every rank reads) and numarun_plan.json\n"
            )
            sys.stdout.write("# config.yaml:\n" + "".join(f"#   {ln}\n" for ln in job.config_text.splitlines()))
            _run(job_args, Target(target.kind, target.name, ()), planner, dict(job.env))
        return 0

    # the workers read the saved config: no arguments after the script
    job_target = Target(target.kind, target.name, ())
    planned: dict[tuple[str, str], tuple[argparse.Namespace, tuple[LaunchPlan, str]]] = {}

    def check(job: Any) -> None:
        """Before Hydra makes any run dir: the job's flags, plan and torchrun options are sound."""
        job_args = settled(job.launcher)
        plan = planner.plan(job_args)
        build_torchrun_argv(vars(job_args), nproc_per_node=plan[0].nproc_per_node, target=job_target)
        planned[(str(job.run_dir), job.config_text)] = (job_args, plan)

    def on_job(job: Any) -> int:
        job_args, plan = planned.pop((str(job.run_dir), job.config_text), None) or (settled(job.launcher), None)
        print(f"numarun: run dir {job.run_dir}", file=sys.stderr, flush=True)
        return _run(job_args, job_target, planner, dict(job.env), run_dir=job.run_dir, planned=plan)

    compose.run_hydra(script_args, on_job, check)
    return 0


def _watch_env(args: argparse.Namespace) -> dict[str, str]:
    if getattr(args, "no_watch", False):
        return {envvars.WATCH_INTERVAL: "0"}
    interval = getattr(args, "watch_interval", None)
    if interval is None:
        return {}
    if interval < 0:
        raise UsageError(f"bad --watch-interval {interval!r}: expected seconds >= 0 (0 turns the watcher off)")
    return {envvars.WATCH_INTERVAL: f"{interval:g}"}


def _run(
    args: argparse.Namespace,
    target: Target,
    planner: _Planner,
    job_env: dict[str, str],
    run_dir: os.PathLike[str] | None = None,
    planned: tuple[LaunchPlan, str] | None = None,
) -> int:
    plan, plan_path = planned or planner.plan(args)
    for w in plan.warnings:
        log.warning("%s", w)
    # The binding line of each rank is logged at INFO on purpose: it is the run's record of
    # what each rank got, so it shows by default although numarun's own level is WARNING;
    # an explicit --log-level (or NUMARUN_LOG_LEVEL) sets the workers' level too.
    if getattr(args, "log_level", None) and envvars.LOG_LEVEL not in os.environ:
        job_env = {envvars.LOG_LEVEL: str(args.log_level).upper(), **job_env}
    argv = build_torchrun_argv(vars(args), nproc_per_node=plan.nproc_per_node, target=target)
    if args.dry_run:
        from ..view.plan import render_plan

        env = {
            **worker_env(plan, os.environ, plan_path=plan_path or "plan.json", strict=args.strict_binding),
            **job_env,
            **_watch_env(args),
        }
        sys.stdout.write(render_plan(plan, width=160))
        if not plan_path:
            sys.stdout.write("\n# plan.json: the output of 'numarun plan --json' with the same options\n")
        sys.stdout.write(command_line(env, argv) + "\n")
        return 0
    if not plan_path:
        plan_path = str(write_plan_file(plan, run_dir, node=node_label(vars(args))))
    env = {**worker_env(plan, os.environ, plan_path=plan_path, strict=args.strict_binding), **job_env, **_watch_env(args)}
    log.info("running: %s", command_line(env, argv))
    run_torchrun(argv, env)
    return 0
