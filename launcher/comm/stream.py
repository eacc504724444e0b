"""One pipeline for all of a backward pass's DDP buckets, so the link never waits for a bucket's tail
(docs/allreduce.md).

The order of collectives depends only on the buckets' sizes and ``is_last()``, never on timing.
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
from .pipeline import Chunk, PipelineJob, Steps

if TYPE_CHECKING:
    import torch

    from .context import DistContext

STREAM_CHUNK_BYTES = 2**20  # the same for every bucket: small buckets are not cut too small
PREFETCH = 2  # the in-node step of the next chunk shares the CPU with backward
CROSSING = 2


@dataclass(eq=False)
class _Bucket:
    buffer: torch.Tensor
    is_last: bool
    future: torch.futures.Future[torch.Tensor]


class BucketStream:
    """Averages DDP buckets on one communication thread, a backward pass's buckets in one chunk pipeline;
    ``submit`` returns a Future completed when that bucket is reduced in place."""

    def __init__(self, context: DistContext, *, inter_dtype: torch.dtype | None, chunk_bytes: int | None) -> None:
        import torch.distributed as dist

        self.context = context
        self.chunk_bytes = chunk_bytes
        self.steps = Steps(
            context, op=dist.ReduceOp.SUM, inter_dtype=inter_dtype, divisor=context.world_size
        )  # average
        self._jobs: queue.SimpleQueue[_Bucket] = queue.SimpleQueue()
        self._taken: list[_Bucket] = []  # of the pass in progress
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
            job = PipelineJob(flat, coll.padded(flat, g), done=functools.partial(b.future.set_result, b.buffer))
            step = coll.chunk_elems(chunk, job.full.element_size(), g, job.full.numel())
            yield from pipeline.chunks_of(job, step, g)
