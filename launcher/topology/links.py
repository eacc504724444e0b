"""How close two GPUs are: one ordered class per pair (pure).

The one fact-finding function (:func:`gpu_links`) behind both the placement of a parallel layout
(:mod:`numarun.plan.placement`) and the slots of a sweep (:mod:`numarun.plan.pack`). A pair's link is
what the topology source recorded (``nvidia-smi topo -m``, NVML), else what the PCI paths say (sysfs),
else what the NUMA nodes say; two GPUs that share a PCIe switch with one NIC share that switch.
Across nodes, the classes go on: the same multi-node NVLink domain, the same leaf switch, the network.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .model import Topology, pci_code

_SWITCH = ("PIX", "PXB")
_HOST = ("PHB", "NODE")


class Link(enum.IntEnum):
    """A link class, smaller is faster; a group of GPUs is as good as its slowest pair."""

    NVLINK = 1
    """NVLink, any number of links (``NV<n>``), or NVSwitch."""
    PCIE_SWITCH = 2
    """Behind one PCIe switch (``PIX``, ``PXB``)."""
    HOST_BRIDGE = 3
    """Through one host bridge or within one NUMA node (``PHB``, ``NODE``)."""
    SYS = 4
    """Across the sockets' interconnect (``SYS``), or nothing known."""
    NVLINK_DOMAIN = 5
    """Other nodes of one multi-node NVLink domain (NVML's fabric cluster and clique)."""
    LEAF_SWITCH = 6
    """Other nodes behind one leaf switch (Slurm's topology)."""
    NETWORK = 7
    """Other nodes, nothing closer known."""

    @property
    def word(self) -> str:
        """What a plan table calls a group whose slowest link is of this class (its code when one was recorded)."""
        return _WORDS[self]


_WORDS = {
    Link.NVLINK: "NVLink",
    Link.PCIE_SWITCH: "PCIe switch",
    Link.HOST_BRIDGE: "host bridge",
    Link.SYS: "SYS",
    Link.NVLINK_DOMAIN: "NVLink domain",
    Link.LEAF_SWITCH: "leaf switch",
    Link.NETWORK: "network",
}


_CLASSES = {
    **dict.fromkeys(_SWITCH, Link.PCIE_SWITCH),
    **dict.fromkeys(_HOST, Link.HOST_BRIDGE),
    "SYS": Link.SYS,
    "SOC": Link.SYS,
}


def classify(code: str) -> Link | None:
    """An ``nvidia-smi topo -m`` code's class; None for ``""``/``X``/unknown codes."""
    return Link.NVLINK if code.startswith("NV") else _CLASSES.get(code)


@dataclass(frozen=True)
class GpuLinks:
    """Every pair of a node's GPUs, by position in ``Topology.gpus``: its class and the code shown for it."""

    classes: tuple[tuple[Link, ...], ...]
    codes: tuple[tuple[str, ...], ...]
    """``NV12``, ``PIX``, ``PHB``, ``NODE``, ``SYS``...; ``X`` on the diagonal."""
    switch: tuple[tuple[bool, ...], ...] = ()
    """Whether a pair shares a PCIe switch, NVLink or not (the sweep's slots keep switches together)."""

    def link(self, a: int, b: int) -> Link:
        return self.classes[a][b]

    def code(self, a: int, b: int) -> str:
        return self.codes[a][b]


def _pair(topology: Topology, a: int, b: int) -> tuple[Link, str, bool]:
    """(class, code, behind one PCIe switch) of GPUs ``a`` and ``b``."""
    recorded = topology.gpu_links[a][b] if topology.gpu_links else ""
    known = classify(recorded)
    ga, gb = topology.gpus[a], topology.gpus[b]
    derived = pci_code(ga.pci_path, gb.pci_path)
    # both one switch away from one NIC: the switch is theirs too
    switch = (
        known is Link.PCIE_SWITCH
        or derived in _SWITCH
        or any(
            topology.gpu_nic_link(a, k) in _SWITCH and topology.gpu_nic_link(b, k) in _SWITCH
            for k in range(len(topology.nics))
        )
    )
    if known is Link.NVLINK:
        return known, recorded, switch
    if switch:
        return (
            Link.PCIE_SWITCH,
            recorded if known is Link.PCIE_SWITCH else derived if derived in _SWITCH else "PXB",
            True,
        )
    if known is not None:
        return known, recorded, False
    if derived:
        return classify(derived) or Link.SYS, derived, False
    if ga.numa_node >= 0 and gb.numa_node >= 0:
        return (Link.HOST_BRIDGE, "NODE", False) if ga.numa_node == gb.numa_node else (Link.SYS, "SYS", False)
    return Link.SYS, "?", False


def gpu_links(topology: Topology) -> GpuLinks:
    """The class and code of every pair of ``topology``'s GPUs."""
    n = len(topology.gpus)
    classes: list[list[Link]] = [[Link.NVLINK] * n for _ in range(n)]
    codes: list[list[str]] = [["X"] * n for _ in range(n)]
    switch: list[list[bool]] = [[True] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            link, code, same = _pair(topology, a, b)
            classes[a][b] = classes[b][a] = link
            codes[a][b] = codes[b][a] = code
            switch[a][b] = switch[b][a] = same
    return GpuLinks(tuple(map(tuple, classes)), tuple(map(tuple, codes)), tuple(map(tuple, switch)))


def components(related: Sequence[Sequence[bool]]) -> list[int]:
    """Each GPU position's component (the smallest position in it) under a symmetric relation."""
    n = len(related)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a in range(n):
        for b in range(a + 1, n):
            if related[a][b]:
                ra, rb = root(a), root(b)
                parent[max(ra, rb)] = min(ra, rb)
    return [root(i) for i in range(n)]


def nvlink_islands(links: GpuLinks) -> list[int]:
    """Each GPU's NVLink island (the smallest position in it); a GPU without NVLink is its own."""
    return components([[c is Link.NVLINK for c in row] for row in links.classes])


def pcie_switches(links: GpuLinks) -> list[int]:
    """Each GPU's PCIe switch group (the smallest position in it)."""
    return components(links.switch)


def nvlink_domain(topology: Topology) -> str:
    """The node's multi-node NVLink domain, ``<cluster UUID>/<clique id>`` from NVML's GPU fabric info (the one most of
    its GPUs report); "" when its GPUs are in none (no NVSwitch fabric across nodes, or not read)."""
    counts = Counter(f"{g.fabric_cluster}/{g.fabric_clique}" for g in topology.gpus if g.fabric_cluster)
    return max(sorted(counts), key=lambda k: counts[k]) if counts else ""
