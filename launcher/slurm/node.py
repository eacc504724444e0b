"""The per-node side of a Slurm job: ``numarun slurm-node task|finish``, called by the sbatch script.

Everything a node must decide lives here, as pure functions over Slurm's variables and
``scontrol`` text, so it is tested without Slurm:

- the node order: Slurm's node order (``SLURM_JOB_NODELIST`` expanded, which is what
  ``SLURM_NODEID`` counts), regrouped by leaf switch when ``topology/tree`` reports one, so
  the nodes under one switch get adjacent node ranks;
- the head node (first in that order), its ``NodeAddr`` and the rendezvous port;
- the node rank, passed to torchrun's *static* rendezvous, so that
  ``RANK == node_rank * nproc_per_node + LOCAL_RANK`` whatever the addresses are (c10d's
  dynamic rendezvous numbers nodes by the sorted string of their addresses instead);
- the exit code of the job (the first node that failed, by time) and the requeue decision.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..envvars import VISIBLE_GPUS
from ..errors import SlurmError, expected
from .nodelist import expand_hostlist

log = logging.getLogger(__name__)

SCONTROL_TIMEOUT_S = 30.0
"""Bound on every ``scontrol`` call from a node (a wedged slurmctld must not hang the job)."""
PORT_BASE = 15000
"""Rendezvous ports are PORT_BASE + job id % PORT_SPAN: below Linux's ephemeral range (32768+)."""
PORT_SPAN = 15000
EXIT_FILE = ".numarun-node{rank}.exit"
GRACE_MARGIN_S = 15
"""Seconds kept back from ``--signal-before`` for the requeue after the ranks have stopped."""


def rendezvous_port(job_id: int) -> int:
    """A port derived from the job id, so concurrent jobs sharing a head node do not collide."""
    return PORT_BASE + job_id % PORT_SPAN


def shutdown_grace(signal_before: int) -> int:
    """Seconds the ranks get between TERM and KILL: ``--signal-before`` minus a margin.

    The margin (GRACE_MARGIN_S, or a quarter of a short lead) leaves time to requeue.
    """
    margin = min(GRACE_MARGIN_S, max(1, signal_before // 4))
    return max(1, signal_before - margin)


def parse_leaf_switches(text: str) -> dict[str, str]:
    """``scontrol show topology`` -> node name -> its leaf (Level=0) switch."""
    leaf: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if fields.get("Level") != "0" or "SwitchName" not in fields or "Nodes" not in fields:
            continue
        for node in expand_hostlist(fields["Nodes"]):
            leaf.setdefault(node, fields["SwitchName"])
    return leaf


def node_order(nodes: Sequence[str], leaf_switch: Mapping[str, str] | None = None) -> list[str]:
    """The job's nodes in node-rank order.

    Slurm's order, except that nodes under one leaf switch are kept together: groups in the
    order of their first node in Slurm's list, Slurm's order inside each group. Without a
    switch map (or with one switch) this is exactly Slurm's order (node rank == SLURM_NODEID).
    """
    if not leaf_switch:
        return list(nodes)
    groups: dict[str, list[str]] = {}
    for n in nodes:
        groups.setdefault(leaf_switch.get(n, f"\0{n}"), []).append(n)
    return [n for group in groups.values() for n in group]


def parse_node_addr(text: str) -> str | None:
    """``scontrol show node NAME`` -> its NodeAddr."""
    m = re.search(r"\bNodeAddr=(\S+)", text)
    return m.group(1) if m else None


def first_failure(records: Sequence[str]) -> int | None:
    """Exit records (``"<ns> <rc>"``, one per failed node) -> the rc of the earliest failure.

    srun reports the largest exit code of its tasks, often the TERM of a peer it killed,
    not the rank that failed first.
    """
    best: tuple[int, int] | None = None
    for rec in records:
        parts = rec.split()
        if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
            continue
        when, rc = int(parts[0]), int(parts[1])
        if best is None or when < best[0]:
            best = (when, rc)
    return None if best is None else best[1]


def should_requeue(preempted: bool, restart_count: int, requeue_limit: int) -> bool:
    """Requeue only after the pre-timeout signal, and at most ``requeue_limit`` times."""
    return preempted and restart_count < requeue_limit


def physical_gpus(cuda_visible: str | None, step_gpus: str | None) -> str | None:
    """The node's GPU indices behind Slurm's ``CUDA_VISIBLE_DEVICES``, or None when they are the same.

    Slurm names the step's GPUs in ``SLURM_STEP_GPUS`` (the node's indices). With ConstrainDevices
    CUDA sees only those devices, and Slurm numbers them 0..k-1 in ``CUDA_VISIBLE_DEVICES``: entry c
    is then the c-th allowed GPU. Without confinement the two lists hold the same indices.
    """
    if not cuda_visible or not step_gpus:
        return None
    try:
        visible = [int(v) for v in cuda_visible.split(",")]
        step = sorted(int(v) for v in step_gpus.split(","))
    except ValueError:
        return None  # UUIDs or MIG names: CUDA resolves them the same inside and outside the cgroup
    if sorted(visible) == step:
        return None
    if sorted(visible) == list(range(len(step))):
        return ",".join(str(step[c]) for c in visible)
    log.warning(
        "CUDA_VISIBLE_DEVICES=%s does not match SLURM_STEP_GPUS=%s: planning on CUDA_VISIBLE_DEVICES", cuda_visible, step_gpus
    )
    return None


@dataclass(frozen=True)
class NodeTask:
    """What one node runs: derived from Slurm's variables and scontrol's answers."""

    node_name: str
    node_rank: int
    nnodes: int
    head_addr: str
    port: int
    local_addr: str | None

    def run_options(self) -> list[str]:
        """``numarun run`` options for this node: static rendezvous at the head."""
        opts = [
            "--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
            "--rdzv-backend", "static", "--master-addr", self.head_addr, "--master-port", str(self.port),
        ]
        if self.local_addr:
            opts += ["--local-addr", self.local_addr]
        return opts


def plan_node_task(env: Mapping[str, str], *, topology_text: str, node_addrs: Mapping[str, str | None]) -> NodeTask:
    """Pure: Slurm's variables + ``scontrol`` answers -> this node's task."""
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    nodes = expand_hostlist(nodelist) if nodelist else []
    me = env.get("SLURMD_NODENAME", "")
    if not nodes or me not in nodes:
        raise SlurmError(
            expected(f"{me}@{nodelist}", "SLURMD_NODENAME one of the nodes of SLURM_JOB_NODELIST", "Slurm environment")
        )
    order = node_order(nodes, parse_leaf_switches(topology_text) if topology_text else None)
    head = order[0]
    head_addr = node_addrs.get(head) or head
    job_id = env.get("SLURM_JOB_ID", "0")
    if not job_id.isdigit():
        raise SlurmError(expected(job_id, "a numeric job id", "SLURM_JOB_ID"))
    return NodeTask(
        node_name=me, node_rank=order.index(me), nnodes=len(order), head_addr=head_addr,
        port=rendezvous_port(int(job_id)), local_addr=node_addrs.get(me),
    )


def _scontrol(*args: str) -> str:
    """Output of ``scontrol ARGS`` ('' when it fails: callers fall back), bounded in time."""
    try:
        proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        log.warning("'scontrol %s' did not answer within %.0f s", " ".join(args), SCONTROL_TIMEOUT_S)
        return ""
    except FileNotFoundError:
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def _cpulist(cpus: Sequence[int]) -> str:
    from ..cpuset import format_list

    return format_list(cpus)


_child: subprocess.Popen[bytes] | None = None
_forwarded: set[int] = set()


def _pass_signal(signum: int, frame: object) -> None:
    """Forward a signal to numarun; this task outlives it, to collect numarun's exit code.

    Slurm (proctrack/cgroup) signals only the step's task process; numarun's agent passes the
    signal to its ranks and gives them the shutdown grace before it kills them.
    """
    if _child is not None and _child.poll() is None:
        try:
            _child.send_signal(signum)
            _forwarded.add(signum)
        except ProcessLookupError:
            pass


def task_main(opts: argparse.Namespace) -> int:
    env = os.environ
    topology = _scontrol("show", "topology")
    nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) if env.get("SLURM_JOB_NODELIST") else []
    wanted = {n for n in (env.get("SLURMD_NODENAME"),) if n}
    # the head is known only after ordering; ask for the NodeAddr of the few candidates
    order = node_order(nodes, parse_leaf_switches(topology) if topology else None)
    if order:
        wanted.add(order[0])
    addrs = {n: parse_node_addr(_scontrol("show", "node", n)) for n in sorted(wanted)}
    task = plan_node_task(env, topology_text=topology, node_addrs=addrs)
    run_dir = Path(opts.run_dir)
    if task.node_rank == 0:
        print(
            f"numarun: job {opts.job_key} (restart {env.get('SLURM_RESTART_COUNT', '0')}) on "
            f"{env.get('SLURM_JOB_NODELIST', '')}: rendezvous {task.head_addr}:{task.port} (static, "
            f"node order {','.join(order)}), run dir {run_dir}",
            flush=True,
        )
    cpus = sorted(os.sched_getaffinity(0))
    print(
        f"numarun: node {task.node_name} (node rank {task.node_rank}): {len(cpus)} CPUs {_cpulist(cpus)}, "
        f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')} "
        f"SLURM_STEP_GPUS={env.get('SLURM_STEP_GPUS', '(unset)')}",
        flush=True,
    )
    argv = [sys.executable, "-m", "numarun", *opts.command[:1], *task.run_options(), *opts.command[1:]]
    child_env = dict(env)
    physical = physical_gpus(env.get("CUDA_VISIBLE_DEVICES"), env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
    if physical is not None:
        child_env[VISIBLE_GPUS] = physical
    global _child
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        # a handler, not SIG_IGN: an ignored disposition would survive exec into numarun
        signal.signal(sig, _pass_signal)
    proc = _child = subprocess.Popen(argv, env=child_env)
    rc = proc.wait()  # PEP 475: the wait resumes after each forwarded signal
    if rc < 0:
        rc = 128 - rc
    if rc - 128 in _forwarded:
        # numarun ended because it was told to (preemption, requeue, scancel), after its ranks
        # finished their checkpoint: not a failure, or srun's --kill-on-bad-exit would stop the
        # other nodes while their ranks still save
        print(f"numarun: node {task.node_name}: numarun stopped by signal {rc - 128}, as asked", flush=True)
        rc = 0
    if rc != 0:
        path = run_dir / EXIT_FILE.format(rank=task.node_rank)
        path.write_text(f"{time.time_ns()} {rc}\n", encoding="utf-8")
    return rc


def finish_main(opts: argparse.Namespace) -> int:
    run_dir = Path(opts.run_dir)
    rc = opts.rc
    if rc != 0:
        records = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(run_dir.glob(EXIT_FILE.format(rank="*")))]
        first = first_failure(records)
        if first is not None:
            rc = first
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if opts.preempted:
        if should_requeue(True, opts.restart_count, opts.requeue_limit):
            print(
                f"numarun: time limit near: requeueing job {job_id} (restart {opts.restart_count + 1} of {opts.requeue_limit})",
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
