"""One pipeline for all of a backward pass's DDP buckets: the link never waits for a bucket's tail.

:func:`numarun.comm.allreduce.hierarchical_all_reduce` pipelines the chunks of one tensor:
while chunk c crosses nodes, chunk c+1 is reduce-scattered and chunk c-1 all-gathered
inside the node. Run once per DDP bucket, each bucket starts with the link idle (its first
chunk is being reduce-scattered) and ends with the link idle (its last chunk is being
all-gathered), and the next bucket waits for both. :class:`BucketStream` runs the chunks of
every bucket of a backward pass as one stream instead: the first chunk of bucket k+1 is
reduce-scattered while the last chunk of bucket k crosses, so with buckets arriving in time
the link is busy from the first bucket to the last.

Collectives must be issued in the same order on every rank, per process group. The order
here depends only on the buckets' sizes and on ``bucket.is_last()``, never on timing: when a
bucket's chunks run out and it is not the last of the pass, the stream waits for the next
bucket before it issues anything more on the intra-node group (the chunk already crossing
keeps the link busy meanwhile).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .context import DistContext

if TYPE_CHECKING:
    import torch


@dataclass(eq=False)
class _Bucket:
    buffer: torch.Tensor
    is_last: bool
    future: torch.futures.Future[torch.Tensor]
    full: torch.Tensor | None = None
    """The bucket, padded to a multiple of the ranks per node (``buffer`` itself when it is one)."""
    pending: int = 0
    """Chunks not yet all-gathered."""
    gathers: list[Any] = field(default_factory=list)


@dataclass(eq=False)
class _Chunk:
    bucket: _Bucket
    data: torch.Tensor
    shard: torch.Tensor
    wire: torch.Tensor | None = None


class BucketStream:
    """Averages DDP buckets hierarchically on one communication thread, all of a backward
    pass's buckets in one chunk pipeline. ``submit`` returns a Future completed when that
    bucket is reduced (in place)."""

    def __init__(self, context: DistContext, *, inter_dtype: torch.dtype | None, chunk_bytes: int | None,
                 one_bucket: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.context = context
        self.inter_dtype = inter_dtype
        self.chunk_bytes = chunk_bytes
        self._one_bucket = one_bucket
        """Reduces one bucket by itself: used until the backend has shown the collectives the
        stream needs (the first call probes them), and where it lacks them."""
        self._jobs: queue.SimpleQueue[_Bucket] = queue.SimpleQueue()
        self._taken: list[_Bucket] = []
        """The buckets of the pass in progress taken off the queue so far."""
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, buffer: torch.Tensor, is_last: bool) -> torch.futures.Future[torch.Tensor]:
        import torch

        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="numarun-comm", daemon=True)
                self._thread.start()
        self._jobs.put(_Bucket(buffer, is_last, fut))
        return fut

    # -------------------------------------------------------------------------- the thread

    def _loop(self) -> None:
        while True:
            first = self._jobs.get()
            try:
                self._run_pass(first)
            except BaseException as e:  # handed to backward (which raises it) for every bucket left
                self._fail_pass(first, e)

    def _fail_pass(self, first: _Bucket, error: BaseException) -> None:
        seen = self._taken or [first]
        while not seen[-1].is_last:  # the rest of this pass: failed without a collective
            seen.append(self._jobs.get())
        for b in seen:
            if not b.future.done():
                cast(Any, b.future).set_exception(error)  # torch types it as taking a Tensor
        self._taken = []

    def _buckets(self, first: _Bucket) -> Iterator[_Bucket]:
        self._taken = [first]
        yield first
        while not self._taken[-1].is_last:
            self._taken.append(self._jobs.get())  # blocks: every rank waits here at the same point
            yield self._taken[-1]
        self._taken = []

    def _run_pass(self, first: _Bucket) -> None:
        from . import allreduce as ar

        buckets = self._buckets(first)
        if not ar.stream_ready():
            for b in buckets:
                b.future.set_result(self._one_bucket(b.buffer))
            return
        self._pipeline(self._chunks(buckets))

    def _chunks(self, buckets: Iterator[_Bucket]) -> Iterator[_Chunk]:
        import torch

        from . import allreduce as ar

        g = self.context.local_world_size
        for b in buckets:
            flat = b.buffer.view(-1)
            if flat.numel() == 0:
                b.future.set_result(b.buffer)
                continue
            b.full = ar.padded(flat, g)
            chunk = STREAM_CHUNK_BYTES if self.chunk_bytes is None else self.chunk_bytes
            step = ar.chunk_elems(chunk, b.full.element_size(), g, b.full.numel())
            bounds = ar.chunk_bounds(b.full.numel(), step, g)
            b.pending = len(bounds)
            for s, e in bounds:
                data = b.full[s:e]
                shard = torch.empty((e - s) // g, dtype=data.dtype, device=data.device) if g > 1 else data
                yield _Chunk(b, data, shard)

    def _pipeline(self, chunks: Iterator[_Chunk]) -> None:
        """Per chunk c, in this order: cross(c) once RS(c) is done; RS of the chunks up to
        c + PREFETCH; gather(c - CROSSING + 1) once its crossing is done. So PREFETCH chunks are
        reduce-scattered ahead of the link and CROSSING chunks are on it at once, and the order
        per group follows from the chunk sequence alone. Taking the next chunk may wait for
        the next bucket; the chunks already crossing keep the link busy meanwhile."""
        ahead: deque[tuple[_Chunk, Any]] = deque()  # reduce-scattered (or being), not yet crossing
        crossing: deque[tuple[_Chunk, Any]] = deque()
        done: list[_Bucket] = []  # all chunks gathered; waiting for their all-gathers to finish

        def fill() -> None:
            while len(ahead) < PREFETCH:
                c = next(chunks, None)
                if c is None:
                    return
                ahead.append((c, self._reduce_scatter(c)))

        fill()
        while ahead:
            c, rs = ahead.popleft()
            _wait(rs)
            crossing.append((c, self._cross(c)))
            fill()
            while len(crossing) >= CROSSING:
                self._land(*crossing.popleft(), done)
            _finish(done, block=False)
        while crossing:
            self._land(*crossing.popleft(), done)
        _finish(done, block=True)

    def _land(self, c: _Chunk, cross: Any, done: list[_Bucket]) -> None:
        _wait(cross)
        self._gather(c)
        if c.bucket.pending == 0:
            done.append(c.bucket)

    # -------------------------------------------------------------------------- the three steps

    def _reduce_scatter(self, c: _Chunk) -> Any:
        import torch.distributed as dist

        from . import allreduce as ar

        if self.context.local_world_size == 1:
            return None
        return ar.rs_single(c.shard, c.data, op=dist.ReduceOp.SUM, group=self.context.intra_group, async_op=True)

    def _cross(self, c: _Chunk) -> Any:
        import torch.distributed as dist

        if self.context.num_nodes == 1:
            return None
        tensor = c.shard
        if self.inter_dtype is not None and self.inter_dtype != c.shard.dtype:
            c.wire = tensor = c.shard.to(self.inter_dtype)
        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.context.inter_group, async_op=True)

    def _gather(self, c: _Chunk) -> None:
        from . import allreduce as ar

        if c.wire is not None:
            c.shard.copy_(c.wire)
            c.wire = None
        c.shard.div_(self.context.world_size)  # AVG: 1/G of the work of dividing the bucket
        b = c.bucket
        if self.context.local_world_size > 1:
            b.gathers.append(ar.ag_single(c.data, c.shard, group=self.context.intra_group, async_op=True))
        b.pending -= 1


STREAM_CHUNK_BYTES = 2**20
"""Default chunk: the same for every bucket, so small buckets (which start the link early
in backward) are not cut into chunks too small to keep the link busy between collectives."""
PREFETCH = 2
"""Chunks reduce-scattered ahead of the one about to cross: the link need not wait for the
in-node step of the next chunk, which shares the CPU with backward."""
CROSSING = 2
"""Chunks on the inter-node link at once: one starts while the other finishes."""


def _finish(done: list[_Bucket], *, block: bool) -> None:
    """Complete the futures of buckets whose all-gathers have finished (all of them with
    ``block``), first bucket first, so DDP sees buckets complete in order."""
    while done:
        b = done[0]
        if not block and not all(_completed(w) for w in b.gathers):
            return
        for w in b.gathers:
            _wait(w)
        b.gathers.clear()
        assert b.full is not None
        flat = b.buffer.view(-1)
        if b.full.data_ptr() != flat.data_ptr():  # padded: copy the data back
            flat.copy_(b.full[: flat.numel()])
        b.full = None
        done.pop(0)
        b.future.set_result(b.buffer)


def _completed(work: Any) -> bool:
    return work is None or bool(work.is_completed())


def _wait(work: Any) -> None:
    if work is not None:
        work.wait()
