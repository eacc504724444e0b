"""The chunk pipeline: one scheduler for every hierarchical reduction (docs/allreduce.md).

What :func:`run` issues next never depends on whether a collective has finished: the order per group
follows from the chunk sequence alone, the same on every rank.
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
class PipelineJob:
    """One tensor through the pipeline: the tensor of one all-reduce call, or a DDP bucket."""

    flat: torch.Tensor
    full: torch.Tensor  # flat padded to a multiple of the ranks per node
    done: Callable[[], None] | None = None  # once all chunks are gathered and back in flat
    pending: int = 0  # chunks not yet all-gathered
    gathers: list[Any] = field(default_factory=list)  # issued, not yet waited on


@dataclass(eq=False)
class Chunk:
    job: PipelineJob
    data: torch.Tensor  # a slice of job.full
    shard: torch.Tensor  # this rank's 1/G (data itself with one rank per node)
    wire: torch.Tensor | None = None  # the shard in the inter-node dtype while it crosses


def chunks_of(job: PipelineJob, step: int, g: int) -> Iterator[Chunk]:
    """The chunks of ``job.full``, at most ``step`` elements each."""
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
    op: Any  # a dist.ReduceOp; SUM for an average
    inter_dtype: torch.dtype | None = None  # on the inter-node link (SUM only)
    divisor: int | None = None  # AVG: divides the reduced shard before the all-gather (1/G of the work)

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
    """Reduce every chunk, overlapped: per chunk c, cross(c) once RS(c) is done, RS up to c + ``prefetch``,
    gather(c - ``crossing`` + 1) once its crossing is done; jobs' ``done`` in order."""
    ahead: deque[tuple[Chunk, Any]] = deque()  # reduce-scattered (or being), not yet crossing
    on_link: deque[tuple[Chunk, Any]] = deque()
    landed: deque[PipelineJob] = deque()  # all chunks gathered; waiting for their all-gathers to finish

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


def _finish(landed: deque[PipelineJob], *, block: bool) -> None:
    """Complete the jobs whose all-gathers have finished (all with ``block``), in order, as DDP expects."""
    while landed:
        job = landed[0]
        if not block and not all(w is None or w.is_completed() for w in job.gathers):
            return
        for w in job.gathers:
            _wait(w)
        job.gathers.clear()
        if job.full is not job.flat:  # padded: copy the data back
            job.flat.copy_(job.full[: job.flat.numel()])
        landed.popleft()
        if job.done is not None:
            job.done()


ONE_TENSOR_PREFETCH = 1  # chunks reduce-scattered ahead of the one about to cross
ONE_TENSOR_CROSSING = 2  # chunks on the link at once: one starts while the other finishes


def one_shot(full: torch.Tensor, steps: Steps, forms: coll.TensorForms) -> None:
    """The three steps on the whole (padded) tensor in turn, with fallbacks; records in ``forms`` what the backend
    showed."""
    ctx = steps.context
    g = ctx.local_world_size
    c = next(chunks_of(PipelineJob(full, full), full.numel(), g))  # one chunk: the whole tensor
    if g > 1:
        coll.reduce_scatter(c.shard, c.data, steps.op, ctx.intra_group, forms)
    _wait(steps.cross(c))
    steps.finish_shard(c)
    if g > 1:
        coll.all_gather(c.data, c.shard, ctx.intra_group, forms)
    forms.tried = True


def reduce_flat(flat: torch.Tensor, steps: Steps, *, forms: coll.TensorForms, chunk_bytes: int | None) -> None:
    """Reduce one flat, contiguous, non-empty tensor in place: one shot until ``forms`` shows the pipeline can run
    (or when it fits one chunk), else pipelined chunks of ``chunk_bytes``."""
    g = steps.context.local_world_size
    full = coll.padded(flat, g)
    step = coll.chunk_elems(chunk_bytes, full.element_size(), g, full.numel())
    if not forms.pipeline_ok or step >= full.numel():
        one_shot(full, steps, forms)
        if full is not flat:
            flat.copy_(full[: flat.numel()])
    else:
        run(
            chunks_of(PipelineJob(flat, full), step, g),
            steps,
            prefetch=ONE_TENSOR_PREFETCH,
            crossing=ONE_TENSOR_CROSSING,
        )


def _wait(work: Any) -> None:
    if work is not None:
        work.wait()
