"""The chunk pipeline: one scheduler for every hierarchical reduction.

Each chunk of a tensor goes through three steps (:class:`Steps`): reduce-scatter inside the
node (intra group), all-reduce of this rank's 1/G shard across nodes (inter group), all-gather
inside the node (intra group). :func:`run` overlaps them across chunks, so that while one
chunk crosses nodes the next ones are reduce-scattered and earlier ones all-gathered inside
the node. It takes the chunks as an iterator: :func:`reduce_flat` feeds it the chunks of one
tensor (``hierarchical_all_reduce``), :class:`~numarun.comm.stream.BucketStream` the chunks of
all of a backward pass's DDP buckets, one bucket after another.

Collectives must be issued in the same order on every rank, per process group. :func:`run`
waits on a collective before the next step of the same chunk, but what it issues next never
depends on whether a collective has finished: the order per group follows from the chunk
sequence alone (and so, for the stream, from the buckets' sizes and ``is_last()``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import collectives as coll

if TYPE_CHECKING:
    import torch

    from .context import DistContext


@dataclass(eq=False)
class Job:
    """One tensor through the pipeline: the tensor of one all-reduce call, or a DDP bucket."""

    flat: torch.Tensor
    full: torch.Tensor
    """``flat`` padded to a multiple of the ranks per node (``flat`` itself when it is one)."""
    done: Callable[[], None] | None = None
    """Called once every chunk is all-gathered and the data is back in ``flat``."""
    pending: int = 0
    """Chunks not yet all-gathered."""
    gathers: list[Any] = field(default_factory=list)
    """The all-gathers issued for its chunks, not yet waited on."""


@dataclass(eq=False)
class Chunk:
    job: Job
    data: torch.Tensor
    """A slice of ``job.full``: reduce-scattered from and all-gathered into."""
    shard: torch.Tensor
    """This rank's 1/G of the chunk (``data`` itself with one rank per node)."""
    wire: torch.Tensor | None = None
    """The shard cast to the inter-node dtype while it crosses (compression)."""


def chunks_of(job: Job, step: int, g: int) -> Iterator[Chunk]:
    """The chunks of ``job.full``, at most ``step`` elements each (see :func:`coll.chunk_bounds`)."""
    import torch

    bounds = coll.chunk_bounds(job.full.numel(), step, g)
    job.pending = len(bounds)
    for s, e in bounds:
        data = job.full[s:e]
        shard = torch.empty((e - s) // g, dtype=data.dtype, device=data.device) if g > 1 else data
        yield Chunk(job, data, shard)


@dataclass(frozen=True, eq=False)
class Steps:
    """The three steps of a chunk over this rank's groups, each issued asynchronously."""

    context: DistContext
    op: Any
    """The reduction (a ``dist.ReduceOp``; SUM for an average)."""
    inter_dtype: torch.dtype | None = None
    """The dtype of the shard on the inter-node link (compression; SUM only)."""
    divisor: int | None = None
    """AVG: the reduced shard is divided by this before the all-gather, 1/G of the work of
    dividing the gathered tensor on every rank."""

    def reduce_scatter(self, c: Chunk) -> Any:
        if self.context.local_world_size == 1:
            return None
        return coll.rs_single(c.shard, c.data, op=self.op, group=self.context.intra_group, async_op=True)

    def cross(self, c: Chunk) -> Any:
        import torch.distributed as dist

        if self.context.num_nodes == 1:
            return None
        tensor = c.shard
        if self.inter_dtype is not None and self.inter_dtype != c.shard.dtype:
            c.wire = tensor = c.shard.to(self.inter_dtype)
        return dist.all_reduce(tensor, op=self.op, group=self.context.inter_group, async_op=True)

    def finish_shard(self, c: Chunk) -> None:
        """Between the crossing (done) and the all-gather: the wire back, AVG's division."""
        if c.wire is not None:
            c.shard.copy_(c.wire)
            c.wire = None
        if self.divisor is not None:
            c.shard.div_(self.divisor)

    def gather(self, c: Chunk) -> Any:
        self.finish_shard(c)
        if self.context.local_world_size == 1:
            return None
        return coll.ag_single(c.data, c.shard, group=self.context.intra_group, async_op=True)


def run(chunks: Iterator[Chunk], steps: Steps, *, prefetch: int, crossing: int) -> None:
    """Reduce every chunk, overlapped. Per chunk c, in this order: cross(c) once RS(c) is done;
    RS of the chunks up to c + ``prefetch``; gather(c - ``crossing`` + 1) once its crossing is
    done. So ``prefetch`` chunks are reduce-scattered ahead of the link and ``crossing`` chunks
    are on it at once. Taking the next chunk may block (the stream waits for the next bucket);
    the chunks already crossing keep the link busy meanwhile. A job's ``done`` is called once
    its chunks are all gathered, jobs in order."""
    ahead: deque[tuple[Chunk, Any]] = deque()  # reduce-scattered (or being), not yet crossing
    on_link: deque[tuple[Chunk, Any]] = deque()
    landed: deque[Job] = deque()  # all chunks gathered; waiting for their all-gathers to finish

    def fill() -> None:
        while len(ahead) < prefetch:
            c = next(chunks, None)
            if c is None:
                return
            ahead.append((c, steps.reduce_scatter(c)))

    def land(c: Chunk, cross: Any) -> None:
        _wait(cross)
        c.job.gathers.append(steps.gather(c))
        c.job.pending -= 1
        if c.job.pending == 0:
            landed.append(c.job)

    fill()
    while ahead:
        c, rs = ahead.popleft()
        _wait(rs)
        on_link.append((c, steps.cross(c)))
        fill()
        while len(on_link) >= crossing:
            land(*on_link.popleft())
        _finish(landed, block=False)
    while on_link:
        land(*on_link.popleft())
    _finish(landed, block=True)


def _finish(landed: deque[Job], *, block: bool) -> None:
    """Complete the jobs whose all-gathers have finished (all of them with ``block``), first
    job first, so that DDP sees its buckets complete in order."""
    while landed:
        job = landed[0]
        if not block and not all(_completed(w) for w in job.gathers):
            return
        for w in job.gathers:
            _wait(w)
        job.gathers.clear()
        if job.full is not job.flat:  # padded: copy the data back
            job.flat.copy_(job.full[: job.flat.numel()])
        landed.popleft()
        if job.done is not None:
            job.done()


ONE_TENSOR_PREFETCH = 1
"""Chunks of one tensor reduce-scattered ahead of the one about to cross."""
ONE_TENSOR_CROSSING = 2
"""Chunks of one tensor on the inter-node link at once: one starts while the other finishes."""


def one_shot(full: torch.Tensor, steps: Steps, forms: coll.TensorForms) -> None:
    """The three steps on the whole (padded) tensor, one after the other, with the fallbacks of
    a backend that lacks the tensor forms; records in ``forms`` what the backend has shown."""
    import torch

    ctx = steps.context
    g = ctx.local_world_size
    shard = torch.empty(full.numel() // g, dtype=full.dtype, device=full.device) if g > 1 else full
    c = Chunk(Job(full, full), full, shard)
    if g > 1:
        coll.reduce_scatter(c.shard, c.data, steps.op, ctx.intra_group, forms)
    _wait(steps.cross(c))
    steps.finish_shard(c)
    if g > 1:
        coll.all_gather(c.data, c.shard, ctx.intra_group, forms)
    forms.tried = True


def reduce_flat(flat: torch.Tensor, steps: Steps, *, forms: coll.TensorForms, chunk_bytes: int | None) -> None:
    """Reduce one flat, contiguous, non-empty tensor in place: in one shot until ``forms`` has
    seen the tensor forms work (or when it fits in one chunk), else in pipelined chunks of
    ``chunk_bytes`` (None: :func:`coll.default_chunk_bytes`; 0: one shot)."""
    g = steps.context.local_world_size
    full = coll.padded(flat, g)
    step = coll.chunk_elems(chunk_bytes, full.element_size(), g, full.numel())
    if not forms.pipeline_ok or step >= full.numel():
        one_shot(full, steps, forms)
        if full is not flat:
            flat.copy_(full[: flat.numel()])
    else:
        run(chunks_of(Job(flat, full), step, g), steps, prefetch=ONE_TENSOR_PREFETCH, crossing=ONE_TENSOR_CROSSING)


def _completed(work: Any) -> bool:
    return work is None or bool(work.is_completed())


def _wait(work: Any) -> None:
    if work is not None:
        work.wait()
