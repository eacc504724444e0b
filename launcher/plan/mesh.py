"""A declared layout placed on one node: which visible GPU each local rank drives, and the record the plan keeps
(:class:`~numarun.plan.model.MeshPlan`). Pure; the objective and the search are :mod:`numarun.plan.placement`'s.

The ranks see the node's GPUs through one ``CUDA_VISIBLE_DEVICES`` that lists them in local-rank order, so that
``cuda:LOCAL_RANK`` is the rank's GPU for numarun's ranks and for scripts that pick their device by local rank
(torchtitan, Megatron-Core, ``init_device_mesh``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..argtypes import NodeRange
from ..errors import LayoutError
from ..layout import PRIORITY, Layout, NodeCut, mesh_groups, node_cut
from ..topology.links import GpuLinks, Link, gpu_links, nvlink_domain, nvlink_islands, pcie_switches
from ..topology.model import Gpu, Topology, link_rank
from ..topology.pci import pci_order
from ..topology.visible import openable
from .model import MeshDim, MeshPlan, PlanRequest
from .placement import Placement, SubMesh, link_classes, place

NETWORK = "network"


@dataclass(frozen=True)
class MeshChoice:
    order: tuple[int, ...]
    """Per local rank, the position in the visible list of the GPU it drives (() without GPUs)."""
    plan: MeshPlan
    warnings: tuple[str, ...] = ()


def resolve_on_nodes(spec: Layout, *, nproc: int, nnodes: NodeRange) -> tuple[Layout, NodeCut, int]:
    """(the layout, where the node boundary cuts it, the node count or 0 when it is elastic).

    An elastic ``--nnodes MIN:MAX`` has no world size before the nodes meet: the layout must then size its
    outermost dimension larger than 1 with -1 (the rest grows with the nodes), and its inner dimensions must
    fit one node."""
    if not nnodes.elastic:
        layout = spec.resolved(nnodes.min * nproc, nodes=nnodes.min)
        return layout, node_cut(layout, nproc), nnodes.min
    rest = spec.rest
    big = [n for n, s in zip(spec.names, spec.shape) if s not in (1, -1)]
    outer = spec.names[: spec.names.index(rest)] if rest is not None else ()
    if rest is None or any(n in big for n in outer):
        raise LayoutError(
            f"bad {spec.where} {spec.text!r} with --nnodes {nnodes}: the world size is known only once the nodes meet; "
            "expected -1 for the outermost dimension larger than 1 (it takes the nodes there are), or a fixed --nnodes",
            where=spec.where,
        )
    if nproc % spec.known:
        raise LayoutError(
            f"bad {spec.where} {spec.text!r}: the sizes inside -1 multiply to {spec.known}, which does not "
            f"divide the {nproc} ranks per node; expected a layout whose other sizes fit one node",
            where=spec.where,
        )
    layout = spec.resolved(nnodes.max * nproc)
    return layout, node_cut(layout, nproc), 0


def _code_key(code: str) -> tuple[int, int]:
    m = re.match(r"NV(\d+)$", code)
    return link_rank(code), -(int(m.group(1)) if m else 0)


def _slowest(order: Sequence[int], group: Sequence[int], positions: Sequence[int], links: GpuLinks) -> str:
    if len(group) < 2:
        return "-"
    pairs = [(positions[order[a]], positions[order[b]]) for i, a in enumerate(group) for b in group[i + 1 :]]
    worst = max(pairs, key=lambda p: (links.link(*p), _code_key(links.code(*p))))
    return links.code(*worst)


def _visible_text(request: PlanRequest, topology: Topology, gpus: Sequence[Gpu], order: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` listing the rank's GPUs first, in local-rank order, then the other visible ones:
    the user's own entries when they set it, else GPU UUIDs when every GPU has one, else CUDA's PCI-order indices."""
    full = [*order, *(p for p in range(len(gpus)) if p not in set(order))]
    if full == list(range(len(gpus))):
        return ""
    if request.cuda_visible_devices is not None:
        entries = [e.strip() for e in request.cuda_visible_devices.split(",")]
    elif all(g.uuid for g in gpus):
        entries = [g.uuid for g in gpus]
    else:
        view = pci_order(openable(tuple(topology.gpus), request.allowed_gpu_minors))
        entries = [str(next(i for i, v in enumerate(view) if v is g)) for g in gpus]
    return ",".join(entries[p] for p in full)


def _topology_order(topology: Topology, positions: Sequence[int], links: GpuLinks) -> tuple[int, ...]:
    """Visible positions sorted by NVLink island, NUMA node, PCIe switch (the search's second start)."""
    island, switch = nvlink_islands(links), pcie_switches(links)
    return tuple(
        sorted(
            range(len(positions)),
            key=lambda v: (island[positions[v]], topology.gpus[positions[v]].numa_node, switch[positions[v]], v),
        )
    )


def plan_mesh(
    topology: Topology, gpus: Sequence[Gpu], positions: Sequence[int], nproc: int, request: PlanRequest
) -> MeshChoice:
    """Place ``request.mesh`` on this node's ``nproc`` ranks; ``gpus``: the visible GPUs in CUDA's order,
    ``positions``: their positions in ``topology.gpus``."""
    assert request.mesh is not None
    spec = request.mesh
    layout, cut, nnodes = resolve_on_nodes(spec, nproc=nproc, nnodes=request.nnodes)
    in_node = ((cut.split,) if cut.split else ()) + cut.inner
    sub_shape = tuple(cut.split_inner if n == cut.split else layout.size(n) for n in in_node)
    scored = tuple(in_node.index(n) for n in PRIORITY if n in cut.inner and layout.size(n) > 1)
    mesh = SubMesh(sub_shape, scored)
    today = tuple(range(nproc))
    warnings: list[str] = []
    links = gpu_links(topology)
    if not gpus or request.keep_gpus:
        placed = Placement(today, (), (), True, 0)
        search = "kept: the scheduler gives each task its own GPU" if gpus else "-"
        if gpus:
            warnings.append(
                f"{spec.where} {spec.text}: the scheduler gives each task its own GPU, so the layout keeps "
                "its GPUs (start one task per node for numarun to place it)"
            )
    else:
        classes = link_classes(links.classes, positions)
        placed = place(mesh, classes, topology_order=_topology_order(topology, positions, links))
        search = f"{'exhaustive' if placed.exact else 'stopped at its step budget'}, {placed.steps} steps"
        if not placed.exact:
            warnings.append(
                f"{spec.where} {spec.text}: {len(gpus)} visible GPUs are past the exhaustive search; placed "
                f"by a search stopped after {placed.steps} steps (docs/layouts.md)"
            )
    order = placed.order if gpus else ()
    dims = []
    for i, name in enumerate(layout.names):
        size = -1 if nnodes == 0 and spec.shape[i] == -1 else layout.shape[i]
        groups = mesh_groups(sub_shape, in_node.index(name)) if name in in_node else tuple((r,) for r in range(nproc))
        reach = "nodes" if name not in in_node else "split" if name == cut.split else "node"
        if reach == "node" and gpus:
            got, default = (tuple(_slowest(o, g, positions, links) for g in groups) for o in (order, today))
        else:
            got = default = (NETWORK if reach != "node" else "-",) * len(groups)
        dims.append(MeshDim(name, size, reach, groups, got, default))
    if gpus and scored and not request.keep_gpus:
        first = in_node[scored[0]]
        dim = next(d for d in dims if d.name == first)
        fastest = min((links.link(a, b) for i, a in enumerate(positions) for b in positions[i + 1 :]), default=Link.SYS)
        worst = max(placed.score[0]) if placed.score else 0
        if worst > fastest:
            slowest = max(dim.links, key=_code_key)
            warnings.append(
                f"{spec.where} {spec.text}: the slowest {first} link is {slowest} (no placement keeps {first}'s groups "
                "of "
                f"{layout.size(first)} on this node's fastest links, {fastest.word}); the job runs so"
            )
    shown_shape = tuple(d.size for d in dims)
    record = MeshPlan(
        spec=",".join(f"{d.name}={d.size}" for d in dims),
        declared=spec.text,
        names=layout.names,
        shape=shown_shape,
        nnodes=nnodes,
        dims=tuple(dims),
        default_gpus=tuple(gpus[p].index for p in today) if gpus else (),
        search=search,
        cuda_visible_devices=_visible_text(request, topology, gpus, order) if gpus else "",
        nvlink_domain=nvlink_domain(topology),
    )
    return MeshChoice(order, record, tuple(warnings))
