"""The frozen, JSON-serialisable model of one node's topology. Pure: no I/O here.

Conventions:
- ids are the kernel's (``cpuN``, ``nodeN``); NUMA ids can be sparse, CPU 0 and node 0
  may not exist.
- ``-1`` means "unknown" for a NUMA node (the kernel's ``numa_node`` of -1).
- PCI bus ids are normalised to lower case ``dddd:bb:dd.f`` with a domain of at least
  4 hex digits (32-bit domains such as ``10000:00:04.0`` are kept whole).
- Link codes are the ones ``nvidia-smi topo -m`` prints: ``X``, ``NV<n>``, ``PIX``,
  ``PXB``, ``PHB``, ``NODE``, ``SYS`` (``SOC`` is read as ``SYS``), or ``""`` unknown.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import TopologyError
from ..jsonable import SchemaError, from_jsonable, to_jsonable
from ..jsonable import loads as jsonable_loads

SCHEMA_VERSION = 2
# Snapshots this version still reads: version 1 had no RDMA ports (``Nic.ports`` stays ()).
READABLE_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)

# Order of PCIe/SMP link codes from closest to farthest (nvidia-smi's legend).
LINK_ORDER: tuple[str, ...] = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")

_BDF = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_bus_id(text: str) -> str:
    """``"00000000:18:00.0"`` / ``"18:00.0"`` / ``"0000:18:00.0"`` -> ``"0000:18:00.0"``.

    NVML prints an 8-digit domain, sysfs a 4-digit one (or more for 32-bit domains).
    Raises :class:`TopologyError` on a value that is not a PCI address.
    """
    m = _BDF.match(text.strip())
    if not m:
        raise TopologyError(f"bad PCI bus id {text!r}: expected the form 'dddd:bb:dd.f' such as '0000:18:00.0'")
    dom = int(m.group(1) or "0", 16)
    return f"{dom:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def link_rank(code: str) -> int:
    """Smaller is closer. ``NV<n>`` ranks as closest after ``X``; unknown ranks farthest."""
    if code.startswith("NV"):
        return 1
    if code == "SOC":
        code = "SYS"
    try:
        i = LINK_ORDER.index(code)
    except ValueError:
        return len(LINK_ORDER) + 1
    return i if i == 0 else i + 1


class NicKind(str, enum.Enum):
    """What a network device speaks; decides which NCCL/gloo variable names it."""

    INFINIBAND = "infiniband"
    """An RDMA device on an InfiniBand link (``mlx5_N`` with link_layer InfiniBand): NCCL_IB_HCA."""
    ROCE = "roce"
    """An RDMA device on an Ethernet link (RoCE): NCCL_IB_HCA."""
    ETHERNET = "ethernet"
    """A plain network interface (``eth0``, ``ens1f0``): NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME."""
    OTHER = "other"
    """Anything else (EFA, OmniPath, unknown)."""


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node as the kernel reports it."""

    id: int
    cpus: tuple[int, ...]
    """All CPUs of the node (online or not, allowed or not), ascending."""
    memory_bytes: int
    """MemTotal of the node; 0 when unknown or empty."""
    distances: tuple[int, ...] = ()
    """Distance row, aligned with ``Topology.numa_nodes`` (ascending id); () when unknown."""
    memory_only: bool = False
    """True for a CPU-less node (GPU HBM on GH200/POWER9, CXL, HBM on KNL)."""


@dataclass(frozen=True)
class Cpu:
    """One logical CPU (hardware thread)."""

    id: int
    package: int
    core: int
    """``core_id``: unique only within (package, die)."""
    numa_node: int = -1
    die: int = 0
    siblings: tuple[int, ...] = ()
    """SMT siblings including itself (``thread_siblings_list``), ascending."""
    llc: int = -1
    """Last-level-cache domain: smallest CPU id sharing this CPU's LLC; -1 unknown."""
    online: bool = True
    allowed: bool = True
    """In this process's affinity (``sched_getaffinity`` / ``Cpus_allowed_list``)."""

    @property
    def core_key(self) -> tuple[int, ...]:
        """Identity of the physical core: its SMT sibling set (or the CPU alone)."""
        return self.siblings or (self.id,)


def physical_cores(cpus: Iterable[Cpu]) -> list[tuple[Cpu, ...]]:
    """Online CPUs grouped into physical cores by their SMT sibling set, as hwloc groups them.

    ``(package, die, core_id)`` is not an identity: multi-die packages without ``die_id``
    repeat ``core_id`` within a package, and offline CPUs have no topology at all. Offline
    CPUs are left out (callers list them apart). Cores in order of their lowest CPU id.
    """
    groups: dict[tuple[int, ...], list[Cpu]] = {}
    for c in sorted(cpus, key=lambda c: c.id):
        if c.online:
            groups.setdefault(c.core_key, []).append(c)
    return [tuple(g) for g in sorted(groups.values(), key=lambda g: g[0].id)]


@dataclass(frozen=True)
class PcieLink:
    """A PCIe function's link as sysfs shows it (``current_link_*`` / ``max_link_*``); 0 unknown."""

    current_gts: float = 0.0
    """Current link speed in GT/s (``current_link_speed`` "16.0 GT/s PCIe")."""
    current_width: int = 0
    """Current lane count (``current_link_width``)."""
    max_gts: float = 0.0
    max_width: int = 0

    @property
    def known(self) -> bool:
        return bool(self.current_gts and self.max_gts and self.current_width and self.max_width)

    @property
    def degraded(self) -> bool:
        """True when the link trained below its maximum speed or width."""
        return self.known and (self.current_gts < self.max_gts or self.current_width < self.max_width)


@dataclass(frozen=True)
class Gpu:
    """One GPU, in the order NVML (PCI bus order) numbers them."""

    index: int
    pci_bus_id: str
    numa_node: int = -1
    name: str = ""
    uuid: str = ""
    vendor: str = "nvidia"
    """``nvidia`` or ``amd``."""
    cpu_affinity: tuple[int, ...] = ()
    """CPUs the device reports as local (NVML or ``local_cpulist``); () when unknown."""
    memory_bytes: int = 0
    memory_numa_node: int = -1
    """NUMA node holding the GPU's own memory on coherent systems (GH200, POWER9); else -1."""
    pci_path: tuple[str, ...] = ()
    """Bus ids from the root port down to the device (sysfs ``devices/pciDDDD:BB/...``)."""
    pcie_link: PcieLink = PcieLink()
    """The device's PCIe link; all 0 when sysfs does not show it."""
    minor: int = -1
    """The device's minor number (``/dev/nvidia<minor>``), which is how Slurm numbers GPUs
    (``SLURM_STEP_GPUS``, gres ``File=``); it need not follow the PCI order. -1 unknown."""


# InfiniBand port states as ``ibv_port_state`` numbers them (hwloc's ``Port<N>State`` info).
PORT_STATES: dict[int, str] = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device (``sys/class/infiniband/<dev>/ports/<N>``)."""

    number: int
    state: str = ""
    """``ACTIVE``, ``DOWN``, ``INIT``, ``ARMED``, ...; "" when the source does not say."""
    link_layer: str = ""
    """``InfiniBand`` or ``Ethernet`` (RoCE); "" unknown."""
    rate_gbps: float = 0.0
    """Signalling rate (``rate``: ``200 Gb/sec (4X HDR)`` -> 200.0); 0 unknown or down."""

    @property
    def active(self) -> bool | None:
        """True when ACTIVE, False when known not to be, None when unknown."""
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
    netdevs: tuple[str, ...] = ()
    """Interface names of this device (``ib0``, ``ens1f0np0``); for a plain NIC, its own name."""
    speed_mbps: int = 0
    """0 when unknown."""
    pci_path: tuple[str, ...] = ()
    ports: tuple[RdmaPort, ...] = ()
    """RDMA ports (ascending number); () for a plain interface or a source without them."""

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
    """The PCI function's link; all 0 when sysfs does not show it (virtio, old kernels)."""


@dataclass(frozen=True)
class Topology:
    """Everything numarun knows about one node. Built by discovery, read by planning."""

    hostname: str
    numa_nodes: tuple[NumaNode, ...]
    cpus: tuple[Cpu, ...]
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    gpu_links: tuple[tuple[str, ...], ...] = ()
    """Square matrix in ``gpus`` order of nvidia-smi link codes; () when unknown."""
    nic_links: tuple[tuple[str, ...], ...] = ()
    """``len(gpus)`` rows x ``len(nics)`` columns of link codes; () when unknown."""
    allowed_mems: tuple[int, ...] = ()
    """NUMA nodes this process may allocate on (``Mems_allowed_list``); () = all."""
    source: str = ""
    """Where this came from: ``live``, ``sysfs:<dir>``, ``hwloc:<file>``, ``nvidia-smi:<file>``
    (a JSON snapshot keeps the one it recorded)"""
    gpu_source: str = "none"
    """How GPUs were found: ``nvml``, ``sysfs``, ``nvidia-smi``, ``json`` or ``none``."""
    notes: tuple[str, ...] = ()
    """Defaults taken while reading (missing files, -1 NUMA nodes...), for ``numarun topo``."""
    kernel_modules: tuple[str, ...] | None = None
    """Loaded kernel modules (``proc/modules``, else ``sys/module/*``), sorted; None when unknown."""
    schema_version: int = SCHEMA_VERSION

    # --- lookups (pure) ---
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
        """Online and allowed CPUs, ascending."""
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
        """Link code between ``gpus[gpu_pos]`` and ``nics[nic_pos]``.

        From ``nic_links`` when recorded (nvidia-smi), else derived from the PCI paths:
        a shared bridge below the root port is PIX (one hop) or PXB, the same root
        complex PHB, the same NUMA node NODE, otherwise SYS; "" when nothing is known.
        """
        if self.nic_links:
            return self.nic_links[gpu_pos][nic_pos]
        g, n = self.gpus[gpu_pos], self.nics[nic_pos]
        if g.pci_path and n.pci_path:
            common = 0
            for x, y in zip(g.pci_path, n.pci_path):
                if x != y:
                    break
                common += 1
            if common:
                hops = (len(g.pci_path) - common) + (len(n.pci_path) - common)
                return "PIX" if hops <= 2 else "PXB"
            if g.pci_path[0].split(":")[:2] == n.pci_path[0].split(":")[:2]:
                return "PHB"
        if g.numa_node >= 0 and n.numa_node >= 0:
            return "NODE" if g.numa_node == n.numa_node else "SYS"
        return ""

    # --- JSON snapshot ---
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
        try:
            # older versions lack only fields that have defaults; what is read is current
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
