"""The roll-call's view past a rank's main thread, in one process (docs/hangs.md, "Workers, threads and the kernel").

What the kernel says of a rank and its descendants is read from ``/proc`` files recorded from real processes
(tests/fixtures/proc-hangs, made by its record.py): a rank whose save thread sleeps in the kernel (state D) with a
child waiting on a FIFO and an unreaped one, a process whose main thread is in state D, one stopped by SIGSTOP, one
stopped by ptrace. A helper's dump handler is armed for real in this process and answers the real dump signal; a
halted rank's Python frames come from a recorded ``py-spy dump --nonblocking --json``. The jobs themselves are in
test_hangs_elsewhere.py.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from pathlib import Path

import pytest
from helpers import FIXTURES

from numarun import envvars
from numarun.launch.hangs import NodeCall, kernel, node, rollcall
from numarun.launch.hangs.rollcall import Frame, Helper, Stand
from numarun.topology import procfs
from numarun.worker import progress

FIX = FIXTURES / "proc-hangs"
ROLES = json.loads((FIX / "roles.json").read_text())
RANK, DISK, STOPPED, TRACED = (ROLES[k] for k in ("rank", "disk", "stopped", "traced"))
WAIT = dict(call="all_reduce", package="torch.distributed", inside="all_reduce")


def test_what_the_kernel_says_of_each_state() -> None:
    disk = kernel.read_task(DISK, FIX)
    assert disk is not None and (disk.name, disk.state, disk.wchan) == ("python", "D", "kernel_clone")
    assert disk.halted and disk.stack[0] == "kernel_clone" and "do_syscall_64" in disk.stack
    assert disk.describe() == "in uninterruptible sleep (state D) in the kernel's kernel_clone"
    stopped, traced = kernel.read_task(STOPPED, FIX), kernel.read_task(TRACED, FIX)
    assert stopped is not None and stopped.describe() == "stopped (state T: SIGSTOP, job control or a debugger)"
    assert traced is not None and traced.describe() == "stopped by a debugger (state t: ptrace)"
    assert stopped.halted and traced.halted and stopped.stack == ()  # a kernel stack is kept for state D only
    rank = kernel.read_task(RANK, FIX)
    assert rank is not None and rank.state == "S" and not rank.halted
    assert kernel.read_task(999999, FIX) is None  # gone


def test_a_rank_s_children_its_descendants_and_its_threads_asleep_in_the_kernel() -> None:
    stats = procfs.read_all(FIX)
    kids = sorted(p for p, s in stats.items() if s.ppid == RANK)
    states = sorted(t.state for t in kernel.tasks(kids, FIX))
    assert len(kids) == 3 and states == ["S", "S", "Z"]  # a FIFO's reader, the save thread's vfork child, a zombie
    zombie = next(t for t in kernel.tasks(kids, FIX) if t.state == "Z")
    assert zombie.describe() == "a zombie (state Z: it ended; its parent has not reaped it)"
    assert procfs.descendants(stats, [RANK]) == kids and procfs.descendants(stats, [RANK], limit=2) == kids[:2]
    (save,) = kernel.halted_threads(RANK, FIX)
    assert save.pid != RANK and (save.state, save.wchan) == ("D", "kernel_clone")
    assert kernel.halted_threads(DISK, FIX) == []  # its only thread is the main one


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("4518 (python) S 4514 4514 0", ("python", "S", 4514)),
        ("7 (a) (b)) D 1 7 7", ("a) (b)", "D", 1)),  # a name with spaces and parentheses
        ("", None),
        ("7 python S 1", None),
        ("7 (x) S", None),
    ],
)
def test_stat_lines(text: str, parsed: tuple[str, str, int] | None) -> None:
    p = procfs.parse_stat(text)
    assert ((p.comm, p.state, p.ppid) if p else None) == parsed


def _beat(local: int, *, main: int = 1, **extra: object) -> dict[str, object]:
    return {"pid": RANK, "rank": local, "local_rank": local, "main": main, "cwd": "/job", "t": 0.0, **extra}


def test_a_rank_in_uninterruptible_sleep_is_named_with_the_kernel_s_wait_and_its_helpers(tmp_path: Path) -> None:
    """The recorded ``disk`` process as rank 3 (its frames from the recorded py-spy dump of a halted process), the
    recorded ``rank`` process's family as its helpers, rank 0 waiting in all_reduce."""
    disk = kernel.read_task(DISK, FIX)
    spy, frames = node.py_spy_json((FIX / "py-spy-stopped.json").read_text(), 7214)
    assert [f.function for f in frames] == ["load_batch", "<module>"] and '"ckpt-save" (py-spy, not paused):' in spy
    family = kernel.tasks(procfs.descendants(procfs.read_all(FIX), [RANK]), FIX)
    helpers = node.helpers_of(
        _beat(3), None, family, {}, state=tmp_path, roots=rollcall.library_roots(), halted_threads=()
    )
    stand = node.stand_of(
        _beat(3, frames=[["/job/old.py", 1, "f"]]),
        None,
        state=tmp_path,
        roots=rollcall.library_roots(),
        host="h",
        running=True,
        task=disk,
        helpers=helpers,
        halted_frames=[Frame("/job/train.py", 6, "load_batch"), Frame("/job/train.py", 7, "<module>")],
    )
    waiting = Stand(0, 0, 100, where="train.py:20", function="main", **WAIT)
    lines = rollcall.lines([waiting, stand])
    pids = sorted(t.pid for t in family)
    zombie = next(t.pid for t in family if t.state == "Z")
    assert lines[0] == "rank 0 waits at train.py:20 in all_reduce (torch.distributed)"
    assert lines[1] == (
        "rank 3 is in uninterruptible sleep (state D) in the kernel's kernel_clone, at train.py:6 in load_batch"
    )
    assert lines[2].startswith("  its kernel stack: kernel_clone < ")
    assert sorted(lines[3:6]) == sorted(
        f"  its process 'python' (pid {p}) is "
        + (
            "a zombie (state Z: it ended; its parent has not reaped it)"
            if p == zombie
            else "sleeping (state S) in the kernel's wait_for_partner"
        )
        for p in pids
    )
    assert lines[6:] == ["=> rank 3 is not where the others are"]
    # the same rank known only by its last heartbeat says so
    sampled = node.stand_of(
        _beat(3, frames=[["/job/train.py", 20, "main"]], inside="all_reduce"),
        None,
        state=tmp_path,
        roots=rollcall.library_roots(),
        host="h",
        running=True,
        task=kernel.read_task(STOPPED, FIX),
    )
    assert sampled.place() == (
        "stopped (state T: SIGSTOP, job control or a debugger), last sampled at train.py:20 in all_reduce "
        "(torch.distributed)"
    )
    assert not sampled.waiting  # a halted rank is never where the collective is


def test_a_thread_asleep_in_the_kernel_is_named_with_its_python_frames(tmp_path: Path) -> None:
    """A rank's dump with a save thread in the user's code, a queue feeder in a library's (left to the file) and
    numarun's sampler; the save thread's tid is the recorded one in state D."""
    (save,) = kernel.halted_threads(RANK, FIX)
    std = "/usr/lib/python3.11"
    dump = "\n".join(
        [
            "Thread 0x0000000000000002 (most recent call first):",
            '  File "/job/train.py", line 30 in write_shard',
            f'  File "{std}/threading.py", line 982 in run',
            "Thread 0x0000000000000003 (most recent call first):",
            f'  File "{std}/threading.py", line 327 in wait',
            f'  File "{std}/multiprocessing/queues.py", line 231 in _feed',
            "Thread 0x0000000000000004 (most recent call first):",
            f'  File "{std}/threading.py", line 331 in wait',
            "Current thread 0x0000000000000001 (most recent call first):",
            '  File "/job/train.py", line 40 in main',
        ]
    )
    beat = _beat(
        1,
        threads={"1": "MainThread", "2": "ckpt-save", "3": "QueueFeederThread", "4": "numarun-hangs"},
        tids={"1": RANK, "2": save.pid},
    )
    helpers = node.helpers_of(beat, dump, [], {}, state=tmp_path, roots=(std,), halted_threads=[save])
    assert [h.line() for h in helpers] == [
        "thread 'ckpt-save' is in uninterruptible sleep (state D) in the kernel's kernel_clone, at train.py:30 in "
        "write_shard"
    ]


def test_helpers_show_under_a_rank_that_does_not_wait_and_are_capped() -> None:
    many = tuple(
        Helper(f"DataLoader worker {i}", 100 + i, call="_worker_loop", package="torch.utils.data") for i in range(10)
    )
    odd = [
        Stand(
            r,
            r,
            10 + r,
            where="train.py:9",
            function="main",
            call="__next__",
            package="torch.utils.data",
            helpers=many[:2],
        )
        for r in (1, 2)
    ]
    waiting = [Stand(r, r, 10 + r, where="train.py:20", function="main", helpers=many, **WAIT) for r in (0, 3, 4)]
    lines = rollcall.lines([*waiting, *odd])
    assert lines == [
        "ranks 0,3,4 wait at train.py:20 in all_reduce (torch.distributed)",
        "ranks 1,2 are at train.py:9 in __next__ (torch.utils.data)",
        "  rank 1's DataLoader worker 0 (pid 100) is in _worker_loop (torch.utils.data)",
        "  rank 1's DataLoader worker 1 (pid 101) is in _worker_loop (torch.utils.data)",
        "  rank 2's DataLoader worker 0 (pid 100) is in _worker_loop (torch.utils.data)",
        "  rank 2's DataLoader worker 1 (pid 101) is in _worker_loop (torch.utils.data)",
        "=> ranks 1,2 are not where the others are",
    ]
    alone = Stand(5, 5, 15, where="train.py:9", function="load", helpers=many).details()
    assert len(alone) == rollcall.MAX_HELPERS + 1 and alone[-1] == "2 other helpers are in the stacks file"
    assert Helper("process 'tar'", 7).line() == "process 'tar' (pid 7) gave no stack"


def test_stands_with_helpers_cross_the_store_as_json() -> None:
    stand = Stand(
        2, 0, 12, node=1, host="h1", where="t.py:9", function="f", kernel="stopped (state T: SIGSTOP)",
        kernel_stack=("a", "b"), helpers=(Helper("thread 'x'", 0, "t.py:3", "g"),), sampled=True,
    )  # fmt: skip
    call = NodeCall(1, "h1", (stand,), "/k", "in-process")
    assert NodeCall.from_json(call.to_json()) == call


def test_where_a_helper_stands_cuts_the_parent_s_frames_below_a_forked_child_s_bootstrap() -> None:
    roots = rollcall.library_roots()
    lib = next(r for r in roots if r.endswith("site-packages"))
    std = next(r for r in roots if os.path.isfile(os.path.join(r, "threading.py")))
    mp = os.path.join(std, "multiprocessing")
    worker = os.path.join(lib, "torch", "utils", "data", "_utils", "worker.py")
    parent = [Frame("/job/train.py", 50, "main"), Frame("/job/train.py", 60, "<module>")]  # the fork point's stack
    idle = [
        Frame(os.path.join(std, "threading.py"), 327, "wait"),
        Frame(os.path.join(mp, "queues.py"), 113, "get"),
        Frame(worker, 300, "_worker_loop"),
        Frame(progress.__file__, 330, "run_helper"),
        Frame(os.path.join(mp, "process.py"), 108, "run"),
        Frame(os.path.join(mp, "process.py"), 314, "_bootstrap"),
        Frame(os.path.join(mp, "popen_fork.py"), 71, "_launch"),
        *parent,
    ]
    assert rollcall.locate_helper(idle, roots, "/job") == ("", "_worker_loop", "_worker_loop", "torch.utils.data")
    stuck = [Frame("/job/data.py", 24, "__getitem__"), *idle[2:]]
    assert rollcall.locate_helper(stuck, roots, "/job")[:2] == ("data.py:24", "__getitem__")
    thread = [Frame("/job/save.py", 7, "write"), Frame(os.path.join(std, "threading.py"), 982, "run")]
    assert rollcall.locate_helper(thread, roots, "/job")[:2] == ("save.py:7", "write")


def test_a_dataloader_worker_is_labelled_by_its_worker_id() -> None:
    from torch.utils.data._utils.worker import _worker_loop

    args = (None,) * 10 + (3, 4, False, None)
    assert progress.helper_label(_worker_loop, args, {}, "Process-7") == "DataLoader worker 3"
    assert progress.helper_label(print, (), {}, "ckpt-writer") == "process 'ckpt-writer'"


class _Process:
    """The part of ``multiprocessing.process.BaseProcess`` the patch touches; start() starts nothing."""

    def __init__(self, target: object) -> None:
        self._target, self._args, self._kwargs, self.name = target, (1,), {}, "ckpt-writer"
        self.started = False

    def start(self) -> None:
        self.started = True


def test_every_multiprocessing_child_runs_its_target_through_the_helper_s_dump_handler() -> None:
    module = type("module", (), {"BaseProcess": type("BaseProcess", (_Process,), {})})
    assert progress.patch_multiprocessing(module) and not progress.patch_multiprocessing(module)  # once
    p = module.BaseProcess(print)
    p.start()
    assert p.started and isinstance(p._target, functools.partial)
    assert (p._target.func, p._target.args) == (progress.run_helper, ("process 'ckpt-writer'", print))


def _dump_myself() -> str:
    os.kill(os.getpid(), progress.DUMP_SIGNAL)  # the handler writes from C at once, in this thread
    return "done"


def test_a_helper_answers_the_dump_signal_in_a_file_of_its_own_gone_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(envvars.STATE_DIR, str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "2")
    path = tmp_path / progress.HELPER.format(local_rank=2, pid=os.getpid())
    seen: list[str] = []

    def target() -> str:
        _dump_myself()
        seen.append(path.read_text())
        return "done"

    assert progress.run_helper("DataLoader worker 1", target) == "done"
    assert not path.exists()  # gone with the target
    head, _, dump = seen[0].partition("\n")
    assert json.loads(head[len(progress.HELPER_HEAD) :]) == {
        "label": "DataLoader worker 1", "pid": os.getpid(), "main": threading.get_ident()
    }  # fmt: skip
    frames = rollcall.parse_faulthandler(dump)[threading.get_ident()]
    assert [f.function for f in frames[:3]] == ["_dump_myself", "target", "run_helper"]
