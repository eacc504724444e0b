"""The sweep's side of numarun's Hydra launcher: jobs written, run as a queue on slots (or a Slurm array),
their ``JobReturn`` read back.

A job's options are ``numarun run``'s, later ones winning: the trainer's ``launcher`` group, the
launcher's ``nproc_per_node`` and ``options``, then what was given to ``numarun SCRIPT -m``
(``NUMARUN_SWEEP_OPTIONS``). A one-rank job with only planning options skips torchrun's agent:
the process started in its slot is the rank (the bootstrap with the slot's plan). Any other job
is a ``numarun run --plan-file`` of its own, its plan made here for its slot.
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
from ..plan.pack import Slot, pack, slot_topology

log = logging.getLogger(__name__)

JOB_MODULE = "numarun.sweep.job"
GRACE_S = 30.0
"""Seconds the running jobs get between SIGTERM and SIGKILL when the sweep is stopped."""


@dataclass(frozen=True)
class Job:
    idx: int
    overrides: tuple[str, ...]
    ranks: int
    options: tuple[str, ...]
    """``numarun run`` options of the job (later ones win)."""


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


def forwarded(args: argparse.Namespace, script: str) -> list[str]:
    """The options given to ``numarun [OPTIONS] SCRIPT -m ...`` that each job of the sweep takes."""
    argv = list(getattr(args, "argv", None) or ())
    given = argv[:argv.index(script)] if script in argv else []
    level = ["--log-level", args.log_level] if getattr(args, "log_level", None) else []
    return level + [a for a in given if a not in ("-m", "--module", "--dry-run")]


def _job(cfg: Any, settings: dict[str, Any], topology: Any, *, trainer: bool) -> Job:
    from omegaconf import OmegaConf

    from ..topology.visible import visible_gpus

    options: list[str] = []
    if trainer:  # numarun's trainer: the job's own launcher group first
        if (OmegaConf.select(cfg, "launcher.nnodes") or 1) != 1:
            raise UsageError(f"bad launcher.nnodes {cfg.launcher.nnodes!r} in a packed sweep: expected 1 "
                             "(hydra/launcher=numarun_slurm runs jobs of several nodes)")
        for key in ("nproc_per_node", "binding", "mem_policy", "nic_policy"):
            if OmegaConf.select(cfg, f"launcher.{key}") is not None:
                options += [f"--{key.replace('_', '-')}", str(cfg.launcher[key])]
        options += ["--strict-binding"] if OmegaConf.select(cfg, "launcher.strict_binding") else []
    if settings.get("nproc_per_node") is not None:
        options += ["--nproc-per-node", str(settings["nproc_per_node"])]
    options += [*(settings.get("options") or ()), *json.loads(os.environ.get(envvars.SWEEP_OPTIONS) or "[]")]
    ranks = _parse(options)[0].nproc_per_node
    if topology is not None and not isinstance(ranks, int):  # torchrun's words; the trainer's None: one per GPU
        gpus, cpus = len(visible_gpus(topology, os.environ.get("CUDA_VISIBLE_DEVICES"), "PCI_BUS_ID")), len(topology.usable_cpus)
        ranks = {"gpu": gpus, "auto": gpus or cpus, "cpu": cpus}.get(ranks or "", gpus if trainer else 1)
    overrides = tuple(str(o) for o in cfg.hydra.overrides.task)
    return Job(int(cfg.hydra.job.num), overrides, int(ranks or 1), tuple(options))


def _task_ref(task: Any) -> tuple[str, str, str, int, bool]:
    """(``file``|``module``, where, qualname, unwrap depth, stands for ``__main__``): how each rank finds the task."""
    named = getattr(task, "numarun_task", None)
    if named:
        module_name, qualname = named.split(":")
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
    main = task.__module__ == "__main__"
    spec = getattr(module, "__spec__", None)
    if main and spec is None:
        return "file", os.path.abspath(str(getattr(module, "__file__", ""))), task.__qualname__, depth, True
    return "module", spec.name if main and spec is not None else task.__module__, task.__qualname__, depth, main


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    """Hydra's ``Launcher.launch``: each job composed as the basic launcher composes it, then run."""
    from hydra.core.utils import setup_globals
    from omegaconf import open_dict

    setup_globals()
    cfgs = []
    for i, overrides in enumerate(job_overrides):
        cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
        with open_dict(cfg):
            cfg.hydra.job.id = cfg.hydra.job.num = initial_job_idx + i
        cfgs.append(cfg)
    return launch_configs(launcher, cfgs)


def launch_configs(launcher: Any, cfgs: Sequence[Any]) -> list[Any]:
    """The composed jobs run, one JobReturn each; a mistake is one line and exit 2 before any job starts."""
    from hydra import version
    from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides

    config, settings, slurm = launcher.config, dict(launcher.settings), getattr(launcher, "slurm", False)
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    folder = None
    try:
        ns = _parse([*(settings.get("options") or ()), *json.loads(os.environ.get(envvars.SWEEP_OPTIONS) or "[]")])[0]
        if slurm:
            topology = None
        else:
            from ..topology.discover import load_topology

            topology = load_topology(ns.topology)
        trainer = getattr(launcher.task_function, "numarun_task", None) is not None
        jobs = [_job(cfg, settings, topology, trainer=trainer) for cfg in cfgs]
        ref = _task_ref(launcher.task_function)
        base = version.getbase()  # the app's version_base, which decides run_job's defaults (chdir) in each rank
        version_base = str(base) if base is not None else None
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        folder = sweep_dir / ".numarun" if slurm else Path(tempfile.mkdtemp(prefix="numarun-sweep-"))
        folder.mkdir(exist_ok=True)
        for job, cfg in zip(jobs, cfgs):
            with open(folder / f"{job.idx}.job", "wb") as f:
                pickle.dump({"task": ref, "job": job, "version_base": version_base}, f)
                pickle.dump(cfg, f)
        log.info("Launching %d jobs with numarun", len(jobs))
        for job in jobs:
            log.info("\t#%d : %s", job.idx, " ".join(filter_overrides(job.overrides)))
        codes = _submit(settings, jobs, folder) if slurm else run_local(jobs, topology, folder, limit=settings.get("max_jobs"))
        if codes is None:  # a dry run
            return [JobReturn(overrides=list(j.overrides), status=JobStatus.COMPLETED) for j in jobs]
        return [_result(folder, job, codes.get(job.idx)) for job in jobs]
    except NumarunError as e:
        print(f"numarun: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(e.exit_code) from None
    finally:
        if folder is not None and not slurm:
            shutil.rmtree(folder, ignore_errors=True)


def _result(folder: Path, job: Job, code: int | None) -> Any:
    """The JobReturn rank 0 wrote, or a FAILED one saying why there is none."""
    from hydra.core.utils import JobReturn, JobStatus

    why = f"exit code {code}" if code is None or code >= 0 else f"killed by {signal.Signals(-code).name}"
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


# --- one node -----------------------------------------------------------------------------------

class _Stop(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def _plan(job: Job, slot: Slot, topology: Any) -> Any:
    from ..plan.binding import make_plan
    from ..plan.options import request_from_args

    environ = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, slot.gpus))}
    request = request_from_args(_parse(job.options)[0], environ)
    return make_plan(slot_topology(topology, slot), replace(request, nproc_per_node=job.ranks, cuda_device_order="PCI_BUS_ID"))


def _start(job: Job, slot: Slot, port: int, topology: Any, folder: Path, now: str) -> subprocess.Popen[bytes]:
    """The job's process, confined to ``slot`` (affinity set before exec, ``CUDA_VISIBLE_DEVICES``)."""
    from ..launch.torchrun import ENTRY_FILE, worker_env

    plan = _plan(job, slot, topology)
    ns, rest = _parse(job.options)
    env = {k: v for k, v in os.environ.items() if k not in (envvars.PLAN, envvars.PLAN_JSON, envvars.SWEEP_OPTIONS)}
    env.update({"CUDA_VISIBLE_DEVICES": ",".join(map(str, slot.gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                envvars.DETECT: "0", envvars.HYDRA_NOW: now, envvars.LAUNCHER_PID: str(os.getpid())})
    if ns.log_level:
        env[envvars.LOG_LEVEL] = ns.log_level.upper()
    args = [str(folder), f"index={job.idx}"]
    if job.ranks == 1 and not rest:  # nothing for torchrun's agent to do: the process is the rank
        env.update(worker_env(plan, os.environ, plan_path="", strict=ns.strict_binding))
        env.pop(envvars.PLAN)
        env.update({envvars.PLAN_JSON: plan.to_json(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                    "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": f"sweep-{os.getpid()}-{job.idx}"})
        cmd = [sys.executable, "-u", ENTRY_FILE, "--module", JOB_MODULE, *args]
    else:
        plan_file = folder / f"{job.idx}.plan.json"
        plan_file.write_text(plan.to_json())
        cmd = [sys.executable, "-m", "numarun", "run", "--no-detect", "--plan-file", str(plan_file), "--nproc-per-node",
               str(job.ranks), "--master-addr", "127.0.0.1", "--master-port", str(port),
               *(["--strict-binding"] if ns.strict_binding else []), *rest, "--module", JOB_MODULE, *args]

    def confine() -> None:  # in the child, before exec: every process of the job inherits it
        os.sched_setaffinity(0, slot.cpus)

    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=confine)


def _end(procs: Sequence[subprocess.Popen[bytes]], signum: int) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signum)
        except ProcessLookupError:
            pass


def run_local(jobs: Sequence[Job], topology: Any, folder: Path, *, limit: int | None = None) -> dict[int, int]:
    """Each job in a slot as soon as one is free; returns each job's exit code. Every job's plan is
    made before the first starts; SIGINT/SIGTERM end every running job and raise (exit 128+N)."""
    from ..launch.supervisor import RunFailed

    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    slots = list(pack(topology, max(j.ranks for j in jobs), cuda_visible_devices=cvd, limit=limit))
    for job in jobs:
        _plan(job, slots[0], topology)
    now = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
    ports = {s.index: _free_port() for s in slots}
    waiting, codes = list(jobs), {}
    running: dict[int, tuple[subprocess.Popen[bytes], Slot]] = {}
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while waiting or running:
            while waiting and slots:
                job, slot = waiting.pop(0), slots.pop(0)
                running[job.idx] = (_start(job, slot, ports[slot.index], topology, folder, now), slot)
                log.info("job #%d in slot %d: cpus %s gpus %s", job.idx, slot.index, format_list(slot.cpus),
                         format_list(slot.gpus) or "-")
            time.sleep(0.05)
            for idx, (proc, slot) in list(running.items()):
                if proc.poll() is not None:
                    codes[idx] = proc.returncode
                    del running[idx]
                    slots = sorted([*slots, slot], key=lambda s: s.index)
        return codes
    except _Stop as stop:
        procs = [p for p, _ in running.values()]
        for s in previous:  # a second signal: no more grace
            signal.signal(s, lambda *_: _end(procs, signal.SIGKILL))
        _end(procs, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _end([p], signal.SIGKILL)
                p.wait()
        name = signal.Signals(stop.signum).name
        raise RunFailed(f"stopped by {name}: {len(procs)} running jobs ended, {len(waiting)} not started",
                        128 + stop.signum) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- Slurm --------------------------------------------------------------------------------------

def _submit(settings: dict[str, Any], jobs: Sequence[Job], folder: Path) -> dict[int, int] | None:
    """The jobs as a job array of ``numarun submit`` (``pack``: that many jobs per array task, packed on its
    node); waits for it. None for a dry run (the script is printed)."""
    sizes = {j.ranks for j in jobs}
    if len(sizes) > 1:
        raise UsageError(f"bad nproc_per_node {sorted(sizes)}: the jobs of one Slurm array take one value")
    now = os.environ.get(envvars.HYDRA_NOW) or _dt.datetime.now().isoformat()
    cmd = [sys.executable, "-m", "numarun", "submit", *settings.get("submit_options", ()), "--nnodes", str(settings["nnodes"]),
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
        opts = [f"--launch-opt={o}" for o in _parse(jobs[0].options)[1]]
        cmd += ["--nproc-per-node", str(sizes.pop()), *opts, "--module", JOB_MODULE, str(folder), "-m",
                f"index=range({jobs[0].idx},{jobs[-1].idx + 1})"]
    code = subprocess.run(cmd, check=False).returncode
    if settings.get("dry_run"):
        if code:
            raise SystemExit(code)
        return None
    return {j.idx: 0 if (folder / f"{j.idx}.ret").exists() else code or 1 for j in jobs}


# --- what numarun shows and starts ---------------------------------------------------------------

def describe(topology: Any, ranks: int, jobs: Sequence[str], *, limit: int | None = None) -> str:
    """Which job takes which slot: one line per slot under its NUMA node, then the queue."""
    slots = pack(topology, ranks, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), limit=limit)
    rows = [(f"NUMA {format_list(s.mems) or '?'}", f"slot {s.index}", f"GPU {format_list(s.gpus) or '-'}",
             f"CPU {format_list(s.cpus)}", f"NIC {','.join(s.nics) or '-'}") for s in slots]
    width = [max(len(r[i]) for r in rows) for i in range(5)]
    ones = "" if ranks == 1 else "s"
    out = [f"{f'{len(jobs)} jobs' if jobs else 'the sweeper’s jobs'} of {ranks} rank{ones}, {len(slots)} at a time on "
           f"{topology.hostname or topology.source}; a job starts as soon as a slot frees"]
    for i, r in enumerate(rows):
        first = i == 0 or r[0] != rows[i - 1][0]
        last = i == len(rows) - 1 or r[0] != rows[i + 1][0]
        tree = "─" if first and last else "┌" if first else "└" if last else "├"
        cells = "  ".join(c.ljust(w) for c, w in zip(r[1:], width[1:]))
        out.append(f"  {(r[0] if first else '').ljust(width[0])} {tree} {cells}  <- {jobs[i] if i < len(jobs) else '-'}")
    if len(jobs) > len(slots):
        out.append(f"  then, each in the first slot that frees: {', '.join(jobs[len(slots):])}")
    return "\n".join(out) + "\n"


def run_app(args: argparse.Namespace, kind: str, name: str, script_args: Sequence[str]) -> int:
    """``numarun [OPTIONS] APP -m ...`` for a user's Hydra app: the app's own Hydra sweeps, each job through
    ``hydra/launcher=numarun`` with OPTIONS. ``--dry-run``: the slots of a basic sweep's jobs; nothing runs."""
    options = forwarded(args, name)
    if args.dry_run:
        from ..config.compose import expand_sweep
        from ..topology.discover import load_topology

        ns = _parse(options)[0]
        overrides = [a for a in script_args if "=" in a and not a.lstrip("+~").startswith("hydra")]
        sweeper = any(a.startswith("hydra/sweeper=") for a in script_args)
        jobs = [] if sweeper else [f"#{i} {' '.join(o)}" for i, o in enumerate(expand_sweep(overrides))]
        sys.stdout.write(describe(load_topology(ns.topology), ns.nproc_per_node or 1, jobs))
        return 0
    launcher = [] if any(a.startswith("hydra/launcher=") for a in script_args) else ["hydra/launcher=numarun"]
    argv = [sys.executable, *(["-m"] if kind == "module" else []), name, *script_args, *launcher]
    os.execve(sys.executable, argv, {**os.environ, envvars.SWEEP_OPTIONS: json.dumps(options)})
    return 0  # not reached
