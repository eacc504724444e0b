"""Hierarchical all-reduce and the DDP communication hooks built on it (when it pays: docs/allreduce.md)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import NumarunError
from . import pipeline
from .context import DistContext, current_context
from .modes import CommMode, Compression, parse_comm_mode, parse_compression
from .pipeline import Steps
from .stream import BucketStream

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

log = logging.getLogger(__name__)


def _context(context: DistContext | None) -> DistContext:
    ctx = context if context is not None else current_context()
    if ctx is None:
        raise NumarunError(
            "no distributed context: expected numarun.init() to be called before hierarchical_all_reduce"
        )
    return ctx


HIERARCHICAL_BUCKET_MB = 2.0  # small buckets start the link early in backward (docs/allreduce.md)


def ddp_bucket_mb(bucket_mb: float | None, mode: str | CommMode) -> float | None:
    """DDP's ``bucket_cap_mb``: the value given, else 2 MiB for the hierarchical hook, else None (DDP's default)."""
    if bucket_mb is None and parse_comm_mode(mode) is not CommMode.FLAT:
        return HIERARCHICAL_BUCKET_MB
    return bucket_mb


def hierarchical_all_reduce(
    tensor: torch.Tensor,
    op: dist.ReduceOp.RedOpType | Any = None,
    *,
    context: DistContext | None = None,
    inter_dtype: torch.dtype | None = None,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """All-reduce ``tensor`` in place over the whole job (docs/allreduce.md); returns it.

    ``op``: SUM (default), AVG (SUM, then a division by the world size), MAX, MIN or PRODUCT. ``inter_dtype``:
    the shard's dtype on the inter-node step only. ``chunk_bytes``: the pipelining chunk (None: about 16 chunks
    of 256 KiB..2 MiB; 0: one shot).
    """
    import torch.distributed as dist

    ctx = _context(context)
    ctx.require_hierarchical()
    if op is None:
        op = dist.ReduceOp.SUM
    average = op == dist.ReduceOp.AVG
    if average:
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise NumarunError(f"bad tensor dtype {tensor.dtype} for AVG: expected a floating-point tensor")
        op = dist.ReduceOp.SUM
    if inter_dtype is not None and op != dist.ReduceOp.SUM:
        raise NumarunError(f"bad op {op} with compression: expected SUM or AVG")

    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    flat = work.view(-1)
    if flat.numel():
        steps = Steps(ctx, op=op, inter_dtype=inter_dtype, divisor=ctx.world_size if average else None)
        pipeline.reduce_flat(flat, steps, forms=ctx.tensor_forms, chunk_bytes=chunk_bytes)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


@dataclass(frozen=True, eq=False)
class HookState:
    """State of the hierarchical DDP comm hook."""

    context: DistContext
    inter_dtype: torch.dtype | None = None
    overlap: bool = True  # reduce on a communication thread while backward goes on (False: in the hook)
    chunk_bytes: int | None = None  # None: the stream's 1 MiB, or the default of the bucket without overlap
    stream: BucketStream | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.overlap and self.stream is None:
            stream = BucketStream(self.context, inter_dtype=self.inter_dtype, chunk_bytes=self.chunk_bytes)
            object.__setattr__(self, "stream", stream)

    def reduce(self, buffer: torch.Tensor) -> torch.Tensor:
        """Average one bucket by itself, in place."""
        import torch.distributed as dist

        return hierarchical_all_reduce(
            buffer, dist.ReduceOp.AVG, context=self.context, inter_dtype=self.inter_dtype, chunk_bytes=self.chunk_bytes
        )


def hierarchical_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average the bucket hierarchically, in the state's :class:`BucketStream` with ``overlap``."""
    import torch

    if state.stream is not None:
        return state.stream.submit(bucket.buffer(), bucket.is_last())
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(state.reduce(bucket.buffer()))
    return fut


def flat_compressed_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: flat all-reduce of the bucket cast to ``state.inter_dtype`` (torch's own refuses gloo)."""
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    wire = buf.to(state.inter_dtype) if state.inter_dtype is not None else buf.clone()
    dist.all_reduce(wire)
    wire.div_(state.context.world_size)
    buf.copy_(wire)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _real_hook_annotations() -> None:
    # DDP compares the hook's annotations with the real classes; this module's are strings
    import torch
    import torch.distributed as dist

    for hook in (hierarchical_hook, flat_compressed_hook):
        hook.__annotations__.update(bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]})


def apply_comm(
    model_ddp: Any,
    mode: str | CommMode,
    compression: str | Compression | None,
    context: DistContext | None,
    *,
    overlap: bool = True,
    chunk_bytes: int | None = None,
) -> CommMode:
    """Apply config ``comm.allreduce`` / ``comm.compression`` to a DDP model (docs/allreduce.md, "In DDP"); returns the
    mode."""
    m = parse_comm_mode(mode)
    c = parse_compression(compression)
    if m is CommMode.FLAT:
        if c is not Compression.NONE:
            _real_hook_annotations()
            model_ddp.register_comm_hook(
                HookState(context=_context(context), inter_dtype=c.dtype()), flat_compressed_hook
            )
        return m
    ctx = _context(context)
    ctx.require_hierarchical()
    _real_hook_annotations()
    if chunk_bytes is not None and chunk_bytes < 0:
        raise NumarunError(f"bad chunk size {chunk_bytes} bytes: expected 0 (one shot) or more")
    model_ddp.register_comm_hook(
        HookState(context=ctx, inter_dtype=c.dtype(), overlap=overlap, chunk_bytes=chunk_bytes), hierarchical_hook
    )
    return m


__all__ = [
    "CommMode",
    "Compression",
    "BucketStream",
    "HookState",
    "apply_comm",
    "hierarchical_all_reduce",
    "flat_compressed_hook",
    "hierarchical_hook",
    "parse_comm_mode",
    "parse_compression",
]
