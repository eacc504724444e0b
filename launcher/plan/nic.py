"""Closest NIC per rank, and the NCCL/gloo variables that name it. Pure.

Closeness of a GPU to a NIC is the nvidia-smi link code (``PIX`` < ``PXB`` < ``PHB`` <
``NODE`` < ``SYS``, see :func:`numarun.topology.model.link_rank`), then whether both sit on
the same NUMA node. Among equally close NICs the ranks of a node are spread round-robin, so
ranks get distinct NICs while there are enough (the multi-rail layout of DGX/HGX boards).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ..topology.model import Nic, NicKind, Topology, link_rank

log = logging.getLogger(__name__)

# Variables the plan may set for a NIC; the user's own values always win.
NIC_VARIABLES: tuple[str, ...] = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")

_UNKNOWN = link_rank("")


@dataclass(frozen=True)
class NicChoice:
    """The NIC picked for one rank and why."""

    nic: Nic
    link: str
    """Link code GPU<->NIC ("" for CPU-only ranks, chosen by NUMA node)."""
    env: tuple[tuple[str, str], ...]
    """Variables naming this NIC, before the user's values are taken out."""


def _is_loopback(nic: Nic) -> bool:
    names = (nic.name, *nic.netdevs)
    return any(n == "lo" or n.startswith("lo:") for n in names)


def nic_env(nic: Nic, *, gpu_rank: bool) -> tuple[tuple[str, str], ...]:
    """NCCL/gloo variables for ``nic``.

    ``NCCL_IB_HCA`` gets a leading ``=`` (NCCL's exact-match syntax) because a bare
    ``mlx5_1`` is a prefix that also matches ``mlx5_10``..``mlx5_17`` on 13-NIC boards;
    no port suffix, so NCCL may use every port of the HCA. ``NCCL_SOCKET_IFNAME`` gets the
    same ``=`` for the same reason (``eth1`` would match ``eth10``); gloo takes a plain name.
    CPU-only ranks only need gloo's variable.
    """
    if nic.kind in (NicKind.INFINIBAND, NicKind.ROCE):
        return (("NCCL_IB_HCA", f"={nic.name}"),) if gpu_rank else ()
    if nic.kind is NicKind.ETHERNET:
        ifname = nic.netdevs[0] if nic.netdevs else nic.name
        if gpu_rank:
            return (("NCCL_SOCKET_IFNAME", f"={ifname}"), ("GLOO_SOCKET_IFNAME", ifname))
        return (("GLOO_SOCKET_IFNAME", ifname),)
    return ()


def choose_nics(
    topology: Topology,
    gpu_positions: Sequence[int | None],
    rank_nodes: Sequence[int],
) -> list[NicChoice | None]:
    """One choice per rank (None: nothing clearly close, no variable is set).

    ``gpu_positions[i]`` is the index into ``topology.gpus`` of rank i's GPU (None for a
    CPU-only rank); ``rank_nodes[i]`` its CPU NUMA node (-1 unknown).
    GPU ranks take the closest NIC by link code then NUMA node, round-robin among ties;
    they take none when no link or node is known. CPU-only ranks take an Ethernet NIC
    on their own NUMA node, and none otherwise (a guess would only misroute gloo).
    """
    nics = [(pos, n) for pos, n in enumerate(topology.nics) if not _is_loopback(n)]
    uses: dict[int, int] = {}
    out: list[NicChoice | None] = []
    for gpu_pos, node in zip(gpu_positions, rank_nodes):
        if gpu_pos is None:
            cands = [
                (0, pos, n) for pos, n in nics
                if n.kind is NicKind.ETHERNET and node >= 0 and n.numa_node == node
            ]
            link = ""
        else:
            gpu_node = topology.gpus[gpu_pos].numa_node
            scored = []
            for pos, n in nics:
                code = topology.gpu_nic_link(gpu_pos, pos)
                same = gpu_node >= 0 and n.numa_node == gpu_node
                if link_rank(code) == _UNKNOWN and not same:
                    continue
                scored.append(((link_rank(code), 0 if same else 1), pos, n))
            if not scored:
                out.append(None)
                continue
            best = min(s for s, _, _ in scored)
            cands = [(0, pos, n) for s, pos, n in scored if s == best]
        if not cands:
            out.append(None)
            continue
        # Least used first, then topology order: round-robin among equally close NICs.
        _, pos, nic = min(cands, key=lambda c: (uses.get(c[1], 0), c[1]))
        uses[pos] = uses.get(pos, 0) + 1
        link = topology.gpu_nic_link(gpu_pos, pos) if gpu_pos is not None else ""
        out.append(NicChoice(nic=nic, link=link, env=nic_env(nic, gpu_rank=gpu_pos is not None)))
    return out
