"""``/proc``, read in one place: the formats numarun reads in more than one place (``/proc/<pid>/status``,
``mounts``, ``cgroup``), the one walk of this process's cgroups, v1 and v2, that the sysfs reader, the step's
cpuset, the launcher's cage and its out-of-memory report share, and the processes as the kernel shows them
(proc(5)), which the agent's roll-call, its step report and numarun's cleaner read.

The process readers take ``root`` (``root/proc/<pid>/...``: a recorded tree in tests, ``/`` live), so each is
tested on recorded trees; psutil, which reads the live ``/proc`` only, cannot be. It does what needs no recording:
numarun's own children (the supervisor). Here: ``stat`` by field number (the CPU a task last ran on, its start
time, its parent), ``schedstat``, ``status`` fields, ``numa_maps``, ``wchan``, the kernel stack, ``environ``, and the
process-tree walks built on each ``stat``'s parent.

Standard library only: the cleaner loads this file by its path, with nothing of the package or the user's.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/")


def status_field(text: str, name: str) -> str | None:
    """The value of field ``name`` in a ``/proc/<pid>/status`` text (``Key:\\tvalue`` lines), stripped;
    None when the field is absent (``Cpus_allowed_list`` and ``Mems_allowed_list`` since Linux 2.6.26)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == name:
            return value.strip()
    return None


def cgroup2_mount(mounts_text: str) -> str | None:
    """Where the cgroup v2 (unified) hierarchy is mounted, from a ``/proc/self/mounts`` text; None without one."""
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return fields[1]
    return None


def own_cgroup2_path(cgroup_text: str) -> str | None:
    """This process's cgroup v2 path (``/`` for the root), from a ``/proc/self/cgroup`` text; None
    when it has no v2 line (``0::``)."""
    for line in cgroup_text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cgroup_dirs(
    mounts: str | None, cgroup: str | None, controller: str, *, fallback: str | None = None
) -> list[tuple[int, str]]:
    """This process's cgroups that may hold ``controller``'s files, innermost first, as (cgroup
    version, directory): its v2 cgroup and each ancestor up to the v2 mount, then the same in the
    v1 hierarchy of ``controller``. ``mounts``/``cgroup``: the texts of ``/proc/self/mounts`` and
    ``/proc/self/cgroup``; without a mount table, the usual ``/sys/fs/cgroup`` (v2) and
    ``/sys/fs/cgroup/<controller>`` (v1). ``fallback``: the path where ``cgroup`` names none."""
    v1_mount = None
    for line in (mounts or "").splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] == "cgroup" and controller in f[3].split(","):
            v1_mount = f[1]
            break
    v1_path = None
    for line in (cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            v1_path = parts[2].strip() or "/"
    v2_mount = cgroup2_mount(mounts or "")
    trees = (
        (2, v2_mount if mounts else "/sys/fs/cgroup", own_cgroup2_path(cgroup or "")),
        (1, v1_mount if mounts else f"/sys/fs/cgroup/{controller}", v1_path),
    )
    out: list[tuple[int, str]] = []
    for version, mount, rel in trees:
        if mount is not None:
            parts = [p for p in (rel or fallback or "/").split("/") if p]
            out += [(version, posixpath.join(mount, *parts[:n])) for n in range(len(parts), -1, -1)]
    return out


def cgroup_read(
    dirs: Sequence[tuple[int, str]], names: Mapping[int, Sequence[str]], read: Callable[[str], str | None]
) -> tuple[str, str] | None:
    """The first of ``names[version]`` that ``read`` finds non-empty in ``dirs`` (innermost first):
    (its path, its text stripped); None when none is."""
    for version, d in dirs:
        for name in names.get(version, ()):
            text = read(posixpath.join(d, name))
            if text and text.strip():
                return posixpath.join(d, name), text.strip()
    return None


# ----------------------------------------------------------------------------- processes


def proc(root: Path, pid: int, tid: int | None = None) -> Path:
    """``root/proc/<pid>`` (``.../task/<tid>`` for a thread)."""
    base = root / "proc" / str(pid)
    return base if tid is None else base / "task" / str(tid)


def read_text(path: Path) -> str | None:
    """A /proc file's text; None when it is gone or unreadable (another user's process, hidepid)."""
    return read_or_why(path)[0]


def read_or_why(path: Path) -> tuple[str | None, str]:
    """(a /proc file's text, '') or (None, why it could not be read, in the system's words: ``Permission
    denied``)."""
    try:
        return path.read_text(errors="replace"), ""
    except OSError as e:
        return None, e.strerror or type(e).__name__


def hidden_processes(root: Path = ROOT) -> str:
    """Why other users' processes are not in this ``/proc``: its mount's ``hidepid`` (``1``/``noaccess``,
    ``2``/``invisible``; proc(5)), read from ``proc/self/mounts`` (the last ``/proc`` mount is the one seen); ''
    where they are shown."""
    hides = ""
    for line in (read_text(root / "proc" / "self" / "mounts") or "").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "/proc" and fields[2] == "proc":
            options = dict(o.partition("=")[::2] for o in fields[3].split(","))
            value = options.get("hidepid", "0")
            hides = "" if value in ("0", "off") else f"/proc is mounted with hidepid={value}"
    return hides


@dataclass(frozen=True)
class ProcStat:
    """A process (or thread) as ``/proc/<pid>/stat`` has it."""

    pid: int
    comm: str
    """The executable's name, 15 characters at most (it may hold spaces and parentheses)."""
    state: str
    """proc(5)'s letter: R, S, D, T, t, Z, ..."""
    ppid: int
    ticks: int = 0
    """utime + stime, clock ticks."""
    cpu: int = -1
    """The CPU it last ran on (field 39); -1 where the line is cut short."""
    start: int = 0
    """Its start time after boot, clock ticks (field 22): with the pid, a process's identity."""


def parse_stat(text: str) -> ProcStat | None:
    """One ``/proc/<pid>/stat`` line; None when it is not one (the name, in parentheses, may hold anything)."""
    head, sep, rest = text.rpartition(")")
    pid, _, comm = head.partition(" (")
    fields = rest.split()
    if not sep or not pid.strip().isdigit() or len(fields) < 2:
        return None
    try:
        # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15, starttime 22, processor 39
        ppid = int(fields[1])
        ticks = int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0
        start = int(fields[19]) if len(fields) > 19 else 0
        cpu = int(fields[36]) if len(fields) > 36 else -1
    except ValueError:
        return None
    return ProcStat(int(pid), comm, fields[0], ppid, ticks, cpu, start)


def read_stat(pid: int, root: Path = ROOT, *, tid: int | None = None) -> ProcStat | None:
    """``pid`` (its thread ``tid``) as its stat line says; None when it is gone."""
    text = read_text(proc(root, pid, tid) / "stat")
    return parse_stat(text) if text else None


def read_all(root: Path = ROOT) -> dict[int, ProcStat]:
    """Every process of ``root/proc`` that can be read."""
    out: dict[int, ProcStat] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(root / "proc"):
            if entry.name.isdigit():
                stat = read_stat(int(entry.name), root)
                if stat is not None:
                    out[stat.pid] = stat
    return out


def alive(pid: int, root: Path = ROOT) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    stat = read_stat(pid, root)
    return stat is not None and stat.state not in ("Z", "X")


def descendants(stats: Mapping[int, ProcStat], roots: Iterable[int], *, limit: int | None = None) -> list[int]:
    """Every descendant of ``roots`` (not the roots) in a reading of every process (:func:`read_all`), parents before
    their children (breadth first, each one's children by pid), at most ``limit``."""
    kids: dict[int, list[int]] = {}
    for p in sorted(stats.values(), key=lambda p: p.pid):
        kids.setdefault(p.ppid, []).append(p.pid)
    out: list[int] = []
    seen: set[int] = set()
    todo = list(roots)
    while todo and (limit is None or len(out) < limit):
        for kid in kids.get(todo.pop(0), ()):
            if kid not in seen and (limit is None or len(out) < limit):
                seen.add(kid)
                out.append(kid)
                todo.append(kid)
    return out


def tree_of(stats: Mapping[int, ProcStat], roots: Iterable[int]) -> set[int]:
    """Every descendant of ``roots`` (not the roots) in a reading of every process (:func:`read_all`)."""
    return set(descendants(stats, roots))


def thread_ids(pid: int, root: Path = ROOT) -> list[int]:
    """The ids of ``pid``'s threads ([] when gone)."""
    try:
        return sorted(int(t) for t in os.listdir(proc(root, pid) / "task") if t.isdigit())
    except OSError:
        return []


def read_schedstat(pid: int, root: Path = ROOT) -> dict[int, tuple[int, int]]:
    """Thread id -> (ns on a CPU, ns waiting on a run queue) of every thread of ``pid``
    (``task/<tid>/schedstat``; Documentation/scheduler/sched-stats.rst); {} where the kernel has no schedstat."""
    out: dict[int, tuple[int, int]] = {}
    for tid in thread_ids(pid, root):
        parts = (read_text(proc(root, pid, tid) / "schedstat") or "").split()
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            out[tid] = (int(parts[0]), int(parts[1]))
    return out


def read_thread_ticks(pid: int, root: Path = ROOT) -> dict[int, int]:
    """Thread id -> its time on a CPU so far, clock ticks (``task/<tid>/stat``: utime + stime), of every thread of
    ``pid``: what a kernel without schedstat still says (not the wait)."""
    return {tid: stat.ticks for tid in thread_ids(pid, root) if (stat := read_stat(pid, root, tid=tid)) is not None}


def read_status(pid: int, key: str, root: Path = ROOT) -> str:
    """Field ``key`` of ``/proc/<pid>/status`` ('' when absent or unreadable)."""
    return status_field(read_text(proc(root, pid) / "status") or "", key) or ""


def caught_signals(pid: int, root: Path = ROOT) -> int:
    """The signals ``pid`` has a handler for, as a mask (``SigCgt``; 0 when unreadable)."""
    try:
        return int(read_status(pid, "SigCgt", root) or "0", 16)
    except ValueError:
        return 0


def read_cmdline(pid: int, root: Path = ROOT, *, fallback: str = "", width: int = 80) -> str:
    """The command line of ``pid`` (arguments joined by spaces, cut to ``width`` characters), else ``fallback``."""
    raw = (read_text(proc(root, pid) / "cmdline") or "").replace("\0", " ").strip()
    return (raw[: width - 3] + "...") if len(raw) > width else (raw or fallback)


def read_environ(pid: int, root: Path = ROOT) -> dict[str, str]:
    """The environment ``pid`` started with (``environ``; {} when unreadable: another user's process)."""
    try:
        raw = (proc(root, pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def read_wchan(pid: int, root: Path = ROOT, *, tid: int | None = None) -> str:
    """The kernel function ``pid`` (its thread) sleeps in ('' when running or unreadable)."""
    text = (read_text(proc(root, pid, tid) / "wchan") or "").strip()
    return "" if text in ("0", "") else text


def read_stack(pid: int, root: Path = ROOT, *, tid: int | None = None) -> str:
    """``pid``'s kernel stack (``stack``: root only; '' when unreadable)."""
    return read_text(proc(root, pid, tid) / "stack") or ""


def read_numa_maps_or_why(pid: int, root: Path = ROOT) -> tuple[str, str]:
    """(``pid``'s ``numa_maps``, '') or ('', why it could not be read: ``Permission denied`` where the process may not
    be looked into, ``No such file or directory`` once it is gone). The kernel walks every resident page to answer:
    read it for the processes that matter only."""
    text, why = read_or_why(proc(root, pid) / "numa_maps")
    return text or "", why
