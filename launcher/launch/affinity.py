"""CPU affinity and NUMA memory policy of the calling process, by system call.

No numactl: ``sched_setaffinity(2)`` through :mod:`os`, ``set_mempolicy(2)`` and
``get_mempolicy(2)`` through ``ctypes`` ``syscall(3)``. Failures surface as
:class:`OSError` carrying the errno (EPERM in a container without CAP_SYS_NICE,
EINVAL for an offline or disallowed CPU/node) so the caller decides whether that
is fatal. :func:`read_back` is the one way a rank reads its binding back from the kernel.

Besides syscalls this module reads only the calling process's own ``/proc/self`` (its
thread ids, its ``Cpus_allowed_list``/``Mems_allowed_list``), never the machine's topology.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..cpuset import parse_list

# syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h)
_SYSCALLS: dict[str, tuple[int, int]] = {
    # machine: (set_mempolicy, get_mempolicy)
    "x86_64": (238, 239),
    "amd64": (238, 239),
    "aarch64": (237, 236),
    "arm64": (237, 236),
}

_WORD_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
# Enough for any kernel: MAX_NUMNODES is at most 1 << NODES_SHIFT = 1024.
_MAX_NODES = 1024
# Mode flags the kernel may OR into the mode get_mempolicy returns (MPOL_F_STATIC_NODES...).
_MPOL_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)


class Mpol(enum.IntEnum):
    """Memory policy modes of ``include/uapi/linux/mempolicy.h``."""

    DEFAULT = 0
    """Kernel default: allocate on the node of the CPU that first touches the page."""
    PREFERRED = 1
    """Allocate on the first node of the mask, fall back to others when it is full."""
    BIND = 2
    """Allocate only on the nodes of the mask."""
    INTERLEAVE = 3
    """Round-robin over the nodes of the mask."""
    LOCAL = 4
    """Allocate on the node of the allocating CPU."""
    PREFERRED_MANY = 5
    """Prefer any node of the mask (Linux >= 5.15)."""


_libc: ctypes.CDLL | None = None


def _syscall(number: int, *args: object) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    ret = _libc.syscall(ctypes.c_long(number), *args)
    if ret == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def _numbers() -> tuple[int, int]:
    machine = platform.machine().lower()
    try:
        return _SYSCALLS[machine]
    except KeyError:
        raise OSError(errno.ENOSYS, f"set_mempolicy: no syscall number known for machine {machine!r}") from None


def set_cpu_affinity(cpus: Iterable[int]) -> None:
    """Bind every thread of this process to ``cpus``.

    ``sched_setaffinity(0)`` only moves the calling thread; threads started
    earlier (by an imported library) keep their mask, so each tid in
    ``/proc/self/task`` is set too. A thread that exits meanwhile is skipped.
    """
    mask = set(cpus)
    if not mask:
        raise OSError(errno.EINVAL, "empty CPU set")
    os.sched_setaffinity(0, mask)
    for tid in thread_ids():
        try:
            os.sched_setaffinity(tid, mask)
        except ProcessLookupError:
            continue


def thread_ids() -> tuple[int, ...]:
    """Ids of this process's threads (``/proc/self/task``); () where it cannot be read."""
    try:
        return tuple(sorted(int(t) for t in os.listdir("/proc/self/task")))
    except OSError:
        return ()


def get_cpu_affinity(pid: int = 0) -> tuple[int, ...]:
    """The CPUs ``pid`` (0: the calling thread) may run on, ascending."""
    return tuple(sorted(os.sched_getaffinity(pid)))


def _nodemask(nodes: Iterable[int]) -> tuple[ctypes.Array, int]:
    ids = sorted(set(nodes))
    if any(n < 0 or n >= _MAX_NODES for n in ids):
        raise OSError(errno.EINVAL, f"NUMA node ids {ids} out of range 0..{_MAX_NODES - 1}")
    words = (ids[-1] // _WORD_BITS + 1) if ids else 1
    mask = (ctypes.c_ulong * words)()
    for n in ids:
        mask[n // _WORD_BITS] |= 1 << (n % _WORD_BITS)
    # The kernel reads only maxnode-1 bits (mm/mempolicy.c get_nodes() begins with
    # --maxnode; set_mempolicy(2) BUGS), so pass one more than the mask holds, as libnuma does.
    return mask, words * _WORD_BITS + 1


def set_mempolicy(mode: Mpol | int, nodes: Iterable[int] = ()) -> None:
    """``set_mempolicy(2)`` for the calling thread (inherited by threads and children it creates).

    ``Mpol.DEFAULT``/``Mpol.LOCAL`` take no nodes. Raises :class:`OSError` with the errno.
    """
    set_nr, _ = _numbers()
    mode = Mpol(int(mode))
    node_list = sorted(set(nodes))
    if mode in (Mpol.DEFAULT, Mpol.LOCAL):
        _syscall(set_nr, ctypes.c_int(int(mode)), None, ctypes.c_ulong(0))
        return
    if not node_list:
        raise OSError(errno.EINVAL, f"set_mempolicy {mode.name}: empty node set")
    mask, maxnode = _nodemask(node_list)
    _syscall(set_nr, ctypes.c_int(int(mode)), mask, ctypes.c_ulong(maxnode))


def get_mempolicy() -> tuple[Mpol, tuple[int, ...]]:
    """The calling thread's policy: (mode without flags, nodes of its mask)."""
    _, get_nr = _numbers()
    mode = ctypes.c_int(0)
    words = _MAX_NODES // _WORD_BITS
    mask = (ctypes.c_ulong * words)()
    _syscall(get_nr, ctypes.byref(mode), mask, ctypes.c_ulong(_MAX_NODES + 1), None, ctypes.c_ulong(0))
    nodes = tuple(w * _WORD_BITS + b for w in range(words) for b in range(_WORD_BITS) if mask[w] >> b & 1)
    return Mpol(mode.value & ~_MPOL_MODE_FLAGS), nodes


def _status_field(name: str, status: Path) -> str:
    for line in status.read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise OSError(errno.ENOENT, f"no {name} in {status}")


def mems_allowed(status: Path = Path("/proc/self/status")) -> tuple[int, ...]:
    """NUMA nodes the cpuset lets this process allocate on (``Mems_allowed_list``)."""
    return parse_list(_status_field("Mems_allowed_list", status), "Mems_allowed_list")


def cpus_allowed(status: Path = Path("/proc/self/status")) -> tuple[int, ...]:
    """CPUs of this process's affinity as ``/proc/self/status`` reports (``Cpus_allowed_list``)."""
    return parse_list(_status_field("Cpus_allowed_list", status), "Cpus_allowed_list")


@dataclass(frozen=True)
class Readback:
    """What the kernel says this process got, read after binding."""

    cpus: tuple[int, ...]
    """Affinity of the calling thread."""
    thread_cpus: Mapping[int, tuple[int, ...]]
    """Affinity of every live thread by tid (empty unless asked for)."""
    mem_policy: str
    """``bind``, ``preferred``, ``default``... (``?`` when get_mempolicy failed)."""
    mems: tuple[int, ...]
    """Nodes of the memory policy."""


def read_back(*, threads: bool = False) -> Readback:
    """This process's CPU affinity and memory policy, as the kernel reports them.

    ``threads=True`` also reads every thread's affinity (a thread that exits meanwhile
    is skipped), to show that threads started by libraries were bound too.
    """
    per_thread: dict[int, tuple[int, ...]] = {}
    if threads:
        for tid in thread_ids():
            try:
                per_thread[tid] = get_cpu_affinity(tid)
            except OSError:
                continue
    try:
        mode, mems = get_mempolicy()
        policy = mode.name.lower()
    except OSError:
        policy, mems = "?", ()
    return Readback(cpus=get_cpu_affinity(), thread_cpus=per_thread, mem_policy=policy, mems=mems)
