"""A self-contained SVG picture of a :class:`Topology`, and of a :class:`LaunchPlan` on it (pure; docs/design-notes.md).

Stable element classes for tools and tests: ``pu``, ``core``, ``core-rank``, ``llc``, ``offline-cpus``, ``numa``,
``package``, ``gpu``, ``nic``, ``link``, ``link-all``, ``link-matrix``, ``link-label``, ``legend-rank``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from ..cpuset import format_list
from ..plan.model import LaunchPlan, RankBinding
from ..topology.model import Cpu, Gpu, Nic, NumaNode, Topology, physical_cores
from .svg_doc import Canvas, clip, num

log = logging.getLogger(__name__)

PU_W, PU_H = 30, 18
GAP = 4
PAD = 6
TITLE_H = 18
DEV_W, DEV_H = 176, 40
DEV_CHARS = 25  # of a device label, fit in its box
CORES_PER_ROW = 8
MAX_WIDTH = 1800
RANK_H = 12  # the rank-number line under a core's PUs
MAX_ARCS = 12  # more NVLink pairs (not all alike) are a matrix
LINK_STEP = 90  # between GPUs in the link panel
NODE_W, NODE_H = 60, 22  # a GPU in the link panel

RANK_COLOURS: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#9edae5",
    "#dbdb8d",
    "#393b79",
)

_STYLE = """.machine > rect.frame { fill: #ffffff; stroke: #000; }
.package > rect.frame { fill: #dfe8d6; stroke: #444; }
.numa > rect.frame { fill: #efe8b8; stroke: #444; }
.numa.memory-only > rect.frame { fill: #f5f0d8; stroke: #444; stroke-dasharray: 4 2; }
.unknown-numa > rect.frame { fill: #f0f0f0; stroke: #888; stroke-dasharray: 4 2; }
.core > rect.frame { fill: #c8c8c8; stroke: #555; }
rect.pu { fill: #ffffff; stroke: #333; }
rect.pu.offline { fill: #9a9a9a; }
rect.pu.disallowed { fill: #dcdcdc; stroke: #aaa; }
text.pu-id.greyed { fill: #777; }
text.pu-id.on-dark { fill: #fff; }
rect.gpu { fill: #c9f2c9; stroke: #2a7a2a; }
rect.nic { fill: #cfe3ff; stroke: #24588f; }
rect.nic.down { fill: #eeeeee; stroke: #888; stroke-dasharray: 4 2; }
rect.nic.nccl { stroke-width: 3; }
.llc > rect.frame { fill: #e4dcc4; stroke: #8a7a50; }
.offline-cpus > rect.frame { fill: #e8e8e8; stroke: #999; stroke-dasharray: 3 2; }
text.core-rank { font-size: 10px; font-weight: bold; }
text.nccl-tag { font-size: 9px; fill: #24588f; font-weight: bold; }
path.link-all { fill: none; stroke: #76b900; stroke-width: 3; }
text.link-cell { font-size: 10px; }
rect.gpu-node { fill: #c9f2c9; stroke: #2a7a2a; }
path.link { fill: none; stroke: #76b900; stroke-width: 2; stroke-opacity: 0.8; }
text.link-label { fill: #3d6000; font-weight: bold; }
rect.link-label-bg { fill: #fafff0; }
rect.links-frame { fill: #fafff0; stroke: #76b900; }
.legend-rank > rect { stroke: #000; }
"""


def rank_colour(local_rank: int) -> str:
    return RANK_COLOURS[local_rank % len(RANK_COLOURS)]


def _dark(colour: str) -> bool:
    """True when black text would be hard to read on ``colour`` (``#rrggbb``)."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b < 100


@dataclass
class _Box:
    """A laid-out piece: its size, and how to emit its SVG at an absolute position."""

    w: float
    h: float
    draw: Callable[[float, float, Canvas], None]


@dataclass
class _Ctx:
    topology: Topology
    cpu_ranks: dict[int, list[int]] = field(default_factory=dict)
    gpu_ranks: dict[int, list[int]] = field(default_factory=dict)
    planned: bool = False
    nccl_nics: frozenset[str] = frozenset()


def _flow(children: Sequence[_Box], max_w: float) -> tuple[float, float, list[tuple[float, float]]]:
    """Place children left to right, wrapping at ``max_w``; returns size and offsets."""
    offsets: list[tuple[float, float]] = []
    x = y = row_h = 0.0
    width = 0.0
    for c in children:
        if x > 0 and x + c.w > max_w:
            x, y = 0.0, y + row_h + GAP
            row_h = 0.0
        offsets.append((x, y))
        x += c.w + GAP
        row_h = max(row_h, c.h)
        width = max(width, x - GAP)
    return width, (y + row_h if children else 0.0), offsets


def _grid(children: Sequence[_Box], cols: int) -> tuple[float, float, list[tuple[float, float]]]:
    """Equal cells, ``cols`` per row (keeps cores aligned in columns)."""
    if not children:
        return 0.0, 0.0, []
    cw = max(c.w for c in children)
    ch = max(c.h for c in children)
    cols = max(1, min(cols, len(children)))
    rows = (len(children) + cols - 1) // cols
    offsets = [((i % cols) * (cw + GAP), (i // cols) * (ch + GAP)) for i in range(len(children))]
    return cols * cw + (cols - 1) * GAP, rows * ch + (rows - 1) * GAP, offsets


def _container(
    css: str,
    title: str,
    children: Sequence[_Box],
    *,
    devices: Sequence[_Box] = (),
    max_w: float = MAX_WIDTH,
    tooltip: str = "",
) -> _Box:
    """A titled frame holding children (in rows that wrap) and, below them, a row of devices."""
    cw, ch, coffs = _flow(children, max_w - 2 * PAD)
    title_w = len(title) * 7 + 2 * PAD
    dev_max = max(cw, title_w - 2 * PAD, min(len(devices), 4) * (DEV_W + GAP) - GAP)
    dw, dh, doffs = _flow(devices, dev_max)
    inner_w = max(cw, dw, title_w - 2 * PAD, 1.0)
    w = inner_w + 2 * PAD
    dev_y = TITLE_H + PAD + ch + (GAP * 2 if children and devices else 0)
    h = dev_y + dh + PAD

    def draw(x: float, y: float, out: Canvas) -> None:
        with out.group(cls=css, tip=tooltip):
            out.rect(x, y, w, h, cls="frame", rx=3)
            out.text(x + PAD, y + 13, title, cls="title")
            for c, (ox, oy) in zip(children, coffs):
                c.draw(x + PAD + ox, y + TITLE_H + PAD + oy, out)
            for d, (ox, oy) in zip(devices, doffs):
                d.draw(x + PAD + ox, y + dev_y + oy, out)

    return _Box(w, h, draw)


def _pu_box(ctx: _Ctx, cpu: Cpu) -> _Box:
    ranks = ctx.cpu_ranks.get(cpu.id, [])

    def draw(x: float, y: float, out: Canvas) -> None:
        cls, state = (
            ("pu offline", "offline")
            if not cpu.online
            else ("pu disallowed", "not allowed")
            if not cpu.allowed
            else ("pu", "online")
        )
        out.rect(
            x,
            y,
            PU_W,
            PU_H,
            cls=cls,
            data={"cpu": cpu.id, "ranks": _ranks(ranks)},
            tip=f"CPU {cpu.id} ({state})" + (f", rank {format_list(ranks)}" if ranks else ""),
            style=f"fill:{rank_colour(ranks[0])}" if len(ranks) == 1 else None,
        )
        if len(ranks) > 1:  # shared CPU: one stripe per rank
            sw = PU_W / len(ranks)
            for i, r in enumerate(ranks):
                out.rect(x + i * sw, y, sw, PU_H, cls="pu-share", data={"rank": r}, style=f"fill:{rank_colour(r)}")
        greyed = " greyed" if not (cpu.online and cpu.allowed) else ""
        if len(ranks) == 1 and _dark(rank_colour(ranks[0])):
            greyed += " on-dark"
        out.text(x + PU_W / 2, y + 13, cpu.id, cls=f"pu-id{greyed}", anchor="middle")

    return _Box(PU_W, PU_H, draw)


def _core_box(ctx: _Ctx, cpus: Sequence[Cpu]) -> _Box:
    pus = [_pu_box(ctx, c) for c in cpus]
    w = len(pus) * PU_W + (len(pus) - 1) * 2 + 6
    h = PU_H + 6 + (RANK_H if ctx.planned else 0)
    ranks = sorted({r for c in cpus for r in ctx.cpu_ranks.get(c.id, [])})
    label = clip("r" + format_list(ranks), max(1, int((w - 4) / 6.2))) if ranks else ""

    def draw(x: float, y: float, out: Canvas) -> None:
        with out.group(cls="core", data={"cpus": ",".join(str(c.id) for c in cpus), "ranks": _ranks(ranks)}):
            out.rect(x, y, w, h, cls="frame", rx=2)
            for i, p in enumerate(pus):
                p.draw(x + 3 + i * (PU_W + 2), y + 3, out)
            if label:
                out.text(x + w / 2, y + PU_H + 3 + 10, label, cls="core-rank", anchor="middle")

    return _Box(w, h, draw)


def _ranks(ranks: Sequence[int]) -> str | None:
    """A box's ``data-ranks``: the ranks on it, none when no rank is."""
    return ",".join(map(str, ranks)) or None


def _plain(children: Sequence[_Box], cols: int) -> _Box:
    """Children in a grid, without a frame."""
    w, h, offs = _grid(children, cols)

    def draw(x: float, y: float, out: Canvas) -> None:
        for c, (ox, oy) in zip(children, offs):
            c.draw(x + ox, y + oy, out)

    return _Box(w, h, draw)


def _cpu_boxes(ctx: _Ctx, cpus: Sequence[Cpu]) -> list[_Box]:
    """The CPUs of one NUMA node (or package): cores, in LLC boxes when there are several, then offline CPUs."""
    cores = physical_cores(cpus)
    llcs: dict[int, list[tuple[Cpu, ...]]] = {}
    for core in cores:
        llcs.setdefault(core[0].llc, []).append(core)
    out: list[_Box] = []
    if len(llcs) >= 2 and all(k >= 0 for k in llcs):
        for members in llcs.values():
            ids = [c.id for core in members for c in core]
            boxes = [_core_box(ctx, core) for core in members]
            out.append(
                _container(
                    "llc",
                    f"LLC {format_list(ids)}",
                    [_plain(boxes, CORES_PER_ROW // 2)],
                    tooltip=f"last-level cache shared by CPUs {format_list(ids)}",
                )
            )
    elif cores:
        out.append(_plain([_core_box(ctx, core) for core in cores], CORES_PER_ROW))
    offline = [c for c in sorted(cpus, key=lambda c: c.id) if not c.online]
    if offline:
        out.append(_container("offline-cpus", "offline", [_plain([_pu_box(ctx, c) for c in offline], CORES_PER_ROW)]))
    return out


def _short_model(name: str) -> str:
    return re.sub(r"^(NVIDIA|AMD) ", "", name)


def _gpu_box(ctx: _Ctx, pos: int, g: Gpu) -> _Box:
    ranks = ctx.gpu_ranks.get(pos, [])
    name = g.name or g.vendor.upper()
    line2 = g.pci_bus_id + (f" mem@{g.memory_numa_node}" if g.memory_numa_node >= 0 else "")
    if ranks:
        line2 = f"rank {format_list(ranks)} {g.pci_bus_id}"

    def draw(x: float, y: float, out: Canvas) -> None:
        out.rect(
            x,
            y,
            DEV_W,
            DEV_H,
            cls="gpu",
            data={"gpu": g.index, "ranks": _ranks(ranks)},
            tip=f"GPU{g.index} {name} {g.pci_bus_id}",
            rx=3,
            style=_rank_stroke(ranks),
        )
        out.text(x + 4, y + 15, f"GPU{g.index} {_short_model(name)}"[:DEV_CHARS], cls="title")
        out.text(x + 4, y + 31, line2[:DEV_CHARS])

    return _Box(DEV_W, DEV_H, draw)


def _nic_box(ctx: _Ctx, n: Nic) -> _Box:
    cls = "nic" + ("" if n.port_up else " down") + (" nccl" if n.name in ctx.nccl_nics else "")

    def draw(x: float, y: float, out: Canvas) -> None:
        ports = ", ".join(f"port {p.number} {p.state or '?'}" for p in n.ports)
        tip = f"{n.name} {n.kind.value} {n.pci_bus_id} {ports}".strip()
        out.rect(x, y, DEV_W, DEV_H, cls=cls, data={"nic": n.name}, tip=tip, rx=3)
        speed = f" {n.speed_mbps // 1000}G" if n.speed_mbps >= 1000 else ""
        line2 = ("" if n.port_up else "port down ") + (",".join(n.netdevs) or n.pci_bus_id) + speed
        out.text(x + 4, y + 15, (n.name + " " + n.kind.value)[:DEV_CHARS], cls="title")
        out.text(x + 4, y + 31, line2[:DEV_CHARS])
        if n.name in ctx.nccl_nics:
            out.text(x + DEV_W - 4, y + 12, "NCCL", cls="nccl-tag", anchor="end")

    return _Box(DEV_W, DEV_H, draw)


def _devices_on(ctx: _Ctx, node_ids: Container[int]) -> list[_Box]:
    """The GPUs, then the NICs, of NUMA nodes ``node_ids``."""
    t = ctx.topology
    gpus = [_gpu_box(ctx, i, g) for i, g in enumerate(t.gpus) if g.numa_node in node_ids]
    return gpus + [_nic_box(ctx, n) for n in t.nics if n.numa_node in node_ids]


def _node_title(n: NumaNode) -> str:
    size = f" ({n.memory_bytes / 2**30:.0f} GiB)" if n.memory_bytes > 0 else ""
    return f"NUMA node {n.id}{size}" + (" memory only" if n.memory_only else "")


def _layout(ctx: _Ctx) -> _Box:
    t = ctx.topology
    node_ids = {n.id for n in t.numa_nodes}
    cpu_node = {cid: n.id for n in t.numa_nodes for cid in n.cpus}
    cpus_by_node: dict[int, list[Cpu]] = {}
    for cpu in t.cpus:
        cpus_by_node.setdefault(cpu_node.get(cpu.id, -1), []).append(cpu)

    cpu_nodes = [n for n in t.numa_nodes if cpus_by_node.get(n.id)]
    mem_nodes = [n for n in t.numa_nodes if not cpus_by_node.get(n.id)]
    # offline CPUs have no package (-1): they follow their node, never make a package
    packages = sorted({c.package for c in t.cpus if c.online}) or [-1]
    node_pkgs = {n.id: {c.package for c in cpus_by_node[n.id] if c.online} or {packages[0]} for n in cpu_nodes}
    nodes_in_packages = all(len(p) == 1 for p in node_pkgs.values())

    top: list[_Box] = []
    unknown_cpus = cpus_by_node.get(-1, [])
    if nodes_in_packages:
        for p in packages:
            inner = [
                _container(
                    "numa",
                    _node_title(n),
                    _cpu_boxes(ctx, cpus_by_node[n.id]),
                    devices=_devices_on(ctx, {n.id}),
                    tooltip=f"NUMA node {n.id}: CPUs {format_list(n.cpus)}",
                )
                for n in cpu_nodes
                if p in node_pkgs[n.id]
            ]
            pkg_unknown = [
                c for c in unknown_cpus if c.package == p or (p == packages[0] and c.package not in packages)
            ]
            if pkg_unknown:
                inner.append(_container("unknown-numa", "CPUs without NUMA node", _cpu_boxes(ctx, pkg_unknown)))
            top.append(_container("package", f"Package {p}", inner, max_w=MAX_WIDTH - 2 * PAD))
    else:
        for n in cpu_nodes:
            inner = [
                _container(
                    "package",
                    f"Package {p}",
                    _cpu_boxes(ctx, [c for c in cpus_by_node[n.id] if c.online and c.package == p]),
                )
                for p in sorted(node_pkgs[n.id])
            ]
            inner += _cpu_boxes(ctx, [c for c in cpus_by_node[n.id] if not c.online])
            top.append(
                _container(
                    "numa",
                    _node_title(n),
                    inner,
                    devices=_devices_on(ctx, {n.id}),
                    max_w=MAX_WIDTH - 2 * PAD,
                )
            )
        if unknown_cpus:
            top.append(_container("unknown-numa", "CPUs without NUMA node", _cpu_boxes(ctx, unknown_cpus)))

    top += [_container("numa memory-only", _node_title(n), [], devices=_devices_on(ctx, {n.id})) for n in mem_nodes]

    stray = _devices_on(ctx, ({g.numa_node for g in t.gpus} | {n.numa_node for n in t.nics}) - node_ids)
    if stray:
        top.append(_container("unknown-numa", "unknown NUMA node", [], devices=stray))

    return _container("machine", f"Machine {t.hostname or '?'}", top)


def _code(t: Topology, i: int, j: int) -> str:
    """The link of GPUs ``i`` and ``j`` (positions); '' unknown."""
    return t.gpu_links[i][j] if i < len(t.gpu_links) and j < len(t.gpu_links[i]) else ""


def _nv_pairs(t: Topology) -> list[tuple[int, int, str]]:
    n = len(t.gpus)
    return [(i, j, _code(t, i, j)) for i in range(n) for j in range(i + 1, n) if _code(t, i, j).startswith("NV")]


def _links(ctx: _Ctx, x0: float, y0: float, out: Canvas) -> tuple[float, float]:
    """The NVLink panel (an arc per pair, one bus, or a matrix); returns its size, (0, 0) without NVLinks."""
    t = ctx.topology
    pairs = _nv_pairs(t)
    if not pairs:
        return 0.0, 0.0
    n = len(t.gpus)
    codes = {code for _, _, code in pairs}
    if n >= 3 and len(pairs) == n * (n - 1) // 2 and len(codes) == 1:
        return _links_all(ctx, codes.pop(), x0, y0, out)
    if len(pairs) > MAX_ARCS:
        return _links_matrix(ctx, x0, y0, out)
    arc_room = 26 + 22 * max(j - i for i, j, _ in pairs)
    base = y0 + TITLE_H + arc_room
    w = PAD * 2 + (n - 1) * LINK_STEP + NODE_W
    h = TITLE_H + arc_room + NODE_H + PAD
    with out.group(cls="links"):
        centre = _panel(out, "GPU links (NVLink)", x0, y0, w, h)
        for i, j, _ in pairs:
            ax, bx = centre(i), centre(j)
            apex = 12 + 22 * (j - i)
            # a quadratic curve peaks at half its control point's offset
            d = f"M{num(ax)},{num(base)} Q{num((ax + bx) / 2)},{num(base - 2 * apex)} {num(bx)},{num(base)}"
            out.path(d, cls="link", data={"a": t.gpus[i].index, "b": t.gpus[j].index})
        for i, j, code in pairs:  # labels above all arcs
            mx, my = (centre(i) + centre(j)) / 2, base - 12 - 22 * (j - i)
            lw = len(code) * 7 + 4
            out.rect(mx - lw / 2, my - 8, lw, 13, cls="link-label-bg")
            out.text(mx, my + 3, code, cls="link-label", anchor="middle")
        _gpu_nodes(ctx, centre, base, out)
    return w, h


def _panel(out: Canvas, title: str, x0: float, y0: float, w: float, h: float) -> Callable[[int], float]:
    """A link panel's frame and title; returns the x of the centre of GPU ``pos``."""
    out.rect(x0, y0, w, h, cls="links-frame", rx=3)
    out.text(x0 + PAD, y0 + 13, title, cls="title")
    return lambda pos: x0 + PAD + pos * LINK_STEP + NODE_W / 2


def _gpu_nodes(ctx: _Ctx, centre: Callable[[int], float], base: float, out: Canvas) -> None:
    for pos, g in enumerate(ctx.topology.gpus):
        style = _rank_stroke(ctx.gpu_ranks.get(pos, []))
        out.rect(
            centre(pos) - NODE_W / 2, base, NODE_W, NODE_H, cls="gpu-node", data={"gpu": g.index}, rx=3, style=style
        )
        out.text(centre(pos), base + 15, f"GPU{g.index}", anchor="middle")


def _rank_stroke(ranks: Sequence[int]) -> str | None:
    """A GPU's box outlined in the colour of its (first) rank."""
    return f"stroke:{rank_colour(ranks[0])};stroke-width:3" if ranks else None


def _links_all(ctx: _Ctx, code: str, x0: float, y0: float, out: Canvas) -> tuple[float, float]:
    """Every pair joined by the same link (NVSwitch): one bus over all GPUs, one label."""
    n = len(ctx.topology.gpus)
    w = max(PAD * 2 + (n - 1) * LINK_STEP + NODE_W, 260)
    bus_y = y0 + TITLE_H + 12
    base = bus_y + 16
    h = base - y0 + NODE_H + PAD
    with out.group(cls="links"):
        centre = _panel(out, f"GPU links: all pairs {code}" + (" (NVSwitch)" if n > 4 else ""), x0, y0, w, h)
        d = f"M{num(centre(0))},{num(bus_y)} H{num(centre(n - 1))}" + "".join(
            f" M{num(centre(i))},{num(bus_y)} V{num(base)}" for i in range(n)
        )
        out.path(d, cls="link-all", data={"code": code, "gpus": n})
        out.text(x0 + w - PAD, y0 + 13, code, cls="link-label", anchor="end")
        _gpu_nodes(ctx, centre, base, out)
    return w, h


def _links_matrix(ctx: _Ctx, x0: float, y0: float, out: Canvas) -> tuple[float, float]:
    """Too many differing NVLink pairs for arcs: a GPU x GPU matrix of their codes."""
    t = ctx.topology
    n = len(t.gpus)
    cell_w, cell_h, head = 40, 16, 48
    w = PAD * 2 + head + n * cell_w
    h = TITLE_H + PAD + (n + 1) * cell_h + PAD
    top = y0 + TITLE_H + PAD
    with out.group(cls="links link-matrix"):
        _panel(out, "GPU links (NVLink)", x0, y0, w, h)
        for j, g in enumerate(t.gpus):
            out.text(
                x0 + PAD + head + j * cell_w + cell_w / 2, top + 12, f"GPU{g.index}", cls="link-cell", anchor="middle"
            )
        for i, g in enumerate(t.gpus):
            y = top + (i + 1) * cell_h
            out.text(x0 + PAD, y + 12, f"GPU{g.index}", cls="link-cell")
            for j in range(n):
                code = _code(t, i, j)
                shown = code if code.startswith("NV") else ("X" if i == j else "")
                if shown:
                    cls = "link-label" if code.startswith("NV") else "link-cell"
                    out.text(x0 + PAD + head + j * cell_w + cell_w / 2, y + 12, shown, cls=cls, anchor="middle")
    return w, h


def _legend_text(r: RankBinding) -> str:
    gpu = f"GPU{r.gpu.index} {r.gpu.pci_bus_id}" if r.gpu else "no GPU"
    text = (
        f"rank {r.local_rank}: {gpu}  CPUs {format_list(r.cpus)}  mems {format_list(r.mems) or '-'}  NIC {r.nic or '-'}"
    )
    return text + (f"  ({r.fallback})" if r.fallback else "")


def _legend(plan: LaunchPlan, x: float, y: float, out: Canvas) -> float:
    """Rank -> GPU, CPUs, NIC rows; returns the height used."""
    with out.group(cls="legend"):
        out.text(x, y + 13, f"Plan: {plan.binding.value} binding, memory {plan.mem_policy.value}", cls="title")
        row_y = y + TITLE_H + 4
        if plan.nccl_nics is not None:
            out.text(x, row_y + 11, f"every rank: {plan.nccl_nics.variable}={plan.nccl_nics.value}", cls="legend-nccl")
            row_y += 18
        for r in plan.ranks:
            with out.group(cls="legend-rank", data={"rank": r.local_rank}):
                out.rect(x, row_y, 14, 14, style=f"fill:{rank_colour(r.local_rank)}")
                out.text(x + 20, row_y + 11, _legend_text(r))
            row_y += 18
        for name, line in _mesh_lines(plan):
            out.text(x, row_y + 11, line, cls="legend-mesh", data={"dim": name})
            row_y += 18
    return row_y - y


def _mesh_lines(plan: LaunchPlan) -> list[tuple[str, str]]:
    """(dimension, ``tp: ranks 0,1 → GPU 0,2 (NV4) ...; default order: ...``) for a plan with a layout."""
    from .plan import link_summary

    if plan.mesh is None:
        return []
    gpu = {r.local_rank: (str(r.gpu.index) if r.gpu else "-") for r in plan.ranks}
    out = [("", f"layout {plan.mesh.spec}")]
    for d in plan.mesh.dims:
        if d.reach == "nodes":
            groups = "across nodes"
        else:
            groups = "  ".join(
                f"[{','.join(map(str, g))}→GPU {','.join(gpu.get(r, '-') for r in g)}]" for g in d.groups
            )
        out.append(
            (
                d.name,
                f"{d.name}={d.size}: {groups}: {link_summary(d.links)}; default order: {link_summary(d.default_links)}",
            )
        )
    return out


def render_svg(topology: Topology, plan: LaunchPlan | None = None) -> str:
    """The picture as a standalone SVG document (UTF-8 text, no external references)."""
    ctx = _Ctx(topology, planned=plan is not None)
    if plan is not None:
        if plan.nccl_nics is not None:
            ctx.nccl_nics = frozenset(plan.nccl_nics.nics)
        # by bus id; by NVML index when a source has none (nvidia-smi text)
        pos_by_bus = {g.pci_bus_id: i for i, g in enumerate(topology.gpus) if g.pci_bus_id}
        pos_by_index = {g.index: i for i, g in enumerate(topology.gpus)}
        for r in plan.ranks:
            for c in r.cpus:
                ctx.cpu_ranks.setdefault(c, []).append(r.local_rank)
            if r.gpu is None:
                continue
            pos = pos_by_bus.get(r.gpu.pci_bus_id) if r.gpu.pci_bus_id else pos_by_index.get(r.gpu.index)
            if pos is not None:
                ctx.gpu_ranks.setdefault(pos, []).append(r.local_rank)
    root = _layout(ctx)
    margin = 10
    out = Canvas()
    root.draw(margin, margin, out)
    lw, lh = _links(ctx, margin, root.h + 2 * margin, out)
    height = root.h + 2 * margin + (lh + margin if lh else 0)
    width = max(root.w, lw) + 2 * margin
    if plan is not None:
        height += _legend(plan, margin, height, out) + margin
        longest = max([len(_legend_text(r)) for r in plan.ranks] + [len(t) for _, t in _mesh_lines(plan)], default=0)
        width = max(width, min(longest, 250) * 7.0 + 40)
    return out.document(
        width, height, title="numarun topology: " + (topology.hostname or topology.source or "?"), style=_STYLE
    )
