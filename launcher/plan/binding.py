"""Topology + request -> LaunchPlan: each local rank's GPU, CPUs, memory nodes, NIC and env (pure).

The rules are docs/binding.md, "The rules". Memory goes to the rank's CPU-side node:
on GH200-like machines the CPU's LPDDR node, never the GPU's HBM node (reached through cudaMalloc).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import PlanError
from ..topology.model import Cpu, Gpu, Topology
from ..topology.visible import visible_gpus
from .model import BindingMode, GpuRef, LaunchPlan, MemPolicy, NicPolicy, PlanRequest, RankBinding
from .nic import NIC_VARIABLES, choose_nics, nccl_nics

log = logging.getLogger(__name__)

_POOL = -1  # group key of ranks whose NUMA node is unknown

Core = tuple[int, ...]  # usable CPUs of one physical core, ascending


@dataclass
class _Rank:
    local_rank: int
    gpu: Gpu | None = None
    gpu_pos: int | None = None
    cuda_index: int = 0
    home: int = _POOL  # CPU NUMA node the rank is placed on
    pool: tuple[int, ...] = ()  # for _POOL ranks: the CPUs they are spread over
    fallback: list[str] = field(default_factory=list)
    cpus: tuple[int, ...] = ()
    sharers: int = 1


def make_plan(topology: Topology, request: PlanRequest) -> LaunchPlan:
    """Plan every local rank. Raises :class:`PlanError` for an impossible request."""
    warnings: list[str] = []
    usable = topology.usable_cpus
    if not usable:
        raise PlanError(
            f"bad topology {topology.source or topology.hostname!r}: no online and allowed CPUs; expected at least one"
        )
    by_id = {c.id: c for c in topology.cpus}
    node_cpus: dict[int, tuple[int, ...]] = defaultdict(tuple)
    for cid in usable:
        node_cpus[by_id[cid].numa_node] += (cid,)
    cpu_nodes = sorted(n for n in node_cpus if n >= 0)

    user_env = dict(request.user_env)
    order_set_by_user = request.cuda_device_order is not None or "CUDA_DEVICE_ORDER" in user_env
    device_order = request.cuda_device_order or user_env.get("CUDA_DEVICE_ORDER") or "PCI_BUS_ID"
    gpus = visible_gpus(topology, request.cuda_visible_devices, device_order, request.allowed_gpu_minors)
    nproc = request.nproc_per_node
    if isinstance(nproc, str):  # the request's maker counts them on the topology (numarun.plan.request.counted)
        raise PlanError(f"bad --nproc-per-node {nproc!r}: expected it counted before planning")
    if nproc is not None and nproc < 1:
        raise PlanError(f"bad --nproc-per-node {nproc!r}: expected a positive integer")
    if nproc is None:
        nproc = len(gpus) or 1
    if gpus and nproc > len(gpus):
        raise PlanError(
            f"bad --nproc-per-node {nproc}: only {len(gpus)} GPUs are visible; expected at most {len(gpus)}, "
            "or CUDA_VISIBLE_DEVICES= (empty) for CPU-only ranks"
        )
    # by identity, then equality: nvidia-smi topologies have no bus ids to match on
    positions = {id(g): i for i, g in enumerate(topology.gpus)}

    mesh = None
    order = tuple(range(len(gpus)))
    if request.mesh is not None:
        from .mesh import plan_mesh

        gpu_positions = [_gpu_position(topology, positions, g) for g in gpus]
        mesh = plan_mesh(topology, gpus, [p if p is not None else -1 for p in gpu_positions], nproc, request)
        order = mesh.order or order
        warnings += mesh.warnings
    cpu_rank_nodes = _spread_cpu_ranks(by_id, node_cpus, cpu_nodes, nproc) if not gpus else []
    ranks: list[_Rank] = []
    for i in range(nproc):
        r = _Rank(local_rank=i)
        if gpus:
            # the rank drives the GPU the layout gives it; a reordered CUDA_VISIBLE_DEVICES makes it cuda:<local rank>
            mine = gpus[order[i]]
            r.gpu, r.gpu_pos, r.cuda_index = mine, _gpu_position(topology, positions, mine), i
            _place_gpu_rank(topology, r, node_cpus, cpu_nodes, usable)
        elif cpu_rank_nodes:
            r.home = cpu_rank_nodes[i]
        else:
            r.pool = usable
        ranks.append(r)
    _resolve_overlapping_pools(by_id, ranks, node_cpus)

    mode = request.binding
    groups: dict[tuple[int, tuple[int, ...]], list[_Rank]] = defaultdict(list)
    for r in ranks:
        groups[(r.home, r.pool if r.home == _POOL else ())].append(r)
    for (home, pool), members in groups.items():
        cpus = node_cpus[home] if home != _POOL else pool
        _assign(topology, by_id, mode, cpus, members, warnings, usable)
    if mode in (BindingMode.NODE, BindingMode.SOCKET, BindingMode.NONE):  # shared sets: OMP gets a share
        same = Counter(r.cpus for r in ranks)
        for r in ranks:
            r.sharers = same[r.cpus]

    mem_policy = request.mem_policy if mode is not BindingMode.NONE else MemPolicy.NONE
    rank_nodes = [_cpu_side_node(by_id, r) for r in ranks]
    nics = choose_nics(
        topology, [r.gpu_pos if r.gpu is not None else None for r in ranks], rank_nodes, request.nic_policy
    )
    nccl = None if request.nic_policy is NicPolicy.PER_RANK else nccl_nics(topology, gpu_ranks=bool(gpus))
    wanted = (
        {"OMP_NUM_THREADS"}
        | {k for c in nics if c is not None for k, _ in c.env}
        | ({nccl.variable} if nccl else set())
    )
    warnings += [
        f"{var} is set by the user ({user_env[var]!r}): the plan's value is not applied"
        for var in ("OMP_NUM_THREADS", *NIC_VARIABLES)
        if var in wanted and var in user_env
    ]
    if nccl is not None and nccl.variable in user_env:
        nccl = None
    node_env = ((nccl.variable, nccl.value),) if nccl is not None else ()

    bindings = []
    for r, node, choice in zip(ranks, rank_nodes, nics):
        mems = _mems(topology, by_id, r, node, mem_policy, warnings)
        cores = len({by_id[c].core_key for c in r.cpus})
        env: dict[str, str] = {}
        if "OMP_NUM_THREADS" not in user_env:
            env["OMP_NUM_THREADS"] = str(max(1, cores // r.sharers))
        if r.gpu is not None and not order_set_by_user:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if r.gpu is not None and mesh is not None and mesh.plan.cuda_visible_devices:
            env["CUDA_VISIBLE_DEVICES"] = mesh.plan.cuda_visible_devices
        own = tuple((k, v) for k, v in (choice.env if choice is not None else ()) if k not in user_env)
        env.update(node_env + own)
        warnings += [f"rank {r.local_rank}: {f}" for f in r.fallback]
        g = r.gpu
        gpu_ref = GpuRef(g.index, g.pci_bus_id, g.numa_node, g.uuid, g.name, r.cuda_index) if g else None
        bindings.append(
            RankBinding(
                local_rank=r.local_rank,
                gpu=gpu_ref,
                cpus=r.cpus,
                mems=mems,
                nic=choice.nic.name if choice else None,
                nic_port=choice.port if choice else 0,
                nic_variables=tuple(k for k, _ in own),
                env=env,
                numa_node=node,
                mem_policy=mem_policy if mems else MemPolicy.NONE,
                physical_cores=cores,
                fallback="; ".join(r.fallback),
            )
        )
    return LaunchPlan(
        ranks=tuple(bindings),
        binding=mode,
        mem_policy=mem_policy,
        hostname=topology.hostname,
        topology_source=topology.source,
        warnings=tuple(dict.fromkeys(warnings)),
        nic_policy=request.nic_policy,
        nccl_nics=nccl,
        mesh=mesh.plan if mesh is not None else None,
    )


def _spread_cpu_ranks(
    by_id: dict[int, Cpu], node_cpus: dict[int, tuple[int, ...]], cpu_nodes: list[int], nproc: int
) -> list[int]:
    """Home node of each CPU-only rank: contiguous blocks in node order, in proportion to each node's usable
    physical cores (largest remainder), so a node cut down by a cgroup gets fewer ranks."""
    cores = {n: len({by_id[c].core_key for c in node_cpus[n]}) for n in cpu_nodes}
    total = sum(cores.values())
    exact = {n: nproc * cores[n] / total for n in cpu_nodes}
    counts = {n: int(exact[n]) for n in cpu_nodes}
    for n in sorted(cpu_nodes, key=lambda n: (-(exact[n] - counts[n]), n))[: nproc - sum(counts.values())]:
        counts[n] += 1
    return [n for n in cpu_nodes for _ in range(counts[n])]


def _gpu_position(topology: Topology, positions: dict[int, int], gpu: Gpu) -> int | None:
    if id(gpu) in positions:
        return positions[id(gpu)]
    return topology.gpus.index(gpu) if gpu in topology.gpus else None


def _nearest_cpu_node(topology: Topology, node: int, cpu_nodes: Sequence[int]) -> int | None:
    return min(cpu_nodes, key=lambda n: (topology.node_distance(node, n), n), default=None)


def _place_gpu_rank(
    topology: Topology, r: _Rank, node_cpus: dict[int, tuple[int, ...]], cpu_nodes: list[int], usable: tuple[int, ...]
) -> None:
    g = r.gpu
    assert g is not None
    node = g.numa_node
    if node >= 0 and node_cpus.get(node):
        r.home = node
        return
    if node >= 0:
        nearest = _nearest_cpu_node(topology, node, cpu_nodes)
        if nearest is not None:
            r.home = nearest
            why = (
                "is memory-only"
                if _is_memory_only(topology, node)
                else "has no usable CPUs (offline or outside the allowed set)"
            )
            r.fallback.append(f"GPU {g.index} NUMA node {node} {why}: using nearest node {nearest}")
            return
    # unknown node, but the GPU's memory is a NUMA node (POWER9/GH200): its distances may single out a CPU node
    if node < 0 and g.memory_numa_node >= 0 and cpu_nodes:
        dist = {n: topology.node_distance(g.memory_numa_node, n) for n in cpu_nodes}
        best = min(dist.values())
        closest = [n for n, d in dist.items() if d == best]
        if len(closest) == 1:
            r.home = closest[0]
            r.fallback.append(
                f"GPU {g.index} NUMA node unknown (-1): placed on node {r.home}, nearest to its memory node "
                f"{g.memory_numa_node}"
            )
            return
    local = tuple(c for c in g.cpu_affinity if c in set(usable))
    local_nodes = {topology.cpu(c).numa_node for c in local} if local else set()
    if len(local_nodes) == 1 and min(local_nodes) >= 0 and node < 0:
        r.home = min(local_nodes)
        r.fallback.append(f"GPU {g.index} NUMA node unknown (-1): placed on node {r.home}, which holds its local CPUs")
        return
    r.pool = local or usable
    what = "unknown (-1)" if node < 0 else f"{node}, and no NUMA node has usable CPUs"
    r.fallback.append(f"GPU {g.index} NUMA node {what}: spread over {'its local' if local else 'all usable'} CPUs")


def _resolve_overlapping_pools(
    by_id: dict[int, Cpu], ranks: list[_Rank], node_cpus: dict[int, tuple[int, ...]]
) -> None:
    """Keep CPU sets disjoint: a pool that shares CPUs with another group has its ranks join NUMA nodes one by one,
    each the pool's node with the most usable cores per rank, so that every group owns whole nodes."""
    homed = {c for r in ranks if r.home != _POOL for c in node_cpus[r.home]}
    pools = list(dict.fromkeys(r.pool for r in ranks if r.home == _POOL))
    clash = {
        pool
        for pool in pools
        if homed.intersection(pool) or any(other != pool and set(other) & set(pool) for other in pools)
    }
    if not clash:
        return
    load = Counter(r.home for r in ranks if r.home != _POOL)
    for r in ranks:
        if r.home != _POOL or r.pool not in clash:
            continue
        nodes = sorted(
            {
                by_id[c].numa_node
                for c in r.pool
                if by_id[c].numa_node >= 0 and c in set(node_cpus.get(by_id[c].numa_node, ()))
            }
        )
        if not nodes:
            continue
        r.home = max(nodes, key=lambda n: (len(node_cpus[n]) / (load[n] + 1), -n))
        load[r.home] += 1
        r.pool = ()
        g = r.gpu
        r.fallback = [
            f"GPU {g.index if g else '?'} NUMA node unknown (-1): placed on node {r.home}, the one with most usable "
            "CPUs per rank"
        ]


def _is_memory_only(topology: Topology, node: int) -> bool:
    try:
        return topology.node(node).memory_only
    except KeyError:
        return False


def _cores(by_id: dict[int, Cpu], cpus: Sequence[int]) -> list[Core]:
    """Usable CPUs grouped by physical core, cores in package/LLC/id order."""
    seen: dict[tuple[int, ...], list[int]] = {}
    for cid in cpus:
        seen.setdefault(by_id[cid].core_key, []).append(cid)
    cores = [tuple(sorted(v)) for v in seen.values()]

    def key(core: Core) -> tuple[int, ...]:
        c = by_id[core[0]]
        return (max(c.numa_node, -1), c.package, c.llc, core[0])

    return sorted(cores, key=key)


def _split(cores: list[Core], k: int) -> list[list[Core]]:
    """k contiguous runs of cores whose sizes differ by at most one."""
    q, rem = divmod(len(cores), k)
    return [cores[i * q + min(i, rem) : (i + 1) * q + min(i + 1, rem)] for i in range(k)]


def _assign(
    topology: Topology,
    by_id: dict[int, Cpu],
    mode: BindingMode,
    cpus: tuple[int, ...],
    members: list[_Rank],
    warnings: list[str],
    usable: tuple[int, ...],
) -> None:
    k = len(members)
    if mode in (BindingMode.NONE, BindingMode.NODE, BindingMode.SOCKET):
        if mode is BindingMode.SOCKET:
            packages = {by_id[c].package for c in cpus}
            cpus = tuple(c for c in usable if by_id[c].package in packages)
        for r in members:
            r.cpus = usable if mode is BindingMode.NONE else cpus
        return
    cores = _cores(by_id, cpus)
    where = f"NUMA node {members[0].home}" if members[0].home != _POOL else "the shared CPU pool"
    if mode is BindingMode.CORE_COMPLEX:
        llcs: dict[int, list[Core]] = defaultdict(list)
        for core in cores:
            llcs[by_id[core[0]].llc].append(core)
        known = [v for key, v in llcs.items() if key >= 0]
        if len(known) == len(llcs) and len(known) >= k:  # spread over the domains available
            picked = [known[i * len(known) // k] for i in range(k)]
            for r, domain in zip(members, picked):
                r.cpus = tuple(sorted(c for core in domain for c in core))
            return
        n_llc = len(known) if len(known) == len(llcs) else 0
        warnings.append(
            f"core-complex: {where} has {n_llc} known last-level-cache domains for {k} ranks; using exclusive"
        )
    if len(cores) < k:
        raise PlanError(
            f"bad --nproc-per-node for binding {mode.value!r}: {where} has {len(cores)} usable physical cores "
            f"for {k} ranks; expected at least one core per rank (use --binding node, or fewer ranks)"
        )
    for r, chunk in zip(members, _split(cores, k)):
        r.cpus = tuple(sorted(c for core in chunk for c in core))


def _cpu_side_node(by_id: dict[int, Cpu], r: _Rank) -> int:
    """The rank's home, else the NUMA node holding most of its CPUs."""
    if r.home != _POOL:
        return r.home
    counts = Counter(by_id[c].numa_node for c in r.cpus if by_id[c].numa_node >= 0)
    return min(counts, key=lambda n: (-counts[n], n), default=-1)


def _mems(
    topology: Topology, by_id: dict[int, Cpu], r: _Rank, node: int, policy: MemPolicy, warnings: list[str]
) -> tuple[int, ...]:
    if policy is MemPolicy.NONE:
        return ()
    nodes = [node] if r.home != _POOL else sorted({by_id[c].numa_node for c in r.cpus if by_id[c].numa_node >= 0})
    allowed = set(topology.allowed_mems)
    if allowed:
        kept = [n for n in nodes if n in allowed]
        if not kept and nodes:
            cands = sorted(a for a in allowed if not _is_memory_only(topology, a))
            near = _nearest_cpu_node(topology, nodes[0], cands)
            if near is not None:
                r.fallback.append(f"memory node {nodes[0]} is not allowed: using nearest allowed node {near}")
                kept = [near]
        nodes = kept
    if not nodes:
        warnings.append(f"rank {r.local_rank}: NUMA node unknown: memory left unbound")
    return tuple(nodes)
