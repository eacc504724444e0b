"""A LaunchPlan as a rich table (what ``numarun plan`` prints), warnings below it."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table

from ..cpuset import format_list
from ..plan.model import LaunchPlan, RankBinding


def _nic_cell(r: RankBinding) -> str:
    """The rank's NIC, with the port it is pinned to (``mlx5_0:1``)."""
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


# The variables that can name a rank's own NIC: NCCL's (only with --nic-policy per-rank), then
# the transports that take one device per process.
_NCCL_VARS = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME")
_DEVICE_VARS = ("UCX_NET_DEVICES", "GLOO_SOCKET_IFNAME")


def nic_lines(plan: LaunchPlan) -> list[str]:
    """``NCCL_IB_HCA==mlx5_0,... (every rank)`` and which per-rank variables carry the NIC column."""
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
