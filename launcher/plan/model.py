"""The launch plan: one RankBinding per local rank; what ``numarun plan --json`` prints and each worker reads.

The NIC choices are fields; each rank's ``env`` holds the variables made from them. Views read the fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .. import envvars
from ..argtypes import ONE_NODE, NodeRange
from ..errors import PlanError, SchemaError
from ..jsonable import from_jsonable, to_jsonable
from ..jsonable import loads as jsonable_loads
from ..layout import Layout
from ..options.choices import BindingMode, MemPolicy, NicPolicy
from ..options.launch import option

PLAN_SCHEMA_VERSION = 2
READABLE_PLAN_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)


DERIVED_ENV: tuple[str, ...] = ("CUDA_VISIBLE_DEVICES",)
"""Plan variables made from the user's own value (the visible GPUs in local-rank order): applied although the user
set them, never kept."""


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for. Its defaults are numarun's, stated here once (the launch options' declarations,
    :class:`numarun.options.launch.LaunchOptions`, and a plan's fields name these)."""

    nproc_per_node: int | str | None = None  # None: one rank per visible GPU (or 1 without GPUs); torchrun's words
    # (auto, gpu, cpu, xpu) until numarun.plan.request.resolve_nproc counts them
    binding: BindingMode = option("binding").default
    mem_policy: MemPolicy = option("mem_policy").default
    cuda_visible_devices: str | None = None  # None = unset: all GPUs
    cuda_device_order: str | None = None
    user_env: dict[str, str] = field(default_factory=dict)  # never overridden
    nic_policy: NicPolicy = option("nic_policy").default
    allowed_gpu_minors: tuple[int, ...] | None = None  # what the device cgroup lets ranks open (None: all)
    mesh: Layout | None = None  # the parallel layout as declared (its source in its messages), None: none
    nnodes: NodeRange = ONE_NODE  # torchrun's --nnodes: the layout spans that many nodes
    keep_gpus: bool = False  # the scheduler fixed each rank's GPU: the layout is recorded, not placed


@dataclass(frozen=True)
class GpuRef:
    """The GPU a rank drives."""

    index: int  # NVML index (PCI bus order)
    pci_bus_id: str
    numa_node: int
    uuid: str = ""
    name: str = ""
    cuda_index: int = 0  # the cuda:N the worker sees


@dataclass(frozen=True)
class NcclNics:
    """The NIC list NCCL gets in every GPU rank of a node: one per node (NVIDIA/nccl#1478)."""

    variable: str  # NCCL_IB_HCA (RDMA) or NCCL_SOCKET_IFNAME
    nics: tuple[str, ...]  # topology names, topology order
    value: str  # exact match: =mlx5_0,mlx5_1 (interface names for sockets)


@dataclass(frozen=True)
class RankBinding:
    """Everything the worker for one local rank applies before the user's code runs."""

    local_rank: int
    gpu: GpuRef | None
    cpus: tuple[int, ...]  # for sched_setaffinity; never empty
    mems: tuple[int, ...]  # for set_mempolicy; () with mem_policy none
    nic: str | None  # the rank's own NIC
    env: dict[str, str]  # set in the worker; the user's values excluded
    numa_node: int = -1  # CPU-side node placed on (-1: spread / unknown)
    mem_policy: MemPolicy = option("mem_policy").default
    physical_cores: int = 0
    fallback: str = ""  # why the rank is not where the ideal plan wanted it
    nic_port: int = 0  # UCX_NET_DEVICES=<nic>:<port>; 0: Ethernet, or per-rank (NCCL takes every port)
    nic_variables: tuple[str, ...] = ()  # the variables in env naming nic for this rank alone (not the user's)


@dataclass(frozen=True)
class MeshDim:
    """One dimension of a placed layout, as this node sees it."""

    name: str
    size: int  # -1: the rest of a world whose size is known only once the nodes meet (elastic --nnodes)
    reach: str  # node: its groups lie inside one node; nodes: across nodes; split: part here, part on other nodes
    groups: tuple[tuple[int, ...], ...]  # this node's part of each of its groups touching the node, as local ranks
    links: tuple[str, ...]  # each group's slowest link (nvidia-smi's code, or "network" across nodes)
    default_links: tuple[str, ...]  # the same with today's order (local rank i on visible GPU i)


@dataclass(frozen=True)
class MeshPlan:
    """The parallel layout of the job and how it is placed on this node (docs/layouts.md)."""

    spec: str  # every size known ("pp=2,dp_shard=2,tp=4"); -1 kept when the world size is known only at rendezvous
    declared: str  # as written
    names: tuple[str, ...]
    shape: tuple[int, ...]  # -1 as in spec
    nnodes: int  # 0: elastic (the world size comes with the rendezvous)
    dims: tuple[MeshDim, ...]
    default_gpus: tuple[int, ...]  # the GPU (NVML index) each local rank drives in today's order
    search: str  # how the placement was found: "exhaustive, N steps", "stopped after N steps", "-" (nothing to place)
    cuda_visible_devices: str = ""  # the GPU order every rank of the node sees ("": the user's, unchanged)
    nvlink_domain: str = ""  # the node's multi-node NVLink domain (NVML fabric cluster UUID/clique id); "" none

    @property
    def layout(self) -> Layout:
        """The layout the plan carries to the ranks (``-1`` only where the world size comes with the rendezvous)."""
        return Layout(self.names, self.shape, where=f"{envvars.PLAN} layout")


@dataclass(frozen=True)
class LaunchPlan:
    """The whole node's plan. JSON contract: ``{"ranks": [RankBinding...], ...}``."""

    ranks: tuple[RankBinding, ...]
    binding: BindingMode = PlanRequest.binding
    mem_policy: MemPolicy = PlanRequest.mem_policy
    hostname: str = ""
    topology_source: str = ""
    warnings: tuple[str, ...] = ()
    schema_version: int = PLAN_SCHEMA_VERSION
    nic_policy: NicPolicy = PlanRequest.nic_policy
    nccl_nics: NcclNics | None = None  # None: nothing to choose, per-rank, or the user's own
    container: str = ""  # the runtime the node runs in (jobenv.container.Runtime)
    mem_unbound: str = ""  # why memory is not bound as mem_policy asks (seccomp); "" when it is
    mesh: MeshPlan | None = None  # the parallel layout (--mesh), None without one

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
            version = data.get("schema_version") if isinstance(data, dict) else None
            if type(version) is not int or version not in READABLE_PLAN_SCHEMA_VERSIONS:
                expected = " or ".join(map(str, READABLE_PLAN_SCHEMA_VERSIONS))
                raise SchemaError(f"$.schema_version: expected {expected}")
            if version == 1:
                data = _nic_fields_of_v1(data)
            return from_jsonable(cls, {**data, "schema_version": PLAN_SCHEMA_VERSION})
        except (json.JSONDecodeError, SchemaError) as e:
            raise PlanError(f"bad plan file {origin!r}: {e}; expected the output of 'numarun plan --json'") from None


_V1_NODE_VARIABLES = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME")
_V1_RANK_VARIABLES = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES")


def _nic_fields_of_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 plan (NIC choices only as variables in each rank's env) with version 2's NIC fields read back;
    anything of the wrong shape is left for :func:`from_jsonable` to report."""
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or not all(
        isinstance(r, dict) and isinstance(r.get("env"), dict) and all(isinstance(v, str) for v in r["env"].values())
        for r in ranks
    ):
        return data
    per_rank = data.get("nic_policy") == NicPolicy.PER_RANK.value
    gpu_envs = [r["env"] for r in ranks if r.get("gpu") is not None]
    nccl: dict[str, Any] | None = None
    if not per_rank and gpu_envs:
        for var in _V1_NODE_VARIABLES:
            values = {env.get(var) for env in gpu_envs}
            value = values.pop() if len(values) == 1 else None
            if isinstance(value, str):
                nccl = {"variable": var, "nics": value.lstrip("=").split(","), "value": value}
                break
    out = []
    for r in ranks:
        env = r["env"]
        own = tuple(v for v in _V1_RANK_VARIABLES if v in env and not (nccl is not None and v == nccl["variable"]))
        ucx = str(env.get("UCX_NET_DEVICES", ""))
        port = ucx.rpartition(":")[2]
        out.append({**r, "nic_variables": list(own), "nic_port": int(port) if port.isdigit() else 0})
    return {**data, "ranks": out, "nccl_nics": nccl}
