"""make_plan on topologies built in code: every mode, every fallback, env and NIC rules."""

from __future__ import annotations

import itertools

import pytest
from helpers import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from topo_helpers import build_topology, check_invariants, eth, ib

from numarun.errors import PlanError
from numarun.plan.binding import make_plan
from numarun.plan.model import BindingMode, LaunchPlan, MemPolicy, NicPolicy, PlanRequest
from numarun.topology.model import Gpu, Nic, NicKind, RdmaPort

MODES = list(BindingMode)


def plan(topo, **kw) -> LaunchPlan:
    p = make_plan(topo, PlanRequest(**kw))
    check_invariants(topo, p)
    return p


SHAPES = {
    "2s-smt": dict(),
    "2s-interleaved": dict(interleaved=True, cores_per_node=6),
    "2s-nosmt-llc": dict(threads_per_core=1, cores_per_node=8, llc_cores=2),
    "4s-smt4-llc": dict(nodes=4, cores_per_node=4, threads_per_core=4, llc_cores=2, gpu_nodes=(0, 1, 2, 3, 3)),
    "sparse-ids": dict(node_ids=(0, 8), gpu_nodes=(8, 0, 8)),
    "offline-disallowed": dict(offline=(0, 9), disallowed=(1, 2, 12), cores_per_node=6),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mem", list(MemPolicy), ids=lambda m: m.value)
def test_invariants_on_built_shapes(shape: str, mode: BindingMode, mem: MemPolicy) -> None:
    topo = build_topology(**SHAPES[shape])
    p = plan(topo, binding=mode, mem_policy=mem)
    assert len(p.ranks) == len(topo.gpus)
    assert [r.gpu.index for r in p.ranks] == [g.index for g in topo.gpus]
    assert [r.gpu.cuda_index for r in p.ranks] == list(range(len(topo.gpus)))


def test_exclusive_splits_node_cores_evenly_and_contiguously() -> None:
    # 2 nodes x 7 cores x 2 threads; three GPUs on node 0 -> cores 3, 2, 2
    topo = build_topology(cores_per_node=7, gpu_nodes=(0, 0, 0, 1))
    p = plan(topo)
    assert [r.physical_cores for r in p.ranks] == [3, 2, 2, 7]
    assert p.ranks[0].cpus == (0, 1, 2, 14, 15, 16)
    assert p.ranks[1].cpus == (3, 4, 17, 18)
    assert p.ranks[2].cpus == (5, 6, 19, 20)
    assert p.ranks[3].cpus == tuple(range(7, 14)) + tuple(range(21, 28))
    assert [r.env["OMP_NUM_THREADS"] for r in p.ranks] == ["3", "2", "2", "7"]
    assert [r.mems for r in p.ranks] == [(0,), (0,), (0,), (1,)]
    assert all(r.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for r in p.ranks)


def test_interleaved_numbering_keeps_ranks_on_their_node() -> None:
    topo = build_topology(interleaved=True, cores_per_node=4)  # node 0 = even cores
    p = plan(topo)
    assert p.ranks[0].cpus == (0, 2, 8, 10)
    assert p.ranks[2].cpus == (1, 3, 9, 11)


def test_node_and_socket_share_and_divide_omp_threads() -> None:
    topo = build_topology(cores_per_node=8)
    p = plan(topo, binding=BindingMode.NODE)
    assert p.ranks[0].cpus == p.ranks[1].cpus == tuple(range(8)) + tuple(range(16, 24))
    assert p.ranks[0].env["OMP_NUM_THREADS"] == "4"  # 8 cores shared by 2 ranks
    s = plan(topo, binding=BindingMode.SOCKET)
    assert s.ranks[2].cpus == tuple(range(8, 16)) + tuple(range(24, 32))


def test_none_binds_nothing_but_still_sets_env() -> None:
    topo = build_topology(disallowed=(3, 11))  # core 3 with both threads
    p = plan(topo, binding=BindingMode.NONE)
    assert all(r.cpus == topo.usable_cpus and r.mems == () for r in p.ranks)
    assert p.mem_policy is MemPolicy.NONE
    assert p.ranks[0].env["OMP_NUM_THREADS"] == str(7 // 4)


def test_mem_policies() -> None:
    topo = build_topology()
    assert plan(topo, mem_policy=MemPolicy.PREFERRED).ranks[2].mems == (1,)
    assert plan(topo, mem_policy=MemPolicy.PREFERRED).ranks[2].mem_policy is MemPolicy.PREFERRED
    assert plan(topo, mem_policy=MemPolicy.NONE).ranks[2].mems == ()


def test_core_complex_one_llc_per_rank() -> None:
    topo = build_topology(threads_per_core=2, cores_per_node=8, llc_cores=4, gpu_nodes=(0, 0, 1))
    p = plan(topo, binding=BindingMode.CORE_COMPLEX)
    assert p.ranks[0].cpus == (0, 1, 2, 3, 16, 17, 18, 19)
    assert p.ranks[1].cpus == (4, 5, 6, 7, 20, 21, 22, 23)
    assert p.ranks[2].cpus == (8, 9, 10, 11, 24, 25, 26, 27)
    assert not p.warnings


def test_core_complex_falls_back_to_exclusive_when_too_few_llcs() -> None:
    topo = build_topology(threads_per_core=1, cores_per_node=8, llc_cores=8, gpu_nodes=(0, 0, 1))
    p = plan(topo, binding=BindingMode.CORE_COMPLEX)
    assert p.ranks[0].cpus == (0, 1, 2, 3) and p.ranks[1].cpus == (4, 5, 6, 7)
    assert any("core-complex" in w and "exclusive" in w for w in p.warnings)
    unknown = plan(build_topology(), binding=BindingMode.CORE_COMPLEX)
    assert any("0 known last-level-cache" in w for w in unknown.warnings)


def test_gpu_node_unknown_splits_all_cpus_evenly_one_node_each() -> None:
    topo = build_topology(gpu_nodes=(-1, -1, -1, -1), cores_per_node=4)
    p = plan(topo)
    assert [r.physical_cores for r in p.ranks] == [2, 2, 2, 2]
    # each rank within one node, memory on that node
    assert [r.mems for r in p.ranks] == [(0,), (0,), (1,), (1,)]
    assert all("unknown (-1)" in r.fallback for r in p.ranks)
    assert len([w for w in p.warnings if "unknown (-1)" in w]) == 4


def test_gpu_node_unknown_uneven_still_differs_by_one_core() -> None:
    topo = build_topology(gpu_nodes=(-1, -1, -1), cores_per_node=4)
    p = plan(topo)
    counts = [r.physical_cores for r in p.ranks]
    assert sorted(counts) == [2, 3, 3]
    assert set(itertools.chain.from_iterable(r.cpus for r in p.ranks)) == set(topo.usable_cpus)


def test_gpu_node_unknown_uses_device_local_cpus() -> None:
    base = build_topology(gpu_nodes=())
    gpu = Gpu(index=0, pci_bus_id="0000:18:00.0", numa_node=-1, cpu_affinity=tuple(range(4, 8)) + tuple(range(12, 16)))
    topo = type(base)(**{**base.__dict__, "gpus": (gpu,)})
    p = plan(topo)
    assert p.ranks[0].cpus == tuple(range(4, 8)) + tuple(range(12, 16))
    assert p.ranks[0].numa_node == 1 and p.ranks[0].mems == (1,)
    assert "placed on node 1" in p.ranks[0].fallback


def test_gpu_node_without_allowed_cpus_goes_to_nearest_node() -> None:
    # 3 nodes; node 0's CPUs are all outside the cgroup; node 1 is nearer to 0 than node 2
    topo = build_topology(nodes=3, cores_per_node=2, disallowed=(0, 1, 6, 7), gpu_nodes=(0, 2))
    p = plan(topo)
    assert p.ranks[0].numa_node == 1
    assert set(p.ranks[0].cpus) == {2, 3, 8, 9}
    assert p.ranks[0].mems == (1,)
    assert "no usable CPUs" in p.ranks[0].fallback and "nearest node 1" in p.ranks[0].fallback
    assert p.ranks[1].fallback == ""


def test_memory_only_gpu_node_is_never_the_cpu_node() -> None:
    # GH200/POWER9 style: the GPU's NUMA node is its own CPU-less HBM node 4
    topo = build_topology(nodes=1, cores_per_node=8, gpu_nodes=(4,), memory_only_nodes=(4,))
    p = plan(topo)
    assert p.ranks[0].numa_node == 0 and p.ranks[0].mems == (0,)
    assert "memory-only" in p.ranks[0].fallback
    assert p.ranks[0].physical_cores == 8


def test_allowed_mems_restricts_memory_nodes() -> None:
    topo = build_topology(allowed_mems=(1,))
    p = plan(topo)
    assert p.ranks[0].mems == (1,)
    assert "not allowed" in p.ranks[0].fallback


def test_too_few_cores_is_an_error_with_the_numbers() -> None:
    topo = build_topology(cores_per_node=2, gpu_nodes=(0, 0, 0, 1))
    with pytest.raises(PlanError, match=r"NUMA node 0 has 2 usable physical cores for 3 ranks"):
        make_plan(topo, PlanRequest())
    # node mode may share cores
    p = plan(topo, binding=BindingMode.NODE)
    assert p.ranks[0].cpus == p.ranks[2].cpus


def test_more_ranks_than_gpus_is_an_error_naming_both_numbers() -> None:
    topo = build_topology()
    with pytest.raises(PlanError, match=r"--nproc-per-node 5: only 4 GPUs.*CUDA_VISIBLE_DEVICES="):
        make_plan(topo, PlanRequest(nproc_per_node=5))
    with pytest.raises(PlanError, match="positive"):
        make_plan(topo, PlanRequest(nproc_per_node=0))


def test_fewer_ranks_than_gpus() -> None:
    p = plan(build_topology(), nproc_per_node=3)
    assert [r.gpu.index for r in p.ranks] == [0, 1, 2]
    assert p.ranks[2].physical_cores == 4  # alone on node 1


def test_cpu_only_ranks_spread_evenly_over_nodes() -> None:
    topo = build_topology(nodes=4, cores_per_node=4, gpu_nodes=())
    p = plan(topo, nproc_per_node=8)
    assert [r.numa_node for r in p.ranks] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(r.gpu is None and r.physical_cores == 2 for r in p.ranks)
    assert all("CUDA_DEVICE_ORDER" not in r.env for r in p.ranks)
    assert len(plan(topo).ranks) == 1
    # CUDA_VISIBLE_DEVICES= (empty) hides the GPUs: CPU-only ranks
    gtopo = build_topology()
    q = plan(gtopo, nproc_per_node=6, cuda_visible_devices="")
    assert [r.gpu for r in q.ranks] == [None] * 6
    assert [r.numa_node for r in q.ranks] == [0, 0, 0, 1, 1, 1]


def test_cuda_visible_devices_picks_gpus_in_cuda_order() -> None:
    topo = build_topology()
    p = plan(topo, cuda_visible_devices="3,1")
    assert [(r.gpu.index, r.gpu.cuda_index) for r in p.ranks] == [(3, 0), (1, 1)]
    assert [r.numa_node for r in p.ranks] == [1, 0]
    assert p.ranks[0].physical_cores == 4  # alone on its node


def test_user_env_is_never_overridden_and_warned() -> None:
    # node 2 holds no GPU: mlx5_2 is SYS to every GPU, so the plan wants a list
    topo = build_topology(nodes=3, nics=(ib("mlx5_0", 0), ib("mlx5_1", 1), ib("mlx5_2", 2)))
    env = {"OMP_NUM_THREADS": "3", "NCCL_IB_HCA": "mlx5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    p = plan(topo, user_env=env, cuda_device_order="PCI_BUS_ID")
    for r in p.ranks:
        assert not set(env) & set(r.env)
        assert r.nic is not None  # still shown in the table
    assert sum("OMP_NUM_THREADS is set by the user" in w for w in p.warnings) == 1
    assert sum("NCCL_IB_HCA is set by the user" in w for w in p.warnings) == 1


def _pci_topology():  # type: ignore[no-untyped-def]
    gpu_paths = [
        ("0000:10:01.0", "0000:11:00.0"),
        ("0000:10:01.0", "0000:12:00.0"),
        ("0000:90:01.0",),
        ("0000:90:01.0",),
    ]
    base = build_topology()
    gpus = tuple(
        Gpu(index=g.index, pci_bus_id=g.pci_bus_id, numa_node=g.numa_node, pci_path=gpu_paths[g.index])
        for g in base.gpus
    )
    nics = (
        Nic("mlx5_0", numa_node=0, kind=NicKind.INFINIBAND, pci_path=("0000:10:01.0", "0000:11:00.0")),
        Nic("mlx5_1", numa_node=0, kind=NicKind.INFINIBAND, pci_path=("0000:20:01.0",)),
        Nic(
            "mlx5_2",
            numa_node=1,
            kind=NicKind.ROCE,
            pci_path=("0000:90:01.0", "0000:91:00.0"),
            ports=(RdmaPort(1, "DOWN", "Ethernet"), RdmaPort(2, "ACTIVE", "Ethernet", 100.0)),
        ),
        Nic("mlx5_3", numa_node=1, kind=NicKind.ROCE, pci_path=("0000:b0:01.0",)),
        eth("lo", 0),
    )
    return type(base)(**{**base.__dict__, "gpus": gpus, "nics": nics})


def test_nics_by_pci_path_then_node_spread_over_ties() -> None:
    p = plan(_pci_topology())
    # GPU0 shares a switch with mlx5_0 (PIX); GPU1 shares the switch too (PXB); GPU2/3 mlx5_2 (PXB)
    assert [r.nic for r in p.ranks] == ["mlx5_0", "mlx5_0", "mlx5_2", "mlx5_2"]
    # one list for the node: the NICs under a GPU's switch, not mlx5_1/mlx5_3 (PHB/NODE only)
    assert {r.env["NCCL_IB_HCA"] for r in p.ranks} == {"=mlx5_0,mlx5_2"}
    # the rank's own NIC goes to UCX only, with its ACTIVE port
    assert [r.env["UCX_NET_DEVICES"] for r in p.ranks] == ["mlx5_0:1", "mlx5_0:1", "mlx5_2:2", "mlx5_2:2"]


def test_per_rank_policy_keeps_one_hca_per_rank() -> None:
    p = plan(_pci_topology(), nic_policy=NicPolicy.PER_RANK)
    assert p.nic_policy is NicPolicy.PER_RANK
    assert [r.env["NCCL_IB_HCA"] for r in p.ranks] == ["=mlx5_0", "=mlx5_0", "=mlx5_2", "=mlx5_2"]
    assert not any("UCX_NET_DEVICES" in r.env for r in p.ranks)
    eth_plan = plan(build_topology(nics=(eth("eth0", 0), eth("eth1", 1))), nic_policy=NicPolicy.PER_RANK)
    assert [r.env["NCCL_SOCKET_IFNAME"] for r in eth_plan.ranks] == ["=eth0", "=eth0", "=eth1", "=eth1"]


def test_storage_nic_and_down_ports_left_out_of_the_node_list() -> None:
    nics = (
        ib("mlx5_0", 0, state="ACTIVE"),
        ib("mlx5_1", 1, state="DOWN"),
        ib("mlx5_2", 1, state="ACTIVE"),
        ib("mlx5_3", 2, state="ACTIVE"),
    )  # mlx5_3: node 2 has no GPU, SYS to all (storage)
    p = plan(build_topology(nodes=3, nics=nics))
    assert {r.env["NCCL_IB_HCA"] for r in p.ranks} == {"=mlx5_0,mlx5_2"}
    assert [r.nic for r in p.ranks] == ["mlx5_0", "mlx5_0", "mlx5_2", "mlx5_2"]


def test_nothing_set_when_nothing_needs_choosing() -> None:
    # every RDMA NIC is a compute NIC: NCCL takes exactly these on its own
    p = plan(build_topology(nics=(ib("mlx5_0", 0), ib("mlx5_1", 1))))
    assert not any(k.startswith("NCCL_") for r in p.ranks for k in r.env)
    assert [r.env["UCX_NET_DEVICES"] for r in p.ranks] == ["mlx5_0:1", "mlx5_0:1", "mlx5_1:1", "mlx5_1:1"]
    # CPU-only ranks never get NCCL's variables
    cpu = plan(build_topology(nodes=3, gpu_nodes=(), nics=(ib("mlx5_0", 0), ib("mlx5_1", 2))), nproc_per_node=2)
    assert not any(k.startswith("NCCL_") or k.startswith("UCX_") for r in cpu.ranks for k in r.env)


def test_ethernet_nic_and_cpu_only_rank_nics() -> None:
    topo = build_topology(nodes=3, nics=(eth("eth0", 0), eth("eth1", 1), eth("eth2", 2), eth("lo", 1)))
    p = plan(topo)
    assert [r.nic for r in p.ranks] == ["eth0", "eth0", "eth1", "eth1"]
    # one NCCL value per node (eth2 is SYS to every GPU); gloo per rank
    assert {r.env["NCCL_SOCKET_IFNAME"] for r in p.ranks} == {"=eth0,eth1"}
    assert [r.env["GLOO_SOCKET_IFNAME"] for r in p.ranks] == ["eth0", "eth0", "eth1", "eth1"]
    cpu = plan(build_topology(gpu_nodes=(), nics=(eth("eth1", 1), eth("lo", 0))), nproc_per_node=2)
    assert [r.nic for r in cpu.ranks] == [None, "eth1"]
    assert cpu.ranks[1].env.get("GLOO_SOCKET_IFNAME") == "eth1" and "NCCL_SOCKET_IFNAME" not in cpu.ranks[1].env


def test_no_nic_when_nothing_is_known() -> None:
    topo = build_topology(gpu_nodes=(-1,), nics=(ib("mlx5_0", -1), ib("mlx5_1", -1)))
    p = plan(topo)
    assert p.ranks[0].nic is None and "NCCL_IB_HCA" not in p.ranks[0].env


def test_plan_json_round_trip_and_contract() -> None:
    topo = build_topology(nics=(ib("mlx5_0", 0), ib("mlx5_1", 1)))
    p = plan(topo)
    assert LaunchPlan.from_json(p.to_json()) == p
    d = p.to_dict()
    r0 = d["ranks"][0]
    assert {"local_rank", "gpu", "cpus", "mems", "nic", "env"} <= set(r0)
    assert {"index", "pci_bus_id", "numa_node"} <= set(r0["gpu"])
    assert r0["nic"] == "mlx5_0" and r0["env"]["OMP_NUM_THREADS"] == "2"


def test_pure_same_input_same_plan() -> None:
    topo = build_topology(nodes=4, gpu_nodes=(3, 1, -1, 0, 2))
    assert make_plan(topo, PlanRequest()) == make_plan(topo, PlanRequest())


def test_gpu_node_unknown_placed_by_its_memory_node_distance() -> None:
    # POWER9-like: GPU numa_node -1, its HBM is CPU-less node 9, nearer to node 1 than node 0
    base = build_topology(gpu_nodes=())
    nodes = list(base.numa_nodes)
    nodes = [
        type(nodes[0])(id=0, cpus=nodes[0].cpus, memory_bytes=1, distances=(10, 40, 80)),
        type(nodes[0])(id=1, cpus=nodes[1].cpus, memory_bytes=1, distances=(40, 10, 60)),
        type(nodes[0])(id=9, cpus=(), memory_bytes=1, distances=(80, 60, 10), memory_only=True),
    ]
    gpu = Gpu(index=0, pci_bus_id="0004:05:00.0", numa_node=-1, memory_numa_node=9)
    topo = type(base)(**{**base.__dict__, "gpus": (gpu,), "numa_nodes": tuple(nodes)})
    p = plan(topo)
    assert p.ranks[0].numa_node == 1 and p.ranks[0].mems == (1,)
    assert "nearest to its memory node 9" in p.ranks[0].fallback
    # equal distances tell nothing: spread over all CPUs instead
    flat = [
        type(n)(
            **{**n.__dict__, "distances": (10, 40, 80) if n.id == 0 else (40, 10, 80) if n.id == 1 else (80, 80, 10)}
        )
        for n in nodes
    ]
    q = plan(type(base)(**{**topo.__dict__, "numa_nodes": tuple(flat)}))
    assert "spread over all usable CPUs" in q.ranks[0].fallback


def test_bench_topology_plan_is_sound() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_plan", REPO / "scripts" / "bench_plan.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    topo = bench.big_topology()
    assert len(topo.cpus) == 384 and len(topo.gpus) == 8
    for mode in MODES:
        p = plan(topo, binding=mode)
        assert [r.nic for r in p.ranks] == [f"mlx5_{i}" for i in range(8)]  # PIX: same switch
    p = plan(topo)
    assert [r.physical_cores for r in p.ranks] == [24] * 8
    cc = plan(topo, binding=BindingMode.CORE_COMPLEX)
    assert [r.physical_cores for r in cc.ranks] == [8] * 8 and not cc.warnings


@st.composite
def _random_case(draw):  # type: ignore[no-untyped-def]
    nodes = draw(st.integers(1, 4))
    cores = draw(st.integers(1, 6))
    threads = draw(st.sampled_from([1, 2, 4]))
    total = nodes * cores * threads
    gpu_nodes = draw(st.lists(st.integers(-1, nodes - 1), max_size=6))
    dis = draw(st.lists(st.integers(0, total - 1), max_size=total - 1, unique=True))
    kw = dict(
        nodes=nodes,
        cores_per_node=cores,
        threads_per_core=threads,
        gpu_nodes=tuple(gpu_nodes),
        disallowed=tuple(dis),
        interleaved=draw(st.booleans()),
        llc_cores=draw(st.sampled_from([0, 1, 2])),
        nics=tuple(ib(f"mlx5_{i}", draw(st.integers(-1, nodes - 1))) for i in range(draw(st.integers(0, 3)))),
    )
    mode = draw(st.sampled_from(MODES))
    nproc = draw(st.one_of(st.none(), st.integers(1, 8)))
    return kw, mode, nproc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_random_case())
def test_random_topologies_plan_soundly_or_refuse_with_numbers(case) -> None:  # type: ignore[no-untyped-def]
    kw, mode, nproc = case
    topo = build_topology(**kw)
    try:
        p = make_plan(topo, PlanRequest(binding=mode, nproc_per_node=nproc))
    except PlanError as e:
        msg = str(e)
        if nproc is not None and topo.gpus and nproc > len(topo.gpus):
            assert f"only {len(topo.gpus)} GPUs" in msg
        else:
            assert mode in (BindingMode.EXCLUSIVE, BindingMode.CORE_COMPLEX) and "usable physical cores for" in msg
        return
    check_invariants(topo, p)
    assert len(p.ranks) == (nproc or len(topo.gpus) or 1)


def test_cpu_only_ranks_follow_usable_cores_per_node() -> None:
    # node 0 keeps 4 cores, node 1 only 2 (cgroup): 6 ranks -> 4 + 2, not 3 + 3 (which cannot fit)
    topo = build_topology(cores_per_node=4, threads_per_core=1, gpu_nodes=(), disallowed=(6, 7))
    p = plan(topo, nproc_per_node=6)
    assert [r.numa_node for r in p.ranks] == [0, 0, 0, 0, 1, 1]
    assert all(r.physical_cores == 1 for r in p.ranks)
    assert [r.numa_node for r in plan(topo, nproc_per_node=3).ranks] == [0, 0, 1]


def test_user_nic_variable_without_a_nic_is_not_warned() -> None:
    p = plan(build_topology(), user_env={"NCCL_SOCKET_IFNAME": "eth9"})
    assert not any("NCCL_SOCKET_IFNAME" in w for w in p.warnings)
