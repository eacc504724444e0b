"""The one way into planning, for ``run``, ``plan``, ``doctor`` and ``tune``: the job a command runs in
(a Slurm step, mpirun), the options settled against it, and the plan of this node or of this task.

:func:`detect_job` reads the scheduler's shape (:mod:`numarun.jobenv`); :func:`settle` settles the options
against it, once per launch: per-node mode's rendezvous the job implies, per-rank mode's the tasks share (and the
node they agree on); :class:`Planner` plans (a plan file, this node, or the node
every task of per-rank mode plans alike, with this task's binding); :func:`refuse` makes a conflict
end the whole job, not only the task that saw it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..argtypes import NodeRange, parse_endpoint
from ..errors import JobConflict, UsageError
from ..jobenv import JobShape, Mode, Scheduler, detect
from ..jobenv.container import Container, detect_container
from ..jobenv.settle import NodeRendezvous, check_rank, own_rendezvous, rank_master, settle_node
from ..options.launch import DECLARED, LaunchOptions
from ..plan.model import LaunchPlan
from ..topology.model import Topology

log = logging.getLogger(__name__)


def announce(options: LaunchOptions, text: str) -> None:
    """One line on stderr, shown unless the user asked for WARNING or quieter (like the binding line)."""
    if options.log_level is None or logging.getLevelName(options.log_level) <= logging.INFO:
        print(f"numarun: {text}", file=sys.stderr, flush=True)


def detect_job(options: LaunchOptions) -> tuple[JobShape | None, LaunchOptions]:
    """The job found in the environment (none with ``--no-detect``), and the options with the job's own
    variables (``MASTER_ADDR``, ``MASTER_PORT``: :meth:`LaunchOptions.with_job_env`) where there is one."""
    if not options.detect:
        return None, options
    job = detect(os.environ, nproc_given="nproc_per_node" in options.stated())
    return job, options.with_job_env(os.environ) if job is not None else options


@dataclass(frozen=True)
class Settled:
    """Step 3 of a launch: the options settled against the job a scheduler started, and what settling found."""

    options: LaunchOptions
    job: JobShape | None = None
    """The job, as settled (per-rank mode: on the node the ranks agreed this task is on); None: no scheduler's."""
    rendezvous: NodeRendezvous | None = None
    """Per-node mode: torchrun's rendezvous for this node."""
    now: str = ""
    """Per-rank mode: Hydra's clock the ranks agreed on ('' when not asked for)."""


def settle(
    options: LaunchOptions,
    job: JobShape,
    environ: Mapping[str, str] | None = None,
    *,
    layout: bool = False,
    agree: bool = True,
    clock: bool = False,
) -> Settled:
    """The options against ``job``, the one settling of every launch. Per-node mode: the rendezvous the job implies
    (static, Slurm's node order); ``layout``: a layout comes later though no mesh is stated (numarun's trainer hands
    its own). Per-rank mode: the rendezvous every task shares and, with ``agree`` (not a dry run), the node each is
    on and Hydra's clock (``clock``), which the ranks agree on where no variable says."""
    env = os.environ if environ is None else environ
    if job.mode is Mode.PER_RANK:
        return _settle_rank(options, job, env, agree=agree, clock=clock)
    from .slurmctld import gather, head_address

    stated = options.stated()
    own = own_rendezvous(stated)
    rdv = settle_node(job, stated)  # conflicts first, before asking Slurm anything
    facts = None
    keyed = own and (
        "mesh" in stated or layout
    )  # a layout under the user's c10d: each node reports its place in Slurm's order
    if job.scheduler is Scheduler.SLURM and job.nnodes > 1 and (not own or keyed):
        head = job.nodes[0] if job.nodes and not own and "master_addr" not in stated else None  # its address
        facts = gather(env, need_switches="node_rank" not in stated or keyed, head=head)
        rdv = settle_node(job, stated, leaf_switch=facts.leaf_switch)
    # the head's address, where no source stated one (rdv.options keeps a stated one)
    addr = "127.0.0.1" if job.nnodes == 1 else head_address(facts, rdv.head) if facts is not None else rdv.head
    return Settled(options.with_job(rdv.options(addr), job.describe().split(":")[0]), job, rdv)


def _settle_rank(
    options: LaunchOptions, job: JobShape, environ: Mapping[str, str], *, agree: bool, clock: bool
) -> Settled:
    """Per-rank mode: the options against the job (nothing asks for torchrun's agent), the rendezvous every task
    shares, and the node the ranks agree on where the scheduler does not say (an MPI launcher)."""
    stated, per_rank = options.stated(), {o.dest for o in DECLARED if o.per_rank}
    check_rank(job, stated, per_rank=per_rank)
    addr, port = rank_master(job, stated)
    if addr is None:
        from .slurmctld import head_addr

        addr = "127.0.0.1" if job.nnodes == 1 else head_addr(environ, job.nodes[0])
    now = ""
    if agree:  # the node and Hydra's clock, where no variable says: one for every rank
        from .rank import agree as agreed

        job, now = agreed(job, addr, port, clock=clock)
        check_rank(job, stated, per_rank=per_rank)
    addr = parse_endpoint(addr, "--master-addr (MASTER_ADDR)", port=False)[0]
    # the node: a dry run may not know it
    node = {"nnodes": NodeRange.of(job.nnodes), "node_rank": job.node_index} if job.node_index >= 0 else {}
    return Settled(
        options.with_job(
            {"nproc_per_node": job.local_world_size, **node, "master_addr": addr, "master_port": port},
            job.describe().split(":")[0],
        ),
        job,
        now=now,
    )


def refuse(job: JobShape, error: JobConflict, options: LaunchOptions) -> int:
    """Print the conflict, make sure the rest of the job stops too, and return exit code 2.

    A conflict every task sees (``--nnodes 3`` on two nodes) stops every task by itself. One that
    only some tasks see (``--node-rank``) must reach the others: in per-node mode through the head's
    rendezvous store (they wait there, and name this node when they stop); in per-rank mode, where
    the others are already running the script, by cancelling the Slurm step.
    """
    print(error.line(), file=sys.stderr, flush=True)
    if not error.node_varying:
        return 2
    index = "SLURM_NODEID" if job.scheduler is Scheduler.SLURM else "node"
    who = f"node {job.node_name or job.node_index} ({index} {job.node_index})"
    if job.mode is Mode.PER_RANK:
        if job.scheduler is Scheduler.SLURM and job.job_id is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    ["scancel", "--quiet", f"{job.job_id}.{job.step_id}"],
                    timeout=30,
                    check=False,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                print(f"numarun: cancelled Slurm step {job.job}: {who} refused to start", file=sys.stderr, flush=True)
        return 2
    addr, port = rank_master(job, options.stated()) if job.nnodes > 1 else (None, 0)
    if addr is None and job.nodes:
        from .slurmctld import head_addr

        addr = head_addr(os.environ, job.nodes[0])
    if addr is not None:
        from . import abort

        if abort.tell(addr, port, f"{who} refused to start: {error}"):
            print(
                f"numarun: told the other nodes to stop (rendezvous store {addr}:{port})", file=sys.stderr, flush=True
            )
    return 2


@dataclass(frozen=True)
class Here:
    """What confines this node's ranks beside the topology (the topology's machine, or the live one)."""

    container: Container | None
    gpu_minors: tuple[int, ...] | None
    """The GPUs the ranks may open, by minor number; None when nothing refuses any."""
    mem_refused: str
    """Why this process may not set a memory policy (:func:`numarun.worker.affinity.mempolicy_refusal`)."""


def container_at(source: str | None, environ: Mapping[str, str] | None = None) -> Container | None:
    """The container of the machine ``source`` names: the live one reads this process's environment too."""
    from ..topology.discover import device_root

    root = device_root(source)
    if root is None:
        return None
    return detect_container((os.environ if environ is None else environ) if _live(root) else {}, root)


def _live(root: Path) -> bool:
    """Whether the device root is this machine's own ``/`` (not a recorded tree)."""
    return bool(root.resolve() == root.__class__("/").resolve())


def here(
    topology: Topology, source: str | None, job: JobShape | None = None, environ: Mapping[str, str] | None = None
) -> Here:
    """The GPUs the ranks may open (the device files answer: a denied open is the cgroup, an absent
    one in a container was not given to it; in a Slurm step without them, ``SLURM_STEP_GPUS`` when
    ``CUDA_VISIBLE_DEVICES`` reads as renumbered from 0), the container, and the memory-policy probe."""
    from ..plan.scheduled import allowed_minors, renumbered
    from ..topology.devices import gpu_device_access
    from ..topology.discover import device_root
    from ..worker.affinity import mempolicy_refusal

    env = os.environ if environ is None else environ
    container = container_at(source, env)
    root = device_root(source)
    access = gpu_device_access(root, [g.minor for g in topology.gpus]) if root is not None and topology.gpus else {}
    allowed = allowed_minors(access, in_container=container is not None)
    if (
        allowed is None
        and topology.gpus
        and not any(v is not None for v in access.values())
        and job is not None
        and job.scheduler is Scheduler.SLURM
    ):
        allowed = renumbered(env.get("CUDA_VISIBLE_DEVICES"), job.step_gpus)
    return Here(container, tuple(sorted(allowed)) if allowed is not None else None, mempolicy_refusal())


@dataclass(frozen=True)
class Planned:
    plan: LaunchPlan
    path: str = ""
    """The plan file it was read from ('' for a fresh plan)."""
    notes: tuple[str, ...] = ()
    """What to say besides the plan's warnings (per-rank mode)."""


class Planner:
    """The one way into planning. Reads the machine once for all the jobs of a run (a sweep plans each job
    once); in per-node mode plans this node's ranks on the GPUs the step may open (:func:`here`); in
    per-rank mode plans the whole node as every task does, and takes this task's binding in it."""

    def __init__(self, job: JobShape | None = None) -> None:
        self.job = job
        self._read: dict[str | None, tuple[Topology, Here]] = {}

    def plan(self, options: LaunchOptions) -> Planned:
        """The plan of ``options``: this task's in per-rank mode, else ``--plan-file``'s, else this node's."""
        from ..plan.binding import make_plan
        from ..plan.request import request_for
        from ..plan.scheduled import confine
        from ..topology.discover import load_topology

        if self.job is not None and self.job.mode is Mode.PER_RANK:
            return self._rank(options, self.job)
        if options.plan_file:
            return self._from_file(options, options.plan_file)
        if options.topology not in self._read:
            topology = load_topology(options.topology)
            self._read[options.topology] = topology, here(topology, options.topology, self.job)
        topology, node = self._read[options.topology]
        request = request_for(options, os.environ, topology, allowed_gpu_minors=node.gpu_minors)
        return Planned(confine(make_plan(topology, request), node.container, node.mem_refused))

    def _from_file(self, options: LaunchOptions, path: str) -> Planned:
        from ..plan.scheduled import confine
        from ..worker.affinity import mempolicy_refusal

        try:
            text = Path(path).read_text()
        except OSError as e:
            raise UsageError(
                f"bad --plan-file {path!r}: {e.strerror}; expected a file from 'numarun plan --json'"
            ) from None
        # the ranks run here, wherever the plan was made
        plan = confine(LaunchPlan.from_json(text, origin=path), detect_container(os.environ), mempolicy_refusal())
        nproc = options.setting("nproc_per_node")
        if isinstance(nproc.value, int) and nproc.value != plan.nproc_per_node:
            raise UsageError(
                f"bad {nproc.where} {nproc.value!r}: the plan file {path!r} has {plan.nproc_per_node} "
                f"rank{'' if plan.nproc_per_node == 1 else 's'}; expected {plan.nproc_per_node} or no {nproc.where}"
            )
        return Planned(plan, os.path.abspath(path))

    def _rank(self, options: LaunchOptions, job: JobShape) -> Planned:
        """The node on the step's cpuset and the job's GPUs (by minor); this task's row (that of its own GPU
        under ``--gpus-per-task``), narrowed to the CPUs the task may use (per-rank mode: docs/slurm.md,
        "Inside your own sbatch script, or under mpirun")."""
        from ..plan.binding import make_plan
        from ..plan.request import request_for
        from ..plan.scheduled import confine, narrow, own_binding, own_gpu_refs, task_plan, with_usable_cpus
        from ..topology.devices import cgroup_cpus
        from ..topology.discover import device_root, load_topology

        notes: list[str] = []
        topology = load_topology(options.topology)
        root = device_root(options.topology)
        if root is not None and _live(root):
            step_cpus = cgroup_cpus()
            if step_cpus:
                topology = with_usable_cpus(topology, step_cpus)
        node = here(topology, options.topology)  # the GPUs this task may open, its container
        node_minors = tuple(job.job_gpus) if job.job_gpus else None
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        request = request_for(options, os.environ, topology)
        # GPUs per task: the task opens fewer GPUs than the node holds
        if node.gpu_minors is not None and node_minors is not None and len(node.gpu_minors) < len(node_minors):
            request = replace(
                request,
                nproc_per_node=max(job.local_world_size, len(node_minors)),
                cuda_visible_devices=None,
                allowed_gpu_minors=node_minors,
                keep_gpus=True,
            )  # each task holds its own GPU: the layout cannot move it
            own = own_gpu_refs(topology, node.gpu_minors, cvd)
        else:
            request = replace(
                request,
                nproc_per_node=job.local_world_size,
                allowed_gpu_minors=node.gpu_minors,
            )
            own = ()
            if (
                (job.gpus_on_node or 0) > job.local_world_size
                and node.gpu_minors is None
                and cvd
                and len(cvd.split(",")) < (job.gpus_on_node or 0)
            ):
                notes.append(
                    "this task sees fewer GPUs than the job holds on the node, and no device file tells "
                    "which: planned by local rank"
                )
        plan = confine(make_plan(topology, request), node.container, node.mem_refused)
        binding = own_binding(plan, local_rank=job.local_rank, own_gpus=own)
        # never wider than what the scheduler let this task use (--cpu-bind, mpirun's --bind-to)
        binding = narrow(binding, topology, os.sched_getaffinity(0))
        return Planned(task_plan(plan, binding), notes=tuple(notes))
