"""The roll-call of a job's ranks, as pure functions: where each rank stands, grouped, the odd ones named.

A rank's *stand* is read from its main thread's Python stack (innermost first): the innermost frame of the
user's code, and the library call it is in (the outermost library frame below it that is not a decorator's
wrapper), e.g. ``train.py:20`` in ``all_reduce`` (``torch.distributed``). Ranks that stand in the same place
form a group; the largest group is where the many wait, the others are named::

    ranks 0,1,3 wait at train.py:20 in all_reduce (torch.distributed)
    rank 2 is at train.py:9 in load_batch
    => rank 2 is not where the others are

A tie for the largest group goes to a group waiting in a collective (that is where the collective is; the rank
elsewhere is where the bug is). :func:`parse_faulthandler` reads the dumps ranks write on numarun's request.
"""

from __future__ import annotations

import itertools
import os
import re
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...cpuset import format_list
from ...worker.progress import COLLECTIVES

WRAPPERS = frozenset(
    {
        "wrapper",
        "inner",
        "_fn",
        "wrapped",
        "_wrapper",
        "wrapped_fn",
        "decorate_context",
        "_call_impl",
        "_wrapped_call_impl",
        "collective",
        "_exception_logger",
        "_time_logger",
    }
)
"""Function names of decorators' wrappers: the call a rank is in is the function they wrap."""
NUMARUN_DIR = str(Path(__file__).resolve().parents[2])
_OWN_PLUMBING = (os.path.join(NUMARUN_DIR, "worker"), os.path.join(NUMARUN_DIR, "launch"))


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str


@dataclass(frozen=True)
class Helper:
    """Where a process or thread a rank started stands: a DataLoader worker, a checkpoint writer, a save thread
    (JSON-able, inside a :class:`Stand`)."""

    label: str
    """``DataLoader worker 1``, ``process 'ckpt-writer'``, ``thread 'save'``."""
    pid: int = 0
    """A process's pid; 0 for a thread of the rank."""
    where: str = ""
    function: str = ""
    call: str = ""
    package: str = ""
    kernel: str = ""
    """What the kernel says of it when that tells something (stopped, asleep in the kernel: where a process without
    a Python stack stands)."""

    def line(self) -> str:
        """``DataLoader worker 1 (pid 4243) is at data.py:24 in __getitem__``."""
        who = f"{self.label} (pid {self.pid})" if self.pid else self.label
        parts = [self.kernel] if self.kernel else []
        if self.where:
            parts.append(f"at {self.where} in {_what(self.call, self.package, self.function)}")
        elif self.call:
            parts.append(f"in {_what(self.call, self.package, self.function)}")
        return f"{who} is {', '.join(parts)}" if parts else f"{who} gave no stack"


@dataclass(frozen=True)
class Stand:
    """Where one rank stands (JSON-able: it crosses nodes through the rendezvous store)."""

    rank: int
    local_rank: int
    pid: int
    node: int = 0
    host: str = ""
    state: str = "running"
    """``running``, ``exited`` (its process ended) or ``silent`` (no stack could be had)."""
    where: str = ""
    """The innermost frame of the user's code, ``train.py:20`` (relative to the rank's working directory)."""
    function: str = ""
    """That frame's function."""
    call: str = ""
    """The library function it is in, ``all_reduce``; '' when the user's frame is the innermost."""
    package: str = ""
    """The call's package, ``torch.distributed``."""
    inside: str = ""
    """The torch.distributed collective the rank's main thread is inside (counted by numarun's worker)."""
    exit_code: int | None = None
    note: str = ""
    kernel: str = ""
    """What the kernel says of a running rank that cannot move: stopped (state T or t), in uninterruptible sleep
    (state D, with the kernel function it sleeps in); '' otherwise."""
    kernel_stack: tuple[str, ...] = ()
    """The kernel stack of a rank in state D, innermost first (where ``/proc/<pid>/stack`` is readable)."""
    helpers: tuple[Helper, ...] = ()
    """Where its DataLoader workers, other child processes and other threads stand."""
    sampled: bool = False
    """Its frames are its last heartbeat's (it could not dump them when asked)."""

    @property
    def waiting(self) -> bool:
        return not self.kernel and (
            bool(self.inside) or (self.package.startswith("torch.distributed") and self.call in _COLLECTIVE_NAMES)
        )

    def place(self) -> str:
        """``at train.py:20 in all_reduce (torch.distributed)``, ``at train.py:9 in load_batch``, ``has exited (code
        0)``, ``stopped (state T: ...), at train.py:9 in load_batch``."""
        if self.state == "exited":
            return "has exited" + (f" (code {self.exit_code})" if self.exit_code is not None else "")
        if (self.state == "silent" or not self.where) and not self.kernel:
            return "gave no stack" + (f" ({self.note})" if self.note else "")
        call = self.inside or self.call
        pkg = self.package or ("torch.distributed" if self.inside else "")
        seen = "last sampled " if self.kernel and self.sampled else ""  # stopped before the sample: older
        at = f"{seen}at {self.where} in {_what(call, pkg, self.function)}" if self.where else ""
        return f"{self.kernel}, {at}" if self.kernel and at else self.kernel or at

    def details(self) -> list[str]:
        """What the roll-call adds under a rank that is not waiting in a collective: its kernel stack, its
        helpers (at most :data:`MAX_HELPERS`)."""
        out = []
        if self.kernel_stack:
            out.append("kernel stack: " + " < ".join(self.kernel_stack[:MAX_KERNEL_FRAMES]))
        out += [h.line() for h in self.helpers[:MAX_HELPERS]]
        if len(self.helpers) > MAX_HELPERS:
            out.append(f"{len(self.helpers) - MAX_HELPERS} other helpers are in the stacks file")
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Stand:
        """The inverse of ``dataclasses.asdict`` (the store carries JSON)."""
        helpers = tuple(Helper(**h) for h in d.get("helpers") or ())
        return Stand(**{**d, "helpers": helpers, "kernel_stack": tuple(d.get("kernel_stack") or ())})


MAX_HELPERS = 8
"""Helper lines under one rank; the rest are in the stacks file."""
MAX_KERNEL_FRAMES = 8


def _what(call: str, package: str, function: str) -> str:
    return f"{call} ({package})" if call and package else call or function


_COLLECTIVE_NAMES = frozenset({*COLLECTIVES, "wait"})
"""The calls a rank waits in: the collectives numarun's worker counts, and a work handle's ``wait``."""


def library_roots() -> tuple[str, ...]:
    """Directories whose files are not the user's code: the standard library, site-packages, numarun itself."""
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted({*roots, NUMARUN_DIR}, key=len, reverse=True))


def is_library(path: str, roots: Sequence[str]) -> bool:
    if path.startswith("<") or not path:
        return True
    if any(part in ("site-packages", "dist-packages") for part in Path(path).parts):
        return True
    real = os.path.realpath(path) if os.path.isabs(path) else path
    return any(real == r or real.startswith(r + os.sep) for r in roots)


def package_of(path: str, roots: Sequence[str]) -> str:
    """``torch.distributed`` for ``.../site-packages/torch/distributed/distributed_c10d.py``; ``threading`` for the
    stdlib's."""
    real = os.path.realpath(path) if os.path.isabs(path) else path
    parts = Path(real).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            rel = list(parts[len(parts) - parts[::-1].index(marker) :])
            break
    else:
        root = next((r for r in roots if real.startswith(r + os.sep)), None)
        if root is None:
            return Path(path).stem
        rel = list(Path(real[len(root) + 1 :]).parts)
        if root == NUMARUN_DIR:
            rel = ["numarun", *rel]
    # a module inside a package: the package names it
    return ".".join(rel[:-1][:3]) if len(rel) > 1 else Path(rel[0] if rel else path).stem


def _plumbing(path: str) -> bool:
    """numarun's own frames in a rank (the bootstrap, the counters): never where a rank stands."""
    real = os.path.realpath(path) if os.path.isabs(path) else path
    return real.startswith(_OWN_PLUMBING)


def _skipped(f: Frame) -> bool:
    """A decorator's wrapper, numarun's plumbing or a frame of no file: never the call a rank is in."""
    return f.function in WRAPPERS or _plumbing(f.file) or f.file.startswith("<")


def locate(frames: Sequence[Frame], roots: Sequence[str], cwd: str = "") -> tuple[str, str, str, str]:
    """(where, function, call, package) of a main thread's stack, innermost first (see the module docstring).

    Without any frame of the user's code (numarun's own trainer), numarun's frames outside its plumbing stand in."""
    if not frames:
        return "", "", "", ""
    user = next(
        itertools.chain(
            (i for i, f in enumerate(frames) if not is_library(f.file, roots)),
            (i for i, f in enumerate(frames) if f.file.startswith(NUMARUN_DIR) and not _plumbing(f.file)),
            [0],
        )
    )
    top = frames[user]
    inner = next((f for f in reversed(frames[:user]) if not _skipped(f)), None)  # from the user's frame inwards
    call, package = (inner.function, package_of(inner.file, roots)) if inner else ("", "")
    return f"{display_path(top.file, cwd)}:{top.line}", top.function, call, package


_MP_PROCESS = os.path.join("multiprocessing", "process.py")


def _bootstrap(f: Frame) -> bool:
    """A thread's or a multiprocessing child's own start-up frames: never where it stands."""
    name = os.path.basename(f.file)
    if name == "threading.py":
        return f.function in ("_bootstrap", "_bootstrap_inner", "run")
    return os.path.basename(os.path.dirname(f.file)) == "multiprocessing" and name in ("process.py", "spawn.py")


def locate_helper(frames: Sequence[Frame], roots: Sequence[str], cwd: str = "") -> tuple[str, str, str, str]:
    """(where, function, call, package) of a helper's main thread (a thread or a multiprocessing child), innermost
    first: as :func:`locate` where it is in the user's code; else ``where`` '' and the outermost library call that
    is not start-up (``_worker_loop`` of ``torch.utils.data``: an idle DataLoader worker)."""
    # a forked child's stack goes on below its multiprocessing bootstrap with its parent's frames: cut there
    cut = next((i for i, f in enumerate(frames) if f.function == "_bootstrap" and f.file.endswith(_MP_PROCESS)), None)
    frames = frames if cut is None else frames[: cut + 1]
    if not all(is_library(f.file, roots) for f in frames):
        return locate(frames, roots, cwd)
    outer = next((f for f in reversed(frames) if not _skipped(f) and not _bootstrap(f)), None)
    return ("", outer.function, outer.function, package_of(outer.file, roots)) if outer else ("", "", "", "")


def display_path(path: str, cwd: str) -> str:
    """``path`` relative to the rank's working directory when inside it."""
    if cwd and os.path.isabs(path) and not (rel := os.path.relpath(path, cwd)).startswith(".."):
        return rel
    return path


# ----------------------------------------------------------------------------- faulthandler's dumps

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)( \"[^\"]*\")? \(most recent call first\):$")
_FILE = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str) -> dict[int, list[Frame]]:
    """``faulthandler.dump_traceback(all_threads=True)`` text -> thread ident -> frames, innermost first. Of several
    dumps in ``text``, the last one's threads win."""
    threads: dict[int, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            current = threads.setdefault(int(m.group(2), 16), [])
            current.clear()
            continue
        f = _FILE.match(line)
        if f and current is not None:
            current.append(Frame(f.group(1), int(f.group(2)), f.group(3)))
    return threads


def name_threads(text: str, names: Mapping[int, str]) -> str:
    """faulthandler's ``Thread 0x...`` headers with each thread's Python name added."""

    def add(m: re.Match[str]) -> str:
        name = names.get(int(m.group(2), 16))
        label = f' "{name}"' if name and not m.group(3) else m.group(3) or ""
        return f"{m.group(1)} {m.group(2)}{label} (most recent call first):"

    return "\n".join(_THREAD.sub(add, line) for line in text.splitlines()) + ("\n" if text.endswith("\n") else "")


# ----------------------------------------------------------------------------- the roll-call


def format_ranks(ranks: Iterable[int]) -> str:
    """``0,1,3``; runs of three or more as ranges: ``0-5,7``."""
    return format_list(ranks, min_run=3)


@dataclass(frozen=True)
class Group:
    place: str
    waiting: bool
    stands: tuple[Stand, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(s.rank for s in self.stands))


def groups(stands: Iterable[Stand]) -> list[Group]:
    """Ranks by place, the largest first (ties: a waiting group first, then by lowest rank)."""
    by: dict[str, list[Stand]] = {}
    for s in stands:
        by.setdefault(s.place(), []).append(s)
    out = [Group(p, all(s.waiting for s in ss), tuple(sorted(ss, key=lambda s: s.rank))) for p, ss in by.items()]
    return sorted(out, key=lambda g: (-len(g.stands), not g.waiting, g.ranks[0]))


def majority(found: Sequence[Group]) -> Group | None:
    """The group where the others are: the largest, or of the largest ones the only one waiting in a collective."""
    if len(found) < 2:
        return found[0] if found else None
    top = [g for g in found if len(g.stands) == len(found[0].stands)]
    if len(top) == 1:
        return top[0]
    waiting = [g for g in top if g.waiting]
    return waiting[0] if len(waiting) == 1 else None


def lines(stands: Sequence[Stand], *, multi_node: bool = False) -> list[str]:
    """The roll-call: a line per group, then the ranks that are not where the others are."""
    found = groups(stands)
    main = majority(found)
    out = []
    for g in found:
        n = len(g.stands)
        who = f"rank {g.ranks[0]}" if n == 1 else f"ranks {format_ranks(g.ranks)}"
        if g is not main and multi_node:
            nodes = sorted({(s.node, s.host) for s in g.stands})
            who += " on " + ", ".join(f"node {node}" + (f" ({host})" if host else "") for node, host in nodes)
        text = g.place
        if text.startswith("at "):
            verb = ("waits" if n == 1 else "wait") if g.waiting else ("is" if n == 1 else "are")
            text = f"{verb} {text}"
        elif text.startswith("has ") and n > 1:
            text = "have " + text[4:]
        elif not text.startswith(("has ", "gave ")):  # stopped, asleep in the kernel
            text = f"{'is' if n == 1 else 'are'} {text}"
        out.append(f"{who} {text}")
        if not g.waiting:
            for s in g.stands:
                whose = "its" if n == 1 else f"rank {s.rank}'s"
                out += [f"  {whose} {line}" for line in s.details()]
    odd = [r for g in found if g is not main for r in g.ranks]
    if main is None and len(found) > 1:
        out.append(f"=> the ranks stand in {len(found)} places, none where most are")
    elif odd:
        many = len(odd) > 1
        out.append(
            f"=> {'ranks' if many else 'rank'} {format_ranks(odd)} {'are' if many else 'is'} not where the others are"
        )
    elif found and len(stands) > 1:
        out.append("=> every rank stands in the same place")
    return out
