"""A LaunchPlan as a rich table (what ``numarun plan`` prints), warnings below it."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table

from ..cpuset import format_list
from ..plan.model import LaunchPlan, RankBinding


def _nic_cell(r: RankBinding) -> str:
    """The rank's NIC, with the port UCX is given (``mlx5_0:1``)."""
    return r.env.get("UCX_NET_DEVICES") or r.nic or "-"


def plan_table(plan: LaunchPlan) -> Table:
    """One row per local rank: GPU, bus id, NUMA node, CPUs, memory nodes, NIC, OMP threads, fallback."""
    ranks = f"{plan.nproc_per_node} rank" + ("" if plan.nproc_per_node == 1 else "s")
    title = f"{plan.hostname or 'this node'}: {ranks}, binding {plan.binding.value}, memory {plan.mem_policy.value}"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (
        ("rank", "right"), ("GPU", "left"), ("bus id", "left"), ("NUMA", "right"), ("CPUs", "left"),
        ("mems", "left"), ("NIC", "left"), ("OMP", "right"), ("fallback", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in plan.ranks:
        if r.gpu is not None:
            gpu = f"{r.gpu.index} (cuda:{r.gpu.cuda_index})"
            bus = r.gpu.pci_bus_id or "-"
        else:
            gpu, bus = "-", "-"
        mems = format_list(r.mems) if r.mems else "-"
        if r.mems:
            mems = f"{mems} {r.mem_policy.value}"
        table.add_row(
            str(r.local_rank), gpu, bus, str(r.numa_node) if r.numa_node >= 0 else "?",
            format_list(r.cpus), mems, _nic_cell(r), r.env.get("OMP_NUM_THREADS", "(user)"), r.fallback or "",
        )
    return table


# Variables the plan sets for the NICs, shown under the table: the ones that name the node's
# NICs (the same in every rank) and the ones that name the rank's own NIC.
_NODE_NIC_VARS = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME")
_RANK_NIC_VARS = ("UCX_NET_DEVICES", "GLOO_SOCKET_IFNAME")


def nic_lines(plan: LaunchPlan) -> list[str]:
    """``NCCL_IB_HCA==mlx5_0,... (every rank)`` and which per-rank variables carry the NIC column."""
    lines = []
    for var in _NODE_NIC_VARS:
        values = list(dict.fromkeys(r.env[var] for r in plan.ranks if var in r.env))
        if len(values) == 1 and all(r.env.get(var) == values[0] for r in plan.ranks if r.gpu is not None):
            lines.append(f"{var}={values[0]} (every rank)")
        elif values:
            lines.append(f"{var}: one per rank (nic policy {plan.nic_policy.value})")
    per_rank = [v for v in _RANK_NIC_VARS if any(v in r.env for r in plan.ranks)]
    if per_rank:
        lines.append(f"{', '.join(per_rank)}: the rank's NIC")
    return lines


def render_plan(plan: LaunchPlan, *, width: int = 140, color: bool = False) -> str:
    """The table and the warnings as text; without colour it is stable (golden files)."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system="auto" if color else None, force_terminal=color, highlight=False, soft_wrap=False
    )
    console.print(plan_table(plan))
    for line in nic_lines(plan):
        console.print(line, markup=False)
    for w in plan.warnings:
        console.print(f"warning: {w}", markup=False)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
