"""The hierarchical DDP hook's communication thread: runs calls in order, completes their futures."""

from __future__ import annotations

import threading

import pytest
import torch

from numarun.comm.allreduce import CommThread


def test_calls_run_in_submission_order_off_the_caller_thread() -> None:
    ct = CommThread()
    seen: list[tuple[int, str]] = []
    gate = threading.Event()

    def job(i: int):  # type: ignore[no-untyped-def]
        def run() -> torch.Tensor:
            if i == 0:
                gate.wait(10)  # the caller goes on while the first call is still running
            seen.append((i, threading.current_thread().name))
            return torch.tensor([float(i)])
        return run

    futs = [ct.submit(job(i)) for i in range(5)]
    assert not futs[0].done()
    gate.set()
    assert [f.wait().item() for f in futs] == [0, 1, 2, 3, 4]
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"numarun-comm"}


def test_an_exception_reaches_the_waiter_and_the_thread_goes_on() -> None:
    ct = CommThread()

    def boom() -> torch.Tensor:
        raise RuntimeError("collective failed")

    with pytest.raises(RuntimeError, match="collective failed"):
        ct.submit(boom).wait()
    assert ct.submit(lambda: torch.ones(1)).wait().item() == 1.0
