"""The sweep's side of numarun's Hydra launcher: jobs composed and written, run as a queue on the node's
slots (or as a Slurm job array), their ``JobReturn`` read back.

A job's launch options are a run's (:mod:`numarun.options.launch`), in the same precedence: the command line
(the launcher's ``options``, then those given to ``numarun SCRIPT -m``, ``NUMARUN_SWEEP_OPTIONS``), the
environment, the job config (the trainer's ``launcher`` group, then the launcher's ``nproc_per_node``), the
defaults. While jobs run, the process's signal loop has the queue stop them or pass signals on.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import envvars, tables
from ..argtypes import ONE_NODE
from ..cpuset import format_list
from ..errors import NumarunError, RunFailed, UsageError
from ..launch.child import numarun_command
from ..options.launch import PLANNING, LaunchOptions, Source, config_keys, from_argv
from ..plan.pack import Slot, confined_cpus, pack, slot_topology

if TYPE_CHECKING:
    from ..launch.torchrun import Target

log = logging.getLogger(__name__)

JOB_MODULE = "numarun.sweep.job"
GRACE_S = 30.0  # between SIGTERM and SIGKILL when the sweep is stopped


@dataclass(frozen=True)
class SweepJob:
    idx: int
    overrides: tuple[str, ...]
    ranks: int
    options: tuple[str, ...]
    """The ``numarun run`` options every job is given, as typed (later ones win)."""
    config: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    """(where, ((key, value), ...)) of each job-config source, the later winning: the trainer's ``launcher`` group,
    the launcher's own ``nproc_per_node``."""

    def launch_options(self, environ: Mapping[str, str]) -> tuple[LaunchOptions, list[str]]:
        """(the job's launch options, the ``numarun run`` options that are not launch options, as given)."""
        options, rest = from_argv(self.options, environ)
        for where, values in self.config:
            options = options.with_config(dict(values), prefix=where)
        return options, rest


SET_BY_SLURM = frozenset(
    {
        "nproc_per_node",
        "nnodes",
        "node_rank",
        "master_addr",
        "master_port",
        "rdzv_backend",
        "rdzv_endpoint",
        "rdzv_id",
        "standalone",
    }
)
"""Launch options a Slurm array task does not take as ``--launch-opt``: submit's and the allocation's."""
SET_BY_SWEEP = SET_BY_SLURM | set(PLANNING)
"""Launch options a job on one node does not pass on: its plan holds the planning ones, the sweep sets the rest."""


def _common(settings: dict[str, Any]) -> list[str]:
    """The options of every job: the launcher's, then those given to ``numarun SCRIPT -m``."""
    return [*(settings.get("options") or ()), *json.loads(os.environ.get(envvars.SWEEP_OPTIONS) or "[]")]


def forwarded(argv: Sequence[str], script: str, log_level: str | None) -> list[str]:
    """The options given to ``numarun [OPTIONS] SCRIPT -m ...`` (``argv``: as typed after ``run``) that each job of
    the sweep takes, and numarun's ``log_level`` (it may come before ``run``)."""
    given = list(argv[: list(argv).index(script)]) if script in argv else []
    level = ["--log-level", log_level] if log_level else []
    return level + [a for a in given if a not in ("-m", "--module", "--dry-run")]


def _job(cfg: Any, settings: dict[str, Any], topology: Any, *, trainer: bool) -> SweepJob:
    from omegaconf import OmegaConf

    from ..config.files import plain
    from ..topology.visible import visible_gpus

    own = OmegaConf.select(cfg, "launcher") if trainer else None  # numarun's trainer: its launcher group
    config: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
        (("launcher", tuple((k, plain(own[k])) for k, _ in config_keys())),) if own is not None else ()
    )
    if settings.get("nproc_per_node") is not None:
        config += (("hydra.launcher", (("nproc_per_node", settings["nproc_per_node"]),)),)
    job = SweepJob(
        int(cfg.hydra.job.num), tuple(str(o) for o in cfg.hydra.overrides.task), 1, tuple(_common(settings)), config
    )
    options = job.launch_options(os.environ)[0]
    nnodes = options.setting("nnodes")
    if nnodes.value != ONE_NODE:
        raise UsageError(
            f"bad {nnodes.where} {str(nnodes.value)!r} in a sweep on one node: expected 1 "
            "(hydra/launcher=numarun_slurm runs jobs of several nodes)"
        )
    ranks = options.nproc_per_node
    if topology is not None and not isinstance(ranks, int):  # torchrun's words; the trainer's None: one per GPU
        gpus, cpus = (
            len(visible_gpus(topology, os.environ.get("CUDA_VISIBLE_DEVICES"), "PCI_BUS_ID")),
            len(topology.usable_cpus),
        )
        ranks = {"gpu": gpus, "auto": gpus or cpus, "cpu": cpus}.get(ranks or "", gpus if trainer else 1)
    return replace(job, ranks=int(ranks or 1))


def _task_ref(task: Any) -> tuple[str, str, str, int, bool]:
    """(``file``|``module``, where, qualname, unwrap depth, stands for ``__main__``): how each rank finds the task."""
    if getattr(task, "numarun_task", None):
        module_name, qualname = task.numarun_task.split(":")
        return "module", module_name, qualname, 0, False
    module = sys.modules.get(task.__module__)
    found: Any = module
    for part in task.__qualname__.split("."):
        found = getattr(found, part, None)
    depth = 0
    while found is not None and found is not task:
        found, depth = getattr(found, "__wrapped__", None), depth + 1
    if found is None:
        raise UsageError(
            f"bad task function {task.__qualname__!r}: each job runs in processes of its own, which find it "
            "by name; expected a function at the top of its module (other decorators with functools.wraps)"
        )
    main, spec = task.__module__ == "__main__", getattr(module, "__spec__", None)
    if main and spec is None:
        return "file", os.path.abspath(str(getattr(module, "__file__", ""))), task.__qualname__, depth, True
    return "module", spec.name if main and spec is not None else task.__module__, task.__qualname__, depth, main


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    """Hydra's ``Launcher.launch``: each job composed as the basic launcher composes it, then run, one
    JobReturn each; a mistake is one line and exit 2 before any job starts."""
    from hydra import version
    from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
    from omegaconf import open_dict, read_write

    setup_globals()
    sys.modules.setdefault(
        "__mp_main__", sys.modules["__main__"]
    )  # as multiprocessing: the jobs' classes of the script
    composed = getattr(launcher, "composed", {})  # numarun's trainer composed each job once already
    cfgs = [
        composed.pop(tuple(o), None) or launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(o))
        for o in job_overrides
    ]
    for i, cfg in enumerate(cfgs):
        with read_write(cfg.hydra), open_dict(cfg):
            cfg.hydra.job.id = cfg.hydra.job.num = initial_job_idx + i
    config, settings, slurm = launcher.config, dict(launcher.settings), getattr(launcher, "slurm", False)
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    folder = None
    try:
        from ..topology.discover import load_topology

        given = SweepJob(0, (), 1, tuple(_common(settings))).launch_options(os.environ)[0]
        topology = None if slurm else load_topology(given.topology)
        jobs = [_job(cfg, settings, topology, trainer=hasattr(launcher.task_function, "numarun_task")) for cfg in cfgs]
        if given.show_sources:
            for job in jobs:
                sys.stderr.write(
                    f"# job #{job.idx} ({' '.join(job.overrides)})\n" + job.launch_options(os.environ)[0].describe()
                )
        base = version.getbase()  # the app's version_base: run_job's defaults (chdir) in each rank
        head = {"task": _task_ref(launcher.task_function), "version_base": None if base is None else str(base)}
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        folder = sweep_dir / ".numarun" if slurm else Path(tempfile.mkdtemp(prefix="numarun-sweep-"))
        folder.mkdir(exist_ok=True)
        log.info("Launching %d jobs with numarun", len(jobs))
        for job, cfg in zip(jobs, cfgs):
            log.info("\t#%d : %s", job.idx, " ".join(filter_overrides(job.overrides)))
            # the head, then the config: each rank finds the task before it reads the config
            (folder / f"{job.idx}.job").write_bytes(pickle.dumps({**head, "job": job}) + pickle.dumps(cfg))
        codes = (
            _submit(settings, jobs, folder)
            if slurm
            else run_local(jobs, topology, folder, limit=settings.get("max_jobs"))
        )
        if codes is None:  # a dry run
            return [JobReturn(overrides=list(j.overrides), status=JobStatus.COMPLETED) for j in jobs]
        return [_result(folder, job, codes[job.idx]) for job in jobs]
    except NumarunError as e:
        print(f"numarun: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(e.exit_code) from None
    finally:
        if folder is not None and not slurm:
            shutil.rmtree(folder, ignore_errors=True)


def _result(folder: Path, job: SweepJob, code: int) -> Any:
    """The JobReturn rank 0 wrote, or a FAILED one saying why there is none."""
    from hydra.core.utils import JobReturn, JobStatus

    why = f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
    try:
        ret = pickle.loads((folder / f"{job.idx}.ret").read_bytes())
        if code == 0 or ret.status is JobStatus.FAILED:
            return ret
    except FileNotFoundError:
        pass
    except Exception as e:  # a class the sweep cannot import
        why = f"its result cannot be read here ({type(e).__name__}: {e})"
    ret = JobReturn(overrides=list(job.overrides), status=JobStatus.FAILED)
    ret.return_value = RuntimeError(f"job #{job.idx} ({' '.join(job.overrides)}) failed: {why}")
    return ret


def _plan(job: SweepJob, options: LaunchOptions, slot: Slot, topology: Any) -> Any:
    from ..plan.binding import make_plan
    from ..plan.request import request_from_options

    request = request_from_options(options, {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, slot.gpus))})
    return make_plan(
        slot_topology(topology, slot, request.binding),
        replace(request, nproc_per_node=job.ranks, cuda_device_order="PCI_BUS_ID"),
    )


def _start(job: SweepJob, slot: Slot, port: int, topology: Any, folder: Path, now: str) -> subprocess.Popen[bytes]:
    """The job's process, confined to ``slot`` (affinity set before exec, ``CUDA_VISIBLE_DEVICES``; its CPUs left
    alone under binding none)."""
    from ..launch.torchrun import ENTRY_FILE, worker_env

    options, rest = job.launch_options(os.environ)
    plan = _plan(job, options, slot, topology)
    env = {
        **{k: v for k, v in os.environ.items() if k not in (envvars.PLAN, envvars.PLAN_JSON, envvars.SWEEP_OPTIONS)},
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, slot.gpus)),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        envvars.DETECT: "0",
        envvars.HYDRA_NOW: now,
        envvars.LAUNCHER_PID: str(os.getpid()),
        **({envvars.LOG_LEVEL: options.log_level} if options.log_level else {}),
    }
    args = [str(folder), f"index={job.idx}"]
    # what the job's numarun run takes (--max-restarts, --hang-timeout...), typed or from the job config; the
    # environment's reach it as they are, below them as in the sweep
    typed = options.flags(Source.COMMAND_LINE, Source.CONFIG, leave_out=SET_BY_SWEEP | {"strict_binding"})
    if job.ranks == 1 and not rest and not typed:  # nothing for torchrun's agent to do: the process is the rank
        env.update(
            {
                **worker_env(plan, options, os.environ, plan_path=None),
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": "0",
                "GROUP_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "TORCHELASTIC_RUN_ID": f"sweep-{os.getpid()}-{job.idx}",
            }
        )
        cmd = [sys.executable, "-u", ENTRY_FILE, "--module", JOB_MODULE, *args]
    else:
        (folder / f"{job.idx}.plan.json").write_text(plan.to_json())
        strict = options.setting("strict_binding")
        cmd = [
            *numarun_command(),
            "run",
            "--no-detect",
            "--plan-file",
            str(folder / f"{job.idx}.plan.json"),
            "--nproc-per-node",
            str(job.ranks),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            *(["--strict-binding"] if strict.value and strict.source is not Source.ENVIRONMENT else []),
            *typed,
            *rest,
            "--module",
            JOB_MODULE,
            *args,
        ]
    # the affinity is set in the child before exec: every process of the job inherits it
    cpus = confined_cpus(slot, plan.binding)
    shown = "not bound" if cpus is None else format_list(cpus)
    log.info("job #%d in slot %d: cpus %s gpus %s", job.idx, slot.index, shown, format_list(slot.gpus) or "-")
    confine = None if cpus is None else lambda: os.sched_setaffinity(0, cpus)
    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=confine)


class _Queue:
    """The jobs of one batch, each in a slot as soon as one is free; the target of the process's signal loop while
    they run (:class:`numarun.launch.signals.SignalTarget`): a death signal ends every running job (SIGTERM,
    SIGKILL after :data:`GRACE_S` or at a second one), SIGUSR1/SIGUSR2 go on to every running job."""

    def __init__(self, jobs: Sequence[SweepJob], slots: list[Slot]) -> None:
        self.waiting, self.slots = list(jobs), slots
        self.running: dict[int, tuple[subprocess.Popen[bytes], Slot]] = {}
        self.codes: dict[int, int] = {}
        self.stopped_by, self.kill_at, self.ended = 0, 0.0, 0
        self.lock = threading.Lock()  # the main thread's and the loop's
        self.changed = threading.Event()

    def forward(self, signum: int) -> None:  # to every running job's process group
        with self.lock:
            procs = [p for p, _ in self.running.values()]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signum)

    def stop(self, signum: int, *, again: bool) -> None:
        with self.lock:
            if not self.stopped_by:
                self.stopped_by, self.kill_at, self.ended = signum, time.monotonic() + GRACE_S, len(self.running)
            else:  # a second one: no more grace
                self.kill_at = time.monotonic()
        if not again:
            self.forward(signal.SIGTERM)
        self.changed.set()

    def end(self, signum: int) -> BaseException:
        print(
            f"numarun: error: stopped by {signal.Signals(signum).name} between the jobs of the sweep",
            file=sys.stderr,
            flush=True,
        )
        return SystemExit(128 + signum)

    def tick(self, now: float) -> None:
        """The loop's periodic check: after the grace, SIGKILL to what still runs."""
        if self.stopped_by and now >= self.kill_at:
            self.forward(signal.SIGKILL)

    def run(self, start: Any) -> None:
        """Start jobs in free slots (``start(job, slot)``) and collect their ends, until none is left to run."""
        while True:
            with self.lock:
                while self.waiting and self.slots and not self.stopped_by:
                    job, slot = self.waiting.pop(0), self.slots.pop(0)
                    self.running[job.idx] = (start(job, slot), slot)
                if not self.running and (self.stopped_by or not self.waiting):
                    return
                for idx, (proc, slot) in list(self.running.items()):
                    if proc.poll() is not None:
                        self.codes[idx] = proc.returncode
                        del self.running[idx]
                        self.slots = sorted([*self.slots, slot], key=lambda s: s.index)
            self.changed.wait(0.2)
            self.changed.clear()


def run_local(jobs: Sequence[SweepJob], topology: Any, folder: Path, *, limit: int | None = None) -> dict[int, int]:
    """Each job in a slot as soon as one is free; returns each job's exit code. Every job's plan is made before
    the first starts. While they run, the process's signal loop has the queue act (:class:`_Queue`); stopped by a
    signal, it raises once every job has ended (exit 128+N)."""
    from ..launch import signals

    slots = list(
        pack(
            topology,
            max(j.ranks for j in jobs),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            limit=limit,
        )
    )
    for job in jobs:
        _plan(job, job.launch_options(os.environ)[0], slots[0], topology)
    now = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
    ports = {s.index: _free_port() for s in slots}
    queue = _Queue(jobs, slots)
    loop = signals.loop()
    loop.handle((*signals.DEATH, *signals.FORWARDED))
    with loop.lock:
        for signum in loop.take_held():
            log.warning("%s came while no job of the sweep ran: no job takes it", signal.Signals(signum).name)
    cancel = loop.every(0.25, queue.tick)
    try:
        with loop.serving(queue, signals.Phase.JOBS):
            queue.run(lambda job, slot: _start(job, slot, ports[slot.index], topology, folder, now))
    finally:
        cancel()
    if queue.stopped_by:
        raise RunFailed(
            f"stopped by {signal.Signals(queue.stopped_by).name}: {queue.ended} running jobs ended, "
            f"{len(queue.waiting)} not started",
            128 + queue.stopped_by,
        )
    return queue.codes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _submit(settings: dict[str, Any], jobs: Sequence[SweepJob], folder: Path) -> dict[int, int] | None:
    """The jobs as a job array of ``numarun submit`` (``pack``: that many jobs per array task, packed on its
    node); waits for it. None for a dry run (the script is printed)."""
    sizes = {j.ranks for j in jobs}
    if len(sizes) > 1:
        raise UsageError(f"bad nproc_per_node {sorted(sizes)}: the jobs of one Slurm array take one value")
    now = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
    cmd = [
        *numarun_command(),
        "submit",
        *settings.get("submit_options", ()),
        "--nnodes",
        str(settings["nnodes"]),
        "--output-dir",
        str(folder / "slurm"),
        "--env",
        f"{envvars.HYDRA_NOW}={now}",
        "--dry-run" if settings.get("dry_run") else "--wait",
    ]
    n = settings.get("pack")
    if n:
        groups = [jobs[i : i + n] for i in range(0, len(jobs), n)]
        for g, members in enumerate(groups):
            (folder / f"group{g}.json").write_text(json.dumps([j.idx for j in members]))
        cmd += [
            "--nproc-per-node",
            "1",
            "--launch-opt=--binding=none",
            "--launch-opt=--no-watch",
            "--module",
            JOB_MODULE,
            str(folder),
            "-m",
            f"group=range(0,{len(groups)})",
        ]
    else:
        options, rest = jobs[0].launch_options(os.environ)
        given = options.flags(Source.COMMAND_LINE, Source.ENVIRONMENT, Source.CONFIG, leave_out=SET_BY_SLURM)
        cmd += [
            "--nproc-per-node",
            str(sizes.pop()),
            *(f"--launch-opt={o}" for o in [*given, *rest]),
            "--module",
            JOB_MODULE,
            str(folder),
            "-m",
            f"index=range({jobs[0].idx},{jobs[-1].idx + 1})",
        ]
    code = subprocess.run(cmd, check=False).returncode
    if settings.get("dry_run"):
        if code:
            raise SystemExit(code)
        return None
    return {j.idx: 0 if (folder / f"{j.idx}.ret").exists() else code or 1 for j in jobs}


def describe(topology: Any, ranks: int, jobs: Sequence[str], *, color: bool = False) -> str:
    """Which job takes which slot: one row per slot under its NUMA node, then the queue."""
    from rich.padding import Padding

    slots = pack(topology, ranks, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    numa = [f"NUMA {format_list(s.mems) or '?'}" for s in slots]
    out = tables.table([(name, "left") for name in ("NUMA", "slot", "GPU", "CPU", "NIC", "job")], header=False)
    for i, s in enumerate(slots):
        first, last = i == 0 or numa[i] != numa[i - 1], i == len(slots) - 1 or numa[i] != numa[i + 1]
        tree = "─" if first and last else "┌" if first else "└" if last else "├"
        out.add_row(
            numa[i] if first else "",
            f"{tree} slot {s.index}",
            f"GPU {format_list(s.gpus) or '-'}",
            f"CPU {format_list(s.cpus)}",
            f"NIC {','.join(s.nics) or '-'}",
            f"<- {jobs[i] if i < len(jobs) else '-'}",
        )
    head = (
        f"{f'{len(jobs)} jobs' if jobs else 'the sweeper’s jobs'} of {ranks} rank{'s' * (ranks > 1)}, {len(slots)} "
        f"at a time on {topology.hostname or topology.source}; a job starts as soon as a slot frees"
    )
    queue = (
        [f"  then, each in the first slot that frees: {', '.join(jobs[len(slots) :])}"]
        if len(jobs) > len(slots)
        else []
    )
    return tables.render(head, Padding(out, (0, 0, 0, 2)), *queue, color=color)


def run_app(target: Target, options: Sequence[str], *, dry_run: bool) -> int:
    """``numarun [OPTIONS] APP -m ...`` for a user's Hydra app: the app's own Hydra sweeps, each job through
    ``hydra/launcher=numarun`` with ``options`` (OPTIONS, :func:`forwarded`). ``dry_run``: the slots of a basic
    sweep's jobs; nothing runs."""
    given = {a.split("=")[0] for a in target.args}
    if dry_run:
        from ..config.compose import expand_sweep
        from ..topology.discover import load_topology

        launch = SweepJob(0, (), 1, tuple(options)).launch_options(os.environ)[0]
        overrides = [a for a in target.args if "=" in a and not a.lstrip("+~").startswith("hydra")]
        jobs = (
            [] if "hydra/sweeper" in given else [f"#{i} {' '.join(o)}" for i, o in enumerate(expand_sweep(overrides))]
        )
        ranks = launch.nproc_per_node if isinstance(launch.nproc_per_node, int) else 1
        sys.stdout.write(describe(load_topology(launch.topology), ranks, jobs, color=sys.stdout.isatty()))
        return 0
    argv = [
        sys.executable,
        *(["-m"] if target.kind == "module" else []),
        target.name,
        *target.args,
        *([] if "hydra/launcher" in given else ["hydra/launcher=numarun"]),
    ]
    os.execve(sys.executable, argv, {**os.environ, envvars.SWEEP_OPTIONS: json.dumps(list(options))})
    return 0  # not reached
