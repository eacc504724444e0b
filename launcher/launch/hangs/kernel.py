"""What the kernel says of a rank and its descendants: state, wait channel, kernel stack, children (``/proc``).

A rank's Python stack cannot say that the rank is stopped (SIGSTOP: a debugger, job control), or asleep in the
kernel where no signal reaches it (state D: a hung network file system, a driver call), or which processes it
started (DataLoader workers, a checkpoint writer); ``/proc/<pid>/stat`` (every process's parent), ``wchan`` and
``stack`` can (proc(5)). Read through numarun's one /proc reader (:mod:`numarun.topology.procfs`), which takes
``root`` (a recorded tree in tests: ``root/proc/<pid>/...``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ...topology import procfs

ROOT = procfs.ROOT

STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible sleep",
    "T": "stopped",
    "t": "stopped by a debugger",
    "Z": "a zombie",
    "X": "dead",
    "I": "idle",
    "P": "parked",
    "W": "paging",
}
"""proc(5)'s state letters, as the roll-call says them."""
WHY = {
    "T": "SIGSTOP, job control or a debugger",
    "t": "ptrace",
    "Z": "it ended; its parent has not reaped it",
}
HALTED = frozenset("DTt")
"""States in which a process cannot answer a signal now (its dump handler would not run): the roll-call reads
its last heartbeat, and py-spy reads it without pausing it (pausing waits for a stop that never comes)."""
MAX_DESCENDANTS = 64
"""Per rank: a rank with more descendants than that is cut (a fork bomb must not make the roll-call one)."""

_STACK_LINE = re.compile(r"^\[<[0-9a-fx]+>\]\s+([^+\s]+)")


@dataclass(frozen=True)
class Task:
    """One process as the kernel sees it (JSON-able)."""

    pid: int
    name: str
    """``comm``: the executable's name, 15 characters at most."""
    state: str
    """proc(5)'s letter: R, S, D, T, t, Z, ..."""
    ppid: int = 0
    wchan: str = ""
    """The kernel function it sleeps in ('' when running or unreadable)."""
    stack: tuple[str, ...] = ()
    """In state D, its kernel stack, innermost first, function names only (``/proc/<pid>/stack``: root only)."""

    @property
    def halted(self) -> bool:
        return self.state in HALTED

    def describe(self) -> str:
        """``in uninterruptible sleep (state D) in the kernel's rpc_wait_bit_killable``, ``stopped (state T:
        SIGSTOP, job control or a debugger)``."""
        what = STATES.get(self.state, f"in state {self.state}")
        why = WHY.get(self.state)
        text = f"{what} (state {self.state}{': ' + why if why else ''})"
        if self.wchan and self.state in "SD":
            text += f" in the kernel's {self.wchan}"
        return text


def read_task(pid: int, root: Path = ROOT, *, tid: int | None = None) -> Task | None:
    """The kernel's view of ``pid`` (of its thread ``tid``); None when it is gone."""
    stat = procfs.read_stat(pid, root, tid=tid)
    if stat is None:
        return None
    # ``[<0>] rpc_wait_bit_killable+0x1e/0xa0 [sunrpc]`` lines -> function names, innermost first
    lines = procfs.read_stack(pid, root, tid=tid).splitlines() if stat.state == "D" else []
    stack = tuple(m.group(1) for line in lines if (m := _STACK_LINE.match(line.strip())))
    return Task(tid or pid, stat.comm, stat.state, stat.ppid, procfs.read_wchan(pid, root, tid=tid), stack)


def halted_threads(pid: int, root: Path = ROOT) -> list[Task]:
    """The threads of ``pid`` other than its main one that sleep in the kernel (state D): a save thread on a
    hung file system while the main thread waits for it."""
    found = (read_task(pid, root, tid=tid) for tid in procfs.thread_ids(pid, root) if tid != pid)
    return [t for t in found if t is not None and t.state == "D"]


def tasks(pids: Iterable[int], root: Path = ROOT) -> list[Task]:
    return [t for p in pids if (t := read_task(p, root)) is not None]
