"""The per-node side of a Slurm job: ``numarun slurm-node task|finish``, called by the sbatch script.

``task`` is the one srun task on each node. It runs ``numarun run`` there, which finds the Slurm
step it is part of (:mod:`numarun.jobenv`, the same code path as a user's own ``srun numarun``):
nnodes from the step, the node rank in Slurm's order regrouped by leaf switch, the head's
``NodeAddr``, a port derived from the job and step ids, static rendezvous. The batch script has
asked Slurm once for the whole job and handed the answers over (``NUMARUN_SLURM_INFO``), so no
node asks slurmctld anything. ``task`` passes its signals on to numarun (Slurm signals only the
task: :class:`numarun.launch.signals.Relay`) and records a failed node's exit code; ``finish`` gives
the job's exit code (the first node that failed, by time) and decides the requeue.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..cpuset import format_list
from ..errors import SlurmError
from ..jobenv import Mode, Scheduler, detect
from ..launch.child import numarun_command
from ..launch.signals import Relay
from ..launch.slurmctld import SCONTROL_TIMEOUT_S

log = logging.getLogger(__name__)

EXIT_FILE = ".numarun-node{rank}.exit"
GRACE_MARGIN_S = 15
"""Seconds kept back from ``--signal-before`` for the requeue after the ranks have stopped."""


def shutdown_grace(signal_before: int) -> int:
    """Seconds the ranks get between TERM and KILL: ``--signal-before`` minus a margin.

    The margin (GRACE_MARGIN_S, or a quarter of a short lead) leaves time to requeue.
    """
    margin = min(GRACE_MARGIN_S, max(1, signal_before // 4))
    return max(1, signal_before - margin)


def first_failure(records: Sequence[str]) -> int | None:
    """Exit records (``"<ns> <rc>"``, one per failed node) -> the rc of the earliest failure.

    srun reports the largest exit code of its tasks, often the TERM of a peer it killed,
    not the rank that failed first.
    """
    failures = [
        (int(parts[0]), int(parts[1]))
        for parts in (rec.split() for rec in records)
        if len(parts) == 2 and all(p.lstrip("-").isdigit() for p in parts)
    ]
    return min(failures, key=lambda f: f[0])[1] if failures else None


def task_main(opts: argparse.Namespace) -> int:
    env = os.environ
    relay = Relay()  # first thing: from now on a signal is held for numarun, never lost
    job = detect(env)
    if job is None or job.scheduler is not Scheduler.SLURM or job.mode is not Mode.PER_NODE:
        raise SlurmError(
            "bad use of 'numarun slurm-node task': expected one srun task per node of a Slurm step "
            "(srun --ntasks-per-node=1), as numarun's sbatch script starts it"
        )
    run_dir = Path(opts.run_dir)
    if job.node_index == 0:
        print(
            f"numarun: job {opts.job_key} (restart {env.get('SLURM_RESTART_COUNT', '0')}) on "
            f"{env.get('SLURM_JOB_NODELIST', '')}: {job.describe()}, run dir {run_dir}",
            flush=True,
        )
    cpus = sorted(os.sched_getaffinity(0))
    print(
        f"numarun: node {job.node_name} (SLURM_NODEID {job.node_index}): {len(cpus)} CPUs {format_list(cpus)}, "
        f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')} "
        f"SLURM_STEP_GPUS={env.get('SLURM_STEP_GPUS', '(unset)')}",
        flush=True,
    )
    rc = relay.run(numarun_command(*opts.command), dict(env))
    return node_outcome(rc, relay.forwarded, record=run_dir / EXIT_FILE.format(rank=job.node_index), node=job.node_name)


def node_outcome(rc: int, forwarded: set[int], *, record: Path, node: str) -> int:
    """What the node task reports: its numarun's exit code in the run dir (read by ``finish``), and
    to srun the same code, except after a signal Slurm sent (preemption, requeue, scancel): then 0,
    or srun's --kill-on-bad-exit would cut short the other nodes' checkpoint saves.

    numarun exits 0 when every rank stopped cleanly after the signal (a checkpoint-and-stop), and
    128+N when ranks had to be killed: that code reaches the job's exit code through ``finish``.
    """
    if rc != 0:
        record.write_text(f"{time.time_ns()} {rc}\n", encoding="utf-8")
    if rc != 0 and forwarded:
        signals = ",".join(signal.Signals(s).name for s in sorted(forwarded))
        print(
            f"numarun: node {node}: after {signals} numarun ended with exit code {rc}: recorded for the job's exit "
            "code",
            flush=True,
        )
        return 0
    return rc


def finish_main(opts: argparse.Namespace) -> int:
    # every node's numarun exit code is in the run dir (srun's may read 0 after a signal: see node_outcome)
    records = [
        p.read_text(encoding="utf-8", errors="replace")
        for p in sorted(Path(opts.run_dir).glob(EXIT_FILE.format(rank="*")))
    ]
    first = first_failure(records)
    rc = opts.rc if first is None else first
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if opts.preempted:  # requeued only after the pre-timeout signal, and at most --requeue-limit times
        if opts.restart_count < opts.requeue_limit:
            print(
                f"numarun: time limit near: requeueing job {job_id} (restart {opts.restart_count + 1} of "
                f"{opts.requeue_limit})",
                flush=True,
            )
            try:
                subprocess.run(["scontrol", "requeue", job_id], timeout=SCONTROL_TIMEOUT_S, check=False)
            except (subprocess.TimeoutExpired, FileNotFoundError) as e:
                print(f"numarun: error: 'scontrol requeue {job_id}' failed ({e})", file=sys.stderr, flush=True)
                return 1
            return 0
        print(
            f"numarun: time limit near and requeue limit {opts.requeue_limit} reached: not requeueing",
            file=sys.stderr,
            flush=True,
        )
    print(f"numarun: step finished with exit code {rc}", flush=True)
    return rc


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("slurm-node", description="per-node entry of numarun's sbatch script")
    # not a user command: keep it out of 'numarun --help' (argparse lists every subparser)
    subparsers._choices_actions = [a for a in subparsers._choices_actions if a.dest != "slurm-node"]
    sub = p.add_subparsers(dest="step", required=True)
    t = sub.add_parser("task", help="run numarun on this node of the job")
    t.add_argument("--run-dir", required=True)
    t.add_argument("--job-key", required=True)
    t.add_argument("command", nargs=argparse.REMAINDER, help="'run' then numarun run's options, script and arguments")
    t.set_defaults(func=lambda a: task_main(a))
    f = sub.add_parser("finish", help="the job's exit code and requeue decision")
    f.add_argument("--run-dir", required=True)
    f.add_argument("--rc", type=int, required=True)
    f.add_argument("--preempted", type=int, choices=(0, 1), default=0)
    f.add_argument("--restart-count", type=int, default=0)
    f.add_argument("--requeue-limit", type=int, default=0)
    f.set_defaults(func=lambda a: finish_main(a))
    return p
