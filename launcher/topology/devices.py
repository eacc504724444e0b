"""What this process may use, as the kernel enforces it: GPU device files and the cgroup's CPUs.

A scheduler confines a task with cgroups. Slurm's ConstrainDevices lets a task open only its
GPUs' ``/dev/nvidiaN`` (with ``--gpus-per-task`` each task its own, while ``SLURM_STEP_GPUS`` and
``CUDA_VISIBLE_DEVICES`` read ``0`` in every task), and its ConstrainCores gives the step a
cpuset while ``--cpu-bind`` narrows each task's affinity inside it. Both are read here, under a
``root`` (``/`` for the live machine; a recorded tree has its own ``dev/`` and ``proc/``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from ..cpuset import parse_list
from ..errors import CpuListError, TopologyError
from .fileio import read_bounded
from .procfs import cgroup_dirs, cgroup_read

DENIED = (errno.EPERM, errno.EACCES)


def gpu_device_access(root: Path, minors: Iterable[int]) -> dict[int, bool | None]:
    """Minor number -> whether ``<root>/dev/nvidia<minor>`` may be opened (None: no such file).

    An open refused with EPERM/EACCES is the device cgroup saying no. Any other outcome (the
    device opens, or the driver answers ENXIO/ENODEV) means the cgroup let it through.
    """
    out: dict[int, bool | None] = {}
    for minor in sorted(set(minors)):
        if minor < 0:
            continue
        try:
            os.close(os.open(root / "dev" / f"nvidia{minor}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY))
        except FileNotFoundError:
            out[minor] = None
        except OSError as e:
            out[minor] = e.errno not in DENIED
        else:
            out[minor] = True
    return out


def _read(path: Path | str) -> str | None:
    try:
        return read_bounded(path, limit=1 << 16).decode("ascii", "replace")
    except (OSError, TopologyError):
        return None


def cgroup_cpus(root: Path = Path("/")) -> tuple[int, ...] | None:
    """The CPUs of this process's cpuset cgroup (v2 ``cpuset.cpus.effective``, v1
    ``cpuset.effective_cpus`` or ``cpuset.cpus``), the nearest ancestor that has the file; None when
    unknown. This is what the scheduler gave the whole step, before any per-task ``--cpu-bind``."""
    dirs = cgroup_dirs(_read(root / "proc/self/mounts"), _read(root / "proc/self/cgroup"), "cpuset")
    found = cgroup_read(
        dirs,
        {2: ("cpuset.cpus.effective",), 1: ("cpuset.effective_cpus", "cpuset.cpus")},
        lambda p: _read(root / p.lstrip("/")),
    )
    try:
        return parse_list(found[1]) if found else None
    except CpuListError:
        return None
