"""Which GPU each local rank drives, so that a layout's contiguous mesh is the fast one (pure; docs/layouts.md).

The objective: the groups of ``tp`` get the fastest links first, then ``cp``'s, then ``dp_shard``'s, then
``dp_replicate``'s (:data:`numarun.layout.PRIORITY`); a group is as good as its slowest pair
(:class:`numarun.topology.links.Link`); the groups of one dimension compare worst first (their classes sorted
from the slowest); a placement that scores no better than today's keeps today's order (local rank ``i`` on
visible GPU ``i``), and among equally good others the first in local-rank order wins.

The search (:func:`place`) runs over the node's share of the mesh: a depth-first search in local-rank order that
visits one placement of each class of placements the mesh's symmetry makes equal (the GPU at the origin is the
lowest, and along each dimension's axis through it the GPUs ascend: relabelling a dimension's coordinates
changes no group), and drops a branch whose lower bound is no better than the best so far. With up to
:data:`EXACT_GPUS` visible GPUs it is exhaustive; beyond, it starts from the better of today's order and the
topology order (GPUs sorted by NVLink island, NUMA node and PCIe switch) and stops after :data:`STEP_BUDGET` steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..layout import mesh_groups
from ..topology.links import Link

EXACT_GPUS = 8
"""Up to this many visible GPUs the search is exhaustive."""
STEP_BUDGET = 20_000
"""Beyond :data:`EXACT_GPUS`, the search stops after this many steps (a step is one rank given one GPU)."""

Score = tuple[tuple[int, ...], ...]
"""Per scored dimension (in priority order), its groups' slowest classes, slowest first."""


@dataclass(frozen=True)
class SubMesh:
    """A node's share of the mesh: local rank ``l`` has the row-major coordinates of ``l`` in ``shape``."""

    shape: tuple[int, ...]
    scored: tuple[int, ...]
    """Indices into ``shape`` of the dimensions whose groups count, highest priority first."""

    @property
    def ranks(self) -> int:
        return math.prod(self.shape)

    def groups(self, dim: int) -> tuple[tuple[int, ...], ...]:
        return mesh_groups(self.shape, dim)


@dataclass(frozen=True)
class Placement:
    """The search's answer: ``order[l]`` is the position (in the visible list) of the GPU local rank ``l`` drives."""

    order: tuple[int, ...]
    score: Score
    default_score: Score
    exact: bool
    """False when the search stopped at its step budget."""
    steps: int


class _Search:
    def __init__(self, mesh: SubMesh, classes: Sequence[Sequence[int]], budget: int | None) -> None:
        self.mesh, self.c, self.budget = mesh, classes, budget
        self.n = len(classes)
        g = mesh.ranks
        self.groups = [mesh.groups(d) for d in mesh.scored]
        # per rank: (scored dim position, group index) it belongs to
        self.member: list[list[tuple[int, int]]] = [[] for _ in range(g)]
        for k, groups in enumerate(self.groups):
            for j, group in enumerate(groups):
                for r in group:
                    self.member[r].append((k, j))
        # per rank: the rank before it on its axis through the origin (symmetry breaking), or -1; 0 for the origin's
        self.axis_prev = [-1] * g
        for d, size in enumerate(mesh.shape):
            stride = math.prod(mesh.shape[d + 1 :])
            for k in range(1, size):
                self.axis_prev[k * stride] = (k - 1) * stride
        self.order = [-1] * g
        self.used = [False] * self.n
        self.steps = 0
        self.stopped = False
        self.best: Score = ()
        self.best_order: tuple[int, ...] = ()
        self.nearest = [min((classes[a][b] for b in range(self.n) if b != a), default=0) for a in range(self.n)]

    def score(self, order: Sequence[int]) -> Score:
        """The objective's value of ``order`` (``classes[i][j]``: the link class of visible GPUs ``i`` and ``j``):
        the bound with every rank placed, which is exact."""
        self.order = list(order)
        return self.bound(len(order))

    def bound(self, depth: int) -> Score:
        """A lower bound of the score of every completion of ranks ``0..depth-1``'s GPUs."""
        free = [u for u in range(self.n) if not self.used[u]]
        spare = min((self.nearest[u] for u in free), default=0)
        out = []
        for groups in self.groups:
            worst = []
            for group in groups:
                placed = [self.order[r] for r in group if r < depth]
                missing = len(group) - len(placed)
                cur = max((self.c[a][b] for i, a in enumerate(placed) for b in placed[i + 1 :]), default=0)
                if missing and placed:
                    # the group needs `missing` more GPUs: at best the missing-th closest free one to those placed
                    reach = sorted(max(self.c[u][a] for a in placed) for u in free)
                    cur = max(cur, reach[missing - 1] if len(reach) >= missing else cur)
                elif missing and len(group) > 1:
                    cur = max(cur, spare)
                worst.append(cur)
            out.append(tuple(sorted(worst, reverse=True)))
        return tuple(out)

    def run(self, start: Sequence[int]) -> None:
        self.best_order = tuple(start)
        self.best = self.score(start)
        self._dfs(0)

    def _dfs(self, depth: int) -> None:
        g = self.mesh.ranks
        if depth == g:
            s = self.bound(depth)
            if s < self.best:
                self.best, self.best_order = s, tuple(self.order)
            return
        prev = self.axis_prev[depth]
        low = self.order[prev] + 1 if prev >= 0 else (self.order[0] + 1 if depth else 0)
        for u in range(low, self.n):
            if self.used[u]:
                continue
            if self.budget is not None and self.steps >= self.budget:
                self.stopped = True
                return
            self.steps += 1
            self.order[depth], self.used[u] = u, True
            if self.bound(depth + 1) < self.best:
                self._dfs(depth + 1)
            self.order[depth], self.used[u] = -1, False
            if self.stopped:
                return


def place(mesh: SubMesh, classes: Sequence[Sequence[int]], *, topology_order: Sequence[int] = ()) -> Placement:
    """The best placement of ``mesh``'s ranks on the visible GPUs whose pairwise classes are ``classes``
    (visible order; at least ``mesh.ranks`` of them). ``topology_order``: the visible positions sorted by
    island, NUMA node and switch, the second start beyond :data:`EXACT_GPUS`."""
    g, n = mesh.ranks, len(classes)
    if n < g:
        raise ValueError(f"{g} ranks on {n} GPUs")
    today = tuple(range(g))
    exact = n <= EXACT_GPUS
    search = _Search(mesh, classes, None if exact else STEP_BUDGET)
    default = search.score(today)
    if not mesh.scored or g < 2:
        return Placement(today, default, default, True, 0)
    start = today
    if not exact and topology_order:
        other = tuple(topology_order[:g])
        if search.score(other) < default:
            start = other
    search.run(start)
    return Placement(search.best_order, search.best, default, not search.stopped, search.steps)


def link_classes(links: Sequence[Sequence[Link]], positions: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The classes between the GPUs at topology ``positions`` (the visible GPUs, in visible order), as ints."""
    return tuple(tuple(int(links[a][b]) for b in positions) for a in positions)
