"""A sweep's jobs side by side on one node: the slots, each a disjoint part of the node. Pure.

GPU slots: the visible GPUs grouped by NVLink island, NUMA node and PCIe switch, each group cut
into runs of ``ranks``, then what the groups leave over; the cores of the slot's NUMA node split
evenly among its slots, that node's memory, the GPUs' own NICs. CPU slots: runs of ``ranks``
physical cores of one NUMA node, then across nodes. See docs/sweeps.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import PlanError
from ..topology.model import Gpu, Topology
from ..topology.visible import visible_gpus
from .binding import _cores, _split
from .nic import gpu_nics


@dataclass(frozen=True)
class Slot:
    """One part of the node that runs one job at a time."""

    index: int
    gpus: tuple[int, ...]
    """NVML indices (PCI order) of its GPUs; () for a CPU slot."""
    cpus: tuple[int, ...]
    mems: tuple[int, ...]
    """NUMA nodes of its memory; () when unknown."""
    nics: tuple[str, ...] = ()
    """Its GPUs' own NICs (one rail each where there are rails)."""


def _groups(topology: Topology, gpus: tuple[Gpu, ...]) -> list[list[Gpu]]:
    """GPUs grouped by NVLink island and NUMA node, each group in PCIe switch order."""
    n, links, close = len(topology.gpus), topology.gpu_links, ("PIX", "PXB")
    island, switch, linked = list(range(n)), list(range(n)), set()
    for a in range(n):
        for b in range(a + 1, n):
            code = links[a][b] if links else ""
            if code.startswith("NV"):
                _join(island, a, b)
                linked |= {a, b}
            if code in close or any(topology.gpu_nic_link(a, k) in close and topology.gpu_nic_link(b, k) in close
                                    for k in range(len(topology.nics))):
                _join(switch, a, b)
    pos = {id(g): i for i, g in enumerate(topology.gpus)}

    def key(g: Gpu) -> tuple[int, int, int, int]:
        i = pos[id(g)]
        return (_root(island, i) if i in linked else -1, g.numa_node, _root(switch, i), i)

    groups: dict[tuple[int, int], list[Gpu]] = {}
    for g in sorted(gpus, key=key):
        groups.setdefault(key(g)[:2], []).append(g)
    return list(groups.values())


def _root(parent: list[int], i: int) -> int:
    while parent[i] != i:
        i = parent[i]
    return i


def _join(parent: list[int], a: int, b: int) -> None:
    ra, rb = _root(parent, a), _root(parent, b)
    parent[max(ra, rb)] = min(ra, rb)


def _cut(groups: list[list[object]], k: int) -> list[list[object]]:
    """Runs of ``k`` inside each group, then runs of ``k`` of what the groups left over."""
    runs, rest = [], []
    for g in groups:
        whole = len(g) // k * k
        runs += [g[i:i + k] for i in range(0, whole, k)]
        rest += g[whole:]
    return runs + [rest[i:i + k] for i in range(0, len(rest) // k * k, k)]


def pack(topology: Topology, ranks: int, *, cuda_visible_devices: str | None = None,
         limit: int | None = None) -> tuple[Slot, ...]:
    """The slots for jobs of ``ranks`` ranks (at most ``limit``); a job larger than the node is a PlanError."""
    by_id = {c.id: c for c in topology.cpus}
    usable = topology.usable_cpus
    gpus = visible_gpus(topology, cuda_visible_devices, "PCI_BUS_ID")
    if gpus:
        if ranks > len(gpus):
            raise PlanError(f"bad nproc_per_node {ranks} for a job of a sweep: this node has {len(gpus)} visible GPUs; "
                            f"expected at most {len(gpus)}")
        runs: list[list[Gpu]] = _cut(_groups(topology, gpus), ranks)  # type: ignore[arg-type,assignment]
        homes = [run[0].numa_node for run in runs]
        nearest = {id(g): c for g, c in zip(topology.gpus, gpu_nics(topology))}
        slots = []
        for home in dict.fromkeys(homes):
            mine = [i for i, h in enumerate(homes) if h == home]
            pool = [c for c in usable if by_id[c].numa_node == home] or list(usable)
            for i, share in zip(mine, _split(_cores(by_id, pool), len(mine))):
                nics = (nearest[id(g)] for g in runs[i])
                slots.append(Slot(i, tuple(g.index for g in runs[i]), tuple(sorted(c for core in share for c in core)),
                                  (home,) if home >= 0 else (), tuple(dict.fromkeys(c.nic.name for c in nics if c))))
        return tuple(sorted(slots, key=lambda s: s.index)[:limit])
    nodes: dict[int, list[int]] = {}
    for c in usable:
        nodes.setdefault(by_id[c].numa_node, []).append(c)
    cores = [_cores(by_id, cpus) for cpus in nodes.values()]
    if ranks > sum(map(len, cores)):
        raise PlanError(f"bad nproc_per_node {ranks} for a job of a sweep: this node has {sum(map(len, cores))} usable "
                        f"cores and no visible GPU; expected at most {sum(map(len, cores))}")
    out = []
    for i, run in enumerate(_cut(cores, ranks)):  # type: ignore[arg-type]
        cpus = tuple(sorted(c for core in run for c in core))  # type: ignore[attr-defined]
        out.append(Slot(i, (), cpus, tuple(sorted({by_id[c].numa_node for c in cpus if by_id[c].numa_node >= 0}))))
    return tuple(out[:limit])


def slot_topology(topology: Topology, slot: Slot) -> Topology:
    """The node as a job confined to ``slot`` sees it: only the slot's CPUs allowed."""
    allowed = set(slot.cpus)
    return replace(topology, cpus=tuple(replace(c, allowed=c.allowed and c.id in allowed) for c in topology.cpus))
