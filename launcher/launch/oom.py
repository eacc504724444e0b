"""Whether a rank that died of SIGKILL was killed for memory, with the evidence (:func:`explain`).

The kernel counts its OOM kills per memory cgroup (v2 ``memory.events``, v1 ``memory.oom_control``:
``oom_kill``) and for the host (``/proc/vmstat``). numarun reads them before the run (:func:`kills`)
and again when a rank died of SIGKILL: a count that rose is the evidence, a SIGKILL alone is not
(torchrun, a user or a scheduler send it too). Files are read under ``root``; the kernel's log
(``/dev/kmsg``, readable by root), when its "Killed process PID" line names the rank, gives what
the rank held when it was killed. Inside a PID namespace of its own (a container) the kernel's pid is
the host's, never the rank's: there the line is the rank's when it is the only kill since the run started.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TopologyError
from ..topology.fileio import read_bounded
from ..topology.procfs import cgroup_dirs, cgroup_read

_UNLIMITED = 1 << 62  # v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages)
_LIMIT = {2: "memory.max", 1: "memory.limit_in_bytes"}
_PEAK = {2: "memory.peak", 1: "memory.max_usage_in_bytes"}
_SLURM = (("SLURM_MEM_PER_NODE", "--mem"), ("SLURM_MEM_PER_CPU", "--mem-per-cpu"))
INIT_PID_NAMESPACE = 0xEFFFFFFC
"""The inode of the host's PID namespace (``PROC_PID_INIT_INO``, include/linux/proc_ns.h)."""
_KILLED = re.compile(r"Killed process (\d+) \(.*?anon-rss:(\d+)kB, file-rss:(\d+)kB, shmem-rss:(\d+)kB")


def _now_us() -> int:
    """The kernel log's clock (microseconds since boot, as /dev/kmsg stamps its records)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


@dataclass(frozen=True)
class Kills:
    """The kernel's OOM kill counts: (file, count) for this process's memory cgroup (v2, v1) and the host."""

    counts: tuple[tuple[str, int], ...]
    since_us: int = field(default_factory=_now_us)
    """When they were read, on the kernel log's clock: a log line stamped before is not this run's."""


def _reader(root: Path) -> tuple[Callable[[str], str | None], list[tuple[int, str]]]:
    def read(path: str) -> str | None:
        try:
            return read_bounded(root / path.lstrip("/"), limit=1 << 20).decode("ascii", "replace")
        except (OSError, TopologyError):
            return None

    return read, cgroup_dirs(read("/proc/self/mounts"), read("/proc/self/cgroup"), "memory")


def _field(text: str, key: str) -> int | None:
    """``N`` of a ``key N`` line (memory.events, memory.oom_control, /proc/vmstat)."""
    m = re.search(rf"^{key}\s+(\d+)\s*$", text, re.M)
    return int(m.group(1)) if m else None


def kills(root: Path = Path("/")) -> Kills:
    """The counts now: this process's (and so its workers') innermost v2 and v1 memory cgroup, the host."""
    read, dirs = _reader(root)
    vmstat = read("/proc/vmstat")
    found = [
        cgroup_read(dirs, {2: ("memory.events",)}, read),
        cgroup_read(dirs, {1: ("memory.oom_control",)}, read),
        ("/proc/vmstat", vmstat) if vmstat else None,
    ]
    return Kills(tuple((hit[0], n) for hit in found if hit and (n := _field(hit[1], "oom_kill")) is not None))


def _size(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def explain(
    before: Kills,
    pid: int,
    *,
    signum: int,
    root: Path = Path("/"),
    environ: Mapping[str, str] | None = None,
    kernel_log: str | None = None,
) -> str:
    """``: out of memory (limit, where it was read, what was used, the count that rose)`` for a rank killed
    by ``signum`` when a kill count rose since ``before``, else ''. ``kernel_log``: default /dev/kmsg's."""
    if signum != signal.SIGKILL:
        return ""
    read, dirs = _reader(root)
    was = dict(before.counts)
    rose = [(path, was[path], n) for path, n in kills(root).counts if path in was and n > was[path]]
    if not rose:
        return ""
    total = re.search(r"^MemTotal:\s+(\d+) kB", read("/proc/meminfo") or "", re.M)
    host = int(total.group(1)) << 10 if total else _UNLIMITED
    limits = [
        (int(t), v, d) for v, d in dirs if (t := (read(f"{d}/{_LIMIT[v]}") or "").strip()).isdigit() and int(t) < host
    ]
    facts, used = [], []
    if limits:
        limit, v, d = min(limits)
        facts.append(f"limit {_size(limit)}: {d}/{_LIMIT[v]}")
        peak = (read(f"{d}/{_PEAK[v]}") or "").strip()
        if peak.isdigit():
            used.append(f"the cgroup's peak {_size(int(peak))} ({d}/{_PEAK[v]})")
    else:
        facts.append("no memory cgroup limit" + (f" below the host's {_size(host)} (/proc/meminfo)" if total else ""))
    env = os.environ if environ is None else environ
    facts += [f"Slurm {flag}: {var}={env[var]} MB" for var, flag in _SLURM if env.get(var)]
    if kernel_log is None and root == Path("/"):
        kernel_log = read_kernel_log()
    held, source = _held(kernel_log or "", pid, since_us=before.since_us, pid_namespace=in_pid_namespace(root))
    if held is not None:
        used.insert(0, f"the rank held {_size(held << 10)} when killed (the kernel's log{source})")
    path, a, b = rose[0]
    facts += [*used, f"the kernel's OOM killer: oom_kill {a} -> {b} in {path}"]
    return f": out of memory ({'; '.join(facts)})"


def in_pid_namespace(root: Path = Path("/")) -> bool:
    """Whether this process (of the machine under ``root``) runs in a PID namespace other than the host's."""
    try:
        m = re.fullmatch(r"pid:\[(\d+)\]", os.readlink(root / "proc/self/ns/pid"))
    except OSError:
        return False
    return m is not None and int(m.group(1)) != INIT_PID_NAMESPACE


def _held(log: str, pid: int, *, since_us: int, pid_namespace: bool) -> tuple[int | None, str]:
    """(KiB the rank held, how the line was matched) from the log's "Killed process" lines (``[USEC;]TEXT``):
    the line of ``pid``; in a PID namespace, the one line since ``since_us`` (the kernel names the host's pid)."""
    found = [
        (int(m.group(1)), sum(int(x) for x in m.groups()[1:]))
        for when, text in map(_stamped, log.splitlines())
        if (m := _KILLED.search(text)) and (when is None or when >= since_us)
    ]
    mine = [kib for killed, kib in found if killed == pid]
    if mine:
        return mine[-1], ""
    if pid_namespace and len(found) == 1:
        return found[0][1], ": the one kill since the run started; in a PID namespace the kernel names the host's pid"
    return None, ""


def _stamped(line: str) -> tuple[int | None, str]:
    """(the kernel's stamp, the text) of a ``[USEC;]TEXT`` line (None: unstamped)."""
    stamp, sep, text = line.partition(";")
    return (int(stamp), text) if sep and stamp.isdigit() else (None, line)


def read_kernel_log(max_records: int = 1 << 16) -> str | None:
    """The kernel log's "Killed process" lines (``USEC;TEXT``, stamped by the kernel), from ``/dev/kmsg``;
    None where it cannot be read (not root)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    lines = []
    try:
        for _ in range(max_records):
            try:
                record = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:  # the record was overwritten while reading: go on with the next
                    continue
                break  # EAGAIN: the end of the log
            if not record:
                break
            if b"Killed process" in record:  # PRIO,SEQ,USEC,FLAGS;TEXT (Documentation/ABI/testing/dev-kmsg)
                head, _, text = record.decode("utf-8", "replace").partition(";")
                stamp = head.split(",")[2] if head.count(",") >= 2 else ""
                lines.append(f"{stamp};{text.strip()}" if stamp.isdigit() else text.strip())
    finally:
        os.close(fd)
    return "\n".join(lines)
