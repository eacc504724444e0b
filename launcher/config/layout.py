"""The trainer's layout: the ``parallel`` group's degrees as one spec ``pp=..,dp_replicate=..,dp_shard=..,cp=..,tp=..``.

Pure (no torch, no Hydra). The dimensions are always named in this order, outermost first, as torchtitan's world
mesh names them; the ranks' mesh is the row-major mesh over it (tp innermost: adjacent ranks share a tp group).
A degree is an integer >= 1, ``-1`` (the rest of the world; at most one), or a word a preset uses: ``nnodes`` (the
number of nodes) or ``nproc_per_node`` (the ranks of one node), resolved with the job's shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from ..argtypes import ascii_digits
from ..errors import TrainerLayoutError

DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""Every dimension, outermost first (the order of the spec and of the ranks' mesh)."""
REST = -1
"""The degree that takes the rest of the world."""
NODE_WORDS = ("nnodes", "nproc_per_node")
"""Degrees a preset can name: the number of nodes, the ranks of one node."""


@dataclass(frozen=True)
class Layout:
    """One degree per dimension of :data:`DIMS`; at most one is :data:`REST` until :meth:`resolved`."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = REST
    cp: int = 1
    tp: int = 1

    def degrees(self) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in DIMS)

    def spec(self) -> str:
        """``pp=1,dp_replicate=1,dp_shard=-1,cp=1,tp=1``: every dimension, in :data:`DIMS` order."""
        return ",".join(f"{d}={getattr(self, d)}" for d in DIMS)

    @property
    def dp(self) -> int:
        """Data-parallel ranks: replicas x shards (each reads its own part of the global batch)."""
        return self.dp_replicate * self.dp_shard

    def resolved(self, world_size: int) -> Layout:
        """The layout for ``world_size`` ranks, ``-1`` filled in; one line naming the rule when the product cannot be
        it."""
        known = math.prod(v for v in self.degrees() if v != REST)
        rest = [d for d in DIMS if getattr(self, d) == REST]
        if rest:
            if world_size % known:
                raise TrainerLayoutError(
                    f"bad layout {self.spec()}: {world_size} ranks cannot be split into {_product(self)} x "
                    f"parallel.{rest[0]}; expected a world size that is a multiple of {known}"
                )
            return Layout(**{**{d: getattr(self, d) for d in DIMS}, rest[0]: world_size // known})
        if known != world_size:
            raise TrainerLayoutError(
                f"bad layout {self.spec()}: the degrees multiply to {known}, not the world size {world_size}; "
                "expected pp x dp_replicate x dp_shard x cp x tp = world size (or one degree -1 for the rest)"
            )
        return self

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s coordinate along each dimension of the row-major mesh (tp fastest), as
        ``init_device_mesh`` lays it out. Only for a resolved layout."""
        out: dict[str, int] = {}
        rest = rank
        for d in reversed(DIMS):
            size = getattr(self, d)
            out[d] = rest % size
            rest //= size
        return {d: out[d] for d in DIMS}

    def dp_rank(self, rank: int) -> int:
        """Which part of the global batch ``rank`` reads: its place on the (dp_replicate, dp_shard) plane."""
        c = self.coords(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]


def _product(layout: Layout) -> str:
    return " x ".join(f"{d}={getattr(layout, d)}" for d in DIMS if getattr(layout, d) not in (1, REST)) or "1"


def _degree(key: str, raw: Any, *, nnodes: int | None, nproc_per_node: int | None) -> int:
    if isinstance(raw, str) and ascii_digits(raw.strip().removeprefix("-")):
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise TrainerLayoutError(
            f"bad parallel.{key} {raw!r}: expected an integer >= 1, -1 (the rest), nnodes or nproc_per_node"
        )
    if isinstance(raw, int):
        if raw < 1 and raw != REST:
            raise TrainerLayoutError(
                f"bad parallel.{key} {raw!r}: expected an integer >= 1, or -1 for the rest of the world"
            )
        return raw
    word = raw.strip()
    if word not in NODE_WORDS:
        raise TrainerLayoutError(
            f"bad parallel.{key} {raw!r}: expected an integer >= 1, -1 (the rest), nnodes or nproc_per_node"
        )
    value = nnodes if word == "nnodes" else nproc_per_node
    if value is None:
        # the ranks always know; the launcher does once the job's shape is fixed
        raise TrainerLayoutError(
            f"bad parallel.{key} {word!r}: the job's {word} is not known here; expected a fixed "
            f"launcher.{word} (or an integer degree)"
        )
    return int(value)


def layout_of(parallel_cfg: Any, *, nnodes: int | None = None, nproc_per_node: int | None = None) -> Layout:
    """The :class:`Layout` a composed ``parallel`` group declares (``-1`` kept); one-line TrainerLayoutError otherwise.

    ``nnodes`` and ``nproc_per_node`` are needed only where a degree names them (the hsdp and tp presets).
    """
    values = {d: _degree(d, _get(parallel_cfg, d), nnodes=nnodes, nproc_per_node=nproc_per_node) for d in DIMS}
    rest = [d for d in DIMS if values[d] == REST]
    if len(rest) > 1:
        raise TrainerLayoutError(
            f"bad layout {','.join(f'{d}={values[d]}' for d in DIMS)}: "
            f"{_and(f'parallel.{d}' for d in rest)} are {'both' if len(rest) == 2 else 'all'} -1; expected at most one "
            "degree -1 (the rest)"
        )
    if values["cp"] != 1:
        raise TrainerLayoutError(
            f"bad parallel.cp {values['cp']!r}: context parallelism is not built; expected parallel.cp=1"
        )
    return Layout(**values)


def _and(items: Iterable[str]) -> str:
    """``a and b``, ``a, b and c``."""
    *head, last = items
    return f"{', '.join(head)} and {last}" if head else last


def _get(cfg: Any, key: str) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(key, _DEFAULTS[key])
    return getattr(cfg, key)


_DEFAULTS = {f.name: f.default for f in fields(Layout)}
