"""The parallel layout, one type for every source: ``--mesh pp=2,dp_shard=-1,tp=4``, the trainer's ``parallel.*``,
the plan's record; read, checked, resolved and named in every rank here (pure; no torch).

The text names dimensions outermost first, exactly as ``init_device_mesh(device, shape, mesh_dim_names=names)``
takes them; the names are torchtitan's (:data:`DIMS`), each at most once, in any order, size 1 allowed;
``-1`` (at most one) is the rest of the world. A rank's place in the mesh is always the contiguous row-major one:
rank ``r`` has coordinates ``numpy.unravel_index(r, shape)``, and a dimension's groups are the ranks that differ
only in that coordinate (docs/layouts.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import envvars
from .errors import TRAINER_LAYOUT, LayoutError

DIMS: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The dimensions a layout may name (torchtitan's world mesh, outermost first); the trainer's names them all."""
REST = -1
"""The size that takes the rest of the world."""
NODE_WORDS = ("nnodes", "nproc_per_node")
"""Degrees the trainer's presets can name: the number of nodes, the ranks of one node."""
PRIORITY: tuple[str, ...] = ("tp", "cp", "dp_shard", "dp_replicate")
"""Whose groups get the fastest links first; pipeline stages (``pp``) meet across what is left."""
FORM = (
    "name=size,... outermost first, names from "
    + ", ".join(DIMS)
    + ", sizes positive integers and at most one -1 (the rest), e.g. pp=2,dp_shard=-1,tp=4"
)
MAX_SIZE = 1 << 20


@dataclass(frozen=True)
class Layout:
    """A parallel layout: the dimensions outermost first and their sizes; ``-1`` (:data:`REST`, at most one) is the
    rest of the world until :meth:`resolved`. The ranks' mesh is the contiguous row-major one over it.

    Read once where it is declared: the text of ``--mesh``, ``NUMARUN_MESH`` or ``launcher.mesh`` (:meth:`parse`,
    by the options), the trainer's ``parallel.*`` degrees (:meth:`of_degrees`); the plan carries it to the ranks."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    where: str = field(default="--mesh", compare=False)
    """The option, variable or config key it came from, for messages."""

    @property
    def text(self) -> str:
        return format_mesh(self.names, self.shape)

    def __str__(self) -> str:
        return self.text

    @property
    def rest(self) -> str | None:
        """The name sized ``-1``, if any."""
        return next((n for n, s in zip(self.names, self.shape) if s == REST), None)

    @property
    def known(self) -> int:
        """The product of the sizes given."""
        return math.prod(s for s in self.shape if s != REST)

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    def resolved(self, world_size: int, *, nodes: int = 1) -> Layout:
        """The layout on ``world_size`` ranks, ``-1`` filled in; :class:`LayoutError` when the sizes do not make it,
        naming the ``nodes`` the ranks span when there are several."""
        ranks = _count(world_size, "rank")
        if nodes > 1:
            ranks += f" ({_count(nodes, 'node')} x {_count(world_size // nodes, 'rank')})"
        if self.rest is None:
            if self.known != world_size:
                raise LayoutError(
                    f"bad {self.where} {self.text!r}: its sizes multiply to {self.known}, but the job has {ranks}; "
                    f"expected sizes whose product is {world_size}, or -1 for one dimension (the rest)",
                    where=self.where,
                )
            return self
        if world_size % self.known:
            raise LayoutError(
                f"bad {self.where} {self.text!r}: -1 for {self.rest} is the job's {ranks} divided by the other "
                f"sizes' product {self.known}, which does not divide it; expected sizes whose product divides "
                f"{world_size}",
                where=self.where,
            )
        shape = tuple(world_size // self.known if s == REST else s for s in self.shape)
        return Layout(self.names, shape, self.where)

    def size(self, name: str) -> int:
        """The size of ``name``; 1 for a dimension the layout does not name."""
        return self.shape[self.names.index(name)] if name in self.names else 1

    @property
    def dp(self) -> int:
        """Data-parallel ranks: replicas x shards (each reads its own part of the global batch)."""
        return self.size("dp_replicate") * self.size("dp_shard")

    def squeezed(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of the dimensions larger than 1: two layouts with the same are the same row-major mesh."""
        return tuple((n, s) for n, s in zip(self.names, self.shape) if s != 1)

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s coordinate along each dimension (resolved layouts only), as ``init_device_mesh`` lays it out."""
        rest, out = rank, {}
        for name, size in reversed(tuple(zip(self.names, self.shape))):
            rest, out[name] = divmod(rest, size)
        return {n: out[n] for n in self.names}

    def dp_rank(self, rank: int) -> int:
        """Which part of the global batch ``rank`` reads: its place on the (dp_replicate, dp_shard) plane."""
        c = self.coords(rank)
        return c.get("dp_replicate", 0) * self.size("dp_shard") + c.get("dp_shard", 0)

    def env(self) -> dict[str, str]:
        """The variables that name the (resolved) layout in every rank (docs/layouts.md): ``NUMARUN_MESH``,
        ``NUMARUN_MESH_NAMES``, ``NUMARUN_MESH_SHAPE`` and one degree per dimension (1 for those it does not name)."""
        return {
            envvars.MESH: self.text,
            envvars.MESH_NAMES: ",".join(self.names),
            envvars.MESH_SHAPE: ",".join(map(str, self.shape)),
            **{var: str(self.size(name)) for name, var in DEGREE_VARIABLES.items()},
        }

    @classmethod
    def parse(cls, text: str, where: str = "--mesh") -> Layout:
        """``"pp=2,dp_shard=-1,tp=4"`` -> its layout; one-line :class:`LayoutError` naming ``where`` otherwise."""
        raw = str(text)
        if not raw.strip():
            raise LayoutError(f"bad {where} {raw!r}: empty; expected {FORM}", where=where)
        names: list[str] = []
        sizes: list[int] = []
        for item in raw.split(","):
            name, sep, value = (part.strip() for part in item.partition("="))
            if not sep or not name:
                raise LayoutError(
                    f"bad {where} {raw!r}: {item.strip()!r} is not name=size; expected {FORM}", where=where
                )
            body = value[1:] if value.startswith(("-", "+")) else value
            if not body.isdigit() or not body.isascii():  # '٢' and '２' are digits to Python, not here
                _check(where, raw, names, name)
                raise LayoutError(
                    f"bad {where} {raw!r}: {name}={value!r} is not an integer; expected a positive size or -1 ({FORM})",
                    where=where,
                )
            size = int(value) if len(body) <= 9 else MAX_SIZE + 1  # past the bound, however long the text
            _check(where, raw, names, name, size, sizes, text=value)
            names.append(name)
            sizes.append(size)
        return cls(tuple(names), tuple(sizes), where)

    @classmethod
    def of_degrees(
        cls, degrees: Mapping[str, object], *, nnodes: int | None = None, nproc_per_node: int | None = None
    ) -> Layout:
        """The layout of the trainer's ``parallel`` group: a degree per dimension of :data:`DIMS` (missing: 1, but
        ``dp_shard``: -1), each an integer, ``-1``, or a word its presets use (:data:`NODE_WORDS`), resolved with
        the job's shape, which is needed only where a degree names it."""
        sizes = [_degree(n, degrees.get(n, REST if n == "dp_shard" else 1), nnodes, nproc_per_node) for n in DIMS]
        rests = [f"parallel.{n}" for n, size in zip(DIMS, sizes) if size == REST]
        if len(rests) > 2:  # two are named by the pairwise rule below
            raise LayoutError(
                f"bad {TRAINER_LAYOUT} {format_mesh(DIMS, tuple(sizes))!r}: {', '.join(rests[:-1])} and {rests[-1]} "
                "are all -1; expected at most one degree -1 (the rest)",
                where=TRAINER_LAYOUT,
            )
        for i, (name, size) in enumerate(zip(DIMS, sizes)):
            _check(
                TRAINER_LAYOUT,
                format_mesh(DIMS[: i + 1], tuple(sizes[: i + 1])),
                DIMS[:i],
                name,
                size,
                sizes[:i],
                key="parallel.",
            )
        return cls(DIMS, tuple(sizes), TRAINER_LAYOUT)


def _check(
    where: str,
    raw: str,
    names: Sequence[str],
    name: str,
    size: int | None = None,
    sizes: Sequence[int] = (),
    *,
    key: str = "",
    text: str | None = None,
) -> None:
    """The rules of one ``name=size`` after those before it: a known name, once, a size from 1 to :data:`MAX_SIZE`
    or the one ``-1``; ``text``: the size as written (``-0``, a number past the bound), for the message."""
    if name not in DIMS:
        raise LayoutError(
            f"bad {where} {raw!r}: unknown dimension {name!r}; expected names from {', '.join(DIMS)} ({FORM})",
            where=where,
        )
    if name in names:
        raise LayoutError(
            f"bad {where} {raw!r}: {name} is named twice; expected each dimension at most once ({FORM})", where=where
        )
    if size == REST and REST in sizes:
        other = names[list(sizes).index(REST)]
        raise LayoutError(
            f"bad {where} {raw!r}: -1 for both {key}{other} and {key}{name}; expected -1 for at most one "
            f"dimension ({FORM})",
            where=where,
        )
    if size is not None and size != REST and not 1 <= size <= MAX_SIZE:
        why = "is not a positive size" if size < 1 else f"is past {MAX_SIZE}"
        shown = size if text is None else text
        raise LayoutError(
            f"bad {where} {raw!r}: {name}={shown} {why}; expected 1 to {MAX_SIZE} or -1 ({FORM})", where=where
        )


def _degree(name: str, raw: object, nnodes: int | None, nproc_per_node: int | None) -> int:
    """A ``parallel.<name>`` degree as a size: an integer (text too), or a word of :data:`NODE_WORDS`."""
    digits = raw.strip().removeprefix("-") if isinstance(raw, str) else ""
    if isinstance(raw, str) and digits.isascii() and digits.isdigit():  # '٢' is a digit to Python, not a degree
        raw = int(raw)
    word = raw.strip() if isinstance(raw, str) else None
    if isinstance(raw, bool) or not isinstance(raw, int) and word not in NODE_WORDS:
        raise LayoutError(
            f"bad parallel.{name} {raw!r}: expected an integer >= 1, -1 (the rest), nnodes or nproc_per_node",
            where=TRAINER_LAYOUT,
        )
    if isinstance(raw, int):
        if raw < 1 and raw != REST:
            raise LayoutError(
                f"bad parallel.{name} {raw!r}: expected an integer >= 1, or -1 for the rest of the world",
                where=TRAINER_LAYOUT,
            )
        return raw
    value = nnodes if word == "nnodes" else nproc_per_node
    if value is None:  # the ranks always know; the launcher does once the job's shape is fixed
        raise LayoutError(
            f"bad parallel.{name} {word!r}: the job's {word} is not known here; expected a fixed "
            f"launcher.{word} (or an integer degree)",
            where=TRAINER_LAYOUT,
        )
    return int(value)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


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


def node_cut(layout: Layout, ranks_per_node: int) -> NodeCut:
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
        f"bad {layout.where} {layout.text!r}: it does not fit nodes of {ranks_per_node} ranks (the innermost "
        f"dimensions {dims} cross the node boundary unevenly); expected {ranks_per_node} to be a product of the "
        "innermost sizes, times a divisor of the next one",
        where=layout.where,
    )


DEGREE_VARIABLES: dict[str, str] = {
    "pp": envvars.MESH_PP,
    "dp_replicate": envvars.MESH_DP_REPLICATE,
    "dp_shard": envvars.MESH_DP_SHARD,
    "cp": envvars.MESH_CP,
    "tp": envvars.MESH_TP,
}
"""Each dimension's degree variable in the ranks' environment."""
