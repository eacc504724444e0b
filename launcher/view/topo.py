"""Terminal view of a :class:`Topology` (``numarun topo``), rendered to a string with rich.

A GPU's "nearest NIC" is the NIC the plan gives the rank of that GPU (:func:`numarun.plan.nic.gpu_nics`:
closest link, then NUMA node, rails spread over GPUs, down ports left out), so ``numarun topo``
and ``numarun plan`` name the same NIC.

Pure: no I/O beyond an in-memory buffer, so tests can check the text.
"""

from __future__ import annotations

import io
import logging

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..cpuset import format_list
from ..plan.nic import gpu_nics, usable_nics
from ..topology.model import Gpu, Topology, physical_cores

log = logging.getLogger(__name__)

NO_GPU_LINE = "no GPUs found (NVML unavailable, no GPU PCI devices in sysfs)"


def gib(nbytes: int) -> str:
    """``68719476736`` -> ``"64.0 GiB"``; ``"?"`` when unknown (0)."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes > 0 else "?"


def nic_cells(topology: Topology) -> list[str]:
    """The "nearest NIC" cell of each GPU: ``mlx5_0 (PXB)``; ``unknown`` when nothing is known
    about how the GPU reaches the usable NICs; ``-`` when no NIC is usable (none, or ports down)."""
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
    """Counts for the summary line, over online CPUs (a core = one SMT sibling set, as hwloc
    counts them): packages, cores, PUs, SMT; offline and disallowed CPUs apart; and the
    same counts over the usable (online and allowed) CPUs, which is what hwloc shows by default."""
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
    """The plain sentence shown when a topology has no GPUs (naming where they were looked for)."""
    kind = (topology.source or "").split(":", 1)[0]
    if kind == "hwloc":
        return "no GPUs found (the hwloc XML lists no GPU)"
    if kind == "nvidia-smi":
        return "no GPUs found (the nvidia-smi text lists no GPU)"
    if topology.gpu_source in ("none", "", "nvml", "sysfs"):
        return NO_GPU_LINE
    return f"no GPUs found (GPU source: {topology.gpu_source})"


def _table(title: str) -> Table:
    # min_width keeps a narrow table (one GPU, one NIC) from wrapping its own title
    return Table(title=title, title_justify="left", min_width=len(title) + 2)


def _speed(mbps: int) -> str:
    if mbps <= 0:
        return "?"
    return f"{mbps / 1000:g} Gb/s" if mbps >= 1000 else f"{mbps} Mb/s"


def _gpu_label(g: Gpu) -> str:
    return f"GPU{g.index}"


def render_text(topology: Topology, *, width: int = 120, color: bool = False, snapshot: str | None = None,
                container: str = "") -> str:
    """The whole ``numarun topo`` view as one string (fixed ``width`` so output is stable).

    ``snapshot``: the JSON file the topology was read from (its recorded source is where
    it was captured, not where it is read now). ``container``: the runtime the machine is seen from.
    """
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
        no_color=not color, highlight=False, soft_wrap=False, emoji=False, markup=False,
    )
    t = topology

    header = Text()
    header.append(f"host: {t.hostname or '?'}", style="bold")
    source = f"snapshot {snapshot} (recorded from {t.source or '?'})" if snapshot else (t.source or "?")
    header.append(f"   source: {source}   GPU source: {t.gpu_source or 'none'}")
    if container:
        header.append(f"   container: {container}")
    console.print(header)
    if not t.gpus:
        console.print(no_gpu_reason(t))

    # --- NUMA nodes ---
    numa = _table("NUMA nodes")
    numa.add_column("node", justify="right")
    numa.add_column("CPUs")
    numa.add_column("allowed CPUs")
    numa.add_column("memory", justify="right")
    numa.add_column("kind")
    numa.add_column("distances")
    allowed_by_id = {c.id for c in t.cpus if c.online and c.allowed}
    for n in t.numa_nodes:
        mem_allowed = not t.allowed_mems or n.id in t.allowed_mems
        kind = "memory-only" if n.memory_only else "cpu+mem"
        if not mem_allowed:
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
    console.print(numa)

    s = cpu_summary(t)
    console.print(
        f"packages: {s['packages']}   cores: {s['cores']}   PUs: {s['pus']}   "
        f"SMT: {'yes' if s['smt'] else 'no'}   offline CPUs: {s['offline']}   "
        f"disallowed CPUs: {s['disallowed']}"
    )
    if s["disallowed"]:
        console.print(f"usable: {s['usable_cores']} cores, {s['usable_pus']} PUs in {s['usable_packages']} packages")
    offline = [c.id for c in t.cpus if not c.online]
    if offline:
        console.print(f"offline: {format_list(offline)}")

    # --- GPUs ---
    if t.gpus:
        gt = _table("GPUs")
        for col in ("GPU", "name", "bus id", "NUMA", "CPU affinity", "memory", "nearest NIC"):
            gt.add_column(col, justify="right" if col in ("GPU", "NUMA", "memory") else "left")
        for g, nic_cell in zip(t.gpus, nic_cells(t)):
            numa_cell = str(g.numa_node) if g.numa_node >= 0 else "unknown"
            if g.memory_numa_node >= 0:
                numa_cell += f" (mem node {g.memory_numa_node})"
            gt.add_row(
                str(g.index), g.name or "?", g.pci_bus_id or "?", numa_cell,
                format_list(g.cpu_affinity) or "?", gib(g.memory_bytes), nic_cell,
            )
        console.print(gt)

        # --- link matrices, nvidia-smi codes: GPU x GPU, then GPU x NIC (kept apart so
        # neither gets squeezed on a box with many NICs) ---
        if t.gpu_links:
            lt = _table("GPU links")
            lt.add_column("")
            for g in t.gpus:
                lt.add_column(_gpu_label(g), justify="center", no_wrap=True)
            for i, g in enumerate(t.gpus):
                lt.add_row(_gpu_label(g), *((t.gpu_links[i][j] or "?") for j in range(len(t.gpus))))
            console.print(lt)
        if t.nics:
            nl = _table("GPU to NIC links")
            nl.add_column("")
            for nic in t.nics:
                nl.add_column(nic.name, justify="center", no_wrap=True)
            for i, g in enumerate(t.gpus):
                nl.add_row(_gpu_label(g), *((t.gpu_nic_link(i, k) or "?") for k in range(len(t.nics))))
            console.print(nl)
        if t.gpu_links or t.nics:
            console.print("legend: X self, NV# NVLink (# links), PIX one PCIe switch, PXB several switches,")
            console.print("        PHB host bridge, NODE same NUMA node, SYS across sockets, ? unknown")

    # --- NICs ---
    if t.nics:
        nt = _table("NICs")
        for col in ("NIC", "kind", "netdevs", "bus id", "NUMA", "speed", "ports"):
            nt.add_column(col, justify="right" if col in ("NUMA", "speed") else "left")
        for nic in t.nics:
            nt.add_row(
                nic.name, nic.kind.value, ",".join(nic.netdevs) or "-", nic.pci_bus_id or "-",
                str(nic.numa_node) if nic.numa_node >= 0 else "unknown",
                _speed(nic.speed_mbps),
                " ".join(f"{p.number}:{p.state or '?'}" for p in nic.ports) or "-",
            )
        console.print(nt)
    else:
        console.print("no NICs found")

    if t.notes:
        console.print("notes:")
        for note in t.notes:
            console.print(f"  - {note}")
    return buf.getvalue()
