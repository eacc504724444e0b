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
