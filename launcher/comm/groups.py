"""Hierarchical process groups: pure rank-list logic, and their creation in torch.

Every rank creates every group in the same order (``new_group`` is collective): intra groups by node rank,
then inter groups by local rank. The lists come from what each rank reports, not from ``rank // G``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import HierarchyError

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankOnNode:
    """Where one global rank runs: its node and its index on that node."""

    node_rank: int
    local_rank: int


@dataclass(frozen=True)
class GroupLayout:
    """Rank lists of the hierarchical groups of a job (index = global rank in ``places``)."""

    places: tuple[RankOnNode, ...]
    intra: tuple[tuple[int, ...], ...]  # per node rank, by local rank
    inter: tuple[tuple[int, ...], ...]  # per local rank, by node rank; () when nodes differ in size

    @property
    def num_nodes(self) -> int:
        return len(self.intra)

    @property
    def node_sizes(self) -> tuple[int, ...]:
        return tuple(len(ranks) for ranks in self.intra)

    @property
    def uniform(self) -> bool:
        return len(set(self.node_sizes)) == 1

    @property
    def local_world_size(self) -> int:
        """Ranks per node; raises HierarchyError when nodes differ."""
        self.require_uniform()
        return self.node_sizes[0]

    def require_uniform(self) -> None:
        if not self.uniform:
            sizes = ",".join(str(s) for s in self.node_sizes)
            raise HierarchyError(
                f"bad job shape: nodes run {sizes} ranks; expected the same number of ranks on every node "
                "for hierarchical all-reduce (use comm.allreduce=flat, or the same --nproc-per-node on all nodes)"
            )

    def intra_of(self, rank: int) -> tuple[int, ...]:
        return self.intra[self.places[rank].node_rank]


def layout_from_places(places: Sequence[RankOnNode] | Sequence[tuple[int, int]]) -> GroupLayout:
    """The layout from each global rank's (node_rank, local_rank); HierarchyError unless they are
    0..N-1 and 0..G_n-1 per node, without gaps or repeats."""
    norm = tuple(p if isinstance(p, RankOnNode) else RankOnNode(int(p[0]), int(p[1])) for p in places)
    if not norm:
        raise HierarchyError("bad job shape: no ranks; expected at least one (node_rank, local_rank)")
    by_node: dict[int, dict[int, int]] = {}
    for rank, p in enumerate(norm):
        slots = by_node.setdefault(p.node_rank, {})
        if p.local_rank in slots:
            raise HierarchyError(
                f"bad job shape: ranks {slots[p.local_rank]} and {rank} both claim node {p.node_rank} "
                f"local rank {p.local_rank}; expected one rank per (node, local rank)"
            )
        slots[p.local_rank] = rank
    nodes = sorted(by_node)
    if nodes != list(range(len(nodes))):
        raise HierarchyError(f"bad node ranks {nodes}: expected 0..{len(nodes) - 1}")
    intra: list[tuple[int, ...]] = []
    for n in nodes:
        locals_ = sorted(by_node[n])
        if locals_ != list(range(len(locals_))):
            raise HierarchyError(f"bad local ranks {locals_} on node {n}: expected 0..{len(locals_) - 1}")
        intra.append(tuple(by_node[n][i] for i in locals_))
    inter = tuple(zip(*intra)) if len({len(r) for r in intra}) == 1 else ()  # per local rank, by node rank
    return GroupLayout(places=norm, intra=tuple(intra), inter=inter)


def create_groups(layout: GroupLayout, rank: int) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """Collective: create all intra groups, then (uniform jobs) all inter groups, on every rank; returns this rank's
    (intra, inter) groups (None where the job shape does not allow them)."""
    import torch.distributed as dist

    mine: dict[str, Any] = {"intra": None, "inter": None}
    for kind, lists in (("intra", layout.intra), ("inter", layout.inter)):
        for i, ranks in enumerate(lists):
            g = dist.new_group(list(ranks), group_desc=f"numarun_{kind}_{i}")
            if rank in ranks:
                mine[kind] = g
    if not layout.uniform:
        log.info("nodes run %s ranks: no inter-node groups, hierarchical all-reduce unavailable", layout.node_sizes)
    return mine["intra"], mine["inter"]
