"""Planning inside what a scheduler gave: its GPUs (by minor number) and its CPUs. Pure.

Per-node mode plans the node's ranks on the GPUs the step may open. Per-rank mode plans the
whole node the same way in every task (the plan is deterministic, so the tasks agree without
talking), takes its own rank's binding (:func:`own_binding`), and never widens what Slurm
already gave the task (:func:`narrow`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from ..cpuset import format_list
from ..jobenv.container import Container, Fix, fix
from ..topology.model import Topology, physical_cores
from ..topology.pci import pci_order
from ..topology.visible import openable
from .model import GpuRef, LaunchPlan, MemPolicy, RankBinding


def allowed_minors(access: Mapping[int, bool | None], *, in_container: bool = False) -> frozenset[int] | None:
    """The GPU minors the device cgroup lets this process open, when it refuses some; None when it
    refuses none (no confinement, or nothing could be checked). ``in_container``: a GPU whose device
    file is absent was not given to the container (its ``/sys`` still shows every GPU)."""
    if not any(v is False or (in_container and v is None) for v in access.values()):
        return None
    return frozenset(m for m, v in access.items() if v)


def confine(plan: LaunchPlan, container: Container | None, mem_refused: str = "") -> LaunchPlan:
    """The plan as it runs in ``container`` (None: none), where the kernel refuses the memory-policy
    syscalls for ``mem_refused`` (the cause; "" when it does not): the ranks keep their CPUs, leave
    memory to first touch, and one warning names the cause and the fix (:func:`mem_refused_line`)."""
    plan = dataclasses.replace(plan, container=container.runtime.value if container else "")
    if not mem_refused or all(r.mem_policy is MemPolicy.NONE for r in plan.ranks):
        return plan
    ranks = tuple(dataclasses.replace(r, mem_policy=MemPolicy.NONE, mems=()) for r in plan.ranks)
    plan = dataclasses.replace(plan, ranks=ranks, mem_unbound=mem_refused)
    return dataclasses.replace(plan, warnings=(*plan.warnings, mem_refused_line(plan)))


def mem_refused_line(plan: LaunchPlan, *, strict: bool = False) -> str:
    """Why a confined plan's memory is not bound, and the fix; ``strict``: as ``--strict-binding``'s refusal."""
    why = (
        "Docker's and containerd's default seccomp profiles allow set_mempolicy and mbind only with CAP_SYS_NICE"
        if plan.mem_unbound == "seccomp"
        else "set_mempolicy fails"
    )
    head = (
        f"--strict-binding, but the ranks' memory cannot be bound here ({plan.mem_unbound})"
        if strict
        else f"memory not bound ({plan.mem_unbound})"
    )
    tail = "" if strict else "; the ranks are bound to their CPUs only"
    return f"{head}: {why}{tail}; fix: {fix(Fix.MEMPOLICY, plan.container)}, or --mem-policy none"


def renumbered(cuda_visible: str | None, step_gpus: Sequence[int] | None) -> frozenset[int] | None:
    """Without device files to check: Slurm's step GPUs (minors) when ``CUDA_VISIBLE_DEVICES`` reads as
    renumbered by ConstrainDevices (``0..k-1`` for a step holding other GPUs); else None."""
    if not cuda_visible or not step_gpus:
        return None
    try:
        visible = sorted(int(v) for v in cuda_visible.split(","))
    except ValueError:
        return None  # UUIDs: CUDA resolves them the same inside and outside the cgroup
    step = sorted(step_gpus)
    if visible == step or visible != list(range(len(step))):
        return None
    return frozenset(step)


def own_gpu_refs(topology: Topology, own_minors: Iterable[int], cuda_visible: str | None) -> tuple[GpuRef, ...]:
    """The GPUs a task may open, as CUDA numbers them for it (its view is only those GPUs)."""
    view = pci_order(openable(tuple(topology.gpus), frozenset(own_minors)))
    picked = list(view)
    if cuda_visible and cuda_visible.strip() not in ("", "-1"):
        with contextlib.suppress(ValueError, IndexError):
            picked = [view[int(e)] for e in cuda_visible.split(",")]
    return tuple(
        GpuRef(index=g.index, pci_bus_id=g.pci_bus_id, numa_node=g.numa_node, uuid=g.uuid, name=g.name, cuda_index=i)
        for i, g in enumerate(picked)
    )


def own_binding(plan: LaunchPlan, *, local_rank: int, own_gpus: Sequence[GpuRef] = ()) -> RankBinding:
    """This task's binding in the node's plan: the entry of the GPU the scheduler gave it (with CUDA's
    index for it as the task sees it), else the entry of its local rank."""
    if own_gpus:
        mine = own_gpus[0]
        for r in plan.ranks:
            if r.gpu is not None and r.gpu.pci_bus_id == mine.pci_bus_id:
                return dataclasses.replace(r, local_rank=local_rank, gpu=mine)
    return dataclasses.replace(plan.rank(local_rank), local_rank=local_rank)


def narrow(binding: RankBinding, topology: Topology, allowed: Iterable[int]) -> RankBinding:
    """The binding kept inside ``allowed`` (the CPUs the scheduler let this task use): never wider.

    When the plan's CPUs and ``allowed`` meet, the rank keeps the common CPUs; when they do not
    (Slurm bound the task elsewhere), it keeps ``allowed``. Memory nodes and OMP threads follow.
    """
    keep = set(allowed)
    if not keep or set(binding.cpus) <= keep:
        return binding
    common = tuple(c for c in binding.cpus if c in keep)
    cpus = common or tuple(sorted(keep))
    planned = _fmt(binding.cpus)
    why = (
        f"the scheduler let this task use only cpus {_fmt(keep)}: kept {_fmt(cpus)} of the planned {planned}"
        if common
        else f"the scheduler bound this task to cpus {_fmt(keep)}, none of the planned {planned}: kept them"
    )
    by_id = {c.id: c for c in topology.cpus}
    cores = len(physical_cores([by_id[c] for c in cpus if c in by_id])) or len(cpus)
    env = dict(binding.env)
    if "OMP_NUM_THREADS" in env:
        env["OMP_NUM_THREADS"] = str(max(1, cores))
    mems = binding.mems
    if mems and not common:
        nodes = sorted({by_id[c].numa_node for c in cpus if c in by_id and by_id[c].numa_node >= 0})
        allowed_mems = set(topology.allowed_mems)
        mems = tuple(n for n in nodes if not allowed_mems or n in allowed_mems)
    return dataclasses.replace(
        binding,
        cpus=cpus,
        env=env,
        mems=mems,
        physical_cores=cores,
        mem_policy=binding.mem_policy if mems else MemPolicy.NONE,
        fallback="; ".join(f for f in (binding.fallback, why) if f),
    )


def _fmt(cpus: Iterable[int]) -> str:
    return format_list(sorted(cpus))


def with_usable_cpus(topology: Topology, cpus: Iterable[int]) -> Topology:
    """The topology with exactly ``cpus`` allowed (the step's cpuset), whatever this task's own affinity."""
    allowed = set(cpus)
    return dataclasses.replace(
        topology, cpus=tuple(dataclasses.replace(c, allowed=c.id in allowed) for c in topology.cpus)
    )


def task_plan(plan: LaunchPlan, binding: RankBinding) -> LaunchPlan:
    """The node's plan with ``binding`` as the entry of its local rank (what ``current_binding()`` returns)."""
    ranks = [binding if r.local_rank == binding.local_rank else r for r in plan.ranks]
    if all(r.local_rank != binding.local_rank for r in plan.ranks):
        ranks.append(binding)
    return dataclasses.replace(plan, ranks=tuple(ranks))
