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
            step = ar.chunk_elems(self.chunk_bytes, b.full.element_size(), g, b.full.numel())
            bounds = [(s, min(s + step, b.full.numel())) for s in range(0, b.full.numel(), step)]
            b.pending = len(bounds)
            for s, e in bounds:
                data = b.full[s:e]
                shard = torch.empty((e - s) // g, dtype=data.dtype, device=data.device) if g > 1 else data
                yield _Chunk(b, data, shard)

    def _pipeline(self, chunks: Iterator[_Chunk]) -> None:
        """RS(c0); then per chunk c: cross(c), gather(c-1), RS(c+1). Per group the order is
        fixed by the chunk sequence alone: intra RS(c0), AG(c0-1)... ; inter cross(c) in order."""
        c = next(chunks, None)
        if c is None:
            return
        rs = self._reduce_scatter(c)
        prev: _Chunk | None = None
        crossing_prev: Any = None
        while c is not None:
            _wait(rs)
            crossing = self._cross(c)
            if prev is not None:
                _wait(crossing_prev)
                self._gather(prev)
            nxt = next(chunks, None)  # may wait for the next bucket; c is crossing meanwhile
            rs = self._reduce_scatter(nxt) if nxt is not None else None
            prev, crossing_prev, c = c, crossing, nxt
        if prev is not None:
            _wait(crossing_prev)
            self._gather(prev)

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
        if b.pending == 0:
            for w in b.gathers:
                _wait(w)
            b.gathers.clear()
            assert b.full is not None
            flat = b.buffer.view(-1)
            if b.full.data_ptr() != flat.data_ptr():  # padded: copy the data back
                flat.copy_(b.full[: flat.numel()])
            b.full = None
            b.future.set_result(b.buffer)


def _wait(work: Any) -> None:
    if work is not None:
        work.wait()
