"""The launch plan: one RankBinding per local rank. What ``numarun plan --json`` prints
and what each worker's bootstrap reads (``NUMARUN_PLAN`` names the file)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import PlanError
from ..jsonable import SchemaError, from_jsonable, to_jsonable
from ..jsonable import loads as jsonable_loads

PLAN_SCHEMA_VERSION = 1


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
    """One ``NCCL_IB_HCA`` / ``NCCL_SOCKET_IFNAME`` per node naming its compute NICs,
    the same for every rank (NCCL's own advice)."""
    PER_RANK = "per-rank"
    """Each rank's ``NCCL_IB_HCA`` / ``NCCL_SOCKET_IFNAME`` names only its closest NIC
    (rails that never meet; see NVIDIA/nccl#1478)."""


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for."""

    nproc_per_node: int | None = None
    """None: one rank per visible GPU (or 1 without GPUs)."""
    binding: BindingMode = BindingMode.EXCLUSIVE
    mem_policy: MemPolicy = MemPolicy.BIND
    cuda_visible_devices: str | None = None
    """The user's ``CUDA_VISIBLE_DEVICES`` (None = unset: all GPUs)."""
    cuda_device_order: str | None = None
    """The user's ``CUDA_DEVICE_ORDER``."""
    user_env: dict[str, str] = field(default_factory=dict)
    """Variables the user already set that the plan may want to set (never overridden)."""
    nic_policy: NicPolicy = NicPolicy.NODE
    allowed_gpu_minors: tuple[int, ...] | None = None
    """GPUs the scheduler's device cgroup lets the ranks open, by minor number (None: all); CUDA
    numbers only those, and ``cuda_visible_devices`` indexes into them."""


@dataclass(frozen=True)
class GpuRef:
    """The GPU a rank drives."""

    index: int
    """NVML index (PCI bus order)."""
    pci_bus_id: str
    numa_node: int
    uuid: str = ""
    name: str = ""
    cuda_index: int = 0
    """The ``cuda:N`` ordinal the worker sees with the plan's CUDA_VISIBLE_DEVICES/CUDA_DEVICE_ORDER."""


@dataclass(frozen=True)
class RankBinding:
    """Everything the worker for one local rank applies before the user's code runs."""

    local_rank: int
    gpu: GpuRef | None
    cpus: tuple[int, ...]
    """CPUs for sched_setaffinity; never empty."""
    mems: tuple[int, ...]
    """NUMA nodes for set_mempolicy; () with mem_policy none."""
    nic: str | None
    env: dict[str, str]
    """Variables set in the worker (OMP_NUM_THREADS, NCCL_IB_HCA, ...), user's values excluded."""
    numa_node: int = -1
    """The CPU-side NUMA node the rank was placed on (-1: spread / unknown)."""
    mem_policy: MemPolicy = MemPolicy.BIND
    physical_cores: int = 0
    fallback: str = ""
    """Why the rank is not where the ideal plan wanted it ("" when it is)."""


@dataclass(frozen=True)
class LaunchPlan:
    """The whole node's plan. JSON contract: ``{"ranks": [RankBinding...], ...}``."""

    ranks: tuple[RankBinding, ...]
    binding: BindingMode = BindingMode.EXCLUSIVE
    mem_policy: MemPolicy = MemPolicy.BIND
    hostname: str = ""
    topology_source: str = ""
    warnings: tuple[str, ...] = ()
    schema_version: int = PLAN_SCHEMA_VERSION
    nic_policy: NicPolicy = NicPolicy.NODE

    @property
    def nproc_per_node(self) -> int:
        return len(self.ranks)

    def rank(self, local_rank: int) -> RankBinding:
        for r in self.ranks:
            if r.local_rank == local_rank:
                return r
        raise PlanError(f"bad local rank {local_rank!r}: expected 0..{len(self.ranks) - 1} for this plan")

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str = "plan") -> LaunchPlan:
        try:
            data = jsonable_loads(text)
            if not isinstance(data, dict) or data.get("schema_version") != PLAN_SCHEMA_VERSION:
                raise SchemaError(f"$.schema_version: expected {PLAN_SCHEMA_VERSION}")
            return from_jsonable(cls, data)
        except (json.JSONDecodeError, SchemaError) as e:
            raise PlanError(f"bad plan file {origin!r}: {e}; expected the output of 'numarun plan --json'") from None
