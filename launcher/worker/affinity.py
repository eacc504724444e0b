"""CPU affinity and NUMA memory policy of the calling process, by system call.

No numactl: ``sched_setaffinity(2)`` through :mod:`os`, ``set_mempolicy(2)`` and
``get_mempolicy(2)`` through ``ctypes`` ``syscall(3)`` by number (:data:`SYSCALLS`), or
through libnuma's wrappers on an architecture whose numbers are not known here. With
neither, memory calls fail with ENOSYS (logged once) and ranks run with CPU binding only. Failures surface as
:class:`OSError` carrying the errno (EPERM in a container without CAP_SYS_NICE,
EINVAL for an offline or disallowed CPU/node) so the caller decides whether that
is fatal. :func:`read_back` is the one way a rank reads its binding back from the kernel.

Besides syscalls this module reads only the calling process's own ``/proc/self`` (its
thread ids, its ``Cpus_allowed_list``/``Mems_allowed_list``), never the machine's topology.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import enum
import errno
import functools
import logging
import os
import platform
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..cpuset import parse_list
from ..topology import procfs

# (set_mempolicy, get_mempolicy) by ``platform.machine()``, for every 64-bit Linux
# architecture torch builds for. Sources: arch/x86/entry/syscalls/syscall_64.tbl,
# include/uapi/asm-generic/unistd.h (arm64, riscv64, loongarch64),
# arch/powerpc/kernel/syscalls/syscall.tbl, arch/s390/kernel/syscalls/syscall.tbl.
SYSCALLS: dict[str, tuple[int, int]] = {
    "x86_64": (238, 239),
    "amd64": (238, 239),
    "aarch64": (237, 236),
    "arm64": (237, 236),
    "riscv64": (237, 236),
    "loongarch64": (237, 236),
    "ppc64le": (261, 260),
    "ppc64": (261, 260),
    "s390x": (270, 269),
}

log = logging.getLogger(__name__)

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


class _Mempolicy:
    """How this process reaches set_mempolicy/get_mempolicy: a syscall number, or libnuma."""

    def __init__(self, machine: str, find_library: Callable[[str], str | None] = ctypes.util.find_library) -> None:
        self.machine = machine
        self.numbers = SYSCALLS.get(machine)
        self.libnuma: ctypes.CDLL | None = None
        self.reason = ""
        self.warned = False
        if self.numbers is None:
            name = find_library("numa")
            try:
                self.libnuma = ctypes.CDLL(name, use_errno=True) if name else None
            except OSError:
                self.libnuma = None
            if self.libnuma is None or not hasattr(self.libnuma, "set_mempolicy"):
                self.libnuma = None
                self.reason = (
                    f"memory binding unavailable on machine {machine!r}: no set_mempolicy syscall number known "
                    "and no libnuma (libnuma.so.1) to call; running with CPU binding only"
                )

    def call(self, which: int, *args: object) -> int:
        """``which`` 0: set_mempolicy, 1: get_mempolicy."""
        if self.numbers is not None:
            fn = _libc().syscall
            ret = fn(ctypes.c_long(self.numbers[which]), *args)
        elif self.libnuma is not None:
            fn = self.libnuma.set_mempolicy if which == 0 else self.libnuma.get_mempolicy
            ret = fn(*args)
        else:
            if not self.warned:
                log.warning("%s", self.reason)
                self.warned = True
            raise OSError(errno.ENOSYS, self.reason)
        if ret == -1:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(ret)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def mempolicy_backend() -> _Mempolicy:
    """This machine's way to set_mempolicy (chosen once per process)."""
    return _Mempolicy(platform.machine().lower())


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
    for tid in procfs.thread_ids(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, mask)


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
    backend = mempolicy_backend()
    mode = Mpol(int(mode))
    node_list = sorted(set(nodes))
    if mode in (Mpol.DEFAULT, Mpol.LOCAL):
        backend.call(0, ctypes.c_int(int(mode)), None, ctypes.c_ulong(0))
        return
    if not node_list:
        raise OSError(errno.EINVAL, f"set_mempolicy {mode.name}: empty node set")
    mask, maxnode = _nodemask(node_list)
    backend.call(0, ctypes.c_int(int(mode)), mask, ctypes.c_ulong(maxnode))


def get_mempolicy() -> tuple[Mpol, tuple[int, ...]]:
    """The calling thread's policy: (mode without flags, nodes of its mask)."""
    mode = ctypes.c_int(0)
    words = _MAX_NODES // _WORD_BITS
    mask = (ctypes.c_ulong * words)()
    mempolicy_backend().call(1, ctypes.byref(mode), mask, ctypes.c_ulong(_MAX_NODES + 1), None, ctypes.c_ulong(0))
    nodes = tuple(w * _WORD_BITS + b for w in range(words) for b in range(_WORD_BITS) if mask[w] >> b & 1)
    return Mpol(mode.value & ~_MPOL_MODE_FLAGS), nodes


def mempolicy_refusal(status: Path = Path("/proc/self/status")) -> str:
    """Why the kernel refuses this process the memory-policy syscalls: ``seccomp`` (EPERM from a seccomp
    filter), another refusal's strerror; "" when they work or cannot be called here (ENOSYS).

    Probed in a thread of its own that reads its policy and sets the default: a thread's policy ends
    with it, so the caller's is left as it was."""
    import threading

    failed: list[OSError] = []

    def probe() -> None:
        try:
            get_mempolicy()
            set_mempolicy(Mpol.DEFAULT)
        except OSError as e:
            failed.append(e)

    thread = threading.Thread(target=probe, name="numarun-mempolicy-probe")
    thread.start()
    thread.join()
    if not failed or failed[0].errno not in (errno.EPERM, errno.EACCES):
        return ""
    try:
        filtered = procfs.status_field(status.read_text(), "Seccomp") == "2"  # SECCOMP_MODE_FILTER
    except OSError:
        filtered = False
    return "seccomp" if filtered else os.strerror(failed[0].errno or errno.EPERM)


def _status_field(name: str, status: Path) -> str:
    value = procfs.status_field(status.read_text(), name)
    if value is None:
        raise OSError(errno.ENOENT, f"no {name} in {status}")
    return value


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
    try:
        mode, mems = get_mempolicy()
        policy = mode.name.lower()
    except OSError:
        policy, mems = "?", ()
    return Readback(
        cpus=get_cpu_affinity(), thread_cpus=thread_affinities() if threads else {}, mem_policy=policy, mems=mems
    )


def thread_affinities() -> dict[int, tuple[int, ...]]:
    """The CPUs each live thread of this process may run on, by tid (a thread that exits meanwhile is skipped)."""
    out: dict[int, tuple[int, ...]] = {}
    for tid in procfs.thread_ids(os.getpid()):
        with contextlib.suppress(OSError):
            out[tid] = get_cpu_affinity(tid)
    return out
