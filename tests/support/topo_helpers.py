"""What the topology, plan and view tests share: topologies built in code or read from the recorded
fixtures, a plan built by hand, and the plan invariants."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence

from helpers import FIXTURES
from trees import SYSFS_DIR, extract_tree

from numarun.plan.model import BindingMode, GpuRef, LaunchPlan, MemPolicy, NicPolicy, RankBinding
from numarun.topology.hwloc_xml import read_hwloc_xml
from numarun.topology.model import Cpu, Gpu, Nic, NicKind, NumaNode, RdmaPort, Topology, link_rank
from numarun.topology.smi import topology_from_smi
from numarun.topology.sysfs import read_sysfs


def build_topology(
    *,
    nodes: int = 2,
    cores_per_node: int = 4,
    threads_per_core: int = 2,
    gpu_nodes: Sequence[int] = (0, 0, 1, 1),
    llc_cores: int = 0,
    interleaved: bool = False,
    offline: Sequence[int] = (),
    disallowed: Sequence[int] = (),
    memory_only_nodes: Sequence[int] = (),
    nics: Sequence[Nic] = (),
    allowed_mems: Sequence[int] = (),
    node_ids: Sequence[int] | None = None,
) -> Topology:
    """``nodes`` sockets of one NUMA node each; SMT sibling of CPU i is i + total cores.

    ``interleaved``: cores alternate between nodes (node = core % nodes), as on some HP/Dell BIOSes.
    ``llc_cores``: cores per last-level cache (0: unknown). ``memory_only_nodes`` are extra
    CPU-less nodes (GPU HBM) appended after the CPU nodes, distance 80 from everything.
    """
    ids = list(node_ids) if node_ids is not None else list(range(nodes))
    total_cores = nodes * cores_per_node
    cpus = []
    for t in range(threads_per_core):
        for core in range(total_cores):
            n_idx = core % nodes if interleaved else core // cores_per_node
            local = core // nodes if interleaved else core % cores_per_node
            cid = core + t * total_cores
            siblings = tuple(core + k * total_cores for k in range(threads_per_core)) if threads_per_core > 1 else ()
            llc = -1
            if llc_cores:
                first_core_of_llc = (local // llc_cores) * llc_cores
                # smallest CPU id sharing the LLC
                members = [
                    c
                    for c in range(total_cores)
                    if (c % nodes if interleaved else c // cores_per_node) == n_idx
                    and (c // nodes if interleaved else c % cores_per_node) // llc_cores
                    == first_core_of_llc // llc_cores
                ]
                llc = min(members)
            cpus.append(
                Cpu(
                    id=cid,
                    package=n_idx,
                    core=local,
                    numa_node=ids[n_idx],
                    siblings=siblings,
                    llc=llc,
                    online=cid not in offline,
                    allowed=cid not in disallowed,
                )
            )
    cpus.sort(key=lambda c: c.id)
    all_ids = ids + list(memory_only_nodes)
    numa = []
    for i, nid in enumerate(all_ids):
        row = tuple(
            10 if j == i else (80 if (i >= len(ids) or j >= len(ids)) else 20 + 5 * abs(i - j))
            for j in range(len(all_ids))
        )
        numa.append(
            NumaNode(
                id=nid,
                cpus=tuple(c.id for c in cpus if c.numa_node == nid),
                memory_bytes=1 << 34,
                distances=row,
                memory_only=nid in memory_only_nodes,
            )
        )
    numa.sort(key=lambda n: n.id)
    gpus = tuple(
        Gpu(index=i, pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0", numa_node=n) for i, n in enumerate(gpu_nodes)
    )
    return Topology(
        hostname="built",
        numa_nodes=tuple(numa),
        cpus=tuple(cpus),
        gpus=gpus,
        nics=tuple(nics),
        allowed_mems=tuple(allowed_mems),
        source="built",
    )


def ib(name: str, node: int, bus: str = "", state: str = "") -> Nic:
    ports = (RdmaPort(number=1, state=state, link_layer="InfiniBand", rate_gbps=200.0),) if state else ()
    return Nic(
        name=name, pci_bus_id=bus, numa_node=node, kind=NicKind.INFINIBAND, netdevs=(f"ib{name[-1]}",), ports=ports
    )


def eth(name: str, node: int) -> Nic:
    return Nic(name=name, numa_node=node, kind=NicKind.ETHERNET, netdevs=(name,))


def check_invariants(topology: Topology, plan: LaunchPlan) -> None:
    """What every plan must satisfy; raises AssertionError naming the rank."""
    usable = set(topology.usable_cpus)
    by_id = {c.id: c for c in topology.cpus}
    mode = plan.binding
    seen: dict[int, int] = {}
    for r in plan.ranks:
        assert r.cpus, f"rank {r.local_rank}: empty CPU set"
        assert set(r.cpus) <= usable, f"rank {r.local_rank}: unusable CPUs {sorted(set(r.cpus) - usable)}"
        assert list(r.cpus) == sorted(set(r.cpus))
        cores = {by_id[c].core_key for c in r.cpus}
        assert r.physical_cores == len(cores)
        if r.fallback:
            assert any(r.fallback in w or w.endswith(r.fallback.split("; ")[0]) for w in plan.warnings), (
                "fallback not warned"
            )
        if mode in (BindingMode.EXCLUSIVE, BindingMode.CORE_COMPLEX):
            for c in r.cpus:
                assert c not in seen, f"CPU {c} in ranks {seen[c]} and {r.local_rank}"
                seen[c] = r.local_rank
                # SMT siblings kept together
                sib = set(by_id[c].siblings) & usable
                assert sib <= set(r.cpus), f"rank {r.local_rank}: CPU {c} without its siblings {sorted(sib)}"
            if "OMP_NUM_THREADS" in r.env:
                assert r.env["OMP_NUM_THREADS"] == str(len(cores))
        elif "OMP_NUM_THREADS" in r.env:
            sharers = sum(1 for o in plan.ranks if o.cpus == r.cpus)
            assert r.env["OMP_NUM_THREADS"] == str(max(1, len(cores) // sharers))
        # NUMA locality unless a fallback says otherwise
        if r.gpu is not None and r.gpu.numa_node >= 0 and not r.fallback and mode is not BindingMode.NONE:
            node_cpus = {c for c in usable if by_id[c].numa_node == r.gpu.numa_node}
            if mode is BindingMode.SOCKET:
                assert node_cpus <= set(r.cpus)
            else:
                assert set(r.cpus) <= node_cpus, f"rank {r.local_rank}: CPUs off GPU node {r.gpu.numa_node}"
            if mode is BindingMode.NODE:
                assert set(r.cpus) == node_cpus
            if plan.mem_policy is not MemPolicy.NONE:
                assert r.mems == (r.gpu.numa_node,)
        for m in r.mems:
            assert not topology.node(m).memory_only, f"rank {r.local_rank}: memory bound to memory-only node {m}"
        if plan.mem_policy is MemPolicy.NONE or mode is BindingMode.NONE:
            assert r.mems == ()
        if r.gpu is not None and r.nic is not None:
            _check_nic(topology, r.gpu.index, r.nic)
    _check_nic_env(topology, plan)
    if mode is BindingMode.EXCLUSIVE:
        groups: dict[int, list[int]] = defaultdict(list)
        for r in plan.ranks:
            if not r.fallback:
                groups[r.numa_node].append(r.physical_cores)
        for node, counts in groups.items():
            assert max(counts) - min(counts) <= 1, f"node {node}: core counts {counts}"


def _check_nic(topology: Topology, gpu_index: int, nic_name: str) -> None:
    gpu_pos = next(i for i, g in enumerate(topology.gpus) if g.index == gpu_index)
    gpu_node = topology.gpus[gpu_pos].numa_node

    def score(pos: int) -> tuple[int, int]:
        n = topology.nics[pos]
        return (link_rank(topology.gpu_nic_link(gpu_pos, pos)), 0 if gpu_node >= 0 and n.numa_node == gpu_node else 1)

    chosen = next(i for i, n in enumerate(topology.nics) if n.name == nic_name)
    assert topology.nics[chosen].port_up, f"GPU {gpu_index}: NIC {nic_name} has no port up"
    best = min(score(i) for i, n in enumerate(topology.nics) if n.port_up)
    assert score(chosen) == best, f"GPU {gpu_index}: NIC {nic_name} {score(chosen)} is not among the closest {best}"


def _check_nic_env(topology: Topology, plan: LaunchPlan) -> None:
    """NCCL's rules: one NCCL_IB_HCA / NCCL_SOCKET_IFNAME per node (unless per-rank was
    asked for), naming only RDMA NICs whose ports are up; per-rank devices only for UCX/gloo."""
    by_name = {n.name: n for n in topology.nics}
    for var in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"):
        values = {r.env.get(var) for r in plan.ranks if r.gpu is not None}
        if plan.nic_policy is NicPolicy.NODE:
            assert len(values) <= 1, f"{var} differs between ranks: {sorted(map(str, values))}"
    for r in plan.ranks:
        hca = r.env.get("NCCL_IB_HCA")
        if hca is not None:
            assert hca.startswith("=") and ":" not in hca, f"rank {r.local_rank}: NCCL_IB_HCA {hca!r} not exact-match"
            for name in hca[1:].split(","):
                assert by_name[name].rdma and by_name[name].port_up, (
                    f"NCCL_IB_HCA names {name}, not an RDMA NIC that is up"
                )
        ucx = r.env.get("UCX_NET_DEVICES")
        if ucx is not None:
            assert r.nic is not None and ucx == f"{r.nic}:{by_name[r.nic].port}"
        if r.gpu is None:
            assert "NCCL_IB_HCA" not in r.env and "NCCL_SOCKET_IFNAME" not in r.env
    _check_nic_fields(topology, plan)


_NIC_VARS = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES")


def _check_nic_fields(topology: Topology, plan: LaunchPlan) -> None:
    """The NIC variables in each rank's env are exactly the ones made from the plan's NIC fields."""
    by_name = {n.name: n for n in topology.nics}
    nccl = plan.nccl_nics
    if nccl is not None:
        assert plan.nic_policy is NicPolicy.NODE, "a node list with --nic-policy per-rank"
        assert nccl.variable in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME") and nccl.value.startswith("=")
        assert all(by_name[n].port_up for n in nccl.nics), f"node list {nccl.nics} names a NIC that is down"
        if nccl.variable == "NCCL_IB_HCA":
            assert nccl.value == "=" + ",".join(nccl.nics)
    for r in plan.ranks:
        node = {nccl.variable} if nccl is not None and r.gpu is not None else set()
        if node:
            assert r.env[nccl.variable] == nccl.value, f"rank {r.local_rank}: {nccl.variable} is not the node list"  # type: ignore[union-attr]
        assert {v for v in _NIC_VARS if v in r.env} == node | set(r.nic_variables), (
            f"rank {r.local_rank}: env and fields differ"
        )
        assert not node & set(r.nic_variables)
        if r.nic is None:
            assert r.nic_variables == () and r.nic_port == 0
        elif r.nic_port:
            assert by_name[r.nic].rdma and r.nic_port == by_name[r.nic].port
        if "UCX_NET_DEVICES" in r.env:
            assert r.env["UCX_NET_DEVICES"] == f"{r.nic}:{r.nic_port}"


def make_topology(
    *,
    packages: int = 2,
    nodes_per_package: int = 1,
    cores_per_node: int = 4,
    smt: int = 2,
    gpus_per_node: int = 2,
    nics_per_node: int = 1,
    nv: str = "NV12",
    hostname: str = "box",
    offline: tuple[int, ...] = (),
    disallowed: tuple[int, ...] = (),
    memory_only_nodes: int = 0,
    stray_gpu: bool = False,
) -> Topology:
    """A regular machine: SMT siblings numbered i and i+N (as on most x86 servers)."""
    n_nodes = packages * nodes_per_package
    n_cores = n_nodes * cores_per_node
    cpus: list[Cpu] = []
    node_cpus: dict[int, list[int]] = {n: [] for n in range(n_nodes)}
    for t in range(smt):
        for core in range(n_cores):
            cid = t * n_cores + core
            node = core // cores_per_node
            pkg = node // nodes_per_package
            sibs = tuple(s * n_cores + core for s in range(smt))
            cpus.append(
                Cpu(
                    id=cid,
                    package=pkg,
                    core=core,
                    numa_node=node,
                    siblings=sibs,
                    online=cid not in offline,
                    allowed=cid not in disallowed,
                )
            )
            node_cpus[node].append(cid)
    cpus.sort(key=lambda c: c.id)
    total = n_nodes + memory_only_nodes
    numa = [
        NumaNode(
            id=n,
            cpus=tuple(sorted(node_cpus[n])),
            memory_bytes=64 << 30,
            distances=tuple(10 if m == n else 21 for m in range(total)),
        )
        for n in range(n_nodes)
    ]
    numa += [
        NumaNode(
            id=n_nodes + k,
            cpus=(),
            memory_bytes=96 << 30,
            memory_only=True,
            distances=tuple(10 if m == n_nodes + k else 40 for m in range(total)),
        )
        for k in range(memory_only_nodes)
    ]
    gpus = []
    for node in range(n_nodes):
        for _ in range(gpus_per_node):
            i = len(gpus)
            gpus.append(
                Gpu(
                    index=i,
                    pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0",
                    numa_node=node,
                    name="NVIDIA H100 80GB HBM3",
                    cpu_affinity=tuple(sorted(node_cpus[node])),
                    memory_bytes=80 << 30,
                )
            )
    if stray_gpu:
        gpus.append(Gpu(index=len(gpus), pci_bus_id="0000:f1:00.0", numa_node=-1, name="NVIDIA L4 <&>"))
    links = tuple(
        tuple(
            "X" if i == j else (nv if gpus[i].numa_node >= 0 and gpus[j].numa_node >= 0 else "SYS")
            for j in range(len(gpus))
        )
        for i in range(len(gpus))
    )
    nics = [
        Nic(
            name=f"mlx5_{node * nics_per_node + k}",
            pci_bus_id=f"0000:{0x1A + 0x20 * node + k:02x}:00.0",
            numa_node=node,
            kind=NicKind.INFINIBAND,
            netdevs=(f"ib{node * nics_per_node + k}",),
            speed_mbps=400000,
        )
        for node in range(n_nodes)
        for k in range(nics_per_node)
    ]
    return Topology(
        hostname=hostname,
        numa_nodes=tuple(numa),
        cpus=tuple(cpus),
        gpus=tuple(gpus),
        nics=tuple(nics),
        gpu_links=links,
        source="test",
        gpu_source="json",
    )


def by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    """The elements of a rendered SVG whose class list holds ``cls``."""
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def plan_for(topo: Topology, *, shared: bool = False) -> LaunchPlan:
    """One rank per GPU; exclusive: the node's cores split; shared: every rank gets the whole node."""
    ranks = []
    for g in topo.gpus:
        node = topo.node(g.numa_node)
        on_node = [x for x in topo.gpus if x.numa_node == g.numa_node]
        if shared:
            cpus = node.cpus
        else:
            k = on_node.index(g)
            cores = sorted({topo.cpu(c).core_key for c in node.cpus})
            share = cores[k :: len(on_node)]
            cpus = tuple(sorted(c for key in share for c in key))
        ranks.append(
            RankBinding(
                local_rank=g.index,
                gpu=GpuRef(index=g.index, pci_bus_id=g.pci_bus_id, numa_node=g.numa_node),
                cpus=cpus,
                mems=(g.numa_node,),
                nic=f"mlx5_{g.numa_node}",
                env={},
                numa_node=g.numa_node,
            )
        )
    return LaunchPlan(ranks=tuple(ranks), binding=BindingMode.NODE if shared else BindingMode.EXCLUSIVE)


def recorded_topologies() -> dict[str, Topology]:
    out: dict[str, Topology] = {}
    for p in sorted((FIXTURES / "nvidia-smi").glob("*.txt")):
        out[f"smi/{p.stem}"] = topology_from_smi(p.read_text(), str(p))
    for p in sorted((FIXTURES / "hwloc").glob("*.xml")):
        out[f"hwloc/{p.stem}"] = read_hwloc_xml(p.read_text(), str(p))
    for p in sorted(SYSFS_DIR.glob("*.tar.bz2")) + [FIXTURES / "live-h200-vm" / "sysfs.tar.gz"]:
        out[f"sysfs/{p.name}"] = read_sysfs(extract_tree(p))
    return out
