"""One pipeline for all of a backward pass's DDP buckets: the link never waits for a bucket's tail.

:func:`numarun.comm.allreduce.hierarchical_all_reduce` pipelines the chunks of one tensor:
while chunk c crosses nodes, chunk c+1 is reduce-scattered and chunk c-1 all-gathered
inside the node. Run once per DDP bucket, each bucket starts with the link idle (its first
chunk is being reduce-scattered) and ends with the link idle (its last chunk is being
all-gathered), and the next bucket waits for both. :class:`BucketStream` feeds the chunks of
every bucket of a backward pass to the same scheduler (:func:`numarun.comm.pipeline.run`) as
one stream instead: the first chunk of bucket k+1 is reduce-scattered while the last chunk of
bucket k crosses, so with buckets arriving in time the link is busy from the first bucket to
the last.

Collectives must be issued in the same order on every rank, per process group. The order
here depends only on the buckets' sizes and on ``bucket.is_last()``, never on timing: when a
bucket's chunks run out and it is not the last of the pass, the stream waits for the next
bucket before it issues anything more on the intra-node group (the chunk already crossing
keeps the link busy meanwhile).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from . import collectives as coll
from . import pipeline
from .pipeline import Chunk, Job, Steps

if TYPE_CHECKING:
    import torch

    from .context import DistContext

STREAM_CHUNK_BYTES = 2**20
"""Default chunk: the same for every bucket, so small buckets (which start the link early
in backward) are not cut into chunks too small to keep the link busy between collectives."""
PREFETCH = 2
"""Chunks reduce-scattered ahead of the one about to cross: the link need not wait for the
in-node step of the next chunk, which shares the CPU with backward."""
CROSSING = 2
"""Chunks on the inter-node link at once: one starts while the other finishes."""


@dataclass(eq=False)
class _Bucket:
    buffer: torch.Tensor
    is_last: bool
    future: torch.futures.Future[torch.Tensor]


class BucketStream:
    """Averages DDP buckets hierarchically on one communication thread, all of a backward
    pass's buckets in one chunk pipeline. ``submit`` returns a Future completed when that
    bucket is reduced (in place).

    Until the backend has shown the collectives the pipeline needs (the context's
    ``tensor_forms``), a pass reduces its buckets one at a time, the first in one shot."""

    def __init__(self, context: DistContext, *, inter_dtype: torch.dtype | None, chunk_bytes: int | None) -> None:
        import torch.distributed as dist

        self.context = context
        self.chunk_bytes = chunk_bytes
        self.steps = Steps(context, op=dist.ReduceOp.SUM, inter_dtype=inter_dtype, divisor=context.world_size)
        """Every bucket is averaged: SUM, then each reduced shard divided by the world size."""
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
        buckets = self._buckets(first)
        forms = self.context.tensor_forms
        if not forms.pipeline_ok:
            for b in buckets:
                flat = b.buffer.view(-1)
                if flat.numel():
                    pipeline.reduce_flat(flat, self.steps, forms=forms, chunk_bytes=self.chunk_bytes)
                b.future.set_result(b.buffer)
            return
        pipeline.run(self._chunks(buckets), self.steps, prefetch=PREFETCH, crossing=CROSSING)

    def _chunks(self, buckets: Iterator[_Bucket]) -> Iterator[Chunk]:
        g = self.context.local_world_size
        chunk = STREAM_CHUNK_BYTES if self.chunk_bytes is None else self.chunk_bytes
        for b in buckets:
            flat = b.buffer.view(-1)
            if flat.numel() == 0:
                b.future.set_result(b.buffer)
                continue
            job = Job(flat, coll.padded(flat, g), done=functools.partial(b.future.set_result, b.buffer))
            step = coll.chunk_elems(chunk, job.full.element_size(), g, job.full.numel())
            yield from pipeline.chunks_of(job, step, g)
