"""The job a command finds itself in (a Slurm step, mpirun), for ``run``, ``plan`` and ``doctor``.

:func:`detect_job` reads the scheduler's shape (:mod:`numarun.jobenv`) and says it in one line;
:func:`settle_node_args` fills the rendezvous options of per-node mode; :func:`rank_setup`
plans the node and picks this task's binding for per-rank mode; :func:`refuse` makes a
conflict end the whole job, not only the task that saw it.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..jobenv import JobShape, Mode, Scheduler, detect, detection_enabled
from ..jobenv.container import Container, detect_container
from ..jobenv.settle import Given, JobConflict, NodeRendezvous, agent_options, settle_node
from ..plan.model import LaunchPlan, RankBinding

log = logging.getLogger(__name__)

_TORCHRUN_DEFAULTS = {"nnodes": "1:1", "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29500,
                      "rdzv_backend": "static", "rdzv_endpoint": "", "standalone": False}


def given_dests(args: argparse.Namespace, parser: argparse.ArgumentParser | None) -> set[str]:
    """The dests the user gave on the command line, even with their default value.

    Parsed again with every default suppressed; without the argv (a programmatic call), the
    dests whose value differs from the torchrun default.
    """
    argv = getattr(args, "argv", None)
    if parser is None or argv is None:
        return {d for d, v in _TORCHRUN_DEFAULTS.items() if getattr(args, d, v) != v} | (
            {"nproc_per_node"} if getattr(args, "nproc_per_node", None) is not None else set())
    saved = [(a, a.default) for a in parser._actions]  # noqa: SLF001
    saved_defaults = dict(parser._defaults)  # noqa: SLF001
    try:
        for a, _ in saved:
            a.default = argparse.SUPPRESS
        parser._defaults.clear()  # noqa: SLF001
        ns, _ = parser.parse_known_args(list(argv))
    finally:
        for a, d in saved:
            a.default = d
        parser._defaults.update(saved_defaults)  # noqa: SLF001
    return set(vars(ns))


def given_options(args: argparse.Namespace, parser: argparse.ArgumentParser | None) -> Given:
    dests = given_dests(args, parser)

    def value(dest: str) -> Any:
        return getattr(args, dest, None) if dest in dests else None

    spelling = {}
    if parser is not None:
        for a in parser._actions:  # noqa: SLF001
            longs = [s for s in a.option_strings if s.startswith("--")]
            if longs:
                spelling[a.dest] = longs[0]
    port = value("master_port")
    node_rank = value("node_rank")
    return Given(
        nnodes=None if value("nnodes") is None else str(value("nnodes")),
        node_rank=None if node_rank is None else int(node_rank),
        master_addr=value("master_addr"), master_port=None if port is None else int(port),
        rdzv_backend=value("rdzv_backend"), rdzv_endpoint=value("rdzv_endpoint") or None,
        standalone=bool(value("standalone")), nproc_per_node=value("nproc_per_node"),
        agent_options=agent_options(dests, spelling),
    )


def announce(args: argparse.Namespace, text: str) -> None:
    """One line on stderr, shown unless the user asked for WARNING or quieter (like the binding line)."""
    level = getattr(args, "log_level", None)
    if level is None or getattr(logging, str(level).upper(), logging.INFO) <= logging.INFO:
        print(f"numarun: {text}", file=sys.stderr, flush=True)


def detect_job(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None,
               environ: Mapping[str, str] | None = None) -> tuple[JobShape | None, Given]:
    """(the job found in the environment or None, the options the user gave)."""
    env = os.environ if environ is None else environ
    given = given_options(args, parser)
    if not detection_enabled(env, no_detect=bool(getattr(args, "no_detect", False))):
        return None, given
    return detect(env, nproc_given=given.nproc_per_node is not None), given


def _facts(job: JobShape, given: Given, environ: Mapping[str, str], *, need_switches: bool) -> Any:
    from ..slurm.controller import gather

    head = job.nodes[0] if job.nodes and job.nnodes > 1 else None
    if head is not None and (given.master_addr or environ.get("MASTER_ADDR")):
        head = None
    return gather(environ, need_switches=need_switches, head=head)


def settle_node_args(args: argparse.Namespace, job: JobShape, given: Given,
                     environ: Mapping[str, str] | None = None) -> tuple[argparse.Namespace, NodeRendezvous]:
    """Per-node mode: a copy of ``args`` with the rendezvous the job implies (static, Slurm's node order)."""
    from ..launch.net import route_address
    from ..slurm.controller import head_address

    env = os.environ if environ is None else environ
    own = bool(given.rdzv_endpoint) or given.standalone or given.rdzv_backend not in (None, "static")
    rdv = settle_node(job, given, env)  # conflicts first, before asking Slurm anything
    facts = None
    if job.scheduler is Scheduler.SLURM and job.nnodes > 1 and not own:
        facts = _facts(job, given, env, need_switches=given.node_rank is None)
        rdv = settle_node(job, given, env, leaf_switch=facts.leaf_switch)
    addr = rdv.master_addr
    if addr is None:
        addr = "127.0.0.1" if job.nnodes == 1 else head_address(facts, rdv.head) if facts is not None else rdv.head
    settled = copy.copy(args)
    for dest, value in rdv.options(addr).items():
        setattr(settled, dest, value)
    if not own and job.nnodes > 1 and not getattr(args, "local_addr", None):
        mine = (facts.addrs.get(job.node_name) if facts is not None else None) or route_address(addr, rdv.master_port or 0)
        if mine:
            settled.local_addr = mine
    return settled, rdv


def refuse(job: JobShape, error: JobConflict, given: Given, environ: Mapping[str, str] | None = None) -> int:
    """Print the conflict, make sure the rest of the job stops too, and return exit code 2.

    A conflict every task sees (``--nnodes 3`` on two nodes) stops every task by itself. One that
    only some tasks see (``--node-rank``) must reach the others: in per-node mode through the head's
    rendezvous store (they wait there, and name this node when they stop); in per-rank mode, where
    the others are already running the script, by cancelling the Slurm step.
    """
    env = os.environ if environ is None else environ
    print(f"numarun: error: {error}", file=sys.stderr, flush=True)
    if not error.node_varying:
        return 2
    index = "SLURM_NODEID" if job.scheduler is Scheduler.SLURM else "node"
    who = f"node {job.node_name or job.node_index} ({index} {job.node_index})"
    if job.mode is Mode.PER_RANK:
        if job.scheduler is Scheduler.SLURM and job.job_id is not None:
            try:
                subprocess.run(["scancel", "--quiet", f"{job.job_id}.{job.step_id}"], timeout=30, check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                print(f"numarun: cancelled Slurm step {job.job}: {who} refused to start", file=sys.stderr, flush=True)
            except (OSError, subprocess.TimeoutExpired):
                pass
        return 2
    from ..jobenv.settle import rank_master

    addr, port = rank_master(job, given, env) if job.nnodes > 1 else (None, 0)
    if addr is None and job.nodes:
        from ..slurm.controller import head_addr

        addr = head_addr(env, job.nodes[0])
    if addr is not None:
        from ..launch import abort

        if abort.tell(addr, port, f"{who} refused to start: {error}"):
            print(f"numarun: told the other nodes to stop (rendezvous store {addr}:{port})", file=sys.stderr, flush=True)
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
    live = root.resolve() == root.__class__("/").resolve()
    return detect_container((os.environ if environ is None else environ) if live else {}, root)


def here(topology: Any, source: str | None, job: JobShape | None = None,
         environ: Mapping[str, str] | None = None) -> Here:
    """The GPUs the ranks may open (the device files answer: a denied open is the cgroup, an absent
    one in a container was not given to it; in a Slurm step without them, ``SLURM_STEP_GPUS`` when
    ``CUDA_VISIBLE_DEVICES`` reads as renumbered from 0), the container, and the memory-policy probe."""
    from ..plan.scheduled import renumbered
    from ..topology.discover import device_root
    from ..worker.affinity import mempolicy_refusal

    env = os.environ if environ is None else environ
    container = container_at(source, env)
    allowed = None
    if topology.gpus:
        access, allowed = _openable_minors(topology, device_root(source), container)
        if (allowed is None and not any(v is not None for v in access.values()) and job is not None
                and job.scheduler is Scheduler.SLURM):
            allowed = renumbered(env.get("CUDA_VISIBLE_DEVICES"), job.step_gpus)
    return Here(container, tuple(sorted(allowed)) if allowed is not None else None, mempolicy_refusal())


def _openable_minors(topology: Any, root: Any,
                     container: Container | None) -> tuple[dict[int, bool | None], frozenset[int] | None]:
    """(minor -> may it be opened, the minors this process may open when some are refused, else None),
    by opening the topology's GPU device files under ``root``."""
    from ..plan.scheduled import refused_minors
    from ..topology.devices import gpu_device_access

    access = gpu_device_access(root, [g.minor for g in topology.gpus]) if root is not None and topology.gpus else {}
    return access, refused_minors(access, in_container=container is not None)


@dataclass(frozen=True)
class RankSetup:
    """Per-rank mode: the node's plan (the same in every task) and this task's binding in it."""

    plan: LaunchPlan
    binding: RankBinding
    notes: tuple[str, ...] = ()


def rank_setup(args: argparse.Namespace, job: JobShape, environ: Mapping[str, str] | None = None) -> RankSetup:
    """Plan the whole node as every task of it does, and take this task's binding.

    The node's CPUs are the step's cpuset (the same for every task, whatever ``--cpu-bind`` gave
    each); the GPUs are the job's on this node, by minor number. A task that Slurm gave GPUs of
    its own (``--gpus-per-task``: its device cgroup opens only them) takes the entry of its GPU;
    the binding is then narrowed to the CPUs this task may use.
    """
    import dataclasses

    from ..plan.binding import make_plan
    from ..plan.options import request_for
    from ..plan.scheduled import confine, narrow, own_binding, own_gpu_refs, with_usable_cpus
    from ..topology.devices import cgroup_cpus
    from ..topology.discover import device_root, load_topology

    env = os.environ if environ is None else environ
    notes: list[str] = []
    topology = load_topology(args.topology)
    root = device_root(args.topology)
    live = root is not None and root.resolve() == root.__class__("/").resolve()
    if live:
        step_cpus = cgroup_cpus()
        if step_cpus:
            topology = with_usable_cpus(topology, step_cpus)
    container = container_at(args.topology, env)
    _, own_minors = _openable_minors(topology, root, container)
    node_minors = tuple(job.job_gpus) if job.job_gpus else None
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    per_task_gpus = own_minors is not None and node_minors is not None and len(own_minors) < len(node_minors)
    if per_task_gpus:
        request = request_for(args, env, topology)
        request = dataclasses.replace(
            request, nproc_per_node=max(job.local_world_size, len(node_minors or ())), cuda_visible_devices=None,
            allowed_gpu_minors=node_minors,
        )
        own = own_gpu_refs(topology, own_minors or (), cvd)
    else:
        request = dataclasses.replace(request_for(args, env, topology), nproc_per_node=job.local_world_size,
                                      allowed_gpu_minors=tuple(sorted(own_minors)) if own_minors is not None else None)
        own = ()
        if (job.gpus_on_node or 0) > job.local_world_size and own_minors is None and cvd and len(cvd.split(",")) < (
                job.gpus_on_node or 0):
            notes.append("this task sees fewer GPUs than the job holds on the node, and no device file tells which: "
                         "planned by local rank")
    from ..worker.affinity import mempolicy_refusal

    plan = confine(make_plan(topology, request), container, mempolicy_refusal())
    binding = own_binding(plan, local_rank=job.local_rank, own_gpus=own)
    # never wider than what the scheduler let this task use (--cpu-bind, mpirun's --bind-to)
    binding = narrow(binding, topology, os.sched_getaffinity(0))
    return RankSetup(plan=plan, binding=binding, notes=tuple(notes))
