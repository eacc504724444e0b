"""The frozen, JSON-serialisable model of one node's topology (pure).

Ids are the kernel's (may be sparse); -1 is an unknown NUMA node; PCI bus ids are lower-case
``dddd:bb:dd.f``; link codes are ``nvidia-smi topo -m``'s (``X NV<n> PIX PXB PHB NODE SYS``, "" unknown).
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SchemaError, TopologyError
from ..jsonable import from_jsonable, to_jsonable
from ..jsonable import loads as jsonable_loads

SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)

_LINK_RANKS: dict[str, int] = {"X": 0, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "SOC": 6}

_BDF = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_bus_id(text: str) -> str:
    """``"00000000:18:00.0"`` (NVML) / ``"18:00.0"`` -> ``"0000:18:00.0"``; TopologyError if not a PCI address."""
    m = _BDF.match(text.strip())
    if not m:
        raise TopologyError(f"bad PCI bus id {text!r}: expected the form 'dddd:bb:dd.f' such as '0000:18:00.0'")
    dom = int(m.group(1) or "0", 16)
    return f"{dom:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def link_rank(code: str) -> int:
    """Smaller is closer. ``NV<n>`` ranks as closest after ``X``; unknown ranks farthest."""
    return 1 if code.startswith("NV") else _LINK_RANKS.get(code, 7)


def pci_code(path_a: Sequence[str], path_b: Sequence[str]) -> str:
    """The link code two PCI devices' paths from their root ports imply: a common port above both is a switch
    (``PIX`` one hop down on each side, else ``PXB``), a common root bus a host bridge (``PHB``); "" otherwise."""
    if not path_a or not path_b:
        return ""
    common = len(os.path.commonprefix([list(path_a), list(path_b)]))
    if common:
        hops = (len(path_a) - common) + (len(path_b) - common)
        return "PIX" if hops <= 2 else "PXB"
    if path_a[0].split(":")[:2] == path_b[0].split(":")[:2]:
        return "PHB"
    return ""


class NicKind(str, enum.Enum):
    """What a network device speaks: RDMA kinds go to NCCL_IB_HCA, ETHERNET to *_SOCKET_IFNAME."""

    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"
    OTHER = "other"  # EFA, OmniPath, unknown


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node as the kernel reports it."""

    id: int
    cpus: tuple[int, ...]  # all, online or not, allowed or not
    memory_bytes: int  # 0 when unknown
    distances: tuple[int, ...] = ()  # aligned with Topology.numa_nodes; () unknown
    memory_only: bool = False  # CPU-less (GPU HBM on GH200/POWER9, CXL)


@dataclass(frozen=True)
class Cpu:
    """One logical CPU (hardware thread)."""

    id: int
    package: int
    core: int  # core_id: unique only within (package, die)
    numa_node: int = -1
    die: int = 0
    siblings: tuple[int, ...] = ()  # SMT siblings including itself
    llc: int = -1  # smallest CPU id sharing this CPU's last-level cache
    online: bool = True
    allowed: bool = True  # in this process's affinity

    @property
    def core_key(self) -> tuple[int, ...]:
        """Identity of the physical core: its SMT sibling set."""
        return self.siblings or (self.id,)


def physical_cores(cpus: Iterable[Cpu]) -> list[tuple[Cpu, ...]]:
    """Online CPUs grouped into physical cores by SMT sibling set (not ``core_id``, which repeats
    across dies without ``die_id``), in order of their lowest CPU id."""
    groups: dict[tuple[int, ...], list[Cpu]] = {}
    for c in sorted(cpus, key=lambda c: c.id):
        if c.online:
            groups.setdefault(c.core_key, []).append(c)
    return [tuple(g) for g in sorted(groups.values(), key=lambda g: g[0].id)]


@dataclass(frozen=True)
class PcieLink:
    """A PCIe function's link (sysfs ``current_link_*`` / ``max_link_*``): GT/s and lanes; 0 unknown."""

    current_gts: float = 0.0
    current_width: int = 0
    max_gts: float = 0.0
    max_width: int = 0

    @property
    def known(self) -> bool:
        return bool(self.current_gts and self.max_gts and self.current_width and self.max_width)

    @property
    def degraded(self) -> bool:
        return self.known and (self.current_gts < self.max_gts or self.current_width < self.max_width)


@dataclass(frozen=True)
class Gpu:
    """One GPU, in the order NVML (PCI bus order) numbers them."""

    index: int
    pci_bus_id: str
    numa_node: int = -1
    name: str = ""
    uuid: str = ""
    vendor: str = "nvidia"  # or "amd"
    cpu_affinity: tuple[int, ...] = ()  # CPUs the device reports as local
    memory_bytes: int = 0
    memory_numa_node: int = -1  # the node holding the GPU's own memory (GH200, POWER9)
    pci_path: tuple[str, ...] = ()  # bus ids from the root port down to the device
    pcie_link: PcieLink = PcieLink()
    minor: int = -1  # N of /dev/nvidiaN: how Slurm numbers GPUs, not PCI order
    fabric_cluster: str = ""  # multi-node NVLink domain (NVML GPU fabric info: cluster UUID); "" none or unknown
    fabric_clique: int = -1  # the NVLink partition (clique id) inside that cluster


PORT_STATES: dict[int, str] = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device (``sys/class/infiniband/<dev>/ports/<N>``)."""

    number: int
    state: str = ""  # ACTIVE, DOWN, INIT, ARMED...; "" unknown
    link_layer: str = ""  # InfiniBand or Ethernet (RoCE)
    rate_gbps: float = 0.0

    @property
    def active(self) -> bool | None:
        if not self.state:
            return None
        return self.state.upper() in ("ACTIVE", "ACTIVE_DEFER")


@dataclass(frozen=True)
class Nic:
    """One network device: an RDMA device (``mlx5_0``) or a plain interface (``eth0``)."""

    name: str
    pci_bus_id: str = ""
    numa_node: int = -1
    kind: NicKind = NicKind.OTHER
    netdevs: tuple[str, ...] = ()  # interface names (ib0); a plain NIC's own name
    speed_mbps: int = 0
    pci_path: tuple[str, ...] = ()
    ports: tuple[RdmaPort, ...] = ()  # RDMA ports, ascending

    @property
    def rdma(self) -> bool:
        return self.kind in (NicKind.INFINIBAND, NicKind.ROCE)

    @property
    def port_up(self) -> bool:
        """False only when every recorded port is known not to be ACTIVE (unknown counts as up)."""
        states = [p.active for p in self.ports]
        return not states or any(s is not False for s in states)

    @property
    def port(self) -> int:
        """The port to name (``mlx5_0:1``): the first ACTIVE one, else the first, else 1."""
        for p in self.ports:
            if p.active:
                return p.number
        return self.ports[0].number if self.ports else 1

    pcie_link: PcieLink = PcieLink()


@dataclass(frozen=True)
class Topology:
    """Everything numarun knows about one node. Built by discovery, read by planning."""

    hostname: str
    numa_nodes: tuple[NumaNode, ...]
    cpus: tuple[Cpu, ...]
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    gpu_links: tuple[tuple[str, ...], ...] = ()  # GPU x GPU link codes; () unknown
    nic_links: tuple[tuple[str, ...], ...] = ()  # GPU rows x NIC columns; () unknown
    allowed_mems: tuple[int, ...] = ()  # Mems_allowed_list; () = all
    source: str = ""  # live, sysfs:<dir>, hwloc:<file>, nvidia-smi:<file>
    gpu_source: str = "none"  # nvml, sysfs, nvidia-smi, hwloc, json or none
    notes: tuple[str, ...] = ()  # defaults taken while reading, for numarun topo
    kernel_modules: tuple[str, ...] | None = None  # sorted; None unknown
    schema_version: int = SCHEMA_VERSION

    def cpu(self, cpu_id: int) -> Cpu:
        for c in self.cpus:
            if c.id == cpu_id:
                return c
        raise KeyError(cpu_id)

    def node(self, node_id: int) -> NumaNode:
        for n in self.numa_nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    @property
    def usable_cpus(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.cpus if c.online and c.allowed)

    def node_distance(self, a: int, b: int) -> int:
        """Kernel distance between two nodes; 10 for a==b, 20 when the row is unknown."""
        if a == b:
            return 10
        ids = [n.id for n in self.numa_nodes]
        try:
            row = self.node(a).distances
            return row[ids.index(b)] if row else 20
        except (KeyError, ValueError, IndexError):
            return 20

    def gpu_nic_link(self, gpu_pos: int, nic_pos: int) -> str:
        """Link code between ``gpus[gpu_pos]`` and ``nics[nic_pos]``: recorded, else from PCI paths and NUMA nodes."""
        if self.nic_links:
            return self.nic_links[gpu_pos][nic_pos]
        g, n = self.gpus[gpu_pos], self.nics[nic_pos]
        code = pci_code(g.pci_path, n.pci_path)
        if code:
            return code
        if g.numa_node >= 0 and n.numa_node >= 0:
            return "NODE" if g.numa_node == n.numa_node else "SYS"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, origin: str = "snapshot") -> Topology:
        if not isinstance(data, dict):
            raise TopologyError(f"bad topology snapshot {origin!r}: expected a JSON object from 'numarun topo --json'")
        version = data.get("schema_version")
        if type(version) is not int or version not in READABLE_SCHEMA_VERSIONS:
            raise TopologyError(
                f"bad topology snapshot {origin!r}: schema_version {version!r}, expected one of "
                f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))} (re-create it with 'numarun topo --json')"
            )
        try:  # older versions lack only fields that have defaults
            return from_jsonable(cls, {**data, "schema_version": SCHEMA_VERSION})
        except SchemaError as e:
            raise TopologyError(
                f"bad topology snapshot {origin!r}: {e}; expected the form 'numarun topo --json' writes"
            ) from None

    @classmethod
    def from_json(cls, text: str, origin: str = "snapshot") -> Topology:
        try:
            data = jsonable_loads(text)
        except json.JSONDecodeError as e:
            raise TopologyError(
                f"bad topology snapshot {origin!r}: not JSON ({e.msg} at line "
                f"{e.lineno}); expected the output of 'numarun topo --json'"
            ) from None
        except UnicodeDecodeError as e:
            raise TopologyError(
                f"bad topology snapshot {origin!r}: not UTF-8 text ({e.reason}); "
                "expected the output of 'numarun topo --json'"
            ) from None
        return cls.from_dict(data, origin)
