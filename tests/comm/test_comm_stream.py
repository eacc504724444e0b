"""The chunk pipeline, the hierarchical DDP hook's bucket stream and hierarchical_all_reduce,
over stand-in collectives: order per group, passes, failures, the backend probe.

The stand-ins reduce as if every rank held the same data, so every result is checkable on
one process; real gloo ranks are compared with plain all_reduce and DDP in
tests/comm/test_comm_multinode.py.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable

import pytest
import torch

from numarun.comm import allreduce, collectives
from numarun.comm.collectives import TensorForms
from numarun.comm.stream import BucketStream

CTX = types.SimpleNamespace(local_world_size=2, num_nodes=2, world_size=4, intra_group=None, inter_group=None)
"""The shape of the job the stand-ins reduce for: 2 nodes x 2 ranks."""


def _ctx() -> types.SimpleNamespace:
    """A context of that shape, nothing reduced on it yet."""
    return types.SimpleNamespace(**vars(CTX), tensor_forms=TensorForms(), require_hierarchical=lambda: None)


class _Collectives:
    """Stand-ins for the three collectives, as if every rank held the same data: RS sums G
    equal contributions, the crossing N, AG puts this rank's (rank 0's) shard in its slot; the
    other slots still hold the input, which is what the other ranks' shards average to. Records
    the calls in order, each as (kind, elements); a work completes when waited on (or at once
    with ``eager``). ``on_rs`` sees each reduce-scatter's input first (to stall or fail it)."""

    def __init__(self, eager: bool = True, on_rs: Callable[[torch.Tensor], None] | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.eager = eager
        self.on_rs = on_rs

    def work(self) -> types.SimpleNamespace:
        state = {"done": self.eager}
        return types.SimpleNamespace(wait=lambda: state.update(done=True), is_completed=lambda: state["done"])

    def rs(self, out: torch.Tensor, data: torch.Tensor, **_: object) -> types.SimpleNamespace:
        if self.on_rs is not None:
            self.on_rs(data)
        self.calls.append(("rs", data.numel()))
        out.copy_(data.view(CTX.local_world_size, -1)[0] * CTX.local_world_size)
        return self.work()

    def cross(self, t: torch.Tensor, **_: object) -> types.SimpleNamespace:
        self.calls.append(("cross", t.numel()))
        t.mul_(CTX.num_nodes)
        return self.work()

    def ag(self, data: torch.Tensor, shard: torch.Tensor, **_: object) -> types.SimpleNamespace:
        self.calls.append(("ag", shard.numel()))
        data.view(CTX.local_world_size, -1)[0].copy_(shard)
        return self.work()

    def take(self) -> list[tuple[str, int]]:
        calls, self.calls = self.calls, []
        return calls


def _fake_collectives(
    monkeypatch: pytest.MonkeyPatch, eager: bool = True, on_rs: Callable[[torch.Tensor], None] | None = None
) -> _Collectives:
    fake = _Collectives(eager, on_rs)
    monkeypatch.setattr(collectives, "rs_single", fake.rs)
    monkeypatch.setattr(collectives, "ag_single", fake.ag)
    monkeypatch.setattr(torch.distributed, "all_reduce", fake.cross)
    return fake


def _stream(
    chunk_bytes: int | None = None, inter_dtype: torch.dtype | None = None, ctx: types.SimpleNamespace | None = None
) -> BucketStream:
    return BucketStream(ctx or _ctx(), inter_dtype=inter_dtype, chunk_bytes=chunk_bytes)  # type: ignore[arg-type]


def _submit(
    s: BucketStream, buckets: list[torch.Tensor], gap: threading.Event | None = None
) -> list[torch.futures.Future[torch.Tensor]]:
    """One backward pass; with ``gap``, the last bucket comes once the stream has had the others a while."""
    futs = []
    for i, b in enumerate(buckets):
        if gap is not None and i == len(buckets) - 1:
            gap.wait(0.2)
        futs.append(s.submit(b, is_last=i == len(buckets) - 1))
    return futs


def _probed(fake: _Collectives, **options: object) -> BucketStream:
    """A stream past its first pass (one bucket, in one shot: the probe), calls forgotten."""
    s = _stream(**options)  # type: ignore[arg-type]
    fake.take()
    assert [f.wait().item() for f in _submit(s, [torch.tensor([3.0])])] == [3.0]
    assert fake.take() == [("rs", 2), ("cross", 1), ("ag", 1)]  # padded to the 2 ranks per node
    assert s.context.tensor_forms.pipeline_ok
    return s


def _pass(
    s: BucketStream, sizes: list[int], gap: threading.Event | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    buckets = [torch.randn(n, generator=g) for n in sizes]
    expect = [b.clone() for b in buckets]
    return [f.wait() for f in _submit(s, buckets, gap)], expect


def test_buckets_are_reduced_in_order_off_the_caller_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, str]] = []
    gate = threading.Event()

    def on_rs(data: torch.Tensor) -> None:
        if data[0].item() == 0:
            gate.wait(10)  # backward goes on while the first bucket is still being reduced
        seen.append((data[0].item(), threading.current_thread().name))

    _fake_collectives(monkeypatch, on_rs=on_rs)
    futs = _submit(_stream(), [torch.tensor([float(i)]) for i in range(5)])
    assert not futs[0].done()
    gate.set()
    assert [f.wait().item() for f in futs] == [0, 1, 2, 3, 4]
    assert [v for v, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"numarun-comm"}


def test_a_failure_fails_the_rest_of_its_pass_and_the_next_pass_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    def on_rs(data: torch.Tensor) -> None:
        calls.append(data[0].item())
        if data[0].item() == 1:
            raise RuntimeError("collective failed")

    _fake_collectives(monkeypatch, on_rs=on_rs)
    s = _stream()
    first = _submit(s, [torch.tensor([float(i)]) for i in range(4)])
    assert first[0].wait().item() == 0
    for f in first[1:]:
        with pytest.raises(RuntimeError, match="collective failed"):
            f.wait()
    assert calls == [0, 1]  # buckets after the failure are not reduced: no collective half-issued
    second = _submit(s, [torch.tensor([5.0]), torch.tensor([6.0])])
    assert [f.wait().item() for f in second] == [5, 6]
    assert calls == [0, 1, 5, 6]


def test_an_empty_bucket_completes_without_a_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_collectives(monkeypatch)
    s = _stream()
    assert _submit(s, [torch.empty(0)])[0].wait().numel() == 0  # first pass: bucket by bucket
    assert fake.calls == [] and not s.context.tensor_forms.tried
    s = _probed(fake)
    assert _submit(s, [torch.empty(0)])[0].wait().numel() == 0  # later: the stream's pipeline
    assert fake.calls == []


def test_the_pipeline_averages_every_bucket_with_padding_and_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_collectives(monkeypatch)
    got, expect = _pass(_probed(fake, chunk_bytes=32), [7, 64, 1, 33])  # odd sizes: padded to 2 ranks per node
    for a, b in zip(got, expect, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # G*N equal parts, averaged: the input
    bf16, expect = _pass(_probed(fake, chunk_bytes=32, inter_dtype=torch.bfloat16), [7, 64, 1, 33])
    for a, b in zip(bf16, expect, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)  # the crossing in bf16


def test_the_pipeline_issues_one_order_whatever_the_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_collectives(monkeypatch)
    _pass(_probed(fake, chunk_bytes=64), [40, 64, 24])
    eager = fake.take()
    late = _fake_collectives(monkeypatch, eager=False)  # works finish only when waited on
    _pass(_probed(late, chunk_bytes=64), [40, 64, 24], gap=threading.Event())  # and the last bucket comes late
    assert late.calls == eager
    # 16 elements per chunk at most; no short tail chunk: 40 -> 14+14+12, 64 -> 16 x 4, 24 -> 12+12
    assert [n for k, n in eager if k == "rs"] == [14, 14, 12, 16, 16, 16, 16, 12, 12]
    # two chunks reduce-scattered ahead of the link, two on it at once: the in-node order is
    # RS0 RS1 | RS2 | RS3 AG0 | RS4 AG1 ... and every crossing follows its own RS
    kinds = [k for k, _ in eager]
    assert kinds[:6] == ["rs", "rs", "cross", "rs", "cross", "rs"]
    intra = [k for k in kinds if k != "cross"]
    assert intra[:5] == ["rs", "rs", "rs", "rs", "ag"]
    assert kinds.count("cross") == kinds.count("ag") == 9


def test_the_first_reduction_on_a_context_probes_then_the_stream_pipelines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until a one-shot reduction has shown the backend has the collectives the pipeline
    needs, a pass reduces bucket by bucket, the first in one shot. What it has shown is the
    context's: a new context starts over; a call made before on the same context counts."""
    fake = _fake_collectives(monkeypatch)
    for _ in range(2):
        s = _stream(chunk_bytes=64)  # a new context each time
        got, expect = _pass(s, [40, 64, 24])
        for a, b in zip(got, expect, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        first = fake.take()
        # bucket 40 in one shot; then each bucket pipelined by itself (one tensor's depth)
        assert [n for k, n in first if k == "rs"] == [40, 16, 16, 16, 16, 12, 12]
        assert [k for k, _ in first][:3] == ["rs", "cross", "ag"]
        _pass(s, [40, 64, 24])
        assert [n for k, n in fake.take() if k == "rs"] == [14, 14, 12, 16, 16, 16, 16, 12, 12]
    ctx = _ctx()
    allreduce.hierarchical_all_reduce(torch.ones(8), context=ctx)  # type: ignore[arg-type]
    assert fake.take() == [("rs", 8), ("cross", 4), ("ag", 4)]
    _pass(_stream(chunk_bytes=64, ctx=ctx), [40, 64, 24])
    assert [n for k, n in fake.take() if k == "rs"] == [14, 14, 12, 16, 16, 16, 16, 12, 12]


def test_all_reduce_of_one_tensor_probes_then_pipelines_in_one_order(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_collectives(monkeypatch)
    ctx = _ctx()
    avg = torch.distributed.ReduceOp.AVG
    t = torch.arange(63, dtype=torch.float32)  # odd: padded to 64
    allreduce.hierarchical_all_reduce(t, avg, context=ctx, chunk_bytes=64)  # type: ignore[arg-type]
    torch.testing.assert_close(t, torch.arange(63, dtype=torch.float32), rtol=0, atol=0)
    assert fake.take() == [("rs", 64), ("cross", 32), ("ag", 32)]  # the first call: one shot
    allreduce.hierarchical_all_reduce(t, avg, context=ctx, chunk_bytes=64)  # type: ignore[arg-type]
    torch.testing.assert_close(t, torch.arange(63, dtype=torch.float32), rtol=0, atol=0)
    calls = fake.take()
    assert [n for k, n in calls if k == "rs"] == [16, 16, 16, 16]
    # one chunk reduce-scattered ahead of the link, two on it at once
    intra = [k for k, _ in calls if k != "cross"]
    assert intra == ["rs", "rs", "rs", "ag", "rs", "ag", "ag", "ag"]
    kinds = [k for k, _ in calls]
    assert kinds.index("cross") == 1 and kinds.count("cross") == 4


def test_a_backend_without_the_tensor_forms_falls_back_and_never_pipelines(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_collectives(monkeypatch)

    def no_rs(*_: object, **__: object) -> None:
        raise RuntimeError("reduce_scatter_tensor is not supported by this backend")

    monkeypatch.setattr(collectives, "rs_single", no_rs)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: CTX.local_world_size)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    ctx = _ctx()
    for _ in range(2):
        t = torch.arange(64, dtype=torch.float32)
        allreduce.hierarchical_all_reduce(t, torch.distributed.ReduceOp.AVG, context=ctx, chunk_bytes=64)  # type: ignore[arg-type]
        torch.testing.assert_close(t, torch.arange(64, dtype=torch.float32), rtol=0, atol=0)
        # all_reduce + slice inside the node (the stand-in sums two equal parts, as for a crossing)
        assert fake.take() == [("cross", 64), ("cross", 32), ("ag", 32)]  # one shot, every time
    assert ctx.tensor_forms.tried and not ctx.tensor_forms.pipeline_ok


def test_chunk_bounds_are_near_equal_multiples_of_the_ranks_per_node() -> None:
    assert collectives.chunk_bounds(40, 16, 2) == [(0, 14), (14, 28), (28, 40)]
    assert collectives.chunk_bounds(8, 100, 2) == [(0, 8)]
    assert collectives.chunk_bounds(6, 2, 2) == [(0, 2), (2, 4), (4, 6)]
    for n, step, g in [(1000, 96, 4), (4, 4, 4), (2**20 + 2, 2**16, 2)]:
        b = collectives.chunk_bounds(n, step, g)
        assert b[0][0] == 0 and b[-1][1] == n and all(e == s2 for (_, e), (s2, _) in zip(b, b[1:]))
        lens = [e - s for s, e in b]
        assert all(ln % g == 0 for ln in lens) and max(lens) - min(lens) <= g


def test_ddp_buckets_default_small_for_the_hierarchical_hook_only() -> None:
    assert allreduce.ddp_bucket_mb(None, "hierarchical") == allreduce.HIERARCHICAL_BUCKET_MB == 2.0
    assert allreduce.ddp_bucket_mb(None, "flat") is None  # DDP's own default
    assert allreduce.ddp_bucket_mb(8.0, "hierarchical") == 8.0 and allreduce.ddp_bucket_mb(3.0, "flat") == 3.0
