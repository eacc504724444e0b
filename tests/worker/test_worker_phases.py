"""A rank's step recorder (numarun.worker.phases) driven through its own hooks, in this process: steps end at the
optimizer step, several optimizers make one step, the phases add up, DDP's sampled communication and
Work.wait count as comm; the agent's tail reads what it writes (docs/steps.md, "What is measured")."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest

from numarun.launch.steps.tail import Tail
from numarun.worker import phases, progress
from numarun.worker.steps import PHASES, StepRecord, read_records


class Clock:
    """The recorder's clock, moved by the test: each piece of work below takes exactly the time it says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def work(self, seconds: float) -> Any:
        def spend(*args: Any) -> None:
            self.now += seconds

        return spend


def _recorder(out: Any = None, *, clock: Any = None, **kw: Any) -> phases.Recorder:
    """A recorder writing to memory; its clock is the test's (:class:`Clock`) unless ``clock`` is given."""
    counters = progress.Counters()
    clock = clock or Clock()
    counters.clock = clock
    return phases.Recorder(
        out or io.StringIO(), rank=3, counters=counters, flush_s=0.0, main=threading.get_ident(), clock=clock, **kw
    )


def _records(rec: phases.Recorder) -> list[StepRecord]:
    rec.flush()
    return list(read_records(rec.out.getvalue().splitlines()))


class Opt:
    """Stands for an optimizer: the hooks see only its identity."""


def _step(rec: phases.Recorder, *opts: Opt, inner: Opt | None = None, seconds: float = 0.0) -> None:
    for opt in opts:
        rec.before_step(opt, (), {})
        if inner is not None:  # an optimizer stepped inside another's step (a wrapper's)
            rec.before_step(inner, (), {})
            rec.after_step(inner, (), {})
        rec.clock.work(seconds)()  # type: ignore[attr-defined]
        rec.after_step(opt, (), {})


def test_each_phase_is_timed_and_a_step_is_closed_by_the_next_optimizer_step() -> None:
    rec = _recorder()
    clock = rec.clock
    load = rec.timed(clock.work(0.02))  # type: ignore[attr-defined]
    backward = clock.work(0.01)  # type: ignore[attr-defined]
    all_reduce = rec.counters.wrap("all_reduce", clock.work(0.015))  # type: ignore[attr-defined]
    opt = Opt()
    for _ in range(3):
        load()
        backward()
        all_reduce()
        clock.work(0.01)()  # type: ignore[attr-defined]  # compute
        _step(rec, opt, seconds=0.005)
    assert [r.step for r in _records(rec)] == [1, 2]  # the third is open until the next step or the exit
    rec.finish()
    records = _records(rec)
    assert [r.step for r in records] == [1, 2, 3] and {r.rank for r in records} == {3}
    for r in records:
        assert r.wall_s == pytest.approx(0.06) and r.gpu_s is None and r.peak_bytes and r.peak_bytes > 0
        assert [r.phase_s(p) for p in PHASES] == pytest.approx([0.02, 0.02, 0.015, 0.005])  # backward is compute
    assert records[1].start == records[0].end and records[2].start == records[1].end


def test_several_optimizers_make_one_step_and_an_inner_one_counts_once() -> None:
    rec = _recorder()
    a, b, inner = Opt(), Opt(), Opt()
    for _ in range(3):
        rec.clock.work(0.005)()  # type: ignore[attr-defined]
        _step(rec, a, b, inner=inner, seconds=0.002)
    rec.finish()
    records = _records(rec)
    assert [r.step for r in records] == [1, 2, 3]
    assert all(r.optim_s == pytest.approx(0.004) and r.wall_s == pytest.approx(0.009) for r in records)


def test_a_closure_run_by_the_optimizers_step_is_compute_not_optim() -> None:
    """Lightning runs forward and backward inside ``optimizer.step(closure)``: the closure's time is the step's
    compute, what it waits in a collective is comm, and only the optimizer's own update is optim; the closure the
    optimizer gets (positional or by keyword) returns what the user's returned."""
    rec = _recorder()
    clock = rec.clock
    all_reduce = rec.counters.wrap("all_reduce", clock.work(0.01))  # type: ignore[attr-defined]

    def closure() -> str:
        clock.work(0.03)()  # type: ignore[attr-defined]  # forward and backward
        all_reduce()
        return "loss"

    opt = Opt()
    for by_keyword in (False, True, False):
        changed = rec.before_step(opt, () if by_keyword else (closure,), {"closure": closure} if by_keyword else {})
        assert changed is not None
        args, kwargs = changed
        assert (kwargs["closure"] if by_keyword else args[0])() == "loss"
        clock.work(0.002)()  # type: ignore[attr-defined]  # the update
        rec.after_step(opt, args, kwargs)
    assert rec.before_step(Opt(), (), {}) is None  # no closure: nothing to change
    rec.finish()
    for r in _records(rec)[:3]:
        assert [r.phase_s(p) for p in PHASES] == pytest.approx([0.0, 0.03, 0.01, 0.002])


def test_collectives_inside_the_input_or_an_optimizer_step_count_as_comm_only() -> None:
    rec = _recorder()
    all_reduce = rec.counters.wrap("all_reduce", rec.clock.work(0.02))  # type: ignore[attr-defined]
    load = rec.timed(lambda: all_reduce())
    opt = Opt()
    load()
    rec.before_step(opt, (), {})
    all_reduce()
    rec.after_step(opt, (), {})
    rec.finish()
    (r,) = _records(rec)
    assert r.comm_s == pytest.approx(0.04) and r.input_s == 0 and r.optim_s == 0


def test_work_wait_counts_as_comm_outside_a_collective_and_once_inside_one() -> None:
    rec = _recorder()
    wait = rec.waited(rec.clock.work(0.01))  # type: ignore[attr-defined]
    collective = rec.counters.wrap("all_reduce", lambda: wait(None))
    wait(None)  # an async collective's wait: comm
    assert rec.counters.comm_s == pytest.approx(0.01)
    collective()  # the wait inside a (wrapped) collective: the collective's time counts, once
    assert rec.counters.comm_s == pytest.approx(0.02)
    other = threading.Thread(target=wait, args=(None,))
    before = rec.counters.comm_s
    other.start()
    other.join()
    assert rec.counters.comm_s == before  # another thread's wait is not the step's


@pytest.fixture
def world_of_one() -> Any:
    """torch.distributed in this process: gloo, a world of one (DDP's reducer runs as in any job)."""
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def _ddp_steps(rec: phases.Recorder, ddp: Any, steps: int, *, accumulate: int = 1) -> None:
    """``steps`` optimizer steps of ``ddp``, each over ``accumulate`` backward passes (the earlier ones in
    ``no_sync()``), on the recorder's real clock."""
    import torch

    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(steps):
        for i in range(accumulate):
            x = torch.randn(4, 8)
            if i < accumulate - 1:
                with ddp.no_sync():
                    ddp(x).square().mean().backward()
            else:
                ddp(x).square().mean().backward()
        rec.before_step(opt, (), {})
        opt.step()
        rec.after_step(opt, (), {})
        opt.zero_grad()


@pytest.mark.parametrize("kind", ["plain", "static_graph", "find_unused_parameters", "accumulate"])
def test_the_wait_inside_ddps_backward_is_measured_every_step(world_of_one: Any, kind: str) -> None:
    """A real DDP module whose gradient sync ends 200 ms after each bucket is handed over: the user's own comm hook
    (which DDP accepts, since numarun registers none) completes its future then, as a late peer would. Each
    step's comm holds the wait, measured between the end of the rank's gradients and the end of DDP's sync; the
    backward passes in ``no_sync()`` (gradient accumulation) wait for nothing and add nothing."""
    import time

    import torch
    from torch.nn.parallel import DistributedDataParallel

    rec = _recorder(clock=time.monotonic)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.unused = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1), torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    options = {"static_graph": {"static_graph": True}, "find_unused_parameters": {"find_unused_parameters": True}}
    net = Net()
    if kind != "find_unused_parameters":
        net.unused.requires_grad_(False)
    ddp = DistributedDataParallel(net, **options.get(kind, {}))
    rec.ddp.attach(ddp)

    def late(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses a hook whose annotations are not its own
        done: Any = torch.futures.Future()
        buffer = bucket.buffer()
        threading.Timer(0.200, lambda: done.set_result(buffer)).start()  # the peers' part comes 200 ms later
        return done

    ddp.register_comm_hook(None, late)
    accumulate = 3 if kind == "accumulate" else 1
    _ddp_steps(rec, ddp, 6, accumulate=accumulate)
    rec.finish()
    records = _records(rec)
    assert [r.step for r in records] == [1, 2, 3, 4, 5, 6]
    assert rec.ddp.syncs == 6  # one measured backward a step, whatever the accumulation
    for r in records[1:]:
        # the 200 ms less what backward had left to compute after the bucket was handed over (a millisecond when
        # the host is idle, more when it is loaded)
        assert 0.100 <= r.extra["ddp_wait_s"] < r.wall_s
        assert r.comm_s == pytest.approx(r.extra["ddp_wait_s"], abs=1e-5)
        assert r.compute_s == pytest.approx(r.wall_s - r.comm_s - r.optim_s, abs=1e-5)


def test_ddp_without_a_late_peer_waits_next_to_nothing(world_of_one: Any) -> None:
    """The same module with DDP's own all-reduce: each step's wait is the sync alone, far below the step."""
    import time

    import torch
    from torch.nn.parallel import DistributedDataParallel

    rec = _recorder(clock=time.monotonic)
    ddp = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)))
    rec.ddp.attach(ddp)
    _ddp_steps(rec, ddp, 4)
    rec.finish()
    assert all(r.extra.get("ddp_wait_s", 0.0) < 0.02 for r in _records(rec))


def test_the_loader_workers_are_taken_from_the_iterator() -> None:
    rec = _recorder()

    class It:
        _num_workers = 4

    rec.timed(lambda it: None)(It())
    _step(rec, Opt())
    rec.finish()
    assert _records(rec)[0].extra["loader_workers"] == 4


class Event:
    """A CUDA event as the recorder uses it, for its bookkeeping (no GPU here; scripts/gpu_check.py runs real
    ones): recorded at a time, done when ``done`` says."""

    clock = 0.0
    done = True

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = Event.clock

    def query(self) -> bool:
        return Event.done

    def elapsed_time(self, end: Event) -> float:
        return (end.t - self.t) * 1e3


class Cuda:
    Event = Event

    @staticmethod
    def max_memory_allocated() -> int:
        return 123 << 20


class Torch:
    cuda = Cuda


def test_gpu_events_give_the_steps_gpu_time_and_the_waits_count_as_comm_once_done() -> None:
    rec = _recorder()
    rec.gpu = phases.GpuEvents(Torch)  # type: ignore[arg-type]
    rec.counters.timed = lambda name, entering: rec.gpu.around(entering) if rec.gpu else None
    rec.start = rec._mark(rec.clock())
    opt = Opt()
    for _ in range(2):
        Event.clock += 0.010
        rec.counters.timed("all_reduce", True)
        Event.clock += 0.030  # the stream waits 30 ms for the others
        rec.counters.timed("all_reduce", False)
        Event.clock += 0.010
        _step(rec, opt)
    Event.done = False
    _step(rec, opt)  # closes step 2: its events are not done yet, its record waits
    assert [r.step for r in _records(rec)] == [1]
    Event.done = True
    rec.finish()
    records = _records(rec)
    assert [r.step for r in records] == [1, 2, 3]
    assert records[1].gpu_s == pytest.approx(0.05) and records[1].extra["gpu_comm_s"] == pytest.approx(0.03)
    assert records[1].comm_s == pytest.approx(0.03) and records[1].peak_bytes == 123 << 20


def test_the_records_rotate_and_the_tail_follows(tmp_path: Path) -> None:
    path = tmp_path / "steps.0.jsonl"
    rec = _recorder(open(path, "w"), path=path, rotate=600)
    tail = Tail(path)
    opt = Opt()
    seen: list[int] = []
    for _ in range(12):
        _step(rec, opt)
        rec.flush()
        got, anew = tail.read()
        seen += [r.step for r in got]
    rec.finish()
    got, _ = tail.read()
    seen += [r.step for r in got]
    assert (tmp_path / "steps.0.jsonl.1").exists()
    assert seen[-1] == 12 and sorted(set(seen)) == seen  # each read once, in order, across the rotations
    path.write_text(StepRecord(0, 1, 1.0, 2.0).line())  # a restarted rank truncates it and starts again
    assert [r.step for r in tail.read()[0]] == [1]
    path.write_text("")
    assert tail.read() == ([], True)


def test_a_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "steps.0.jsonl"
    line = StepRecord(0, 1, 1.0, 2.0, 0.1, 0.2, 0.3, 0.4).line()
    path.write_text(line + line[:20])
    tail = Tail(path)
    assert [r.step for r in tail.read()[0]] == [1]
    with open(path, "a") as f:
        f.write(line[20:])
    assert [r.step for r in tail.read()[0]] == [1]


def test_shares_of_the_recent_steps() -> None:
    rec = _recorder()
    load = rec.timed(rec.clock.work(0.02))  # type: ignore[attr-defined]
    opt = Opt()
    for _ in range(3):
        load()
        rec.clock.work(0.01)()  # type: ignore[attr-defined]
        _step(rec, opt)
    phases._current = rec
    try:
        shares = phases.shares(10)
    finally:
        phases._current = None
    assert shares == pytest.approx({"input": 2 / 3, "compute": 1 / 3, "comm": 0.0, "optim": 0.0})
    assert phases.shares(10) == {}


def test_records_that_cannot_be_written_stop_in_one_line_and_never_the_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every write fails as on a full disk (``/dev/full``: ENOSPC): the optimizer's hooks return as ever, and one
    line on the rank's stderr names the file and the error."""
    path = tmp_path / "steps.0.jsonl"
    rec = _recorder(open("/dev/full", "w"), path=path)
    opt = Opt()
    for _ in range(5):
        _step(rec, opt)  # raises nothing: the rank trains on
        rec.flush()
    rec.finish()
    assert capsys.readouterr().err.splitlines() == [
        f"numarun: WARNING: rank 3's step records stop here: cannot write {path}: No space left on device (the step "
        "report leaves out its later steps)"
    ]


def test_a_nodes_records_are_bounded_whatever_its_ranks() -> None:
    """Two files of a rank's share per rank: the node's ranks together hold at most NODE_BYTES."""
    for ranks in (1, 2, 8, 64, 8192):
        assert 2 * ranks * phases.rotate_bytes(ranks) <= max(phases.NODE_BYTES, 2 * ranks * (1 << 16))
    assert phases.rotate_bytes(8) == 4 << 20
