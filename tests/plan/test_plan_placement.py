"""The placement of a layout against a brute-force optimum of the stated objective (docs/layouts.md).

The objective is written here again from its statement, apart from numarun's code: the contiguous row-major mesh
over the declared names; tp's groups first, then cp's, dp_shard's, dp_replicate's (pp not counted); a group is as good
as its slowest pair; one dimension's groups compare worst first; a placement no better than today's keeps today's
order, and among equal others the first in local-rank order wins. The facts (each pair's link class) come from
numarun's one fact-finding function, tested on its own below.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random

import pytest
from layouts import classes_of, groups_of, objective, optimum, with_links
from topo_helpers import FIXTURES, build_topology

from numarun.layout import Layout
from numarun.plan.binding import make_plan
from numarun.plan.model import BindingMode, PlanRequest
from numarun.plan.placement import EXACT_GPUS, STEP_BUDGET, SubMesh, place
from numarun.topology.discover import load_topology, merge_nvml
from numarun.topology.links import Link, gpu_links, nvlink_domain
from numarun.topology.model import Gpu, Nic, NicKind, Topology
from numarun.topology.nvml import fabric_of, reading_from_record
from numarun.topology.visible import visible_gpus

CODE_CLASS = {"PIX": 2, "PXB": 2, "PHB": 3, "NODE": 3, "SYS": 4}


def chosen(topology: Topology, spec: str, nproc: int, cuda_visible_devices: str | None = None) -> tuple[int, ...]:
    """The visible positions numarun's plan gives local ranks 0..nproc-1."""
    plan = make_plan(
        topology,
        PlanRequest(
            nproc_per_node=nproc,
            mesh=Layout.parse(spec),
            cuda_visible_devices=cuda_visible_devices,
            binding=BindingMode.NODE,
        ),
    )
    gpus = visible_gpus(topology, cuda_visible_devices, "PCI_BUS_ID")
    index = [g.index for g in gpus]
    assert [r.gpu.cuda_index for r in plan.ranks] == list(range(nproc))
    return tuple(index.index(r.gpu.index) for r in plan.ranks)


def check(topology: Topology, names: tuple[str, ...], shape: tuple[int, ...], cvd: str | None = None) -> tuple:
    spec = ",".join(f"{n}={s}" for n, s in zip(names, shape))
    cls, _ = classes_of(topology, cvd)
    best, best_order = optimum(names, shape, cls)
    got = chosen(topology, spec, math.prod(shape), cvd)
    assert objective(names, shape, cls, got) == best, (spec, cvd, got, best_order)
    assert got == best_order, (spec, cvd, got, best_order)  # and the same tie-break
    return got


# ---------------------------------------------------------------- every recorded topology
def _recorded() -> list[str]:
    files = sorted((FIXTURES / "nvidia-smi").glob("*.txt")) + sorted((FIXTURES / "hwloc").glob("*.xml"))
    files += [
        FIXTURES / "hwloc-linux-sysfs" / "nvidiagpunumanodes.tar.bz2",
        FIXTURES / "live-h200-vm" / "sysfs.tar.gz",
        FIXTURES / "constructed" / "2gpu-minors-reversed.tar.gz",
    ]
    return [str(f.relative_to(FIXTURES)) for f in files]


def _nvml_topology(name: str) -> Topology:
    """A node whose GPUs are the recorded NVML reading ``name`` (CPUs built: 2 NUMA nodes of 8 cores)."""
    reading = reading_from_record(json.loads((FIXTURES / "nvml" / name).read_text()))
    return merge_nvml(build_topology(nodes=2, cores_per_node=8, gpu_nodes=()), reading)


# layouts by rank count, in several name orders (outermost first); the trainer may write any subset of the names
LAYOUTS = {
    2: [(("tp",), (2,)), (("dp_shard",), (2,)), (("pp",), (2,))],
    3: [(("tp",), (3,)), (("cp", "tp"), (3, 1))],
    4: [(("dp_shard", "tp"), (2, 2)), (("tp", "dp_shard"), (2, 2)), (("pp", "cp"), (2, 2)), (("cp", "tp"), (1, 4))],
    5: [(("dp_replicate",), (5,))],
    6: [(("dp_shard", "tp"), (3, 2)), (("tp", "cp"), (2, 3))],
    8: [
        (("dp_shard", "tp"), (2, 4)),
        (("tp", "dp_shard"), (2, 4)),
        (("cp", "dp_replicate", "tp"), (2, 2, 2)),
        (("pp", "dp_shard", "tp"), (2, 2, 2)),
    ],
}


@pytest.mark.parametrize("source", _recorded())
def test_the_choice_is_the_optimum_on_every_recorded_topology(source: str) -> None:
    topology = load_topology(str(FIXTURES / source))
    n = len(topology.gpus)
    if n > EXACT_GPUS:
        pytest.skip(f"{n} GPUs: placed past the exhaustive search (the 16-GPU tests)")
    if n < 2:  # nothing to choose: the layout is recorded, today's GPU (or none) kept
        plan = make_plan(
            topology, PlanRequest(nproc_per_node=1, mesh=Layout.parse("pp=1,dp_shard=-1"), binding=BindingMode.NODE)
        )
        assert plan.mesh.spec == "pp=1,dp_shard=1" and plan.mesh.cuda_visible_devices == ""
        assert [r.gpu.index if r.gpu else None for r in plan.ranks] == ([g.index for g in topology.gpus] or [None])
        return
    rng = random.Random(source)
    sizes = [4] if n == 8 else sorted(k for k in LAYOUTS if k <= n)[-2:]
    for k in sizes:  # subsets of the node's GPUs: which GPUs to use is part of the choice
        for names, shape in LAYOUTS[k]:
            check(topology, names, shape)
    if n == 8:  # the whole box: one layout per source (the brute force tries 8! placements)
        check(topology, *rng.choice(LAYOUTS[8]))
    if n >= 4:  # a scheduler's shuffled order
        shuffled = ",".join(map(str, rng.sample(range(n), n)))
        check(topology, *rng.choice(LAYOUTS[4]), cvd=shuffled)


@pytest.mark.parametrize(
    "name",
    [
        "constructed-4gpu-nvlink-pairs.json",
        "constructed-4gpu-crossed-nvlink.json",
        "constructed-gb200-fabric.json",
        "h200-vm.json",
    ],
)
def test_the_choice_is_the_optimum_on_recorded_nvml_readings(name: str) -> None:
    topology = _nvml_topology(name)
    for k in sorted(LAYOUTS):
        for names, shape in LAYOUTS[k] if k <= len(topology.gpus) and k > 1 else ():
            check(topology, names, shape)


# ---------------------------------------------------------------- constructed machines
def islands_out_of_order() -> Topology:
    """8 GPUs, 4 per socket, NVLink pairs 0-3, 1-2 (socket 0) and 4-6, 5-7 (socket 1); PCIe switch pairs 0-1, 2-3."""
    t = build_topology(nodes=2, cores_per_node=8, gpu_nodes=(0, 0, 0, 0, 1, 1, 1, 1))
    return with_links(t, ["0-3=NV4", "1-2=NV4", "4-6=NV2", "5-7=NV4", "0-1=PIX", "2-3=PIX", "4-5=PXB", "6-7=PXB"])


def uneven_sockets() -> Topology:
    """6 GPUs: GPU0 and GPU5 alone... GPU0 on socket 1, GPUs 1-4 on socket 0 (pairs 1-2, 3-4 PHB), GPU5 on socket 1."""
    t = build_topology(nodes=2, cores_per_node=8, gpu_nodes=(1, 0, 0, 0, 0, 1))
    return with_links(t, ["1-2=PHB", "3-4=PHB", "0-5=PHB"])


def controls() -> list[Topology]:
    """Machines whose contiguous order is already best: all NVLink; PCIe pairs in index order; one socket."""
    nv = with_links(build_topology(gpu_nodes=(0,) * 8), [f"{a}-{b}=NV18" for a in range(8) for b in range(a + 1, 8)])
    pcie = load_topology(str(FIXTURES / "nvidia-smi" / "pcie-8gpu-pix-phb-sys-2x14c.txt"))
    flat = with_links(build_topology(nodes=1, gpu_nodes=(0,) * 4), [])
    return [nv, pcie, flat]


def test_islands_out_of_index_order_get_the_tp_groups() -> None:
    t = islands_out_of_order()
    got = check(t, ("dp_shard", "tp"), (4, 2))
    cls, _ = classes_of(t)
    pairs = {tuple(sorted(got[r] for r in g)) for g in groups_of((4, 2), 1)}
    assert pairs == {(0, 3), (1, 2), (4, 6), (5, 7)}
    assert all(cls[a][b] == Link.NVLINK for a, b in pairs)
    check(t, ("tp", "dp_shard"), (2, 4))  # the same pairs when tp is written outermost
    check(t, ("pp", "dp_shard", "tp"), (2, 2, 2))


def test_uneven_sockets_keep_tp_inside_a_socket() -> None:
    t = uneven_sockets()
    got = check(t, ("tp",), (2,))
    assert [t.gpus[g].index for g in got] == [0, 5]  # the first pair on one host bridge, in local-rank order
    check(t, ("dp_shard", "tp"), (2, 2))
    check(t, ("dp_shard", "tp"), (3, 2))


def test_the_recorded_five_gpu_box_puts_tp_on_its_host_bridge() -> None:
    t = load_topology(str(FIXTURES / "nvidia-smi" / "5gpu-dual-socket-mixed-numa.txt"))
    got = check(t, ("tp",), (2,))
    assert got == (1, 2)  # GPU0 is alone on socket 1: today's ranks 0,1 would cross the sockets


@pytest.mark.parametrize("cvd", ["0,4,2,6,1,5,3,7", "7,6,5,4,3,2,1,0", "3,0,6,1,4,7,2,5"])
def test_a_shuffled_cuda_visible_devices(cvd: str) -> None:
    t = load_topology(str(FIXTURES / "nvidia-smi" / "pcie-8gpu-pix-phb-sys-2x14c.txt"))
    check(t, ("dp_shard", "tp"), (4, 2), cvd)
    check(t, ("tp", "dp_shard"), (2, 2), cvd)


@pytest.mark.parametrize("index", range(3))
def test_controls_keep_todays_order(index: int) -> None:
    t = controls()[index]
    n = len(t.gpus)
    assert check(t, *LAYOUTS[n][0]) == tuple(range(n))  # tp innermost: contiguous pairs, quads


@pytest.mark.parametrize("seed", range(6))
def test_random_machines(seed: int) -> None:
    """Random link matrices (NVLink, switch, host bridge, SYS pairs) of 4-6 GPUs, any name order."""
    rng = random.Random(seed)
    n = rng.choice((4, 5, 6))
    t = build_topology(nodes=2, cores_per_node=8, gpu_nodes=tuple(rng.choice((0, 1)) for _ in range(n)))
    t = with_links(
        t,
        [
            f"{a}-{b}={rng.choice(['NV2', 'PIX', 'PXB', 'PHB', 'SYS', 'NODE'])}"
            for a in range(n)
            for b in range(a + 1, n)
            if rng.random() < 0.5
        ],
    )
    for k in (4, n):
        for names, shape in LAYOUTS.get(k, []):
            check(t, names, shape)
        for names in itertools.permutations(("dp_replicate", "cp", "tp")):
            if k == 4:
                check(t, names, (2, 2, 1))


# ---------------------------------------------------------------- beyond 8 GPUs
def sixteen_gpu_box(cvd_shuffle: int | None = None) -> Topology:
    """2 sockets x 2 PCIe switches x 4 GPUs, NVLink bridges on pairs that the index order splits (i, i+2)."""
    t = build_topology(nodes=2, cores_per_node=8, gpu_nodes=())
    t = dataclasses.replace(
        t, gpus=tuple(Gpu(index=i, pci_bus_id=f"0000:{0x10 + 8 * i:02x}:00.0", numa_node=i // 8) for i in range(16))
    )
    rows = []
    for a in range(16):
        for b in range(a + 1, 16):
            if a // 4 == b // 4:
                rows.append(f"{a}-{b}=PXB")
            elif a // 8 == b // 8:
                rows.append(f"{a}-{b}=NODE")
    for s in range(4):
        rows += [f"{4 * s}-{4 * s + 2}=NV4", f"{4 * s + 1}-{4 * s + 3}=NV4"]
    return with_links(t, rows)


def test_sixteen_gpus_reach_the_bound_and_say_how() -> None:
    """Past the exhaustive search: each group at its best conceivable link (tp on NVLink, dp_shard in a switch), which
    no placement beats, found from the topology order within the budget; the plan says how."""
    t = sixteen_gpu_box()
    plan = make_plan(
        t, PlanRequest(nproc_per_node=16, mesh=Layout.parse("dp_replicate=2,dp_shard=4,tp=2"), binding=BindingMode.NODE)
    )
    cls, _ = classes_of(t)
    got = [r.gpu.index for r in plan.ranks]
    names, shape = ("dp_replicate", "dp_shard", "tp"), (2, 2 * 2, 2)
    value = objective(names, shape, cls, got)
    assert value[0] == (int(Link.NVLINK),) * 8  # every tp pair on NVLink
    assert value[1] == (int(Link.PCIE_SWITCH),) * 4 or max(value[1]) <= int(Link.HOST_BRIDGE)
    assert "steps" in plan.mesh.search
    assert value < objective(names, shape, cls, tuple(range(16)))
    shuffled = ",".join(map(str, random.Random(3).sample(range(16), 16)))
    plan2 = make_plan(
        t,
        PlanRequest(
            nproc_per_node=16,
            mesh=Layout.parse("dp_shard=8,tp=2"),
            binding=BindingMode.NODE,
            cuda_visible_devices=shuffled,
        ),
    )
    order = [int(e) for e in shuffled.split(",")]
    got2 = [order.index(r.gpu.index) for r in plan2.ranks]
    cls2, _ = classes_of(t, shuffled)
    assert objective(("dp_shard", "tp"), (8, 2), cls2, got2)[0] == (int(Link.NVLINK),) * 8


def test_the_search_beyond_eight_stops_at_its_budget() -> None:
    cls = [[0 if a == b else 4 - (a // 4 == b // 4) for b in range(12)] for a in range(12)]
    cls[0][11] = cls[11][0] = 1  # one NVLink pair far apart: a search that cannot prune all ties
    p = place(SubMesh((2, 2, 3), (2, 1)), cls)
    assert p.steps <= STEP_BUDGET and p.score <= p.default_score


def test_the_dgx2_record_of_sixteen_gpus_plans() -> None:
    t = load_topology(str(FIXTURES / "hwloc" / "nvidiaDGX2.xml"))
    plan = make_plan(t, PlanRequest(nproc_per_node=16, mesh=Layout.parse("dp_shard=-1,tp=8"), binding=BindingMode.NODE))
    assert sorted(r.gpu.index for r in plan.ranks) == sorted(g.index for g in t.gpus)
    assert plan.mesh.spec == "dp_shard=2,tp=8"


# ---------------------------------------------------------------- the facts
def test_links_from_pci_paths_numa_and_a_shared_nic_switch() -> None:
    t = build_topology(nodes=2, gpu_nodes=(0, 0, 0, 1))
    root = "0000:10:01.0"
    gpus = list(t.gpus)
    gpus[0] = dataclasses.replace(gpus[0], pci_path=(root, "0000:11:00.0", "0000:12:00.0"))
    gpus[1] = dataclasses.replace(gpus[1], pci_path=(root, "0000:11:00.0", "0000:13:00.0"))
    gpus[2] = dataclasses.replace(gpus[2], pci_path=("0000:10:02.0", "0000:20:00.0"))
    nic = Nic(name="mlx5_0", numa_node=1, kind=NicKind.INFINIBAND)
    t = dataclasses.replace(t, gpus=tuple(gpus), nics=(nic,), nic_links=(("SYS",), ("SYS",), ("SYS",), ("PIX",)))
    links = gpu_links(t)
    assert (links.link(0, 1), links.code(0, 1)) == (Link.PCIE_SWITCH, "PIX")  # one switch below one root port
    assert (links.link(0, 2), links.code(0, 2)) == (Link.HOST_BRIDGE, "PHB")  # one root bus, two ports
    assert (links.link(2, 3), links.code(2, 3)) == (Link.SYS, "SYS")  # NUMA nodes only
    both = dataclasses.replace(t, nic_links=(("PXB",), ("SYS",), ("SYS",), ("PIX",)))
    assert gpu_links(both).link(0, 3) is Link.PCIE_SWITCH  # both one switch from one NIC


def test_nvml_fabric_info_names_the_node_s_nvlink_domain() -> None:
    t = _nvml_topology("constructed-gb200-fabric.json")
    assert nvlink_domain(t) == "8f3b2c1d-4e5f-6071-8293-a4b5c6d7e8f9/32766"
    assert {gpu_links(t).code(a, b) for a in range(4) for b in range(4) if a != b} == {"NV18"}  # NVSwitch links
    assert nvlink_domain(_nvml_topology("constructed-4gpu-crossed-nvlink.json")) == ""
    assert fabric_of({"cluster_uuid": "0" * 32, "clique_id": 0, "state": 3, "status": 0}) == ("", -1)  # one node's
    assert fabric_of({"cluster_uuid": "ab" * 16, "clique_id": 4, "state": 2, "status": 0}) == ("", -1)  # in progress
    assert fabric_of("ERR NVMLError_NotSupported: Not Supported") == ("", -1)
    plan = make_plan(t, PlanRequest(mesh=Layout.parse("tp=4")))
    assert plan.mesh.nvlink_domain == nvlink_domain(t)
