"""The choices the options take: ``str`` Enums with a docstring per member (torch's names where torch has them),
the watchdog's default and exit code, torchrun's words for ``--nproc-per-node``. Pure; the options
(:mod:`numarun.options.launch`), the plan and the watchdog all name them."""

from __future__ import annotations

import enum

from ..argtypes import MAX_LOCAL_RANKS, ascii_digits, duration
from ..errors import UsageError


class BindingMode(str, enum.Enum):
    """How CPUs are given to ranks. Names and meanings follow ``torchrun --numa-binding``."""

    NODE = "node"
    """All allowed CPUs of the GPU's NUMA node (shared by the ranks on that node)."""
    SOCKET = "socket"
    """All allowed CPUs of the package (socket) holding the GPU's NUMA node."""
    EXCLUSIVE = "exclusive"
    """The node's physical cores split evenly among the ranks whose GPUs sit on it; SMT siblings kept together."""
    CORE_COMPLEX = "core-complex"
    """One last-level-cache domain (AMD CCX / L3 slice) per rank, on the GPU's NUMA node."""
    NONE = "none"
    """No CPU binding: all allowed CPUs, as plain torchrun."""


class MemPolicy(str, enum.Enum):
    """Memory policy applied with ``set_mempolicy(2)`` in each worker."""

    BIND = "bind"
    """MPOL_BIND to the rank's NUMA node(s): allocations fail over to nothing else."""
    PREFERRED = "preferred"
    """MPOL_PREFERRED: allocate on the rank's node, fall back to others when full."""
    NONE = "none"
    """Leave the kernel default (first touch)."""


class NicPolicy(str, enum.Enum):
    """How the NCCL NIC variables are set for the ranks of a node."""

    NODE = "node"
    """One ``NCCL_IB_HCA`` / ``NCCL_SOCKET_IFNAME`` per node naming its compute NICs (NCCL's own advice)."""
    PER_RANK = "per-rank"
    """Each rank's NCCL variable names only its closest NIC (for rails that never meet)."""


DEFAULT_TIMEOUT_S = 300.0
"""``--hang-timeout``'s default (docs/hangs.md, "Options"): half of NCCL's own collective timeout (10 min), so
the roll-call comes while every rank still stands where it hangs, before NCCL's watchdog tears the ranks down; far
longer than a healthy job goes without a collective or an optimizer step; minutes, not a queue's time limit."""
EXIT_HANG = 75
"""The exit code of a job ended by ``--on-hang stop``: sysexits.h's EX_TEMPFAIL (a temporary failure, worth a
retry), apart from a failed rank's code, 2 (a usage mistake) and 128+N (a signal)."""


class OnHang(str, enum.Enum):
    """What numarun does once it has printed the roll-call of a hung job."""

    REPORT = "report"
    """Nothing more: the job keeps running (a debugger can still attach; a long step may still finish)."""
    STOP = "stop"
    """End the job on every node, nothing left running, with exit code :data:`EXIT_HANG`."""


class StepReport(str, enum.Enum):
    """Whether numarun records where each step's time goes and says which rank holds the job back."""

    ON = "on"
    """Each rank records its steps' phases; the agent compares the ranks, keeps ``numarun top``'s table and prints
    the summary at the end (docs/steps.md)."""
    OFF = "off"
    """No recorder in the ranks, no report."""


parse_hang_timeout = duration(above=False)
"""``--hang-timeout``'s reader (its declaration: :mod:`numarun.options.launch`)."""


NPROC_KEYWORDS = ("auto", "cpu", "gpu", "xpu")
"""torchrun's words for ``--nproc-per-node`` (torch.distributed.run.determine_local_world_size)."""


def parse_nproc(text: str, where: str) -> int | str | None:
    """``"4"`` -> 4; torchrun's ``auto``/``cpu``/``gpu``/``xpu`` kept as words (the plan resolves them)."""
    if text in NPROC_KEYWORDS:
        return text
    digits = text.strip()
    value = int(digits) if ascii_digits(digits) and len(digits) <= 30 else 0  # not '٢', '1_6'
    if not 1 <= value <= MAX_LOCAL_RANKS:  # each rank is a binding and a process: bounded before any is made
        raise UsageError(
            f"bad {where} {text!r}: expected a positive integer up to {MAX_LOCAL_RANKS} "
            f"or one of {', '.join(NPROC_KEYWORDS)}"
        )
    return value
