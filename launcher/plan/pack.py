"""A sweep's jobs side by side on one node: the slots, each a disjoint part of the node (pure; rules:
docs/sweeps.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import PlanError
from ..topology.links import Link, gpu_links, nvlink_islands, pcie_switches
from ..topology.model import Gpu, Topology
from ..topology.visible import visible_gpus
from .binding import _cores, _split
from .model import BindingMode
from .nic import gpu_nics


@dataclass(frozen=True)
class Slot:
    """One part of the node that runs one job at a time."""

    index: int
    gpus: tuple[int, ...]  # NVML indices; () for a CPU slot
    cpus: tuple[int, ...]
    mems: tuple[int, ...]  # () when unknown
    nics: tuple[str, ...] = ()  # its GPUs' own NICs


def _groups(topology: Topology, gpus: tuple[Gpu, ...]) -> list[list[Gpu]]:
    """GPUs grouped by NVLink island and NUMA node, each group in PCIe switch order (facts:
    :mod:`numarun.topology.links`)."""
    links = gpu_links(topology)
    island, switch = nvlink_islands(links), pcie_switches(links)
    linked = {a for a, row in enumerate(links.classes) for b, c in enumerate(row) if a != b and c is Link.NVLINK}
    pos = {id(g): i for i, g in enumerate(topology.gpus)}

    def key(g: Gpu) -> tuple[int, int, int, int]:
        i = pos[id(g)]
        return (island[i] if i in linked else -1, g.numa_node, switch[i], i)

    groups: dict[tuple[int, int], list[Gpu]] = {}
    for g in sorted(gpus, key=key):
        groups.setdefault(key(g)[:2], []).append(g)
    return list(groups.values())


def _cut(groups: list[list[object]], k: int) -> list[list[object]]:
    """Runs of ``k`` inside each group, then runs of ``k`` of what the groups left over."""
    runs, rest = [], []
    for g in groups:
        whole = len(g) // k * k
        runs += [g[i : i + k] for i in range(0, whole, k)]
        rest += g[whole:]
    return runs + [rest[i : i + k] for i in range(0, len(rest) // k * k, k)]


def pack(
    topology: Topology, ranks: int, *, cuda_visible_devices: str | None = None, limit: int | None = None
) -> tuple[Slot, ...]:
    """The slots for jobs of ``ranks`` ranks (at most ``limit``); a job larger than the node is a PlanError."""
    by_id = {c.id: c for c in topology.cpus}
    usable = topology.usable_cpus
    gpus = visible_gpus(topology, cuda_visible_devices, "PCI_BUS_ID")
    if gpus:
        if ranks > len(gpus):
            raise PlanError(
                f"bad nproc_per_node {ranks} for a job of a sweep: this node has {len(gpus)} visible GPUs; "
                f"expected at most {len(gpus)}"
            )
        runs: list[list[Gpu]] = _cut(_groups(topology, gpus), ranks)  # type: ignore[arg-type,assignment]
        homes = [run[0].numa_node for run in runs]
        nearest = {id(g): c for g, c in zip(topology.gpus, gpu_nics(topology))}
        slots = []
        for home in dict.fromkeys(homes):
            mine = [i for i, h in enumerate(homes) if h == home]
            pool = [c for c in usable if by_id[c].numa_node == home] or list(usable)
            for i, share in zip(mine, _split(_cores(by_id, pool), len(mine))):
                nics = (nearest[id(g)] for g in runs[i])
                slots.append(
                    Slot(
                        i,
                        tuple(g.index for g in runs[i]),
                        tuple(sorted(c for core in share for c in core)),
                        (home,) if home >= 0 else (),
                        tuple(dict.fromkeys(c.nic.name for c in nics if c)),
                    )
                )
        return tuple(sorted(slots, key=lambda s: s.index)[:limit])
    nodes: dict[int, list[int]] = {}
    for c in usable:
        nodes.setdefault(by_id[c].numa_node, []).append(c)
    cores = [_cores(by_id, cpus) for cpus in nodes.values()]
    if ranks > sum(map(len, cores)):
        raise PlanError(
            f"bad nproc_per_node {ranks} for a job of a sweep: this node has {sum(map(len, cores))} usable "
            f"cores and no visible GPU; expected at most {sum(map(len, cores))}"
        )
    out = []
    for i, run in enumerate(_cut(cores, ranks)):  # type: ignore[arg-type]
        cpus = tuple(sorted(c for core in run for c in core))  # type: ignore[attr-defined]
        out.append(Slot(i, (), cpus, tuple(sorted({by_id[c].numa_node for c in cpus if by_id[c].numa_node >= 0}))))
    return tuple(out[:limit])


def confined_cpus(slot: Slot, binding: BindingMode) -> tuple[int, ...] | None:
    """The CPUs a job in ``slot`` is confined to; None for ``binding`` none, which leaves a job's CPUs alone as it
    leaves a run's (its GPUs still come from its slot)."""
    return None if binding is BindingMode.NONE else slot.cpus


def slot_topology(topology: Topology, slot: Slot, binding: BindingMode) -> Topology:
    """The node as a job in ``slot`` sees it: only the CPUs it is confined to allowed (all, unbound)."""
    cpus = confined_cpus(slot, binding)
    if cpus is None:
        return topology
    allowed = set(cpus)
    return replace(topology, cpus=tuple(replace(c, allowed=c.allowed and c.id in allowed) for c in topology.cpus))
