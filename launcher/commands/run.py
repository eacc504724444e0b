"""``numarun [run] [torchrun options] SCRIPT|-m MODULE [args...]``: torchrun with each rank bound.

One road, in order (:func:`main`, :class:`Road`):

1. **options**: torchrun's, numarun's, ``--dry-run``... resolved once, typed, each with its source
   (:class:`numarun.options.launch.LaunchOptions`);
2. **job**: the job numarun runs in, if a scheduler started it (:func:`numarun.launch.planning.detect_job`);
3. **settle**: the options against that job, its rendezvous (:meth:`Road.settle`), once per launch; with
   ``--preflight``, the doctor on every node then, before the first launch (:meth:`Road.check_nodes`);
4. **plan**: each local rank's binding (:meth:`Road.plan`);
5. **spec**: torchrun's launch, every option checked (:meth:`Road.spec`);
6. **supervise**: the supervisor runs it, or the dry run prints it (:meth:`Road.supervise`). What every launch
   starts beside the workers (the hang watchdog, the step report, each with its option) is handed to the
   supervisor there.

Two variants take the same steps. Per-rank mode (:func:`run_rank`): the scheduler started this process as one
rank; steps 3 and 4 are the rank's, and the process becomes the rank instead of 5 and 6. numarun's trainer
(:class:`TrainerRun`): Hydra composes each job once (:func:`numarun.config.compose.run_hydra`), its ``launcher``
group a source of the options, its layout (``parallel.*``) the job's mesh between steps 4 and 5. A user's
``@hydra.main`` app or any other script runs as torchrun runs it (a Hydra app's clock fixed once for every rank:
:mod:`numarun.worker.hydra_pin`). Exit codes: docs/reference/exit-codes.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .. import envvars, torch_private
from ..config.detect import AppKind, detect_app
from ..errors import TRAINER_LAYOUT, BindingError, JobConflict, LayoutError, UsageError
from ..jobenv import JobShape, Mode
from ..jobenv.settle import NodeRendezvous, rank_env
from ..launch.agent import AgentPolicy
from ..launch.hangs import policy_from
from ..launch.net import addressing
from ..launch.planning import Planned, Planner, Settled, announce, detect_job, refuse, settle
from ..launch.spec import LaunchSpec, launch_spec, rendezvous_key
from ..launch.steps import steps_from
from ..launch.supervisor import Supervisor
from ..launch.torchrun import Target, command_line, worker_env
from ..layout import Layout
from ..options.launch import LaunchOptions, Setting, Source, add_options, from_args, launch_dests
from ..options.torchrun import torchrun_parser
from ..plan.model import LaunchPlan
from ..plan.scheduled import mem_refused_line
from ..train.preflight import check_launch_layout, check_prepared

if TYPE_CHECKING:
    from ..config.files import PreparedJob
    from ..doctor.diagnose import Settings as DoctorSettings

log = logging.getLogger(__name__)

REFUSED_OPTIONS = {
    "run_path": "numarun runs each worker in its own process to bind it",
    "virtual_local_rank": "every rank would read local rank 0's binding",
}
"""torchrun options numarun refuses (by dest), and why."""


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
    parser.add_argument_group("numarun").add_argument(
        "--dry-run", action="store_true", help="print the plan and the equivalent torchrun command; run nothing"
    )
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


def main(args: argparse.Namespace, supervisor: Supervisor) -> int:
    """The road. ``supervisor``: the one the CLI made before parsing, which holds the signals since."""
    options = from_args(args, os.environ)  # 1. options
    target = target_of(args)
    job, options = detect_job(options)  # 2. job
    if job is None or job.mode is not Mode.PER_RANK:  # a process that starts torchrun, not one that becomes a rank
        torch_private.quiet_cpp_logs()
    road = Road(supervisor, Planner(job), dry_run=args.dry_run, no_watch=args.no_watch, preflight=preflight_of(args))
    kind = detect_app(target.name, is_module=target.kind == "module") if target.kind != "exec" else AppKind.PLAIN
    try:
        if job is not None:
            announce(options, job.describe())
        if job is not None and job.mode is Mode.PER_RANK:  # the variant of a process that is one rank
            return run_rank(road, options, target, kind, preflight=args.preflight)
        if kind is AppKind.TRAINER:  # the variant whose jobs Hydra composes
            return TrainerRun(road, options, target).run(args.argv)
        if kind is AppKind.HYDRA_MAIN and any(a in ("-m", "--multirun") for a in target.args):
            from ..sweep.launch import forwarded, run_app

            if road.preflight is not None:  # the doctor before the app's sweep launches its jobs
                road.check_nodes(road.settle(options))
            supervisor.release()
            return run_app(target, forwarded(args.argv, target.name, options.log_level), dry_run=road.dry_run)
        # a Hydra app's ${now:} fixed once here: every rank's Hydra picks the same run dir
        when = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
        job_env = {envvars.HYDRA_NOW: when} if kind is AppKind.HYDRA_MAIN else {}
        return road.supervise(road.prepare(options, target), job_env)  # 3.-6.
    except JobConflict as e:
        if job is None:
            raise
        return refuse(job, e, options)


def preflight_of(args: argparse.Namespace) -> DoctorSettings | None:
    """``--preflight``: the doctor's settings, read once from the flags ``run`` shares with ``numarun doctor``; None
    without it, and in a dry run, which starts nothing."""
    if not args.preflight or args.dry_run:
        return None
    from .doctor import settings_of

    return settings_of(args)


def target_of(args: argparse.Namespace) -> Target:
    """The user's program from torchrun's positional and flag options; torchrun's options numarun refuses, refused."""
    for dest, why in REFUSED_OPTIONS.items():
        if getattr(args, dest, False):  # torchrun's parser of the installed torch may not have it
            raise UsageError(f"bad option '--{dest.replace('_', '-')}': {why}; expected it left out")
    return Target.of(
        args.training_script, tuple(args.training_script_args), module=args.module, no_python=args.no_python
    )


@dataclass(frozen=True)
class Prepared:
    """One job's launch, built once: its options settled against the job, its plan, torchrun's spec."""

    options: LaunchOptions
    planned: Planned
    spec: LaunchSpec
    layout: Layout | None = None
    """numarun's trainer: the job's layout, resolved (None: elastic, the ranks resolve it)."""


@dataclass
class Road:
    """The steps of one numarun's launches after the options and the job, in order: :meth:`settle` (and
    :meth:`check_nodes`), :meth:`plan`, :meth:`spec` (:meth:`prepare` takes them), :meth:`supervise`."""

    supervisor: Supervisor
    planner: Planner
    dry_run: bool = False
    no_watch: bool = False
    preflight: DoctorSettings | None = None
    """``--preflight``: the doctor's settings, until it has run before the first launch."""

    def prepare(self, options: LaunchOptions, target: Target, *, trainer: PreparedJob | None = None) -> Prepared:
        """Steps 3 to 5 for one job. ``trainer``: a job of numarun's trainer, whose layout becomes the job's mesh once
        the plan says how many ranks the job has (the ranks are placed for it, before any starts)."""
        settled = self.settle(options, layout=trainer is not None)
        self.check_nodes(settled)
        options = settled.options
        planned = self.plan(options)
        layout = None
        if trainer is not None:  # the trainer's layout, checked against the world the plan makes
            layout = check_launch_layout(
                trainer.config, nnodes=options.nnodes, nproc_per_node=planned.plan.nproc_per_node
            )
            mesh = trainer_mesh(options, layout)
            if mesh is not None:
                options = options.with_setting("mesh", Setting(mesh, Source.CONFIG, TRAINER_MESH))
                planned = self.plan(options)
        return Prepared(options, planned, self.spec(options, planned, target, settled.rendezvous), layout)

    def settle(self, options: LaunchOptions, *, layout: bool = False, clock: bool = False) -> Settled:
        """3. The options against the job a scheduler started, the one settling of a launch
        (:func:`numarun.launch.planning.settle`): per-node mode, the rendezvous the job implies; per-rank mode, the
        one the tasks share and, unless a dry run, the node and Hydra's clock (``clock``) the ranks agree on."""
        if self.planner.job is None:
            return Settled(options)
        settled = settle(options, self.planner.job, layout=layout, agree=not self.dry_run, clock=clock)
        self.planner.job = settled.job
        rendezvous = settled.rendezvous
        if rendezvous is not None and not rendezvous.own_rendezvous and rendezvous.nnodes > 1:
            order = f", node order {','.join(rendezvous.order)}" if rendezvous.order else ""
            announce(
                settled.options,
                f"node rank {rendezvous.node_rank} of {rendezvous.nnodes}: rendezvous "
                f"{settled.options.master_addr}:{settled.options.master_port} (static{order})",
            )
        return settled

    def check_nodes(self, settled: Settled) -> None:
        """``--preflight``: the doctor on every node with the options settled, before the first launch only;
        :class:`~numarun.errors.PreflightFailed` when a node has an error."""
        if self.preflight is None:
            return
        from ..doctor.preflight import preflight

        settings, self.preflight = self.preflight, None
        preflight(settled.options, settings)

    def plan(self, options: LaunchOptions) -> Planned:
        """4. Each local rank's binding (``--plan-file``'s, or this node's; this task's in per-rank mode)."""
        planned = self.planner.plan(options)
        refuse_unbound(planned.plan, options.strict_binding)
        return planned

    def spec(
        self, options: LaunchOptions, planned: Planned, target: Target, rendezvous: NodeRendezvous | None
    ) -> LaunchSpec:
        """5. torchrun's launch, every option checked; under a dynamic rendezvous with a layout, the key that
        orders the nodes."""
        if not self.dry_run:  # a dry run prints the same block on stdout
            options.shown()
        plan = planned.plan
        spec = launch_spec(
            options, nproc_per_node=plan.nproc_per_node, target=target, nics=[r.nic for r in plan.ranks if r.nic]
        )
        if plan.mesh is None or not spec.multi_node or spec.backend == "static":
            return spec
        nodes = rendezvous.order if rendezvous is not None else ()
        name = self.planner.job.node_name if self.planner.job is not None else ""
        key = rendezvous_key(
            nvlink_domain=plan.mesh.nvlink_domain,
            position=nodes.index(name) if name in nodes else None,
            environ=os.environ,
        )
        announce(
            options,
            f"node order key {'/'.join(key)}: the {spec.backend} rendezvous gives node ranks in the order of the "
            "nodes' keys",
        )
        return replace(spec, node_key=key)

    def supervise(self, ready: Prepared, job_env: Mapping[str, str], run_dir: os.PathLike[str] | None = None) -> int:
        """6. The supervisor runs the launch: the plan where the workers read it, their environment, and what
        watches the job beside them, each with its option (the hang watchdog: ``--hang-timeout``, ``--on-hang``).
        A dry run prints it all instead."""
        options, planned, spec = ready.options, ready.planned, ready.spec
        agent = AgentPolicy(policy_from(options), steps_from(options, os.environ))  # read before anything starts
        for w in planned.plan.warnings:
            log.warning("%s", w)
        plan_path = planned.path or (
            "plan.json"
            if self.dry_run
            else str(self.supervisor.write_plan(planned.plan.to_json(), run_dir, node=spec.node_label()))
        )
        env = {
            **(dict(spec.env) if self.dry_run else {}),  # the address rule's: a real run's supervisor adds them
            **worker_env(planned.plan, options, os.environ, plan_path=plan_path, no_watch=self.no_watch),
            **job_env,
        }
        if self.dry_run:
            note = "" if planned.path else "\n# plan.json: the output of 'numarun plan --json' with the same options"
            return dry_run(planned.plan, options, note, command_line(env, spec.argv()))
        log.info("running: %s", command_line(env, spec.argv()))
        self.supervisor.run(
            spec,
            env,
            agent=agent,
            run_dir=run_dir,
        )
        return 0


def run_rank(road: Road, options: LaunchOptions, target: Target, kind: AppKind, *, preflight: bool) -> int:
    """Per-rank mode: the scheduler started this process as one rank. 3: the options against the job and the
    rendezvous the ranks agree on; 4: the node's plan as every task makes it, this rank's row; then the process
    binds itself as that row and runs the script (no torchrun agent, nothing to supervise)."""
    job = road.planner.job
    assert job is not None
    if preflight:
        raise JobConflict(
            f"bad option '--preflight': {job.describe()}; the pre-flight runs once per node: expected it left out, or "
            "one task per node (srun --ntasks-per-node=1)"
        )
    if kind is AppKind.TRAINER:
        raise UsageError(
            f"bad launch of numarun's trainer {target.name!r}: {job.describe()}; the trainer composes its config and "
            "run dir once per node: expected one task per node (srun --ntasks-per-node=1 numarun ...), which starts "
            "the node's ranks"
        )
    settled = road.settle(options, clock=kind is AppKind.HYDRA_MAIN and not os.environ.get(envvars.HYDRA_NOW))
    options, job = settled.options, settled.job
    assert job is not None and options.master_addr is not None and options.master_port is not None
    addr, port = options.master_addr, options.master_port
    planned = road.plan(options)
    plan = planned.plan
    for note in (*(plan.warnings if job.local_rank == 0 else ()), *planned.notes):  # the node's: said once
        log.warning("%s", note)
    env = {
        **rank_env(job, master_addr=addr, master_port=port, environ=os.environ),
        **worker_env(plan, options, os.environ, plan_path=None, no_watch=road.no_watch),
        **dict(
            addressing(
                multi_node=job.nnodes > 1,
                backend="static",
                endpoint=(addr, port),
                flag="--master-addr (MASTER_ADDR)",
                node_rank=job.node_index,
            ).env
        ),
        **({envvars.HYDRA_NOW: settled.now} if settled.now else {}),
    }
    if road.dry_run:
        listed = [f"{k}={shlex.quote(v)}" for k, v in env.items() if k != envvars.PLAN_JSON]
        unknown = (
            ""
            if job.node_index >= 0
            else "\n# GROUP_RANK and GROUP_WORLD_SIZE (this node's index and the node count): agreed by the ranks when "
            "they start, as the launcher does not say which node a rank is on"
        )
        return dry_run(
            plan,
            options,
            f"# this task is local rank {job.local_rank}: it would bind itself as that row and run, with{unknown}",
            " ".join([*listed, shlex.join([target.name, *target.args])]),
        )
    from ..launch.rank import become_rank

    options.shown()
    env.update(node_agent(job, options, plan, addr, port))
    road.supervisor.release()  # the rank handles its own signals, as under plain python
    become_rank(target, env)


def node_agent(job: JobShape, options: LaunchOptions, plan: LaunchPlan, addr: str, port: int) -> dict[str, str]:
    """Per-rank mode's node agent: the node's private directory, which every task computes alike and the ranks write
    to; the node's first task starts the sidecar there (:mod:`numarun.launch.sidecar`). What the rank's environment
    gains."""
    from ..launch import sidecar

    policy = AgentPolicy(policy_from(options), steps_from(options, os.environ))
    store_port = sidecar.agent_port(os.environ, port)  # a bad NUMARUN_AGENT_PORT is one line on one node too
    state = sidecar.state_dir(job.job, port, job.node_index)
    try:
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        log.warning("no node agent for this job (no hang watchdog, no step report): %s", e)
        return {}
    env = {**policy.worker_env(), envvars.STATE_DIR: str(state)}
    if job.local_rank != 0:
        return env
    (state / "plan.json").write_text(plan.to_json())
    args = sidecar.SidecarArgs(
        state=str(state),
        first_task=os.getpid(),
        job_argv=tuple(sys.argv),
        local_world=job.local_world_size,
        node=max(0, job.node_index),
        nodes=max(1, job.nnodes),
        store_host=addr,
        store_port=store_port,
        policy=policy,
    )
    pid = sidecar.spawn(args)
    return {**env, envvars.SIDECAR: str(pid)} if pid else env


class TrainerRun:
    """numarun's trainer: Hydra composes each job once (``-m``: a sweep, each job through numarun's Hydra
    launcher); each job is prepared before Hydra makes any run dir (:meth:`check`), then run (:meth:`on_job`)."""

    def __init__(self, road: Road, options: LaunchOptions, target: Target) -> None:
        self.road = road
        self.options = options
        self.target = Target(target.kind, target.name, ())  # the workers read the saved config: no arguments
        self.script_args = list(target.args)
        self.prepared: dict[tuple[str, str], Prepared] = {}

    def prepare(self, job: PreparedJob) -> Prepared:
        """The job's launch: its ``launcher`` group a source of its options, its layout its mesh."""
        return self.road.prepare(self.options.with_config(job.launcher), self.target, trainer=job)

    def check(self, job: PreparedJob) -> None:
        """Before Hydra makes any run dir: the job's inputs, options, plan and torchrun options are sound."""
        check_prepared(job)
        self.prepared[(str(job.run_dir), job.config_text)] = self.prepare(job)

    def on_job(self, job: PreparedJob) -> int:
        ready = self.prepared.pop((str(job.run_dir), job.config_text))  # every job run was checked first
        print(f"numarun: run dir {job.run_dir}", file=sys.stderr, flush=True)
        return self.road.supervise(ready, dict(job.env), run_dir=job.run_dir)

    def run(self, argv: Sequence[str]) -> int:
        """Hydra's command for the trainer's arguments; ``argv``: ``run``'s, as typed (a sweep's jobs take the options
        before the script)."""
        from ..config import compose

        multirun = any(a in compose.MULTIRUN_FLAGS for a in self.script_args)
        if self.road.dry_run and not compose.is_info_command(self.script_args):
            return self.dry_run(multirun)
        if multirun:  # each job through numarun's Hydra launcher
            from ..sweep.launch import forwarded

            os.environ[envvars.SWEEP_OPTIONS] = json.dumps(forwarded(argv, self.target.name, self.options.log_level))
            if not any(a.startswith("hydra/launcher=") for a in self.script_args):
                self.script_args.append("hydra/launcher=numarun")
        compose.run_hydra(self.script_args, self.on_job, self.check)
        return 0

    def dry_run(self, multirun: bool) -> int:
        """Each job composed, prepared and printed; a sweep's slots on the node after them."""
        from ..config import compose

        jobs = compose.compose_dry(self.script_args, check_prepared)
        for run_dir, job in jobs:
            ready = self.prepare(job)
            sys.stdout.write(
                f"# a real run would create {run_dir}/ holding .hydra/{{config,hydra,overrides}}.yaml, "
                "config.yaml (below, what every rank reads) and numarun_plan.json\n"
            )
            if ready.layout:
                sys.stdout.write(f"# layout of the ranks (parallel.*): {ready.layout}\n")
            sys.stdout.write("# config.yaml:\n" + "".join(f"#   {ln}\n" for ln in job.config_text.splitlines()))
            self.road.supervise(ready, dict(job.env))
        if multirun:
            from ..sweep.launch import describe
            from ..topology.discover import load_topology

            sizes = [self.options.with_config(j.launcher).nproc_per_node for _, j in jobs]
            ranks = max([n for n in sizes if isinstance(n, int)], default=1)
            labels = [f"#{i} {' '.join(j.overrides)}" for i, (_, j) in enumerate(jobs)]
            sys.stdout.write(describe(load_topology(self.options.topology), ranks, labels))
        return 0


TRAINER_MESH = "parallel.* (the trainer's layout)"
"""Where the mesh of a trainer job comes from, as messages name it."""


def trainer_mesh(options: LaunchOptions, layout: Layout | None) -> Layout | None:
    """The mesh to plan a trainer job with: its ``layout`` (every dimension, resolved), unless a mesh is stated
    already (``--mesh``, ``NUMARUN_MESH``, ``launcher.mesh``): then it must be the same layout (the same row-major
    mesh: the same sizes in the same order, dimensions of size 1 left out), and None is returned."""
    if layout is None or options.mesh is None or options.setting("mesh").source is Source.DEFAULT:
        return layout
    if options.mesh.resolved(layout.world_size).squeezed() != layout.squeezed():
        raise LayoutError(
            f"bad {options.setting('mesh').where} {options.mesh.text!r}: numarun's trainer lays its ranks out as "
            f"{layout} (parallel.*); expected the same layout, or no mesh (the trainer hands its own)",
            where=TRAINER_LAYOUT,
        )
    return None


def refuse_unbound(plan: LaunchPlan, strict: bool) -> None:
    """``--strict-binding`` where the kernel refuses the ranks' memory policy: one line before any rank starts."""
    if strict and plan.mem_unbound:
        raise BindingError(mem_refused_line(plan, strict=True))


def dry_run(plan: LaunchPlan, options: LaunchOptions, note: str, command: str) -> int:
    """The one dry-run output: the plan, each launch option with its source, what would run."""
    from ..view.plan import render_plan

    sys.stdout.write(render_plan(plan, width=160) + options.describe() + (f"{note}\n" if note else "") + f"{command}\n")
    return 0
