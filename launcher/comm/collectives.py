"""The collectives a hierarchical reduction is made of, with their fallbacks, and how a tensor is padded and cut."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def rs_single(output: Any, input: Any, **kwargs: Any) -> Any:
    """``reduce_scatter_single`` where torch has it (2.13 deprecates ``reduce_scatter_tensor``)."""
    import torch.distributed as dist

    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, **kwargs)


def ag_single(output: Any, input: Any, **kwargs: Any) -> Any:
    """``all_gather_single`` where torch has it (2.13 deprecates ``all_gather_into_tensor``)."""
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, **kwargs)


@dataclass(eq=False)
class TensorForms:
    """What one context's reductions have shown of the backend's tensor forms of reduce-scatter and
    all-gather (older gloo lacks them); the pipeline needs both (docs/allreduce.md)."""

    tried: bool = False  # a one-shot reduction has run
    reduce_scatter: bool = True
    all_gather: bool = True

    @property
    def pipeline_ok(self) -> bool:
        return self.tried and self.reduce_scatter and self.all_gather


def _unsupported(e: BaseException) -> bool:
    """An error that says the backend lacks the operation (older gloo), not a failed collective."""
    if isinstance(e, NotImplementedError):
        return True
    text = str(e).lower()
    return any(k in text for k in ("not supported", "unsupported", "not implemented", "does not support"))


def reduce_scatter(out: torch.Tensor, full: torch.Tensor, op: Any, group: Any, forms: TensorForms) -> None:
    """out = this rank's 1/G slice of the group's reduction of ``full`` (len G * len(out)); waits."""
    import torch.distributed as dist

    if forms.reduce_scatter:
        try:
            rs_single(out, full, op=op, group=group)
            return
        except (RuntimeError, NotImplementedError) as e:
            if not _unsupported(e):
                raise
            forms.reduce_scatter = False
            log.info("reduce_scatter_tensor unsupported here (%s); using all_reduce + slice", e)
    g = dist.get_world_size(group)
    me = dist.get_rank(group)
    tmp = full.clone()
    dist.all_reduce(tmp, op=op, group=group)
    out.copy_(tmp.view(g, -1)[me])


def all_gather(full: torch.Tensor, shard: torch.Tensor, group: Any, forms: TensorForms) -> None:
    """full = the group's shards side by side, this rank's ``shard`` in its slot; waits."""
    import torch.distributed as dist

    if forms.all_gather:
        try:
            ag_single(full, shard, group=group)
            return
        except (RuntimeError, NotImplementedError) as e:
            if not _unsupported(e):
                raise
            forms.all_gather = False
            log.info("all_gather_into_tensor unsupported here (%s); using all_gather", e)
    g = dist.get_world_size(group)
    parts = list(full.view(g, -1).unbind(0))
    dist.all_gather(parts, shard.contiguous(), group=group)


def padded(flat: torch.Tensor, g: int) -> torch.Tensor:
    """``flat`` itself when its length is a multiple of ``g``, else a zero-padded copy (the caller copies ``[:n]``
    back)."""
    import torch

    n = flat.numel()
    shard_len = -(-n // g)
    if shard_len * g == n:
        return flat
    full = torch.zeros(shard_len * g, dtype=flat.dtype, device=flat.device)
    full[:n].copy_(flat)
    return full


MAX_CHUNK_BYTES = 2 * 2**20
MIN_CHUNK_BYTES = 256 * 2**10
PIPELINE_DEPTH = 16  # chunks of one tensor by default: more hide more, until per-collective overhead dominates


def default_chunk_bytes(total_bytes: int) -> int:
    return max(MIN_CHUNK_BYTES, min(MAX_CHUNK_BYTES, total_bytes // PIPELINE_DEPTH))


def chunk_elems(chunk_bytes: int | None, elem_size: int, g: int, numel: int) -> int:
    """Elements per chunk of ``chunk_bytes`` (None: the default; 0: one chunk), a multiple of ``g``, at least ``g``."""
    b = default_chunk_bytes(numel * elem_size) if chunk_bytes is None else chunk_bytes
    if b <= 0:
        return 1 << 62
    return max(g, (b // elem_size) // g * g)


def chunk_bounds(numel: int, step: int, g: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ceil(numel / step) chunks of near-equal length, each a multiple of ``g`` (no short tail)."""
    n = max(1, -(-numel // step))
    base, extra = divmod(numel // g, n)
    bounds, s = [], 0
    for i in range(n):
        e = s + (base + (i < extra)) * g
        if e > s:
            bounds.append((s, e))
        s = e
    return bounds
