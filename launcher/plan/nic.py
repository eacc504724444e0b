"""NICs for a node's ranks: one NCCL list per node, the closest NIC per rank (pure).

The rules and why (NVIDIA/nccl#1478) are docs/plan.md, "NICs". The choices are plan fields;
the variables are made from them here, and ``numarun topo`` names each GPU's NIC by the same rule (:func:`gpu_nics`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ..topology.model import Nic, NicKind, Topology, link_rank
from ..topology.pci import pci_order
from .model import NcclNics, NicPolicy

log = logging.getLogger(__name__)

NIC_VARIABLES: tuple[str, ...] = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES")

_UNKNOWN = link_rank("")
_PXB = link_rank("PXB")


@dataclass(frozen=True)
class NicChoice:
    """The NIC picked for one rank, and the variables that name it for that rank alone."""

    nic: Nic
    position: int  # in topology.nics
    port: int  # pinned to (UCX_NET_DEVICES); 0 none
    env: tuple[tuple[str, str], ...]  # before the user's values are taken out


def _is_loopback(nic: Nic) -> bool:
    return any(n == "lo" or n.startswith("lo:") for n in (nic.name, *nic.netdevs))


def _ifname(nic: Nic) -> str:
    return nic.netdevs[0] if nic.netdevs else nic.name


def usable_nics(topology: Topology) -> list[tuple[int, Nic]]:
    """(position, NIC) of every NIC that can carry traffic: not loopback, ports not all down."""
    return [(pos, n) for pos, n in enumerate(topology.nics) if not _is_loopback(n) and n.port_up]


def _closest_class(topology: Topology, candidates: list[tuple[int, Nic]]) -> list[tuple[int, Nic]]:
    """The candidates a node's NCCL list should name: the closest link class (PIX = PXB), else those on a GPU's node."""
    if not candidates or not topology.gpus:
        return []
    best = {
        pos: min(link_rank(topology.gpu_nic_link(g, pos)) for g in range(len(topology.gpus))) for pos, _ in candidates
    }
    if all(b == _UNKNOWN for b in best.values()):
        gpu_nodes = {g.numa_node for g in topology.gpus if g.numa_node >= 0}
        return [(pos, n) for pos, n in candidates if n.numa_node in gpu_nodes]
    tier = {pos: min(b, _PXB) if b <= _PXB else b for pos, b in best.items()}
    top = min(tier.values())
    return [(pos, n) for pos, n in candidates if tier[pos] == top]


def compute_nics(topology: Topology) -> tuple[Nic, ...]:
    """The node's compute RDMA NICs, in topology order."""
    rdma = [(pos, n) for pos, n in usable_nics(topology) if n.rdma]
    return tuple(n for _, n in _closest_class(topology, rdma))


def nccl_nics(topology: Topology, *, gpu_ranks: bool) -> NcclNics | None:
    """The ``NCCL_IB_HCA`` or ``NCCL_SOCKET_IFNAME`` list for every rank of the node; None when nothing needs choosing.

    Exact match (``=``): a bare ``mlx5_1`` also matches ``mlx5_10``; no port, so NCCL may use every ACTIVE port.
    """
    if not gpu_ranks:
        return None
    all_rdma = [n for n in topology.nics if n.rdma and not _is_loopback(n)]
    compute = compute_nics(topology)
    if compute:
        if [n.name for n in compute] == [n.name for n in all_rdma]:
            return None
        names = tuple(n.name for n in compute)
        return NcclNics(variable="NCCL_IB_HCA", nics=names, value="=" + ",".join(names))
    if all_rdma and any(n.port_up for n in all_rdma):
        return None  # RDMA NICs exist but none is closer than another: leave NCCL's own choice
    eth = [(pos, n) for pos, n in usable_nics(topology) if n.kind is NicKind.ETHERNET]
    all_eth = [n for n in topology.nics if n.kind is NicKind.ETHERNET and not _is_loopback(n)]
    chosen = [n for _, n in _closest_class(topology, eth)]
    if not chosen or [n.name for n in chosen] == [n.name for n in all_eth]:
        return None
    return NcclNics(
        variable="NCCL_SOCKET_IFNAME",
        nics=tuple(n.name for n in chosen),
        value="=" + ",".join(_ifname(n) for n in chosen),
    )


def rank_nic(nic: Nic, position: int, *, gpu_rank: bool, policy: NicPolicy = NicPolicy.NODE) -> NicChoice:
    """``nic`` as one rank's NIC, with the variables naming it for that rank alone (NCCL's only with ``per-rank``)."""
    env: tuple[tuple[str, str], ...] = ()
    port = 0
    if nic.rdma:
        if gpu_rank and policy is NicPolicy.PER_RANK:
            env = (("NCCL_IB_HCA", f"={nic.name}"),)
        elif gpu_rank:
            port = nic.port
            env = (("UCX_NET_DEVICES", f"{nic.name}:{port}"),)
    elif nic.kind is NicKind.ETHERNET:
        ifname = _ifname(nic)
        if gpu_rank and policy is NicPolicy.PER_RANK:
            env = (("NCCL_SOCKET_IFNAME", f"={ifname}"), ("GLOO_SOCKET_IFNAME", ifname))
        else:
            env = (("GLOO_SOCKET_IFNAME", ifname),)
    return NicChoice(nic=nic, position=position, port=port, env=env)


def choose_nics(
    topology: Topology,
    gpu_positions: Sequence[int | None],
    rank_nodes: Sequence[int],
    policy: NicPolicy = NicPolicy.NODE,
) -> list[NicChoice | None]:
    """One choice per rank, None when nothing is clearly close; ``gpu_positions[i]`` indexes ``topology.gpus``
    (None: CPU-only), ``rank_nodes[i]`` is the rank's CPU node (-1 unknown).

    GPU ranks: the closest usable NIC by link code, then NUMA node, round-robin among ties. CPU-only ranks: an
    Ethernet NIC on their own node, else none (a guess would only misroute gloo).
    """
    nics = usable_nics(topology)
    uses: dict[int, int] = {}
    out: list[NicChoice | None] = []
    for gpu_pos, node in zip(gpu_positions, rank_nodes):
        if gpu_pos is None:
            cands = [(0, pos, n) for pos, n in nics if n.kind is NicKind.ETHERNET and node >= 0 and n.numa_node == node]
        else:
            gpu_node = topology.gpus[gpu_pos].numa_node
            scored = []
            for pos, n in nics:
                code = topology.gpu_nic_link(gpu_pos, pos)
                same = gpu_node >= 0 and n.numa_node == gpu_node
                if link_rank(code) == _UNKNOWN and not same:
                    continue
                scored.append(((link_rank(code), 0 if same else 1), pos, n))
            best = min((s for s, _, _ in scored), default=None)
            cands = [(0, pos, n) for s, pos, n in scored if s == best]
        if not cands:
            out.append(None)
            continue
        _, pos, nic = min(cands, key=lambda c: (uses.get(c[1], 0), c[1]))
        uses[pos] = uses.get(pos, 0) + 1
        out.append(rank_nic(nic, pos, gpu_rank=gpu_pos is not None, policy=policy))
    return out


def gpu_nics(topology: Topology) -> tuple[NicChoice | None, ...]:
    """Each GPU's NIC (``topology.gpus`` order) as the plan gives it with one rank per GPU, all visible."""
    position = {id(g): i for i, g in enumerate(topology.gpus)}
    ranks = [position[id(g)] for g in pci_order(topology.gpus)]
    by_gpu = dict(zip(ranks, choose_nics(topology, ranks, [-1] * len(ranks))))
    return tuple(by_gpu[i] for i in range(len(topology.gpus)))
