"""``numarun [run] [torchrun options] SCRIPT|-m MODULE [args...]``: torchrun with each rank bound.

torchrun's options in its spellings, numarun's launch options, ``--dry-run`` and ``--plan-file``,
resolved once with their sources (:mod:`numarun.options.launch`). numarun's trainer
is composed by Hydra once per job, here (:func:`numarun.config.compose.run_hydra`), its ``launcher``
group one of those sources; a user's ``@hydra.main`` app or any other script runs as torchrun runs it
(a Hydra app's clock fixed once for every rank: :mod:`numarun.worker.hydra_pin`). Exit codes: README.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

from .. import argtypes, envvars
from ..errors import BindingError, TrainerLayoutError, UsageError
from ..jobenv import Mode
from ..jobenv.settle import JobConflict, check_rank, rank_env, rank_master
from ..launch.hangs import policy_from
from ..launch.net import addressing
from ..launch.planning import Planned, Planner, announce, detect_job, refuse, settle
from ..launch.spec import LaunchSpec, launch_spec, rendezvous_key
from ..launch.supervisor import Supervisor
from ..launch.torchrun import Target, add_run_options, command_line, target_from_args, worker_env
from ..layout import Layout
from ..options.launch import DECLARED, LaunchOptions, Setting, Source, add_options, from_args, launch_dests
from ..options.torchrun import torchrun_parser
from ..plan.model import LaunchPlan
from ..plan.scheduled import mem_refused_line

log = logging.getLogger(__name__)

REFUSED_OPTIONS = ("run_path", "virtual_local_rank")
"""torchrun options numarun refuses (:func:`numarun.launch.torchrun.target_from_args` says why)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    torchrun = torchrun_parser()
    parser = subparsers.add_parser(
        "run",
        parents=[torchrun],
        add_help=False,
        # numarun's --nproc-per-node and --binding take over torchrun's --nproc-per-node and --numa-binding
        conflict_handler="resolve",
        help="run a training script like torchrun, each local rank bound (default when the first argument is a script)",
        description="torchrun with each local rank bound to its GPU, CPU cores, memory and NIC.",
    )
    add_options(parser, (*launch_dests(), "detect", "plan_file", "watch_interval"))
    add_run_options(parser)
    from .doctor import add_doctor_options

    parser.add_argument(
        "--preflight", action="store_true", help="run 'numarun doctor' on every node first and stop on errors"
    )
    add_doctor_options(parser)
    parser.add_argument("--no-watch", action="store_true", help="do not watch the binding while the job runs")
    for action in parser._actions:  # torchrun options numarun refuses are not offered
        if action.dest in REFUSED_OPTIONS:
            action.help = argparse.SUPPRESS
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    options = from_args(args, os.environ)
    target: Target = target_from_args(args)
    supervisor = getattr(args, "supervisor", None)
    if supervisor is None:
        supervisor = Supervisor()
        supervisor.hold_signals()
    job, options = detect_job(options)
    run = _Runner(args, supervisor, Planner(job))
    try:
        if job is not None:
            announce(options, job.describe())
            if job.mode is Mode.PER_RANK:
                return _run_rank(run, options, target)
        if args.preflight and not args.dry_run:
            from ..doctor.preflight import preflight

            if preflight(settle(options, job)[0] if job is not None else options, args):
                return 1
        if target.kind != "exec":
            from ..config.detect import AppKind, detect_app

            kind = detect_app(target.name, is_module=target.kind == "module")
            if kind is AppKind.TRAINER:
                return _run_trainer(args, options, target, run)
            if kind is AppKind.HYDRA_MAIN and any(a in ("-m", "--multirun") for a in target.args):
                from ..sweep.launch import run_app

                supervisor.release()
                return run_app(args, target.kind, target.name, target.args)
            if kind is AppKind.HYDRA_MAIN:
                # Hydra's ${now:} fixed once here: every rank's Hydra picks the same run dir
                when = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
                return run(options, target, {envvars.HYDRA_NOW: when})
        return run(options, target, {})
    except JobConflict as e:
        if job is None:
            raise
        return refuse(job, e, options)


def _run_rank(run: _Runner, options: LaunchOptions, target: Target) -> int:
    """Per-rank mode: bind this process as its rank of the node's plan, then run the script here."""
    args, job = run.args, run.job
    assert job is not None
    stated = options.stated()
    per_rank = {o.dest for o in DECLARED if o.per_rank}
    check_rank(job, stated, per_rank=per_rank)
    if args.preflight:
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
                f"bad launch of numarun's trainer {target.name!r}: {job.describe()}; the trainer composes its config "
                "and "
                "run dir once per node: expected one task per node (srun --ntasks-per-node=1 numarun ...), which "
                "starts "
                "the node's ranks"
            )
    addr, port = rank_master(job, stated)
    if addr is None:
        from ..launch.slurmctld import head_addr

        addr = "127.0.0.1" if job.nnodes == 1 else head_addr(os.environ, job.nodes[0])
    clock = hydra_app and not os.environ.get(envvars.HYDRA_NOW)
    if not args.dry_run:  # the node and Hydra's clock, where no variable says: one for every rank
        from ..launch.rank import agree

        job, now = agree(job, addr, port, clock=clock)
        run.job = run.planner.job = job
        check_rank(job, stated, per_rank=per_rank)
    addr = argtypes.parse_endpoint(addr, "--master-addr (MASTER_ADDR)", port=False)[0]
    node = (
        {"nnodes": str(job.nnodes), "node_rank": job.node_index} if job.node_index >= 0 else {}
    )  # a dry run may not know
    options = options.with_job(
        {"nproc_per_node": job.local_world_size, **node, "master_addr": addr, "master_port": port},
        job.describe().split(":")[0],
    )
    planned = run.planner.plan(options)
    plan = planned.plan
    refuse_unbound(plan, options.strict_binding)
    for note in (*(plan.warnings if job.local_rank == 0 else ()), *planned.notes):  # the node's: said once
        log.warning("%s", note)
    env = {**rank_env(job, master_addr=addr, master_port=port, environ=os.environ), **run.env(options, plan, "")}
    env.update(
        addressing(
            multi_node=job.nnodes > 1,
            backend="static",
            endpoint=(addr, port),
            flag="--master-addr (MASTER_ADDR)",
            node_rank=job.node_index,
        ).env
    )
    env.pop(envvars.PLAN, None)
    env[envvars.PLAN_JSON] = plan.to_json()
    if clock and not args.dry_run:
        env[envvars.HYDRA_NOW] = now
    if args.dry_run:
        listed = [f"{k}={shlex.quote(v)}" for k, v in env.items() if k != envvars.PLAN_JSON]
        unknown = (
            ""
            if job.node_index >= 0
            else (
                "\n# GROUP_RANK and GROUP_WORLD_SIZE (this node's index and the node count): agreed by the ranks when "
                "they "
                "start, as the launcher does not say which node a rank is on"
            )
        )
        return dry_run(
            plan,
            options,
            f"# this task is local rank {job.local_rank}: it would bind itself as that row and run, with{unknown}",
            " ".join([*listed, shlex.join([target.name, *target.args])]),
        )
    from ..launch.rank import become_rank

    options.shown()
    run.supervisor.release()  # the rank handles its own signals, as under plain python
    become_rank(target, env)


def _run_trainer(args: argparse.Namespace, options: LaunchOptions, target: Target, run: _Runner) -> int:
    """numarun's trainer: Hydra composes each job once; each job is planned once and run."""
    from ..config import compose
    from ..train.preflight import check_launch_layout, check_prepared

    script_args = list(target.args)
    job_target = Target(target.kind, target.name, ())  # the workers read the saved config: no arguments after it

    def planned(job: Any) -> tuple[_Prepared, Layout | None]:
        """The job's launch, prepared with the trainer's layout as its mesh (the ranks are placed for it), the
        layout checked against the world it makes (before any rank starts)."""
        found: list[Layout | None] = [None]

        def mesh_of(opts: LaunchOptions, plan: Planned) -> Layout | None:
            found[0] = check_launch_layout(job.config, nnodes=opts.nnodes, nproc_per_node=plan.plan.nproc_per_node)
            return trainer_mesh(opts, found[0])

        return run.prepare(options.with_config(job.launcher), job_target, mesh_of=mesh_of), found[0]

    if args.dry_run and not compose.is_info_command(script_args):
        jobs = compose.compose_dry(script_args, check_prepared)
        for run_dir, job in jobs:
            ready, layout = planned(job)
            sys.stdout.write(
                f"# a real run would create {run_dir}/ holding .hydra/{{config,hydra,overrides}}.yaml, "
                "config.yaml (below, what every rank reads) and numarun_plan.json\n"
            )
            if layout:
                sys.stdout.write(f"# layout of the ranks (parallel.*): {layout}\n")
            sys.stdout.write("# config.yaml:\n" + "".join(f"#   {ln}\n" for ln in job.config_text.splitlines()))
            run(ready[0], job_target, dict(job.env), prepared=ready)
        if any(a in compose.MULTIRUN_FLAGS for a in script_args):
            from ..sweep.launch import describe
            from ..topology.discover import load_topology

            sizes = [options.with_config(j.launcher).nproc_per_node for _, j in jobs]
            ranks = max([n for n in sizes if isinstance(n, int)], default=1)
            labels = [f"#{i} {' '.join(j.overrides)}" for i, (_, j) in enumerate(jobs)]
            sys.stdout.write(describe(load_topology(options.topology), ranks, labels))
        return 0
    prepared: dict[tuple[str, str], _Prepared] = {}

    def check(job: Any) -> None:
        """Before Hydra makes any run dir: the job's inputs, options, plan and torchrun options are sound."""
        check_prepared(job)
        prepared[(str(job.run_dir), job.config_text)] = planned(job)[0]

    def on_job(job: Any) -> int:
        ready = prepared.pop((str(job.run_dir), job.config_text))  # every job run was checked first
        print(f"numarun: run dir {job.run_dir}", file=sys.stderr, flush=True)
        return run(ready[0], job_target, dict(job.env), run_dir=job.run_dir, prepared=ready)

    if any(a in compose.MULTIRUN_FLAGS for a in script_args):  # each job through numarun's Hydra launcher
        from ..sweep.launch import forwarded

        os.environ[envvars.SWEEP_OPTIONS] = json.dumps(forwarded(args, target.name))
        script_args += [] if any(a.startswith("hydra/launcher=") for a in script_args) else ["hydra/launcher=numarun"]
    compose.run_hydra(script_args, on_job, check)
    return 0


TRAINER_MESH = "parallel.* (the trainer's layout)"
"""Where the mesh of a trainer job comes from, as messages name it."""


def _with_mesh(options: LaunchOptions, mesh: Layout) -> LaunchOptions:
    """``options`` with the trainer's layout as the job config's mesh (below a stated one, which it equals)."""
    return options.with_setting("mesh", Setting(mesh, Source.CONFIG, TRAINER_MESH))


def trainer_mesh(options: LaunchOptions, layout: Layout | None) -> Layout | None:
    """The mesh to plan a trainer job with: its layout ``spec`` (every dimension, resolved), unless a mesh is
    stated already (``--mesh``, ``NUMARUN_MESH``, ``launcher.mesh``): then it must be the same layout (the same
    row-major mesh: the same sizes in the same order, dimensions of size 1 left out), and None is returned."""
    if layout is None:
        return None
    stated = options.setting("mesh")
    if options.mesh is None or not options.given("mesh"):
        return layout
    if options.mesh.resolved(layout.world_size).squeezed() != layout.squeezed():
        raise TrainerLayoutError(
            f"bad {stated.where} {options.mesh.text!r}: numarun's trainer lays its ranks out as {layout} "
            "(parallel.*); expected the same layout, or no mesh (the trainer hands its own)"
        )
    return None


def refuse_unbound(plan: LaunchPlan, strict: bool) -> None:
    """``--strict-binding`` where the kernel refuses the ranks' memory policy: one line before any rank starts."""
    if strict and plan.mem_unbound:
        raise BindingError(mem_refused_line(plan, strict=True))


def dry_run(plan: LaunchPlan, options: LaunchOptions, note: str, command: str) -> int:
    """The one dry-run output: the plan, each launch option with its source, what would run."""
    from ..view.plan import render_plan

    sys.stdout.write(render_plan(plan, width=160))
    sys.stdout.write(options.describe())
    sys.stdout.write(f"{note}\n{command}\n" if note else f"{command}\n")
    return 0


_Prepared = tuple[LaunchOptions, Planned, LaunchSpec]
"""(options settled against the job, plan, launch spec) of one job, built once."""


class _Runner:
    """Runs the jobs of one numarun: each job's options settled, planned and its launch spec built once,
    then run under the supervisor."""

    def __init__(self, args: argparse.Namespace, supervisor: Supervisor, planner: Planner) -> None:
        self.args = args
        self.supervisor = supervisor
        self.planner = planner
        self.job = planner.job

    def env(self, options: LaunchOptions, plan: LaunchPlan, plan_path: str) -> dict[str, str]:
        """What numarun adds to the workers' environment: the plan, the watcher, numarun's log level."""
        env = worker_env(plan, os.environ, plan_path=plan_path, strict=options.strict_binding)
        if self.args.no_watch:
            env[envvars.WATCH_INTERVAL] = "0"
        elif options.watch_interval is not None:  # >= 0: its option type refuses the rest
            env[envvars.WATCH_INTERVAL] = f"{options.watch_interval:g}"
        # The binding line of each rank is logged at INFO on purpose (see the README); an explicit
        # --log-level (or NUMARUN_LOG_LEVEL) sets the workers' level too.
        if options.log_level and envvars.LOG_LEVEL not in os.environ:
            env[envvars.LOG_LEVEL] = options.log_level
        return env

    def prepare(
        self,
        options: LaunchOptions,
        target: Target,
        mesh_of: Callable[[LaunchOptions, Planned], Layout | None] | None = None,
    ) -> _Prepared:
        """The job's options settled, its plan and launch spec. ``mesh_of`` (numarun's trainer) sees the first
        plan and may return a mesh to plan with instead (the trainer's layout)."""
        rendezvous = None
        given = options
        if self.job is not None:
            options, rendezvous = settle(options, self.job)
            if not rendezvous.own_rendezvous and self.job.nnodes > 1:
                order = f", node order {','.join(rendezvous.order)}" if rendezvous.order else ""
                announce(
                    options,
                    f"node rank {rendezvous.node_rank} of {self.job.nnodes}: rendezvous "
                    f"{options.master_addr}:{options.master_port} (static{order})",
                )
        planned = self.planner.plan(options)
        trainer = mesh_of(options, planned) if mesh_of is not None else None
        if trainer is not None:
            options = _with_mesh(options, trainer)
            if rendezvous is not None and rendezvous.own_rendezvous:
                # under the user's c10d a layout keys the nodes by Slurm's order: settle asks for it once it sees one
                options, rendezvous = settle(_with_mesh(given, trainer), self.job)  # type: ignore[arg-type]
            planned = self.planner.plan(options)
        refuse_unbound(planned.plan, options.strict_binding)
        if not self.args.dry_run:  # a dry run prints the same block on stdout
            options.shown()
        spec = launch_spec(
            options.values(),
            nproc_per_node=planned.plan.nproc_per_node,
            target=target,
            nics=[r.nic for r in planned.plan.ranks if r.nic],
        )
        mesh = planned.plan.mesh
        if mesh is not None and spec.multi_node and spec.backend != "static":
            nodes: tuple[str, ...] = rendezvous.order if rendezvous is not None else ()
            name = self.job.node_name if self.job is not None else ""
            key = rendezvous_key(
                nvlink_domain=mesh.nvlink_domain,
                position=nodes.index(name) if name in nodes else None,
                environ=os.environ,
            )
            spec = dataclasses.replace(spec, node_key=key)
            announce(
                options,
                f"node order key {'/'.join(key)}: the {spec.backend} rendezvous gives node ranks in the "
                "order of the nodes' keys",
            )
        return options, planned, spec

    def __call__(
        self,
        options: LaunchOptions,
        target: Target,
        job_env: dict[str, str],
        run_dir: os.PathLike[str] | None = None,
        prepared: _Prepared | None = None,
    ) -> int:
        options, planned, spec = prepared or self.prepare(options, target)
        plan, plan_path = planned.plan, planned.path
        for w in plan.warnings:
            log.warning("%s", w)
        if self.args.dry_run:
            env = {**dict(spec.env), **self.env(options, plan, plan_path or "plan.json"), **job_env}
            note = "" if plan_path else "\n# plan.json: the output of 'numarun plan --json' with the same options"
            return dry_run(plan, options, note, command_line(env, spec.argv()))
        self.supervisor.start()
        if not plan_path:
            plan_path = str(self.supervisor.write_plan(plan.to_json(), run_dir, node=spec.node_label()))
        env = {**self.env(options, plan, plan_path), **job_env}
        log.info("running: %s", command_line(env, spec.argv()))
        self.supervisor.run(spec, env, hang=policy_from(options), run_dir=run_dir)
        return 0
