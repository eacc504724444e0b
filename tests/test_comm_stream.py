"""The hierarchical DDP hook's bucket stream, without collectives: order, passes, failures.

Before the backend has been probed (a fresh process) the stream reduces each bucket by
itself with the function it was given; that path is what these tests drive. The pipelined
path is checked against plain DDP with real gloo ranks in tests/test_dist_multinode.py.
"""

from __future__ import annotations

import threading
import types

import pytest
import torch

from numarun.comm import allreduce
from numarun.comm.stream import BucketStream

CTX = types.SimpleNamespace(local_world_size=2, num_nodes=2, world_size=4, intra_group=None, inter_group=None)


@pytest.fixture(autouse=True)
def _not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allreduce, "_PROBED", False)


def _stream(one_bucket):  # type: ignore[no-untyped-def]
    return BucketStream(CTX, inter_dtype=None, chunk_bytes=None, one_bucket=one_bucket)  # type: ignore[arg-type]


def test_buckets_are_reduced_in_order_off_the_caller_thread() -> None:
    seen: list[tuple[float, str]] = []
    gate = threading.Event()

    def one(buf: torch.Tensor) -> torch.Tensor:
        if buf.item() == 0:
            gate.wait(10)  # backward goes on while the first bucket is still being reduced
        seen.append((buf.item(), threading.current_thread().name))
        return buf.mul_(10)

    s = _stream(one)
    futs = [s.submit(torch.tensor([float(i)]), is_last=i == 4) for i in range(5)]
    assert not futs[0].done()
    gate.set()
    assert [f.wait().item() for f in futs] == [0, 10, 20, 30, 40]
    assert [v for v, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"numarun-comm"}


def test_a_failure_fails_the_rest_of_its_pass_and_the_next_pass_runs() -> None:
    calls: list[float] = []

    def one(buf: torch.Tensor) -> torch.Tensor:
        calls.append(buf.item())
        if buf.item() == 1:
            raise RuntimeError("collective failed")
        return buf

    s = _stream(one)
    first = [s.submit(torch.tensor([float(i)]), is_last=i == 3) for i in range(4)]
    assert first[0].wait().item() == 0
    for f in first[1:]:
        with pytest.raises(RuntimeError, match="collective failed"):
            f.wait()
    assert calls == [0, 1]  # buckets after the failure are not reduced: no collective half-issued
    second = [s.submit(torch.tensor([float(i)]), is_last=i == 1) for i in (5, 6)]
    assert [f.wait().item() for f in second] == [5, 6]


def test_an_empty_bucket_completes_without_a_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allreduce, "_PROBED", True)  # the pipelined path; nothing to send
    s = _stream(lambda buf: pytest.fail("not the one-bucket path"))
    fut = s.submit(torch.empty(0), is_last=True)
    assert fut.wait().numel() == 0


class _Collectives:
    """Stand-ins for the three collectives, as if every rank held the same bucket: RS sums G
    equal contributions, the crossing N, AG puts this rank's (rank 0's) shard in its slot; the
    other slots still hold the input, which is what the other ranks' shards average to. Records the order
    of the calls per group; a work completes when waited on (or at once with ``eager``)."""

    def __init__(self, eager: bool = True) -> None:
        self.calls: list[tuple[str, int]] = []
        self.eager = eager

    def work(self) -> types.SimpleNamespace:
        state = {"done": self.eager}
        return types.SimpleNamespace(wait=lambda: state.update(done=True), is_completed=lambda: state["done"])

    def rs(self, out: torch.Tensor, data: torch.Tensor, **_: object) -> types.SimpleNamespace:
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


def _fake_collectives(monkeypatch: pytest.MonkeyPatch, eager: bool = True) -> _Collectives:
    fake = _Collectives(eager)
    monkeypatch.setattr(allreduce, "_PROBED", True)
    monkeypatch.setattr(allreduce, "rs_single", fake.rs)
    monkeypatch.setattr(allreduce, "ag_single", fake.ag)
    monkeypatch.setattr(torch.distributed, "all_reduce", fake.cross)
    return fake


def _pass(sizes: list[int], *, chunk_bytes: int, inter_dtype: torch.dtype | None = None,
          gap: threading.Event | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One backward pass of buckets of these sizes through a stream; with ``gap``, the last
    bucket is submitted only once the stream has had the others for a while."""
    s = BucketStream(CTX, inter_dtype=inter_dtype, chunk_bytes=chunk_bytes,  # type: ignore[arg-type]
                     one_bucket=lambda b: pytest.fail("not the pipelined path"))
    g = torch.Generator().manual_seed(1)
    buckets = [torch.randn(n, generator=g) for n in sizes]
    expect = [b.clone() for b in buckets]
    futs = []
    for i, b in enumerate(buckets):
        if gap is not None and i == len(buckets) - 1:
            gap.wait(0.2)
        futs.append(s.submit(b, is_last=i == len(buckets) - 1))
    return [f.wait() for f in futs], expect


def test_the_pipeline_averages_every_bucket_with_padding_and_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_collectives(monkeypatch)
    got, expect = _pass([7, 64, 1, 33], chunk_bytes=32)  # odd sizes: padded to the 2 ranks per node
    for a, b in zip(got, expect, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # G*N equal parts, averaged: the input
    bf16, expect = _pass([7, 64, 1, 33], chunk_bytes=32, inter_dtype=torch.bfloat16)
    for a, b in zip(bf16, expect, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)  # the crossing in bf16


def test_the_pipeline_issues_one_order_whatever_the_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_collectives(monkeypatch)
    _pass([40, 64, 24], chunk_bytes=64)
    eager = list(fake.calls)
    late = _fake_collectives(monkeypatch, eager=False)  # works finish only when waited on
    _pass([40, 64, 24], chunk_bytes=64, gap=threading.Event())  # and the last bucket comes late
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


def test_chunk_bounds_are_near_equal_multiples_of_the_ranks_per_node() -> None:
    assert allreduce.chunk_bounds(40, 16, 2) == [(0, 14), (14, 28), (28, 40)]
    assert allreduce.chunk_bounds(8, 100, 2) == [(0, 8)]
    assert allreduce.chunk_bounds(6, 2, 2) == [(0, 2), (2, 4), (4, 6)]
    for n, step, g in [(1000, 96, 4), (4, 4, 4), (2**20 + 2, 2**16, 2)]:
        b = allreduce.chunk_bounds(n, step, g)
        assert b[0][0] == 0 and b[-1][1] == n and all(e == s2 for (_, e), (s2, _) in zip(b, b[1:]))
        lens = [e - s for s, e in b]
        assert all(ln % g == 0 for ln in lens) and max(lens) - min(lens) <= g


def test_ddp_buckets_default_small_for_the_hierarchical_hook_only() -> None:
    assert allreduce.ddp_bucket_mb(None, "hierarchical") == allreduce.HIERARCHICAL_BUCKET_MB == 2.0
    assert allreduce.ddp_bucket_mb(None, "flat") is None  # DDP's own default
    assert allreduce.ddp_bucket_mb(8.0, "hierarchical") == 8.0 and allreduce.ddp_bucket_mb(3.0, "flat") == 3.0
