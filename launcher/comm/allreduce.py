"""Hierarchical all-reduce and the DDP communication hook built on it.

Of S bytes, a flat ring all-reduce over N nodes x G ranks sends 2(NG-1)/(NG)*S out of
each node; reduce-scatter inside the node, all-reduce of the 1/G shard across nodes (the
G shards cross in parallel, one per local rank) and all-gather inside the node send
2(N-1)/N*S. NCCL already does this on NVSwitch + multi-rail IB, so it is opt-in
(``comm.allreduce: hierarchical``); it pays on TCP/gloo clusters, VMs where NCCL cannot
see the topology, and with compression of the inter-node step only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import NumarunError
from .context import DistContext, current_context
from .modes import CommMode, Compression, parse_comm_mode, parse_compression
from .stream import BucketStream

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

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


def _context(context: DistContext | None) -> DistContext:
    ctx = context if context is not None else current_context()
    if ctx is None:
        raise NumarunError("no distributed context: expected numarun.init() to be called before hierarchical_all_reduce")
    return ctx


# Set once a backend has shown it lacks the tensor forms of reduce-scatter / all-gather.
_NO_RS_TENSOR = False
_NO_AG_TENSOR = False


def _unsupported(e: BaseException) -> bool:
    """An error that says the backend lacks the operation (older gloo), not a failed collective."""
    if isinstance(e, NotImplementedError):
        return True
    text = str(e).lower()
    return any(k in text for k in ("not supported", "unsupported", "not implemented", "does not support"))


def _reduce_scatter(out: torch.Tensor, full: torch.Tensor, op: Any, group: Any) -> None:
    """out = this rank's 1/G slice of the group's reduction of ``full`` (len G * len(out))."""
    global _NO_RS_TENSOR
    import torch.distributed as dist

    if not _NO_RS_TENSOR:
        try:
            rs_single(out, full, op=op, group=group)
            return
        except (RuntimeError, NotImplementedError) as e:
            if not _unsupported(e):
                raise
            _NO_RS_TENSOR = True
            log.info("reduce_scatter_tensor unsupported here (%s); using all_reduce + slice", e)
    # Fallback: costs a full all-reduce inside the node, still never crosses nodes.
    g = dist.get_world_size(group)
    me = dist.get_rank(group)
    tmp = full.clone()
    dist.all_reduce(tmp, op=op, group=group)
    out.copy_(tmp.view(g, -1)[me])


def _all_gather(full: torch.Tensor, shard: torch.Tensor, group: Any) -> None:
    global _NO_AG_TENSOR
    import torch.distributed as dist

    if not _NO_AG_TENSOR:
        try:
            ag_single(full, shard, group=group)
            return
        except (RuntimeError, NotImplementedError) as e:
            if not _unsupported(e):
                raise
            _NO_AG_TENSOR = True
            log.info("all_gather_into_tensor unsupported here (%s); using all_gather", e)
    g = dist.get_world_size(group)
    parts = list(full.view(g, -1).unbind(0))
    dist.all_gather(parts, shard.contiguous(), group=group)


HIERARCHICAL_BUCKET_MB = 2.0
"""DDP's ``bucket_cap_mb`` the trainer uses with the hierarchical hook unless told: the
stream pipelines across buckets, so small buckets cost little and let the link start early
in backward instead of waiting for one big bucket at its end."""


def ddp_bucket_mb(bucket_mb: float | None, mode: str | CommMode) -> float | None:
    """DDP's ``bucket_cap_mb`` for ``comm.bucket_mb`` under ``mode``: the value given, else
    :data:`HIERARCHICAL_BUCKET_MB` for the hierarchical hook, else None (DDP's default)."""
    if bucket_mb is None and parse_comm_mode(mode) is not CommMode.FLAT:
        return HIERARCHICAL_BUCKET_MB
    return bucket_mb

MAX_CHUNK_BYTES = 2 * 2**20
MIN_CHUNK_BYTES = 256 * 2**10
PIPELINE_DEPTH = 16
"""Default pipelining: about this many chunks, each MIN..MAX_CHUNK_BYTES. Only the in-node
steps of the first and last chunk are not hidden behind the link, so more chunks hide
more, until per-collective overhead dominates."""

# True once a one-shot call has shown the backend has the tensor forms used when pipelining.
_PROBED = False


def padded(flat: torch.Tensor, g: int) -> torch.Tensor:
    """``flat`` itself when its length is a multiple of ``g``, else a zero-padded copy. The ops
    are elementwise, so the pad never mixes with the data; the caller copies ``[:n]`` back."""
    import torch

    n = flat.numel()
    shard_len = -(-n // g)
    if shard_len * g == n:
        return flat
    full = torch.zeros(shard_len * g, dtype=flat.dtype, device=flat.device)
    full[:n].copy_(flat)
    return full


def stream_ready() -> bool:
    """The backend has shown the async tensor forms of reduce-scatter / all-gather that
    pipelining needs (a first one-shot call probes them)."""
    return _PROBED and not (_NO_RS_TENSOR or _NO_AG_TENSOR)


def default_chunk_bytes(total_bytes: int) -> int:
    return max(MIN_CHUNK_BYTES, min(MAX_CHUNK_BYTES, total_bytes // PIPELINE_DEPTH))


def chunk_elems(chunk_bytes: int | None, elem_size: int, g: int, numel: int) -> int:
    b = default_chunk_bytes(numel * elem_size) if chunk_bytes is None else chunk_bytes
    if b <= 0:
        return 1 << 62
    return max(g, (b // elem_size) // g * g)


def chunk_bounds(numel: int, step: int, g: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ceil(numel / step) chunks of near-equal length, each a multiple of
    ``g`` (``numel`` is one): no short tail chunk paying a collective's fixed cost on its own."""
    n = max(1, -(-numel // step))
    base, extra = divmod(numel // g, n)
    bounds, s = [], 0
    for i in range(n):
        e = s + (base + (i < extra)) * g
        if e > s:
            bounds.append((s, e))
        s = e
    return bounds


def _one_shot(full: torch.Tensor, shard_len: int, op: Any, ctx: DistContext, inter_dtype: torch.dtype | None,
              divisor: int | None = None) -> None:
    """Reduce-scatter, inter-node all-reduce, all-gather of the whole (padded) tensor.
    ``divisor``: divide the reduced shard before the all-gather (AVG), 1/G of the work of
    dividing the gathered tensor on every rank."""
    global _PROBED
    import torch
    import torch.distributed as dist

    g = ctx.local_world_size
    if g > 1:
        shard = torch.empty(shard_len, dtype=full.dtype, device=full.device)
        _reduce_scatter(shard, full, op, ctx.intra_group)
    else:
        shard = full
    if ctx.num_nodes > 1:
        if inter_dtype is not None and inter_dtype != shard.dtype:
            wire = shard.to(inter_dtype)
            dist.all_reduce(wire, op=op, group=ctx.inter_group)
            shard.copy_(wire)
        else:
            dist.all_reduce(shard, op=op, group=ctx.inter_group)
    if divisor is not None:
        shard.div_(divisor)
    if g > 1:
        _all_gather(full, shard, ctx.intra_group)
    _PROBED = True


def _pipelined(full: torch.Tensor, step: int, op: Any, ctx: DistContext, inter_dtype: torch.dtype | None,
               divisor: int | None = None) -> None:
    """The same three steps per chunk, overlapped: while chunk c crosses nodes (inter group),
    chunk c+1 is reduce-scattered and chunk c-1 all-gathered inside the node (intra group).
    Every rank issues the collectives of each group in the same order, as they must."""
    import torch
    import torch.distributed as dist

    g = ctx.local_world_size
    bounds = chunk_bounds(full.numel(), step, g)
    k = len(bounds)
    chunks = [full[s:e] for s, e in bounds]
    if g > 1:
        shards = [torch.empty((e - s) // g, dtype=full.dtype, device=full.device) for s, e in bounds]
    else:
        shards = chunks
    compress = ctx.num_nodes > 1 and inter_dtype is not None and inter_dtype != full.dtype
    wires: list[Any] = [None] * k

    def reduce_scatter(c: int) -> Any:
        if g == 1:
            return None
        return rs_single(shards[c], chunks[c], op=op, group=ctx.intra_group, async_op=True)

    def cross(c: int) -> Any:
        if ctx.num_nodes == 1:
            return None
        if compress:
            wires[c] = shards[c].to(inter_dtype)
            return dist.all_reduce(wires[c], op=op, group=ctx.inter_group, async_op=True)
        return dist.all_reduce(shards[c], op=op, group=ctx.inter_group, async_op=True)

    def gather(c: int) -> Any:
        if compress:
            shards[c].copy_(wires[c])
            wires[c] = None
        if divisor is not None:
            shards[c].div_(divisor)
        if g == 1:
            return None
        return ag_single(chunks[c], shards[c], group=ctx.intra_group, async_op=True)

    def wait(w: Any) -> None:
        if w is not None:
            w.wait()

    pending_rs = reduce_scatter(0)
    crossing: list[Any] = [None] * k
    gathers: list[Any] = []
    for c in range(k):
        wait(pending_rs)
        if c + 1 < k:
            pending_rs = reduce_scatter(c + 1)
        crossing[c] = cross(c)
        if c >= 1:
            wait(crossing[c - 1])
            gathers.append(gather(c - 1))
    wait(crossing[k - 1])
    gathers.append(gather(k - 1))
    for w in gathers:
        wait(w)


def hierarchical_all_reduce(
    tensor: torch.Tensor,
    op: dist.ReduceOp.RedOpType | Any = None,
    *,
    context: DistContext | None = None,
    inter_dtype: torch.dtype | None = None,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """All-reduce ``tensor`` in place over the whole job, one node at a time; returns it.

    ``op``: SUM (default), AVG, MAX, MIN or PRODUCT. AVG is computed as SUM then a division by
    the world size on every backend, so results do not depend on a backend's AVG support.
    ``inter_dtype``: cast the shard to this dtype (bf16/fp16) for the inter-node step only.
    ``chunk_bytes``: tensors larger than this are reduced in chunks, pipelined so that one
    chunk crosses nodes while the next is reduced inside the node (default None: about
    ``PIPELINE_DEPTH`` chunks of 256 KiB..2 MiB; 0 = one shot). Chunking never changes the result.
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

    g = ctx.local_world_size
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    flat = work.view(-1)
    n = flat.numel()
    full = padded(flat, g)
    shard_len = full.numel() // g

    if n:
        step = chunk_elems(chunk_bytes, full.element_size(), g, full.numel())
        divisor = ctx.world_size if average else None
        if not stream_ready() or step >= full.numel():
            _one_shot(full, shard_len, op, ctx, inter_dtype, divisor)
        else:
            _pipelined(full, step, op, ctx, inter_dtype, divisor)
        if full is not flat:
            flat.copy_(full[:n])
    if work is not tensor:
        tensor.copy_(work)
    return tensor


@dataclass(frozen=True, eq=False)
class HookState:
    """State of the hierarchical DDP comm hook."""

    context: DistContext
    inter_dtype: torch.dtype | None = None
    overlap: bool = True
    """Reduce buckets on a communication thread while backward continues (False: in the hook)."""
    chunk_bytes: int | None = None
    """Pipelining chunk of each bucket (None: the stream's 1 MiB, or :func:`default_chunk_bytes`
    of the bucket without ``overlap``; 0: one shot)."""
    stream: BucketStream | None = field(default=None, repr=False)
    """With ``overlap``: the pipeline all of a backward pass's buckets go through."""

    def __post_init__(self) -> None:
        if self.overlap and self.stream is None:
            stream = BucketStream(self.context, inter_dtype=self.inter_dtype, chunk_bytes=self.chunk_bytes,
                                  one_bucket=self.reduce)
            object.__setattr__(self, "stream", stream)

    def reduce(self, buffer: torch.Tensor) -> torch.Tensor:
        """Average one bucket by itself, in place."""
        import torch.distributed as dist

        return hierarchical_all_reduce(buffer, dist.ReduceOp.AVG, context=self.context, inter_dtype=self.inter_dtype,
                                       chunk_bytes=self.chunk_bytes)


def hierarchical_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average the bucket with :func:`hierarchical_all_reduce`.

    With ``state.overlap`` (default) the bucket goes to the state's :class:`BucketStream`,
    which reduces every bucket of the backward pass in one pipeline on its communication
    thread while backward goes on; the returned Future completes when the bucket is done.
    Otherwise it is reduced here and the Future is already complete.
    """
    import torch

    if state.stream is not None:
        return state.stream.submit(bucket.buffer(), bucket.is_last())
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(state.reduce(bucket.buffer()))
    return fut


def flat_compressed_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: flat all-reduce of the bucket cast to ``state.inter_dtype`` (every hop compressed).

    torch's own bf16 hook refuses non-NCCL backends; this one works on gloo too.
    """
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
    # (postponed evaluation), so give DDP the objects it looks for.
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
    """Apply config ``comm.allreduce`` / ``comm.compression`` to a DDP model; returns the mode used.

    flat + no compression leaves DDP's own all-reduce; flat + bf16/fp16 registers
    :func:`flat_compressed_hook` (every hop compressed); hierarchical registers
    :func:`hierarchical_hook` (compression of the inter-node step only), reducing each
    bucket while backward goes on unless ``overlap`` is False.
    """
    m = parse_comm_mode(mode)
    c = parse_compression(compression)
    if m is CommMode.FLAT:
        if c is not Compression.NONE:
            _real_hook_annotations()
            model_ddp.register_comm_hook(HookState(context=_context(context), inter_dtype=c.dtype()), flat_compressed_hook)
        return m
    ctx = _context(context)
    ctx.require_hierarchical()
    _real_hook_annotations()
    if chunk_bytes is not None and chunk_bytes < 0:
        raise NumarunError(f"bad chunk size {chunk_bytes} bytes: expected 0 (one shot) or more")
    model_ddp.register_comm_hook(HookState(context=ctx, inter_dtype=c.dtype(), overlap=overlap, chunk_bytes=chunk_bytes),
                                 hierarchical_hook)
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
