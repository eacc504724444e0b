"""A LaunchPlan as a rich table (what ``numarun plan`` prints), warnings below it."""

from __future__ import annotations

import collections

from rich import box
from rich.console import RenderableType
from rich.table import Table

from ..cpuset import format_list
from ..plan.model import LaunchPlan, MeshDim, MeshPlan, RankBinding
from ..tables import render


def _nic_cell(r: RankBinding) -> str:
    if r.nic is None:
        return "-"
    return f"{r.nic}:{r.nic_port}" if r.nic_port else r.nic


def plan_table(plan: LaunchPlan) -> Table:
    """One row per local rank: GPU, bus id, NUMA node, CPUs, memory nodes, NIC, OMP threads, fallback."""
    ranks = f"{plan.nproc_per_node} rank" + ("" if plan.nproc_per_node == 1 else "s")
    memory = f"not bound ({plan.mem_unbound})" if plan.mem_unbound else plan.mem_policy.value
    where = f" in a {plan.container} container" if plan.container else ""
    title = f"{plan.hostname or 'this node'}{where}: {ranks}, binding {plan.binding.value}, memory {memory}"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (
        ("rank", "right"),
        ("GPU", "left"),
        ("bus id", "left"),
        ("NUMA", "right"),
        ("CPUs", "left"),
        ("mems", "left"),
        ("NIC", "left"),
        ("OMP", "right"),
        ("fallback", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in plan.ranks:
        gpu, bus = (f"{r.gpu.index} (cuda:{r.gpu.cuda_index})", r.gpu.pci_bus_id or "-") if r.gpu else ("-", "-")
        mems = f"{format_list(r.mems)} {r.mem_policy.value}" if r.mems else "-"
        table.add_row(
            str(r.local_rank),
            gpu,
            bus,
            str(r.numa_node) if r.numa_node >= 0 else "?",
            format_list(r.cpus),
            mems,
            _nic_cell(r),
            r.env.get("OMP_NUM_THREADS", "(user)"),
            r.fallback or "",
        )
    return table


_NCCL_VARS = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME")
_DEVICE_VARS = ("UCX_NET_DEVICES", "GLOO_SOCKET_IFNAME")


def nic_lines(plan: LaunchPlan) -> list[str]:
    """``NCCL_IB_HCA=mlx5_0,... (every rank)`` and which per-rank variables carry the NIC column."""
    lines = []
    if plan.nccl_nics is not None:
        lines.append(f"{plan.nccl_nics.variable}={plan.nccl_nics.value} (every rank)")
    for var in _NCCL_VARS:
        if any(var in r.nic_variables for r in plan.ranks):
            lines.append(f"{var}: one per rank (nic policy {plan.nic_policy.value})")
    per_rank = [v for v in _DEVICE_VARS if any(v in r.nic_variables for r in plan.ranks)]
    if per_rank:
        lines.append(f"{', '.join(per_rank)}: the rank's NIC")
    return lines


_PREPOSITIONS = {"PIX": "behind", "PXB": "behind", "PHB": "through", "NODE": "through"}


def _preposition(code: str) -> str:
    if code == "network":
        return "across the network"
    return f"{'on' if code.startswith('NV') else _PREPOSITIONS.get(code, 'across')} {code}"


def link_summary(links: tuple[str, ...]) -> str:
    """``("NV4", "NV4", "SYS")`` -> ``2 groups on NV4, 1 across SYS`` (slowest last)."""
    counts = collections.Counter(links)  # in first-seen order, as a dict
    return ", ".join(
        f"{n}{(' group' if n == 1 else ' groups') if i == 0 else ''} {_preposition(code)}"
        for i, (code, n) in enumerate(counts.items())
    )


def _cell(dim: MeshDim, plan: LaunchPlan) -> str:
    gpu = {r.local_rank: (str(r.gpu.index) if r.gpu else "-") for r in plan.ranks}
    if dim.reach == "nodes":
        return "each rank with its peers on the other nodes"
    cells = [f"{','.join(map(str, g))}→{','.join(gpu.get(r, '-') for r in g)}" for g in dim.groups]
    text = "  ".join(cells)
    return text + (" (+ other nodes)" if dim.reach == "split" else "")


def mesh_table(plan: LaunchPlan, mesh: MeshPlan) -> Table:
    """One row per dimension: its groups (local ranks → GPUs), their slowest links, and today's order's."""
    where = f"{mesh.nnodes} nodes" if mesh.nnodes > 1 else "elastic nodes" if mesh.nnodes == 0 else "1 node"
    title = f"layout {mesh.spec} on {where} (search: {mesh.search})"
    if mesh.cuda_visible_devices:
        title += f"; every rank sees CUDA_VISIBLE_DEVICES={mesh.cuda_visible_devices}"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (
        ("dim", "left"),
        ("size", "right"),
        ("groups (local ranks→GPUs)", "left"),
        ("slowest link", "left"),
        ("default order", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for d in mesh.dims:
        size = "rest" if d.size == -1 else str(d.size)
        table.add_row(d.name, size, _cell(d, plan), link_summary(d.links), link_summary(d.default_links))
    return table


def mesh_lines(mesh: MeshPlan) -> list[str]:
    """``tp: 4 groups on NV4; default order: 4 groups across SYS`` for each dimension inside the node."""
    return [
        f"{d.name}: {link_summary(d.links)}; default order: {link_summary(d.default_links)}"
        for d in mesh.dims
        if d.reach == "node" and d.size > 1
    ]


def render_plan(plan: LaunchPlan, *, width: int = 140, color: bool = False) -> str:
    """The table and the warnings as text; without colour it is stable (golden files)."""
    items: list[RenderableType] = [plan_table(plan), *nic_lines(plan)]
    if plan.mesh is not None:
        items += [mesh_table(plan, plan.mesh), *mesh_lines(plan.mesh)]
    return render(*items, *(f"warning: {w}" for w in plan.warnings), width=width, color=color)
