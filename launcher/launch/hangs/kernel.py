"""What the kernel says of a rank and its descendants: state, wait channel, kernel stack, children (``/proc``).

A rank's Python stack cannot say that the rank is stopped (SIGSTOP: a debugger, job control), or asleep in the
kernel where no signal reaches it (state D: a hung network file system, a driver call), or which processes it
started (DataLoader workers, a checkpoint writer); ``/proc/<pid>/stat``, ``wchan``, ``stack`` and ``task/*/children``
can (proc(5)). Every reader takes ``root`` (a recorded tree in tests: ``root/proc/<pid>/...``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/")

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


def proc(root: Path, pid: int) -> Path:
    return root / "proc" / str(pid)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def parse_stat(text: str) -> tuple[str, str, int] | None:
    """(comm, state, ppid) of a ``/proc/<pid>/stat`` line; the name may hold spaces and parentheses."""
    head, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or "(" not in head or len(fields) < 2 or not fields[1].lstrip("-").isdigit():
        return None
    return head.partition("(")[2], fields[0], int(fields[1])


def parse_stack(text: str) -> tuple[str, ...]:
    """``[<0>] rpc_wait_bit_killable+0x1e/0xa0 [sunrpc]`` lines -> function names, innermost first."""
    return tuple(m.group(1) for line in text.splitlines() if (m := _STACK_LINE.match(line.strip())))


def read_task(pid: int, root: Path = ROOT, *, tid: int | None = None) -> Task | None:
    """The kernel's view of ``pid`` (of its thread ``tid``); None when it is gone."""
    base = proc(root, pid) if tid is None else proc(root, pid) / "task" / str(tid)
    stat = _read(base / "stat")
    parsed = parse_stat(stat) if stat else None
    if parsed is None:
        return None
    name, state, ppid = parsed
    wchan = (_read(base / "wchan") or "").strip()
    stack = parse_stack(_read(base / "stack") or "") if state == "D" else ()
    return Task(tid or pid, name, state, ppid, "" if wchan in ("0", "") else wchan, stack)


def halted_threads(pid: int, root: Path = ROOT) -> list[Task]:
    """The threads of ``pid`` other than its main one that sleep in the kernel (state D): a save thread on a
    hung file system while the main thread waits for it."""
    out = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(proc(root, pid) / "task")):
            if entry.isdigit() and int(entry) != pid:
                task = read_task(pid, root, tid=int(entry))
                if task is not None and task.state == "D":
                    out.append(task)
    return out


def children(pid: int, root: Path = ROOT) -> list[int]:
    """The children of ``pid``: ``task/<tid>/children`` of each of its threads (Linux 3.5+,
    CONFIG_PROC_CHILDREN), else every process's parent read from ``stat``."""
    found: list[int] = []
    tasks = proc(root, pid) / "task"
    listed = False
    with contextlib.suppress(OSError):
        for entry in os.listdir(tasks):
            text = _read(tasks / entry / "children")
            if text is not None:
                listed = True
                found += [int(p) for p in text.split() if p.isdigit()]
    if listed:
        return sorted(set(found))
    out = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(root / "proc"):
            if entry.isdigit() and (stat := _read(root / "proc" / entry / "stat")):
                parsed = parse_stat(stat)
                if parsed is not None and parsed[2] == pid:
                    out.append(int(entry))
    return sorted(out)


def descendants(pid: int, root: Path = ROOT, *, limit: int = MAX_DESCENDANTS) -> list[int]:
    """Every descendant of ``pid``, parents before their children (breadth first), at most ``limit``."""
    out: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo and len(out) < limit:
        for child in children(todo.pop(0), root):
            if child not in seen and len(out) < limit:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def tasks(pids: Iterable[int], root: Path = ROOT) -> list[Task]:
    return [t for p in pids if (t := read_task(p, root)) is not None]
