"""``numarun [run] [torchrun options] SCRIPT|-m MODULE [args...]``: torchrun with each rank bound.

Accepts every torchrun option in torchrun's spellings, plus the planning options
(``--topology``, ``--binding``, ``--mem-policy``; ``--nproc-per-node`` defaults to one
rank per visible GPU, or 1 without GPUs) and ``--dry-run``, ``--strict-binding``,
``--plan-file``.

Three kinds of program (:mod:`numarun.config.detect`):

* numarun's trainer: Hydra composes each job once, here (:func:`numarun.config.compose.run_hydra`);
  each job's ``launcher`` group fills the flags the user left out, then the job is planned
  once and run; a sweep (``-m``) runs its jobs through numarun's Hydra launcher (:mod:`numarun.sweep`);
* a user's ``@hydra.main`` app, or any other script: run as torchrun runs it. For a Hydra
  app numarun fixes Hydra's clock once (``NUMARUN_HYDRA_NOW``) so that every rank's own
  Hydra picks the same run dir (:mod:`numarun.worker.hydra_pin`).

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
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from .. import argtypes, envvars
from ..errors import UsageError
from ..jobenv import JobShape, Mode
from ..jobenv.settle import Given, JobConflict
from ..launch.net import addressing
from ..launch.spec import LaunchSpec, launch_spec
from ..launch.supervisor import Supervisor
from ..launch.torchrun import Target, add_run_options, command_line, target_from_args, torchrun_parser, worker_env
from ..plan.model import LaunchPlan
from ..plan.options import add_plan_options, request_for
from ..plan.scheduled import confine, mem_refused_line

log = logging.getLogger(__name__)

REFUSED_OPTIONS = ("run_path", "virtual_local_rank")
"""torchrun options numarun refuses (:func:`numarun.launch.torchrun.target_from_args` says why)."""


_PARSER: argparse.ArgumentParser | None = None
"""The run command's parser, to tell which options were given (:func:`numarun.commands.detected.given_dests`)."""


def _scheduler_started_ranks() -> bool:
    """Whether a scheduler seems to have started one process per rank: then no torchrun runs, and the
    run command's parser is rebuilt from its record instead of importing torch for torchrun's."""
    from ..jobenv import Mode, detection_enabled, scheduler_in

    if not detection_enabled(os.environ) or scheduler_in(os.environ) is None:
        return False
    try:
        from ..jobenv import detect

        job = detect(os.environ)
    except Exception:  # a malformed environment is reported once the options are parsed
        return False
    return job is not None and job.mode is Mode.PER_RANK


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    global _PARSER
    parser = subparsers.add_parser(
        "run",
        parents=[torchrun_parser(recorded=_scheduler_started_ranks())],
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
    parser.add_argument(
        "--no-detect", action="store_true",
        help="do not read the job's shape from a Slurm step or mpirun's environment (also NUMARUN_DETECT=0)",
    )
    for action in parser._actions:  # torchrun options numarun refuses are not offered
        if action.dest in REFUSED_OPTIONS:
            action.help = argparse.SUPPRESS
    pet = os.environ.get("PET_NPROC_PER_NODE")  # torchrun reads its options from PET_* too
    if pet:
        parser.set_defaults(nproc_per_node=pet)  # a string default goes through parse_nproc
    parser.set_defaults(func=main)
    _PARSER = parser
    return parser


# ----------------------------------------------------------------------------- flags from the config

# the config's launcher keys, which are the run command's option dests too
_FLAGS = ("nproc_per_node", "nnodes", "node_rank", "binding", "mem_policy", "nic_policy", "master_addr", "master_port",
          "rdzv_endpoint", "rdzv_id", "strict_binding")


def apply_launcher_settings(args: Any, settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """Copy the config's ``launcher`` values into ``args`` where the flag was left at its default.

    A flag given with its default value counts as not given (argparse cannot tell them apart).
    Returns the names set from the config.
    """
    from ..plan.options import parse_binding, parse_mem_policy, parse_nic_policy

    applied = []
    for key in _FLAGS:
        dest = key
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
    """Plans from one topology read: a sweep reads the machine once, plans each job once.

    In a Slurm step, the ranks plan on the GPUs the step may open (:meth:`_step_gpus`)."""

    def __init__(self, job: JobShape | None = None) -> None:
        self._job = job
        self._topology: Any = None
        self._here: Any = None

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
            from ..jobenv.container import detect_container
            from ..worker.affinity import mempolicy_refusal

            plan = confine(LaunchPlan.from_json(text, origin=args.plan_file), detect_container(os.environ),
                           mempolicy_refusal())  # the ranks run here, wherever the plan was made
            if isinstance(args.nproc_per_node, int) and args.nproc_per_node != plan.nproc_per_node:
                raise UsageError(
                    f"bad --nproc-per-node {args.nproc_per_node!r}: the plan file {args.plan_file!r} has "
                    f"{plan.nproc_per_node} rank{'' if plan.nproc_per_node == 1 else 's'}; "
                    f"expected {plan.nproc_per_node} or no --nproc-per-node"
                )
            return plan, os.path.abspath(args.plan_file)
        from ..plan.binding import make_plan
        from ..topology.discover import load_topology
        from .detected import here

        if self._topology is None:
            self._topology = load_topology(args.topology)
            self._here = here(self._topology, args.topology, self._job)
        node = self._here
        request = request_for(args, os.environ, self._topology, allowed_gpu_minors=node.gpu_minors)
        return confine(make_plan(self._topology, request), node.container, node.mem_refused), ""


def main(args: argparse.Namespace) -> int:
    target: Target = target_from_args(args)
    from .detected import announce, detect_job, refuse, settle_node_args

    job, given = detect_job(args, _PARSER)
    supervisor = getattr(args, "supervisor", None)
    if supervisor is None:
        supervisor = Supervisor()
        supervisor.hold_signals()
    if job is not None:
        announce(args, job.describe())
        try:
            if job.mode is Mode.PER_RANK:
                return _run_rank(args, target, job, given, supervisor)
            args, rendezvous = settle_node_args(args, job, given)
        except JobConflict as e:
            return refuse(job, e, given)
        if not rendezvous.own_rendezvous and job.nnodes > 1:
            order = f", node order {','.join(rendezvous.order)}" if rendezvous.order else ""
            announce(args, f"node rank {rendezvous.node_rank} of {job.nnodes}: rendezvous {args.master_addr}:"
                           f"{args.master_port} (static{order})")
    if getattr(args, "preflight", False) and not args.dry_run:
        from ..doctor.preflight import preflight

        if preflight(args):
            return 1
    run = _Runner(supervisor, _Planner(job))
    if target.kind != "exec":
        from ..config.detect import AppKind, detect_app

        kind = detect_app(target.name, is_module=target.kind == "module")
        if kind is AppKind.TRAINER:
            return _run_trainer(args, target, run)
        if kind is AppKind.HYDRA_MAIN and any(a in ("-m", "--multirun") for a in target.args):
            from ..sweep.launch import run_app

            supervisor.release()
            return run_app(args, target.kind, target.name, target.args)
        if kind is AppKind.HYDRA_MAIN:
            # Hydra's ${now:} fixed once here: every rank's Hydra picks the same run dir
            when = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
            return run(args, target, {envvars.HYDRA_NOW: when})
    return run(args, target, {})


def _run_rank(args: argparse.Namespace, target: Target, job: JobShape, given: Given, supervisor: Supervisor) -> int:
    """Per-rank mode: bind this process as its rank of the node's plan, then run the script here."""
    from ..jobenv.settle import check_rank, rank_env, rank_master
    from .detected import rank_setup

    check_rank(job, given)
    if getattr(args, "preflight", False):
        raise JobConflict(
            f"bad option '--preflight': {job.describe()}; the pre-flight runs once per node: expected it left out, or "
            "one task per node (srun --ntasks-per-node=1)"
        )
    hydra_app = False
    if target.kind != "exec":
        from ..config.detect import AppKind, detect_app

        kind = detect_app(target.name, is_module=target.kind == "module")
        hydra_app = kind is AppKind.HYDRA_MAIN
        if kind is AppKind.TRAINER:
            raise UsageError(
                f"bad launch of numarun's trainer {target.name!r}: {job.describe()}; the trainer composes its config and "
                "run dir once per node: expected one task per node (srun --ntasks-per-node=1 numarun ...), which starts "
                "the node's ranks"
            )
    addr, port = rank_master(job, given, os.environ)
    if addr is None:
        from ..slurm.controller import head_addr

        addr = "127.0.0.1" if job.nnodes == 1 else head_addr(os.environ, job.nodes[0])
    clock = hydra_app and not os.environ.get(envvars.HYDRA_NOW)
    if not args.dry_run:  # the node and Hydra's clock, where no variable says: one for every rank
        from ..launch.rank import agree

        job, now = agree(job, addr, port, clock=clock)
        check_rank(job, given)
    setup = rank_setup(args, job)
    refuse_unbound(setup.plan, args.strict_binding)
    for note in (*(setup.plan.warnings if job.local_rank == 0 else ()), *setup.notes):  # the node's: said once
        log.warning("%s", note)
    addr = argtypes.parse_endpoint(addr, "--master-addr (MASTER_ADDR)", port=False)[0]
    env = rank_env(job, master_addr=addr, master_port=port, environ=os.environ)
    env.update(addressing(multi_node=job.nnodes > 1, backend="static", endpoint=(addr, port),
                          flag="--master-addr (MASTER_ADDR)", node_rank=job.node_index).env)
    from ..plan.scheduled import task_plan

    plan = task_plan(setup.plan, setup.binding)
    plan_text = plan.to_json()
    env.update(worker_env(setup.plan, os.environ, plan_path="", strict=args.strict_binding))
    env.pop(envvars.PLAN, None)
    env[envvars.PLAN_JSON] = plan_text
    env.update(_watch_env(args))
    if clock and not args.dry_run:
        env[envvars.HYDRA_NOW] = now
    if getattr(args, "log_level", None) and envvars.LOG_LEVEL not in os.environ:
        env[envvars.LOG_LEVEL] = str(args.log_level).upper()
    if args.dry_run:
        import shlex

        from ..view.plan import render_plan

        sys.stdout.write(render_plan(plan, width=160))
        sys.stdout.write(f"# this task is local rank {job.local_rank}: it would bind itself as that row and run, with\n")
        shown = [f"{k}={shlex.quote(v)}" for k, v in env.items() if k != envvars.PLAN_JSON]
        sys.stdout.write(" ".join([*shown, shlex.join([target.name, *target.args])]) + "\n")
        return 0
    from ..launch.rank import become_rank

    supervisor.release()  # the rank handles its own signals, as under plain python
    become_rank(target, env)


def _run_trainer(args: argparse.Namespace, target: Target, run: _Runner) -> int:
    """numarun's trainer: Hydra composes each job once; each job is planned once and run."""
    from ..config import compose
    from ..train.preflight import check_prepared

    defaults = _flag_defaults()
    script_args = list(target.args)

    def settled(launcher: Mapping[str, Any]) -> argparse.Namespace:
        job_args = copy.copy(args)
        apply_launcher_settings(job_args, launcher, defaults)
        return job_args

    if args.dry_run and not compose.is_info_command(script_args):
        jobs = compose.compose_dry(script_args, check_prepared)
        for run_dir, job in jobs:
            job_args = settled(job.launcher)
            sys.stdout.write(
                f"# a real run would create {run_dir}/ holding .hydra/{{config,hydra,overrides}}.yaml, "
                "config.yaml (below, what every rank reads) and numarun_plan.json\n"
            )
            sys.stdout.write("# config.yaml:\n" + "".join(f"#   {ln}\n" for ln in job.config_text.splitlines()))
            run(job_args, Target(target.kind, target.name, ()), dict(job.env))
        if any(a in compose.MULTIRUN_FLAGS for a in script_args):
            from ..sweep.launch import describe
            from ..topology.discover import load_topology

            sizes = [settled(j.launcher).nproc_per_node for _, j in jobs]
            ranks = max([n for n in sizes if isinstance(n, int)], default=1)
            labels = [f"#{i} {' '.join(j.overrides)}" for i, (_, j) in enumerate(jobs)]
            sys.stdout.write(describe(load_topology(args.topology), ranks, labels))
        return 0

    # the workers read the saved config: no arguments after the script
    job_target = Target(target.kind, target.name, ())
    prepared: dict[tuple[str, str], tuple[argparse.Namespace, _Prepared]] = {}

    def check(job: Any) -> None:
        """Before Hydra makes any run dir: the job's inputs, flags, plan and torchrun options are sound."""
        check_prepared(job)
        job_args = settled(job.launcher)
        prepared[(str(job.run_dir), job.config_text)] = (job_args, run.prepare(job_args, job_target))

    def on_job(job: Any) -> int:
        job_args, ready = prepared.pop((str(job.run_dir), job.config_text))  # every job run was checked first
        print(f"numarun: run dir {job.run_dir}", file=sys.stderr, flush=True)
        return run(job_args, job_target, dict(job.env), run_dir=job.run_dir, prepared=ready)

    if any(a in compose.MULTIRUN_FLAGS for a in script_args):  # each job through numarun's Hydra launcher
        from ..sweep.launch import forwarded

        os.environ[envvars.SWEEP_OPTIONS] = json.dumps(forwarded(args, target.name))
        script_args += [] if any(a.startswith("hydra/launcher=") for a in script_args) else ["hydra/launcher=numarun"]
    compose.run_hydra(script_args, on_job, check)
    return 0


def refuse_unbound(plan: LaunchPlan, strict: bool) -> None:
    """``--strict-binding`` where the kernel refuses the ranks' memory policy: one line before any rank starts."""
    if strict and plan.mem_unbound:
        from ..errors import BindingError

        raise BindingError(mem_refused_line(plan, strict=True))


def _watch_env(args: argparse.Namespace) -> dict[str, str]:
    if getattr(args, "no_watch", False):
        return {envvars.WATCH_INTERVAL: "0"}
    interval = getattr(args, "watch_interval", None)  # >= 0: its option type refuses the rest
    if interval is None:
        return {}
    return {envvars.WATCH_INTERVAL: f"{interval:g}"}


_Prepared = tuple[LaunchPlan, str, LaunchSpec]
"""(plan, plan file path or '', launch spec) of one job, built once."""


class _Runner:
    """Runs jobs of one numarun: each job planned and its launch spec built once, then run under the supervisor."""

    def __init__(self, supervisor: Supervisor, planner: _Planner) -> None:
        self.supervisor = supervisor
        self.planner = planner

    def prepare(self, args: argparse.Namespace, target: Target) -> _Prepared:
        plan, plan_path = self.planner.plan(args)
        refuse_unbound(plan, args.strict_binding)
        spec = launch_spec(vars(args), nproc_per_node=plan.nproc_per_node, target=target,
                           nics=[r.nic for r in plan.ranks if r.nic])
        return plan, plan_path, spec

    def __call__(self, args: argparse.Namespace, target: Target, job_env: dict[str, str],
                 run_dir: os.PathLike[str] | None = None, prepared: _Prepared | None = None) -> int:
        plan, plan_path, spec = prepared or self.prepare(args, target)
        for w in plan.warnings:
            log.warning("%s", w)
        # The binding line of each rank is logged at INFO on purpose: it is the run's record of
        # what each rank got, so it shows by default although numarun's own level is WARNING;
        # an explicit --log-level (or NUMARUN_LOG_LEVEL) sets the workers' level too.
        if getattr(args, "log_level", None) and envvars.LOG_LEVEL not in os.environ:
            job_env = {envvars.LOG_LEVEL: str(args.log_level).upper(), **job_env}
        if args.dry_run:
            from ..view.plan import render_plan

            env = {
                **dict(spec.env),
                **worker_env(plan, os.environ, plan_path=plan_path or "plan.json", strict=args.strict_binding),
                **job_env,
                **_watch_env(args),
            }
            sys.stdout.write(render_plan(plan, width=160))
            if not plan_path:
                sys.stdout.write("\n# plan.json: the output of 'numarun plan --json' with the same options\n")
            sys.stdout.write(command_line(env, spec.argv()) + "\n")
            return 0
        self.supervisor.start()
        if not plan_path:
            plan_path = str(self.supervisor.write_plan(plan.to_json(), run_dir, node=spec.node_label()))
        env = {**worker_env(plan, os.environ, plan_path=plan_path, strict=args.strict_binding), **job_env,
               **_watch_env(args)}
        log.info("running: %s", command_line(env, spec.argv()))
        self.supervisor.run(spec, env)
        return 0
