"""``numarun submit``: render an sbatch script that runs numarun once per node, and submit it.

A dry run is a value: the script is built in full first; ``--dry-run`` prints it and stops.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .. import argtypes
from ..errors import SlurmError, UsageError, expected
from ..options.launch import LaunchOptions, Source, Spelled, add_options, from_args, option
from ..slurm.options import SlurmOptions, check_env, check_output_dir, header_value
from ..slurm.script import SlurmJob, render_sbatch

if TYPE_CHECKING:
    from ..config.detect import AppKind

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "submit",
        help="submit the job to SLURM (one numarun per node; multirun sweeps become job arrays)",
        description="Render an sbatch script that starts numarun on every node (srun, one task per "
        "node owning its CPUs and GPUs; static rendezvous at the first node, ranks in Slurm's node order) "
        "and submit it with 'sbatch --parsable'. Prints the job id, the run dir and the log paths. The job requeues "
        "itself after the pre-timeout signal (the trainer checkpoints on it) and resumes from "
        "the run dir, which is keyed on the job id. '-m a=1,2' after SCRIPT makes a job array.",
    )
    g = p.add_argument_group("sbatch options")
    # the node count and ranks per node: launch options, also from the environment and the job config (1 node unless
    # told)
    add_options(p, ("nnodes", "nproc_per_node"), group=g)
    g.add_argument(
        "--nodes",
        dest="nnodes",
        type=argtypes.typed("--nodes", option("nnodes").read),
        default=argparse.SUPPRESS,
        action=Spelled,
        help=argparse.SUPPRESS,
    )  # sbatch's

    def header(flag: str, **more: Any) -> None:  # checked as read: refused before a trainer job's config is composed
        g.add_argument(flag, type=argtypes.typed(flag, header_value(flag[2:].replace("-", "_"))), **more)

    header("--gpus-per-node", metavar="[TYPE:]N", help="GPUs to request per node (default: every GPU of a whole node)")
    header("--partition")
    header("--time", metavar="LIMIT", help="time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED")
    for flag in ("--account", "--qos", "--constraint"):
        header(flag)
    g.add_argument(
        "--exclusive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whole nodes (the default unless --cpus-per-task or --gpus-per-node asks for part of one); "
        "--no-exclusive: share nodes, with Slurm's default CPUs",
    )
    g.add_argument(
        "--cpus-per-task",
        type=argtypes.int_in("--cpus-per-task", low=1, high=argtypes.MAX_LOCAL_RANKS),
        default=None,
        help="CPUs of the single task per node (default: every CPU of a whole node)",
    )
    header("--mem", help="memory per node, e.g. 64G")
    header("--job-name", default="numarun")
    g.add_argument(
        "--sbatch-option",
        dest="extra_sbatch",
        action="append",
        default=[],
        metavar="--FLAG=VALUE",
        help="any other sbatch option for the header (repeatable)",
    )
    r = p.add_argument_group("run")
    r.add_argument(
        "--output-dir",
        metavar="DIR",
        help="root of run dirs (DIR/<job id>) and Slurm logs (DIR/slurm-<job id>.out); "
        "on a filesystem the nodes share (default: ./outputs/slurm)",
    )
    r.add_argument(
        "--requeue-limit",
        type=argtypes.int_in("--requeue-limit", low=0, high=argtypes.MAX_COUNT),
        help="how often the job requeues itself near its time limit (default: slurm.requeue_limit, 3)",
    )
    r.add_argument(
        "--signal-before",
        type=argtypes.int_in("--signal-before", low=0, high=argtypes.MAX_SECONDS),
        metavar="SECONDS",
        help="seconds before the time limit at which the job checkpoints and requeues; the ranks get this minus "
        "a margin before they are killed (default: slurm.signal_before, 120, or a quarter of a shorter limit)",
    )
    r.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="environment variable for the job (repeatable)"
    )
    r.add_argument(
        "--numarun",
        metavar="COMMAND",
        help="how compute nodes start numarun (default: the numarun next to this Python, on a shared filesystem)",
    )
    r.add_argument(
        "--launch-opt",
        dest="launch_opts",
        action="append",
        default=[],
        metavar="OPT",
        help="an extra 'numarun run' option for every node, e.g. --launch-opt=--binding=node (repeatable)",
    )
    add_options(p, ("mesh",), group=r)  # every node's layout, checked here against --nnodes x --nproc-per-node
    r.add_argument(
        "--hydra-run-dir",
        choices=("auto", "yes", "no"),
        default="auto",
        help="append hydra.run.dir=<run dir> to the arguments (auto: for numarun's trainer and @hydra.main scripts)",
    )
    r.add_argument(
        "--preflight",
        action="store_true",
        help="every node runs 'numarun doctor' before the job and the job "
        "stops on errors, naming the nodes to --exclude",
    )
    p.add_argument("--dry-run", action="store_true", help="print the sbatch script and submit nothing")
    p.add_argument("--wait", action="store_true", help="follow the job to its end and exit with its exit code")
    p.add_argument("--poll-seconds", type=argtypes.seconds("--poll-seconds"), default=2.0, help=argparse.SUPPRESS)
    p.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="SCRIPT is a module run as 'python -m' (e.g. numarun.train), as 'numarun run -m' takes it",
    )
    p.add_argument("script", metavar="SCRIPT", help="the training script (Python file), or a module with -m")
    p.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        metavar="OVERRIDES",
        help="script arguments or Hydra overrides; -m/--multirun makes a sweep a job array",
    )
    p.set_defaults(func=main)
    return p


def _config_settings(
    script: str, user_args: list[str], *, is_module: bool = False
) -> tuple[AppKind, dict[str, Any], dict[str, Any]]:
    """(kind of script, sbatch settings from the job config's ``slurm`` group, its ``launcher`` group).

    Only numarun's trainer composes numarun's configs/: every job of a sweep is composed once
    and checked, as 'numarun run -m' does, so a wrong key fails before anything is submitted.
    """
    from ..config.compose import compose_dry
    from ..config.detect import AppKind, detect_app
    from ..train.preflight import check_prepared

    kind = detect_app(script, is_module=is_module)
    if kind is not AppKind.TRAINER:
        return kind, {}, {}  # a user's Hydra app composes itself on the nodes, as Hydra does
    (_, first), *_ = compose_dry(list(user_args), check_prepared)
    slurm = first.config.slurm
    keys = ("partition", "time", "account", "signal_before", "requeue_limit")
    settings: dict[str, Any] = {key: getattr(slurm, key) for key in keys}
    settings["gpus_per_node"] = None if slurm.gpus_per_node is None else str(slurm.gpus_per_node)
    return kind, settings, dict(first.launcher)


def check_mesh(launch: LaunchOptions, given: LaunchOptions, *, nodes: int, nproc: int | None) -> list[str]:
    """The layout every node takes (``--mesh``, a ``--launch-opt=--mesh``: ``given``, ``NUMARUN_MESH``,
    ``launcher.mesh``), checked against the job before anything is submitted (the nodes check it again); the launch
    option that hands ``--mesh`` on (the others reach the nodes by themselves)."""
    from ..layout import node_cut

    mine = launch.setting("mesh").source is Source.COMMAND_LINE
    mesh = launch.mesh if mine or given.mesh is None else replace(given.mesh, where="--launch-opt=--mesh")
    if mesh is not None and nproc is not None:
        node_cut(mesh.resolved(nodes * nproc, nodes=nodes), nproc)
    return [f"--mesh={mesh}"] if mine and mesh is not None else []


# the --launch-opt options refused, with what is expected instead
_NOT_LAUNCH_OPTS = {
    # 'numarun run' options the job sets on each node itself, from Slurm's allocation
    **dict.fromkeys(
        (
            "--nnodes",
            "--node-rank",
            "--node_rank",
            "--rdzv-backend",
            "--rdzv_backend",
            "--rdzv-endpoint",
            "--rdzv_endpoint",
            "--rdzv-id",
            "--rdzv_id",
            "--master-addr",
            "--master_addr",
            "--master-port",
            "--master_port",
            "--local-addr",
            "--local_addr",
            "--standalone",
        ),
        "an option the job does not set itself (node count and rank, rendezvous and addresses come from Slurm's "
        "allocation)",
    ),
    "--nproc-per-node": "--nproc-per-node as a 'numarun submit' option",
    "--nproc_per_node": "--nproc-per-node as a 'numarun submit' option",
}


class _LaunchOptParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SlurmError(f"bad --launch-opt: {message}; expected 'numarun run' options (see 'numarun run --help')")


def check_launch_opts(opts: list[str], script: str, *, is_module: bool = False) -> LaunchOptions:
    """The ``--launch-opt`` values read with ``numarun run``'s own parser and checks, as on a node."""
    for opt in opts:
        refused = _NOT_LAUNCH_OPTS.get(opt.split("=", 1)[0])
        if refused:
            raise SlurmError(expected(opt, refused, "--launch-opt"))
    if not opts:
        return LaunchOptions()
    from ..launch.torchrun import check_torchrun_options
    from . import run as run_command

    parser = run_command.add_parser(_LaunchOptParser(prog="numarun").add_subparsers(parser_class=_LaunchOptParser))
    ns = parser.parse_args([*opts, *(["--module"] if is_module else []), script])
    if ns.training_script != script or ns.training_script_args:
        raise SlurmError(expected(" ".join(opts), "options only (the script is SCRIPT)", "--launch-opt"))
    check_torchrun_options(vars(ns))
    return from_args(ns, {})


def build_job(args: argparse.Namespace) -> SlurmJob:
    """argparse namespace -> validated SlurmJob (raises NumarunError; touches nothing)."""
    module = bool(getattr(args, "module", False))
    script = Path(args.script)
    if module:
        import importlib.util

        try:
            found = importlib.util.find_spec(args.script) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise SlurmError(expected(args.script, "a module importable here, e.g. numarun.train", "-m MODULE"))
    elif not script.is_file():
        raise SlurmError(expected(args.script, "an existing script file", "SCRIPT"))
    user_args = list(args.args)
    kind, from_config, launcher = _config_settings(args.script if module else str(script), user_args, is_module=module)
    launch = (
        from_args(args, os.environ)
        .with_config(launcher)
        .with_defaults("numarun submit", nnodes=argtypes.ONE_NODE)
        .shown()
    )

    def pick(name: str, default: Any = None) -> Any:
        # a flag on the command line wins over the job config, which wins over the default
        return next((v for v in (getattr(args, name), from_config.get(name)) if v is not None), default)

    options = SlurmOptions(
        nodes=_count(launch, "nnodes", "a fixed node count") or 1,
        nproc_per_node=_count(launch, "nproc_per_node", "a number of ranks"),
        gpus_per_node=pick("gpus_per_node"),
        partition=pick("partition"),
        time=pick("time"),
        account=pick("account"),
        qos=args.qos,
        constraint=args.constraint,
        exclusive=args.exclusive,
        cpus_per_task=args.cpus_per_task,
        mem=args.mem,
        job_name=args.job_name,
        requeue_limit=pick("requeue_limit", 3),
        signal_before=pick("signal_before"),
        extra_sbatch=tuple(args.extra_sbatch),
    ).validate()
    if options.whole_nodes and options.gpus_per_node is None:  # a whole-node job asks for every GPU the nodes have
        from ..slurm.submit import partition_gpus

        options = replace(options, node_gpus=partition_gpus(options.partition))
    output_dir = check_output_dir(os.path.abspath(args.output_dir or os.path.join("outputs", "slurm")))
    from ..config.compose import sweep_arg_sets

    arg_sets = tuple(tuple(a) for a in sweep_arg_sets(user_args))  # one argument set per job of a -m sweep
    if kind.value == "trainer" and not any(a.split("=", 1)[0].lstrip("+") == "trainer.resume" for a in user_args):
        # a requeued job must continue from its checkpoint in the (job-id) run dir
        arg_sets = tuple(s + ("trainer.resume=true",) for s in arg_sets)
    hydra_run_dir = kind.value != "plain" if args.hydra_run_dir == "auto" else args.hydra_run_dir == "yes"
    if args.numarun is not None:
        try:
            numarun = tuple(shlex.split(args.numarun))
        except ValueError:
            numarun = ()
        if not numarun:
            raise SlurmError(expected(args.numarun, "a command such as '/opt/venv/bin/numarun'", "--numarun"))
    else:
        from ..launch.child import numarun_command

        numarun = tuple(numarun_command())
    launch_opts = [*args.launch_opts, *(["--preflight"] if args.preflight else [])]
    given = check_launch_opts(launch_opts, args.script if module else str(script), is_module=module)
    launch_opts += check_mesh(launch, given, nodes=options.nodes, nproc=options.nproc_per_node)
    return SlurmJob(
        script=args.script if module else str(script.resolve()),
        module=module,
        output_dir=output_dir,
        options=options,
        arg_sets=arg_sets,
        env=check_env(args.env),
        numarun=numarun,
        launch_opts=tuple(launch_opts),
        hydra_run_dir=hydra_run_dir,
    )


def _count(options: LaunchOptions, dest: str, what: str) -> int | None:
    """A launch option that sbatch takes as a whole number, its range checked where it was read (None: not given):
    a fixed ``--nnodes``, a number of ranks (not torchrun's words)."""
    s = options.setting(dest)
    value = s.value.min if isinstance(s.value, argtypes.NodeRange) and not s.value.elastic else s.value
    if value is None or isinstance(value, int):
        return value
    raise UsageError(f"bad {s.where} {str(s.value)!r}: expected {what} for sbatch, a whole number")


def main(args: argparse.Namespace) -> int:
    from ..slurm.submit import overall_return_code, sbatch, wait_for_job

    job = build_job(args)
    text = render_sbatch(job)
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    out = Path(job.output_dir)
    created = [p for p in (out, *out.parents) if not p.exists()]  # what mkdir(parents=True) creates, deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SlurmError(
            expected(job.output_dir, f"a directory you can create ({e.strerror})", "--output-dir")
        ) from None
    try:
        if not os.access(out, os.W_OK | os.X_OK):
            raise SlurmError(expected(job.output_dir, "a writable directory", "--output-dir"))
        job_id = sbatch(text)
    except BaseException:
        # a failed submit leaves nothing behind: remove the (empty) directories made for it
        with contextlib.suppress(OSError):
            for d in created:
                d.rmdir()
        raise
    # keep what was submitted next to its logs
    from ..fsutil import write_atomic

    write_atomic(out / f"sbatch-{job_id}.sh", text)
    keys = [f"{job_id}_{i}" for i in range(len(job.arg_sets))] if job.is_array else [job_id]
    print(f"job id:  {job_id}")
    for key in keys:
        print(f"run dir: {out}/{key}")
        print(f"log:     {out}/slurm-{key}.out")
    sys.stdout.flush()
    if not args.wait:
        return 0
    records = wait_for_job(
        job_id,
        poll_seconds=args.poll_seconds,
        on_state=lambda state: print(f"job {job_id}: {state}", file=sys.stderr, flush=True),
    )
    for r in records:
        print(f"job {r.job_id}: {r.state} exit code {r.exit_code}:{r.signal}", flush=True)
    return overall_return_code(records)
