"""The collectives a hierarchical reduction is made of, with their fallbacks, and how a tensor is padded and cut."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def _single(name: str, older: str) -> Callable[..., Any]:
    """``torch.distributed.<name>`` where torch has it (2.13 deprecates ``<older>``)."""

    def call(output: Any, input: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist

        return (getattr(dist, name, None) or getattr(dist, older))(output, input, **kwargs)

    return call


rs_single = _single("reduce_scatter_single", "reduce_scatter_tensor")
ag_single = _single("all_gather_single", "all_gather_into_tensor")


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


def _tensor_form(forms: TensorForms, kind: str, names: tuple[str, str], run: Callable[[], Any]) -> bool:
    """Run the tensor form of ``kind`` (a field of ``forms``) unless the backend has shown it lacks it; False when it
    did not run (the caller falls back). An error that says the backend lacks the operation (older gloo), not a
    failed collective, is recorded in ``forms``; ``names``: the tensor form's and its fallback's, for the log."""
    if not getattr(forms, kind):
        return False
    try:
        run()
        return True
    except (RuntimeError, NotImplementedError) as e:
        text = str(e).lower()
        words = ("not supported", "unsupported", "not implemented", "does not support")
        if not isinstance(e, NotImplementedError) and not any(k in text for k in words):
            raise
        setattr(forms, kind, False)
        log.info("%s unsupported here (%s); using %s", names[0], e, names[1])
    return False


def reduce_scatter(out: torch.Tensor, full: torch.Tensor, op: Any, group: Any, forms: TensorForms) -> None:
    """out = this rank's 1/G slice of the group's reduction of ``full`` (len G * len(out)); waits."""
    import torch.distributed as dist

    if _tensor_form(
        forms,
        "reduce_scatter",
        ("reduce_scatter_tensor", "all_reduce + slice"),
        lambda: rs_single(out, full, op=op, group=group),
    ):
        return
    tmp = full.clone()
    dist.all_reduce(tmp, op=op, group=group)
    out.copy_(tmp.view(dist.get_world_size(group), -1)[dist.get_rank(group)])


def all_gather(full: torch.Tensor, shard: torch.Tensor, group: Any, forms: TensorForms) -> None:
    """full = the group's shards side by side, this rank's ``shard`` in its slot; waits."""
    import torch.distributed as dist

    if not _tensor_form(
        forms, "all_gather", ("all_gather_into_tensor", "all_gather"), lambda: ag_single(full, shard, group=group)
    ):
        dist.all_gather(list(full.view(dist.get_world_size(group), -1).unbind(0)), shard.contiguous(), group=group)


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


def chunk_elems(chunk_bytes: int | None, elem_size: int, g: int, numel: int) -> int:
    """Elements per chunk of ``chunk_bytes`` (None: the default; 0: one chunk), a multiple of ``g``, at least ``g``."""
    b = (
        max(MIN_CHUNK_BYTES, min(MAX_CHUNK_BYTES, numel * elem_size // PIPELINE_DEPTH))
        if chunk_bytes is None
        else chunk_bytes
    )
    if b <= 0:
        return 1 << 62
    return max(g, (b // elem_size) // g * g)


def chunk_bounds(numel: int, step: int, g: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ceil(numel / step) chunks of near-equal length, each a multiple of ``g`` (no short tail)."""
    n = max(1, -(-numel // step))
    base, extra = divmod(numel // g, n)
    edges = itertools.accumulate(((base + (i < extra)) * g for i in range(n)), initial=0)
    return [(s, e) for s, e in itertools.pairwise(edges) if e > s]
