"""A parallel layout: ``pp=2,dp_shard=-1,tp=4`` read, checked and resolved (pure; no torch).

The text names dimensions outermost first, exactly as ``init_device_mesh(device, shape, mesh_dim_names=names)``
takes them; the names are torchtitan's (:data:`DIM_NAMES`), each at most once, in any order, size 1 allowed;
``-1`` (at most one) is the rest of the world. A rank's place in the mesh is always the contiguous row-major one:
rank ``r`` has coordinates ``numpy.unravel_index(r, shape)``, and a dimension's groups are the ranks that differ
only in that coordinate (docs/layouts.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import envvars
from .errors import UsageError

DIM_NAMES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The dimensions a layout may name (torchtitan's world mesh, outermost first)."""
PRIORITY: tuple[str, ...] = ("tp", "cp", "dp_shard", "dp_replicate")
"""Whose groups get the fastest links first; pipeline stages (``pp``) meet across what is left."""
FORM = (
    "name=size,... outermost first, names from "
    + ", ".join(DIM_NAMES)
    + ", sizes positive integers and at most one -1 (the rest), e.g. pp=2,dp_shard=-1,tp=4"
)
MAX_SIZE = 1 << 20


class LayoutError(UsageError):
    """A parallel layout that cannot be read, or that does not fit the job."""

    page = "layouts.md"


@dataclass(frozen=True)
class MeshSpec:
    """A layout as declared: names outermost first, sizes (``-1``: the rest of the world)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    where: str = "--mesh"
    """The option or variable it came from, for messages."""

    @property
    def text(self) -> str:
        return format_mesh(self.names, self.sizes)

    @property
    def rest(self) -> str | None:
        """The name sized ``-1``, if any."""
        return next((n for n, s in zip(self.names, self.sizes) if s == -1), None)

    @property
    def known(self) -> int:
        """The product of the sizes given."""
        return math.prod(s for s in self.sizes if s != -1)

    def resolve(self, world_size: int) -> Layout:
        """The layout on ``world_size`` ranks; :class:`LayoutError` when the sizes do not make it."""
        if self.rest is None:
            if self.known != world_size:
                raise LayoutError(
                    f"bad {self.where} {self.text!r}: its sizes multiply to {self.known}, but the job has {world_size} "
                    f"rank{'s' if world_size != 1 else ''}; expected sizes whose product is {world_size}, or -1 for "
                    "one "
                    "dimension (the rest)"
                )
            return Layout(self.names, self.sizes)
        if world_size % self.known:
            raise LayoutError(
                f"bad {self.where} {self.text!r}: -1 for {self.rest} is the job's {world_size} ranks divided by the "
                f"other sizes' product {self.known}, which does not divide it; expected sizes whose product divides "
                f"{world_size}"
            )
        return Layout(self.names, tuple(world_size // self.known if s == -1 else s for s in self.sizes))


@dataclass(frozen=True)
class Layout:
    """A layout with every size known: the contiguous row-major mesh over ``names``."""

    names: tuple[str, ...]
    shape: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    @property
    def text(self) -> str:
        return format_mesh(self.names, self.shape)

    def size(self, name: str) -> int:
        """The size of ``name``; 1 for a dimension the layout does not name."""
        return self.shape[self.names.index(name)] if name in self.names else 1

    def stride(self, name: str) -> int:
        """How far apart in rank two neighbours of ``name``'s groups are."""
        i = self.names.index(name)
        return math.prod(self.shape[i + 1 :])

    def groups(self, name: str) -> tuple[tuple[int, ...], ...]:
        """Every group of ``name`` as ascending global ranks, in the order of their first rank."""
        return mesh_groups(self.shape, self.names.index(name))


def mesh_groups(shape: tuple[int, ...], dim: int) -> tuple[tuple[int, ...], ...]:
    """The groups of dimension ``dim`` of the row-major mesh of ``shape``, by first rank."""
    size = shape[dim]
    stride = math.prod(shape[dim + 1 :])
    total = math.prod(shape)
    return tuple(
        tuple(start + k * stride for k in range(size)) for start in range(total) if (start // stride) % size == 0
    )


def format_mesh(names: tuple[str, ...], sizes: tuple[int, ...]) -> str:
    """``("pp", "tp"), (2, 4)`` -> ``"pp=2,tp=4"``."""
    return ",".join(f"{n}={s}" for n, s in zip(names, sizes))


def parse_mesh(text: str, where: str = "--mesh") -> MeshSpec:
    """``"pp=2,dp_shard=-1,tp=4"`` -> :class:`MeshSpec`; one-line :class:`LayoutError` naming ``where`` otherwise."""
    raw = str(text)
    if not raw.strip():
        raise LayoutError(f"bad {where} {raw!r}: empty; expected {FORM}")
    names: list[str] = []
    sizes: list[int] = []
    for item in raw.split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise LayoutError(f"bad {where} {raw!r}: {item.strip()!r} is not name=size; expected {FORM}")
        if name not in DIM_NAMES:
            raise LayoutError(
                f"bad {where} {raw!r}: unknown dimension {name!r}; expected names from {', '.join(DIM_NAMES)} ({FORM})"
            )
        if name in names:
            raise LayoutError(
                f"bad {where} {raw!r}: {name} is named twice; expected each dimension at most once ({FORM})"
            )
        body = value[1:] if value.startswith(("-", "+")) else value
        if not body.isdigit() or not body.isascii() or len(body) > 9:
            raise LayoutError(
                f"bad {where} {raw!r}: {name}={value!r} is not an integer; expected a positive size or -1 ({FORM})"
            )
        size = int(value)
        if size == -1:
            if -1 in sizes:
                other = names[sizes.index(-1)]
                raise LayoutError(
                    f"bad {where} {raw!r}: -1 for both {other} and {name}; expected -1 for at most one "
                    f"dimension ({FORM})"
                )
        elif not 1 <= size <= MAX_SIZE:
            raise LayoutError(
                f"bad {where} {raw!r}: {name}={size} is not a positive size; expected 1 to {MAX_SIZE} or -1 ({FORM})"
            )
        names.append(name)
        sizes.append(size)
    return MeshSpec(tuple(names), tuple(sizes), where)


@dataclass(frozen=True)
class NodeCut:
    """Where the node boundary falls in a layout: the node's ranks are the row-major block of the ``inner``
    dimensions with ``split``'s ``split_inner`` innermost coordinates."""

    inner: tuple[str, ...]
    """Dimensions whose groups lie inside one node."""
    split: str | None
    """The dimension whose groups the node boundary cuts (part in the node, part across nodes), if any."""
    split_inner: int
    outer: tuple[str, ...]
    """Dimensions whose groups are ranks of one local rank on different nodes."""


def node_cut(layout: Layout, ranks_per_node: int, *, where: str = "--mesh") -> NodeCut:
    """How ``layout`` falls on nodes of ``ranks_per_node`` ranks (torchrun numbers each node's ranks contiguously):
    :class:`LayoutError` unless the node boundary cuts at most one dimension, evenly."""
    inner: list[str] = []
    block = 1
    for i in range(len(layout.names) - 1, -1, -1):
        name, size = layout.names[i], layout.shape[i]
        if block * size <= ranks_per_node:
            if ranks_per_node % (block * size):
                break
            inner.insert(0, name)
            block *= size
            continue
        if ranks_per_node % block == 0 and size % (ranks_per_node // block) == 0:
            part = ranks_per_node // block
            outer = layout.names[:i] if part > 1 else layout.names[: i + 1]
            return NodeCut(tuple(inner), name if part > 1 else None, part if part > 1 else 1, tuple(outer))
        break
    else:
        if block == ranks_per_node:
            return NodeCut(tuple(inner), None, 1, ())
    dims = ", ".join(f"{n}={s}" for n, s in zip(layout.names, layout.shape))
    raise LayoutError(
        f"bad {where} {layout.text!r}: it does not fit nodes of {ranks_per_node} ranks (the innermost dimensions "
        f"{dims} cross the node boundary unevenly); expected {ranks_per_node} to be a product of the innermost sizes, "
        "times a divisor of the next one"
    )


DEGREE_VARIABLES: dict[str, str] = {
    "pp": envvars.MESH_PP,
    "dp_replicate": envvars.MESH_DP_REPLICATE,
    "dp_shard": envvars.MESH_DP_SHARD,
    "cp": envvars.MESH_CP,
    "tp": envvars.MESH_TP,
}
"""Each dimension's degree variable in the ranks' environment."""


def layout_env(layout: Layout) -> dict[str, str]:
    """The variables that name ``layout`` in every rank (docs/layouts.md): ``NUMARUN_MESH``, ``NUMARUN_MESH_NAMES``,
    ``NUMARUN_MESH_SHAPE`` and one degree per dimension (1 for those it does not name)."""
    env = {
        envvars.MESH: layout.text,
        envvars.MESH_NAMES: ",".join(layout.names),
        envvars.MESH_SHAPE: ",".join(map(str, layout.shape)),
    }
    env.update({var: str(layout.size(name)) for name, var in DEGREE_VARIABLES.items()})
    return env
