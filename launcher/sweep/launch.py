"""The sweep's side of numarun's Hydra launcher: jobs composed and written, run as a queue on the node's
slots (or as a Slurm job array), their ``JobReturn`` read back.

A job's ``numarun run`` options, later ones winning: the trainer's ``launcher`` group, the launcher's
``nproc_per_node`` and ``options``, those given to ``numarun SCRIPT -m`` (``NUMARUN_SWEEP_OPTIONS``).
"""

from __future__ import annotations

import argparse
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
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import envvars
from ..cpuset import format_list
from ..errors import NumarunError, UsageError
from ..launch.child import numarun_command
from ..plan.pack import Slot, pack, slot_topology

log = logging.getLogger(__name__)

JOB_MODULE = "numarun.sweep.job"
GRACE_S = 30.0  # between SIGTERM and SIGKILL when the sweep is stopped


@dataclass(frozen=True)
class Job:
    idx: int
    overrides: tuple[str, ...]
    ranks: int
    options: tuple[str, ...]  # numarun run options (later ones win)


def _parse(options: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(the planning options, the other ``numarun run`` options as given)."""
    from ..plan.options import add_plan_options

    parser = argparse.ArgumentParser(add_help=False, prog="numarun")
    add_plan_options(parser)
    parser.add_argument("--strict-binding", action="store_true")
    parser.add_argument("--log-level")

    def refuse(message: str) -> None:
        raise UsageError(f"bad launcher options {' '.join(options)!r}: {message}; expected 'numarun run' options")

    parser.error = refuse  # type: ignore[method-assign,assignment]
    return parser.parse_known_args(list(options))


def _common(settings: dict[str, Any]) -> list[str]:
    """The options of every job: the launcher's, then those given to ``numarun SCRIPT -m``."""
    return [*(settings.get("options") or ()), *json.loads(os.environ.get(envvars.SWEEP_OPTIONS) or "[]")]


def forwarded(args: argparse.Namespace, script: str) -> list[str]:
    """The options given to ``numarun [OPTIONS] SCRIPT -m ...`` that each job of the sweep takes."""
    argv = list(getattr(args, "argv", None) or ())
    given = argv[:argv.index(script)] if script in argv else []
    level = ["--log-level", args.log_level] if getattr(args, "log_level", None) else []
    return level + [a for a in given if a not in ("-m", "--module", "--dry-run")]


def _job(cfg: Any, settings: dict[str, Any], topology: Any, *, trainer: bool) -> Job:
    from omegaconf import OmegaConf

    from ..topology.visible import visible_gpus

    own = OmegaConf.select(cfg, "launcher") if trainer else None  # numarun's trainer: its launcher group first
    if own is not None and own.nnodes not in (None, 1):
        raise UsageError(f"bad launcher.nnodes {own.nnodes!r} in a sweep on one node: expected 1 "
                         "(hydra/launcher=numarun_slurm runs jobs of several nodes)")
    options = [o for k in ("nproc_per_node", "binding", "mem_policy", "nic_policy", "mesh", "hang_timeout", "on_hang")
               if own is not None and own[k] is not None for o in (f"--{k.replace('_', '-')}", str(own[k]))]
    options += ["--strict-binding"] if own is not None and own.strict_binding else []
    if settings.get("nproc_per_node") is not None:
        options += ["--nproc-per-node", str(settings["nproc_per_node"])]
    options += _common(settings)
    ranks = _parse(options)[0].nproc_per_node
    if topology is not None and not isinstance(ranks, int):  # torchrun's words; the trainer's None: one per GPU
        gpus, cpus = len(visible_gpus(topology, os.environ.get("CUDA_VISIBLE_DEVICES"), "PCI_BUS_ID")), len(topology.usable_cpus)
        ranks = {"gpu": gpus, "auto": gpus or cpus, "cpu": cpus}.get(ranks or "", gpus if trainer else 1)
    return Job(int(cfg.hydra.job.num), tuple(str(o) for o in cfg.hydra.overrides.task), int(ranks or 1), tuple(options))


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
        raise UsageError(f"bad task function {task.__qualname__!r}: each job runs in processes of its own, which find it "
                         "by name; expected a function at the top of its module (other decorators with functools.wraps)")
    main, spec = task.__module__ == "__main__", getattr(module, "__spec__", None)
    if main and spec is None:
        return "file", os.path.abspath(str(getattr(module, "__file__", ""))), task.__qualname__, depth, True
    return "module", spec.name if main and spec is not None else task.__module__, task.__qualname__, depth, main


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    """Hydra's ``Launcher.launch``: each job composed as the basic launcher composes it, then run, one
    JobReturn each; a mistake is one line and exit 2 before any job starts."""
    from hydra import version
    from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
    from omegaconf import open_dict

    setup_globals()
    sys.modules.setdefault("__mp_main__", sys.modules["__main__"])  # as multiprocessing: the jobs' classes of the script
    cfgs = [launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(o)) for o in job_overrides]
    for i, cfg in enumerate(cfgs):
        with open_dict(cfg):
            cfg.hydra.job.id = cfg.hydra.job.num = initial_job_idx + i
    config, settings, slurm = launcher.config, dict(launcher.settings), getattr(launcher, "slurm", False)
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    folder = None
    try:
        from ..topology.discover import load_topology

        topology = None if slurm else load_topology(_parse(_common(settings))[0].topology)
        jobs = [_job(cfg, settings, topology, trainer=hasattr(launcher.task_function, "numarun_task")) for cfg in cfgs]
        base = version.getbase()  # the app's version_base: run_job's defaults (chdir) in each rank
        head = {"task": _task_ref(launcher.task_function), "version_base": None if base is None else str(base)}
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        folder = sweep_dir / ".numarun" if slurm else Path(tempfile.mkdtemp(prefix="numarun-sweep-"))
        folder.mkdir(exist_ok=True)
        log.info("Launching %d jobs with numarun", len(jobs))
        for job, cfg in zip(jobs, cfgs):
            log.info("\t#%d : %s", job.idx, " ".join(filter_overrides(job.overrides)))
            with open(folder / f"{job.idx}.job", "wb") as f:
                pickle.dump({**head, "job": job}, f)
                pickle.dump(cfg, f)
        codes = _submit(settings, jobs, folder) if slurm else run_local(jobs, topology, folder, limit=settings.get("max_jobs"))
        if codes is None:  # a dry run
            return [JobReturn(overrides=list(j.overrides), status=JobStatus.COMPLETED) for j in jobs]
        return [_result(folder, job, codes[job.idx]) for job in jobs]
    except NumarunError as e:
        print(f"numarun: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(e.exit_code) from None
    finally:
        if folder is not None and not slurm:
            shutil.rmtree(folder, ignore_errors=True)


def _result(folder: Path, job: Job, code: int) -> Any:
    """The JobReturn rank 0 wrote, or a FAILED one saying why there is none."""
    from hydra.core.utils import JobReturn, JobStatus

    why = f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
    try:
        with open(folder / f"{job.idx}.ret", "rb") as f:
            ret = pickle.load(f)
        if code == 0 or ret.status is JobStatus.FAILED:
            return ret
    except FileNotFoundError:
        pass
    except Exception as e:  # a class the sweep cannot import
        why = f"its result cannot be read here ({type(e).__name__}: {e})"
    ret = JobReturn(overrides=list(job.overrides), status=JobStatus.FAILED)
    ret.return_value = RuntimeError(f"job #{job.idx} ({' '.join(job.overrides)}) failed: {why}")
    return ret


def _plan(job: Job, slot: Slot, topology: Any) -> Any:
    from ..plan.binding import make_plan
    from ..plan.options import request_from_args

    request = request_from_args(_parse(job.options)[0], {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, slot.gpus))})
    return make_plan(slot_topology(topology, slot), replace(request, nproc_per_node=job.ranks, cuda_device_order="PCI_BUS_ID"))


def _start(job: Job, slot: Slot, port: int, topology: Any, folder: Path, now: str) -> subprocess.Popen[bytes]:
    """The job's process, confined to ``slot`` (affinity set before exec, ``CUDA_VISIBLE_DEVICES``)."""
    from ..launch.torchrun import ENTRY_FILE, worker_env

    plan, (ns, rest) = _plan(job, slot, topology), _parse(job.options)
    env = {k: v for k, v in os.environ.items() if k not in (envvars.PLAN, envvars.PLAN_JSON, envvars.SWEEP_OPTIONS)}
    env.update({"CUDA_VISIBLE_DEVICES": ",".join(map(str, slot.gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                envvars.DETECT: "0", envvars.HYDRA_NOW: now, envvars.LAUNCHER_PID: str(os.getpid()),
                **({envvars.LOG_LEVEL: ns.log_level.upper()} if ns.log_level else {})})
    args = [str(folder), f"index={job.idx}"]
    if job.ranks == 1 and not rest:  # nothing for torchrun's agent to do: the process is the rank
        env.update(worker_env(plan, os.environ, plan_path="", strict=ns.strict_binding))
        env.pop(envvars.PLAN)
        env.update({envvars.PLAN_JSON: plan.to_json(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                    "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": f"sweep-{os.getpid()}-{job.idx}"})
        cmd = [sys.executable, "-u", ENTRY_FILE, "--module", JOB_MODULE, *args]
    else:
        (folder / f"{job.idx}.plan.json").write_text(plan.to_json())
        cmd = [*numarun_command(), "run", "--no-detect", "--plan-file", str(folder / f"{job.idx}.plan.json"),
               "--nproc-per-node", str(job.ranks), "--master-addr", "127.0.0.1", "--master-port", str(port),
               *(["--strict-binding"] if ns.strict_binding else []), *rest, "--module", JOB_MODULE, *args]
    # the affinity is set in the child before exec: every process of the job inherits it
    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, slot.cpus))


def _signal(procs: Sequence[subprocess.Popen[bytes]], signum: int) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signum)
        except ProcessLookupError:
            pass


def run_local(jobs: Sequence[Job], topology: Any, folder: Path, *, limit: int | None = None) -> dict[int, int]:
    """Each job in a slot as soon as one is free; returns each job's exit code. Every job's plan is
    made before the first starts. SIGUSR1/SIGUSR2 go on to every running job; SIGINT/SIGTERM end every
    running job (SIGKILL after :data:`GRACE_S`, or at a second one) and raise (exit 128+N)."""
    from ..launch.signals import recorded
    from ..launch.supervisor import RunFailed

    slots = list(pack(topology, max(j.ranks for j in jobs), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                      limit=limit))
    for job in jobs:
        _plan(job, slots[0], topology)
    now = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
    ports = {s.index: _free_port() for s in slots}
    waiting, codes = list(jobs), {}
    running: dict[int, tuple[subprocess.Popen[bytes], Slot]] = {}
    stopped_by, kill_at, ended = 0, 0.0, 0
    death = (signal.SIGINT, signal.SIGTERM)
    with recorded((*death, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)) as wakeup:
        while waiting or running:
            while waiting and slots and not stopped_by:
                job, slot = waiting.pop(0), slots.pop(0)
                running[job.idx] = (_start(job, slot, ports[slot.index], topology, folder, now), slot)
                log.info("job #%d in slot %d: cpus %s gpus %s", job.idx, slot.index, format_list(slot.cpus),
                         format_list(slot.gpus) or "-")
            if stopped_by and not running:
                break
            for signum in wakeup.read(1.0):  # a job's end (SIGCHLD) wakes it too
                procs = [p for p, _ in running.values()]
                if signum in death:
                    if stopped_by:  # a second one: no more grace
                        kill_at = time.monotonic()
                    else:
                        stopped_by, kill_at, ended = signum, time.monotonic() + GRACE_S, len(procs)
                        _signal(procs, signal.SIGTERM)
                elif signum in (signal.SIGUSR1, signal.SIGUSR2):
                    _signal(procs, signum)
            if stopped_by and time.monotonic() >= kill_at:
                _signal([p for p, _ in running.values()], signal.SIGKILL)
            for idx, (proc, slot) in list(running.items()):
                if proc.poll() is not None:
                    codes[idx] = proc.returncode
                    del running[idx]
                    slots = sorted([*slots, slot], key=lambda s: s.index)
    if stopped_by:
        raise RunFailed(f"stopped by {signal.Signals(stopped_by).name}: {ended} running jobs ended, "
                        f"{len(waiting)} not started", 128 + stopped_by)
    return codes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _submit(settings: dict[str, Any], jobs: Sequence[Job], folder: Path) -> dict[int, int] | None:
    """The jobs as a job array of ``numarun submit`` (``pack``: that many jobs per array task, packed on its
    node); waits for it. None for a dry run (the script is printed)."""
    sizes = {j.ranks for j in jobs}
    if len(sizes) > 1:
        raise UsageError(f"bad nproc_per_node {sorted(sizes)}: the jobs of one Slurm array take one value")
    now = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
    cmd = [*numarun_command(), "submit", *settings.get("submit_options", ()), "--nnodes", str(settings["nnodes"]),
           "--output-dir", str(folder / "slurm"), "--env", f"{envvars.HYDRA_NOW}={now}",
           "--dry-run" if settings.get("dry_run") else "--wait"]
    n = settings.get("pack")
    if n:
        groups = [jobs[i:i + n] for i in range(0, len(jobs), n)]
        for g, members in enumerate(groups):
            (folder / f"group{g}.json").write_text(json.dumps([j.idx for j in members]))
        cmd += ["--nproc-per-node", "1", "--launch-opt=--binding=none", "--launch-opt=--no-watch",
                "--module", JOB_MODULE, str(folder), "-m", f"group=range(0,{len(groups)})"]
    else:
        cmd += ["--nproc-per-node", str(sizes.pop()), *(f"--launch-opt={o}" for o in _parse(jobs[0].options)[1]),
                "--module", JOB_MODULE, str(folder), "-m", f"index=range({jobs[0].idx},{jobs[-1].idx + 1})"]
    code = subprocess.run(cmd, check=False).returncode
    if settings.get("dry_run"):
        if code:
            raise SystemExit(code)
        return None
    return {j.idx: 0 if (folder / f"{j.idx}.ret").exists() else code or 1 for j in jobs}


def describe(topology: Any, ranks: int, jobs: Sequence[str], *, limit: int | None = None) -> str:
    """Which job takes which slot: one line per slot under its NUMA node, then the queue."""
    slots = pack(topology, ranks, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), limit=limit)
    rows = [(f"NUMA {format_list(s.mems) or '?'}", f"slot {s.index}", f"GPU {format_list(s.gpus) or '-'}",
             f"CPU {format_list(s.cpus)}", f"NIC {','.join(s.nics) or '-'}") for s in slots]
    width = [max(len(r[i]) for r in rows) for i in range(5)]
    out = [f"{f'{len(jobs)} jobs' if jobs else 'the sweeper’s jobs'} of {ranks} rank{'s' * (ranks > 1)}, {len(slots)} "
           f"at a time on {topology.hostname or topology.source}; a job starts as soon as a slot frees"]
    for i, r in enumerate(rows):
        first, last = i == 0 or r[0] != rows[i - 1][0], i == len(rows) - 1 or r[0] != rows[i + 1][0]
        cells = "  ".join(c.ljust(w) for c, w in zip(r[1:], width[1:]))
        tree = "─" if first and last else "┌" if first else "└" if last else "├"
        out.append(f"  {(r[0] if first else '').ljust(width[0])} {tree} {cells}  <- {jobs[i] if i < len(jobs) else '-'}")
    if len(jobs) > len(slots):
        out.append(f"  then, each in the first slot that frees: {', '.join(jobs[len(slots):])}")
    return "\n".join(out) + "\n"


def run_app(args: argparse.Namespace, kind: str, name: str, script_args: Sequence[str]) -> int:
    """``numarun [OPTIONS] APP -m ...`` for a user's Hydra app: the app's own Hydra sweeps, each job through
    ``hydra/launcher=numarun`` with OPTIONS. ``--dry-run``: the slots of a basic sweep's jobs; nothing runs."""
    options = forwarded(args, name)
    given = {a.split("=")[0] for a in script_args}
    if args.dry_run:
        from ..config.compose import expand_sweep
        from ..topology.discover import load_topology

        ns = _parse(options)[0]
        overrides = [a for a in script_args if "=" in a and not a.lstrip("+~").startswith("hydra")]
        jobs = [] if "hydra/sweeper" in given else [f"#{i} {' '.join(o)}" for i, o in enumerate(expand_sweep(overrides))]
        ranks = ns.nproc_per_node if isinstance(ns.nproc_per_node, int) else 1
        sys.stdout.write(describe(load_topology(ns.topology), ranks, jobs))
        return 0
    argv = [sys.executable, *(["-m"] if kind == "module" else []), name, *script_args,
            *([] if "hydra/launcher" in given else ["hydra/launcher=numarun"])]
    os.execve(sys.executable, argv, {**os.environ, envvars.SWEEP_OPTIONS: json.dumps(options)})
    return 0  # not reached
