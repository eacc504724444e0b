"""Terminal view of a :class:`Topology` (``numarun topo``), rendered to a string with rich (pure).

A GPU's "nearest NIC" is the one the plan gives that GPU's rank (:func:`numarun.plan.nic.gpu_nics`),
so ``numarun topo`` and ``numarun plan`` name the same NIC.
"""

from __future__ import annotations

import logging

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ..cpuset import format_list
from ..plan.nic import gpu_nics, usable_nics
from ..tables import render
from ..topology.model import Topology, physical_cores

log = logging.getLogger(__name__)

NO_GPU_LINE = "no GPUs found (NVML unavailable, no GPU PCI devices in sysfs)"


def gib(nbytes: int) -> str:
    """``68719476736`` -> ``"64.0 GiB"``; ``"?"`` when unknown (0)."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes > 0 else "?"


def nic_cells(topology: Topology) -> list[str]:
    """Each GPU's "nearest NIC" cell: ``mlx5_0 (PXB)``, ``unknown`` when nothing links it to a usable NIC,
    ``-`` when no NIC is usable."""
    usable = bool(usable_nics(topology))
    cells = []
    for pos, choice in enumerate(gpu_nics(topology)):
        if choice is None:
            cells.append("unknown" if usable else "-")
            continue
        code = topology.gpu_nic_link(pos, choice.position)
        cells.append(choice.nic.name + (f" ({code})" if code else ""))
    return cells


def cpu_summary(topology: Topology) -> dict[str, int | bool]:
    """Packages, cores (SMT sibling sets, as hwloc counts), PUs and SMT over online CPUs, offline and
    disallowed apart, and the same counts over usable CPUs (``usable_*``, what hwloc shows by default)."""
    online = [c for c in topology.cpus if c.online]
    usable = [c for c in online if c.allowed]
    cores = physical_cores(online)
    usable_cores = physical_cores(usable)
    return {
        "packages": len({c.package for c in online}),
        "cores": len(cores),
        "pus": len(online),
        "smt": any(len(core) > 1 for core in cores),
        "offline": len(topology.cpus) - len(online),
        "disallowed": len(online) - len(usable),
        "usable_packages": len({c.package for c in usable}),
        "usable_cores": len(usable_cores),
        "usable_pus": len(usable),
        "usable_smt": any(len(core) > 1 for core in usable_cores),
    }


def no_gpu_reason(topology: Topology) -> str:
    kind = (topology.source or "").split(":", 1)[0]
    if kind in ("hwloc", "nvidia-smi"):
        return f"no GPUs found (the {'hwloc XML' if kind == 'hwloc' else 'nvidia-smi text'} lists no GPU)"
    if topology.gpu_source in ("none", "", "nvml", "sysfs"):
        return NO_GPU_LINE
    return f"no GPUs found (GPU source: {topology.gpu_source})"


def _table(title: str, *columns: str, right: tuple[str, ...] = ()) -> Table:
    # min_width keeps a narrow table (one GPU, one NIC) from wrapping its own title
    table = Table(title=title, title_justify="left", min_width=len(title) + 2)
    for col in columns:
        table.add_column(col, justify="right" if col in right else "left")
    return table


def _speed(mbps: int) -> str:
    if mbps <= 0:
        return "?"
    return f"{mbps / 1000:g} Gb/s" if mbps >= 1000 else f"{mbps} Mb/s"


def render_text(
    topology: Topology, *, width: int = 120, color: bool = False, snapshot: str | None = None, container: str = ""
) -> str:
    """The whole ``numarun topo`` view (fixed ``width``: stable output). ``snapshot``: the JSON file read
    (its recorded source is where it was captured); ``container``: the runtime the machine is seen from."""
    items: list[RenderableType] = []
    t = topology

    header = Text()
    header.append(f"host: {t.hostname or '?'}", style="bold")
    source = f"snapshot {snapshot} (recorded from {t.source or '?'})" if snapshot else (t.source or "?")
    header.append(f"   source: {source}   GPU source: {t.gpu_source or 'none'}")
    if container:
        header.append(f"   container: {container}")
    items.append(header)
    if not t.gpus:
        items.append(no_gpu_reason(t))

    numa = _table("NUMA nodes", "node", "CPUs", "allowed CPUs", "memory", "kind", "distances", right=("node", "memory"))
    allowed_by_id = {c.id for c in t.cpus if c.online and c.allowed}
    for n in t.numa_nodes:
        kind = "memory-only" if n.memory_only else "cpu+mem"
        if t.allowed_mems and n.id not in t.allowed_mems:
            kind += " (mem disallowed)"
        numa.add_row(
            str(n.id),
            format_list(n.cpus) or "-",
            format_list(c for c in n.cpus if c in allowed_by_id) or "-",
            gib(n.memory_bytes),
            kind,
            " ".join(str(d) for d in n.distances) or "?",
        )
    if not t.numa_nodes:
        numa.add_row("-", "-", "-", "-", "-", "-")
    items.append(numa)

    s = cpu_summary(t)
    items.append(
        f"packages: {s['packages']}   cores: {s['cores']}   PUs: {s['pus']}   SMT: {'yes' if s['smt'] else 'no'}   "
        f"offline CPUs: {s['offline']}   disallowed CPUs: {s['disallowed']}"
    )
    if s["disallowed"]:
        items.append(f"usable: {s['usable_cores']} cores, {s['usable_pus']} PUs in {s['usable_packages']} packages")
    offline = [c.id for c in t.cpus if not c.online]
    if offline:
        items.append(f"offline: {format_list(offline)}")

    if t.gpus:
        gt = _table(
            "GPUs",
            "GPU",
            "name",
            "bus id",
            "NUMA",
            "CPU affinity",
            "memory",
            "nearest NIC",
            right=("GPU", "NUMA", "memory"),
        )
        for g, nic_cell in zip(t.gpus, nic_cells(t)):
            numa_cell = (str(g.numa_node) if g.numa_node >= 0 else "unknown") + (
                f" (mem node {g.memory_numa_node})" if g.memory_numa_node >= 0 else ""
            )
            gt.add_row(
                str(g.index),
                g.name or "?",
                g.pci_bus_id or "?",
                numa_cell,
                format_list(g.cpu_affinity) or "?",
                gib(g.memory_bytes),
                nic_cell,
            )
        items.append(gt)
        # GPU x GPU and GPU x NIC apart, so that neither is squeezed on a box with many NICs
        matrices = (
            [("GPU links", [f"GPU{g.index}" for g in t.gpus], lambda i, j: t.gpu_links[i][j])] if t.gpu_links else []
        )
        if t.nics:
            matrices.append(("GPU to NIC links", [nic.name for nic in t.nics], t.gpu_nic_link))
        for title, names, cell in matrices:
            lt = _table(title, "")
            for name in names:
                lt.add_column(name, justify="center", no_wrap=True)
            for i, g in enumerate(t.gpus):
                lt.add_row(f"GPU{g.index}", *((cell(i, j) or "?") for j in range(len(names))))
            items.append(lt)
        if matrices:
            items += [
                "legend: X self, NV# NVLink (# links), PIX one PCIe switch, PXB several switches,",
                "        PHB host bridge, NODE same NUMA node, SYS across sockets, ? unknown",
            ]

    if t.nics:
        nt = _table("NICs", "NIC", "kind", "netdevs", "bus id", "NUMA", "speed", "ports", right=("NUMA", "speed"))
        for nic in t.nics:
            nt.add_row(
                nic.name,
                nic.kind.value,
                ",".join(nic.netdevs) or "-",
                nic.pci_bus_id or "-",
                str(nic.numa_node) if nic.numa_node >= 0 else "unknown",
                _speed(nic.speed_mbps),
                " ".join(f"{p.number}:{p.state or '?'}" for p in nic.ports) or "-",
            )
        items.append(nt)
    else:
        items.append("no NICs found")

    if t.notes:
        items += ["notes:", *(f"  - {note}" for note in t.notes)]
    return render(*items, width=width, color=color)
