"""The SVG picture (``numarun topo --svg`` / ``numarun plan --svg``): valid XML with one box per
PU, GPU and NIC, labelled NVLink arcs, and each rank's CPUs in that rank's colour."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from helpers import FIXTURES
from topo_helpers import by_class, make_topology, plan_for

from numarun.cpuset import format_list
from numarun.plan.model import BindingMode, LaunchPlan
from numarun.topology.model import NumaNode, Topology
from numarun.view.svg import RANK_COLOURS, render_svg

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode("utf-8"))


def test_counts_pus_gpus_nics_and_links() -> None:
    topo = make_topology()
    root = parse(render_svg(topo))
    assert root.tag == f"{SVG}svg"
    pus = [e for e in by_class(root, "pu") if e.tag == f"{SVG}rect"]
    assert sorted(int(e.get("data-cpu")) for e in pus) == [c.id for c in topo.cpus]
    assert len(by_class(root, "core")) == 8
    assert len(by_class(root, "numa")) == 2
    assert len(by_class(root, "package")) == 2
    assert sorted(int(e.get("data-gpu")) for e in by_class(root, "gpu")) == [0, 1, 2, 3]
    assert sorted(e.get("data-nic") for e in by_class(root, "nic")) == ["mlx5_0", "mlx5_1"]
    # all 4*3/2 pairs NV12 (NVSwitch): one bus and one label, not six identical arcs
    assert [e.text for e in by_class(root, "link-label")] == ["NV12"]
    (bus,) = by_class(root, "link-all")
    assert bus.get("data-code") == "NV12" and bus.get("data-gpus") == "4"
    assert by_class(root, "link") == []
    # the link panel has one small box per GPU; they are not counted as GPU boxes
    assert sorted(int(e.get("data-gpu")) for e in by_class(root, "gpu-node")) == [0, 1, 2, 3]


def test_nvlink_pairs_are_arcs_each_label_apart() -> None:
    topo = make_topology(nv="NV4", stray_gpu=True)  # 4 of 5 GPUs linked: not all pairs
    root = parse(render_svg(topo))
    assert len(by_class(root, "link")) == 6 and by_class(root, "link-all") == []
    spots = {(e.get("x"), e.get("y")) for e in by_class(root, "link-label")}
    assert len(spots) == 6  # each label at its own place, so none hides another


def test_many_differing_nvlinks_become_a_matrix() -> None:
    topo = make_topology(packages=2, gpus_per_node=4)
    n = len(topo.gpus)
    # NV2 inside a board half, NV1 across, GPU 0 and 7 not linked: 27 pairs, two codes
    links = tuple(
        tuple(
            "X" if i == j else ("SYS" if {i, j} == {0, n - 1} else ("NV2" if i // 4 == j // 4 else "NV1"))
            for j in range(n)
        )
        for i in range(n)
    )
    root = parse(render_svg(Topology(**{**topo.__dict__, "gpu_links": links})))
    (matrix,) = by_class(root, "link-matrix")
    assert by_class(root, "link") == [] and by_class(root, "link-all") == []
    cells = [e.text for e in by_class(matrix, "link-label")]
    assert len(cells) == 2 * 27 and set(cells) == {"NV1", "NV2"}


def test_pcie_level_links_are_not_drawn() -> None:
    topo = make_topology(nv="PXB")
    root = parse(render_svg(topo))
    assert by_class(root, "link-label") == []
    mixed = make_topology(nv="NV4", stray_gpu=True)  # stray GPU is SYS to all others
    labels = [e.text for e in by_class(parse(render_svg(mixed)), "link-label")]
    assert labels == ["NV4"] * 6


def test_cpu_ids_are_written_in_their_pu() -> None:
    topo = make_topology(packages=1, cores_per_node=3, smt=2)
    root = parse(render_svg(topo))
    ids = sorted(int(e.text) for e in by_class(root, "pu-id"))
    assert ids == [0, 1, 2, 3, 4, 5]
    # SMT siblings share a core box
    for core in by_class(root, "core"):
        cpus = sorted(int(r.get("data-cpu")) for r in by_class(core, "pu"))
        assert cpus[1] - cpus[0] == 3


def test_devices_attach_under_their_numa_node_and_unknown_apart() -> None:
    topo = make_topology(stray_gpu=True)
    root = parse(render_svg(topo))
    for node in by_class(root, "numa"):
        node_id = int(node.find(f"{SVG}text").text.split()[2])
        gpus = [int(g.get("data-gpu")) for g in by_class(node, "gpu")]
        assert gpus == [g.index for g in topo.gpus if g.numa_node == node_id]
        nics = [n.get("data-nic") for n in by_class(node, "nic")]
        assert nics == [n.name for n in topo.nics if n.numa_node == node_id]
    unknown = [g for g in by_class(root, "unknown-numa")]
    assert len(unknown) == 1
    assert [int(g.get("data-gpu")) for g in by_class(unknown[0], "gpu")] == [4]


def test_text_is_escaped() -> None:
    topo = make_topology(stray_gpu=True, hostname='a<b>&"c"')
    svg = render_svg(topo)
    root = parse(svg)  # would raise on unescaped < or &
    assert any('a<b>&"c"' in (e.text or "") for e in root.iter())
    assert any("<&>" in (e.text or "") for e in root.iter())


def test_offline_and_disallowed_cpus_are_greyed() -> None:
    topo = make_topology(offline=(3,), disallowed=(0, 9))
    root = parse(render_svg(topo))
    pus = {int(e.get("data-cpu")): e.get("class").split() for e in by_class(root, "pu") if e.tag == f"{SVG}rect"}
    assert "offline" in pus[3]
    assert "disallowed" in pus[0] and "disallowed" in pus[9]
    assert all(cls == ["pu"] for cid, cls in pus.items() if cid not in (0, 3, 9))


def test_memory_only_nodes_are_drawn_apart() -> None:
    topo = make_topology(memory_only_nodes=2)
    root = parse(render_svg(topo))
    mem = by_class(root, "memory-only")
    assert len(mem) == 2
    for box in mem:
        assert by_class(box, "pu") == []
        assert "memory only" in box.find(f"{SVG}text").text


def test_node_spanning_packages_nests_packages_inside_it() -> None:
    # a cpuid-only dump: one NUMA node covering both packages
    topo = make_topology()
    one = NumaNode(id=0, cpus=tuple(c.id for c in topo.cpus), memory_bytes=128 << 30)
    topo = Topology(hostname="one", numa_nodes=(one,), cpus=topo.cpus)
    root = parse(render_svg(topo))
    (node,) = by_class(root, "numa")
    assert len(by_class(node, "package")) == 2
    assert len([e for e in by_class(node, "pu") if e.tag == f"{SVG}rect"]) == 16


def test_plan_colours_each_ranks_cpus_and_lists_a_legend() -> None:
    topo = make_topology()
    plan = plan_for(topo)
    root = parse(render_svg(topo, plan))
    pus = {int(e.get("data-cpu")): e for e in by_class(root, "pu") if e.tag == f"{SVG}rect"}
    for r in plan.ranks:
        colour = RANK_COLOURS[r.local_rank]
        for c in r.cpus:
            assert pus[c].get("data-ranks") == str(r.local_rank)
            assert f"fill:{colour}" in pus[c].get("style")
    bound = {c for r in plan.ranks for c in r.cpus}
    assert bound == set(pus)  # the helper plan covers every CPU
    legend = by_class(root, "legend-rank")
    assert [int(e.get("data-rank")) for e in legend] == [0, 1, 2, 3]
    for e, r in zip(legend, plan.ranks):
        text = "".join(e.itertext())
        assert f"GPU{r.gpu.index}" in text and format_list(r.cpus) in text and r.nic in text
    gpus = {int(e.get("data-gpu")): e.get("data-ranks") for e in by_class(root, "gpu")}
    assert gpus == {0: "0", 1: "1", 2: "2", 3: "3"}


def test_plan_with_unbound_cpus_leaves_them_plain() -> None:
    topo = make_topology()
    full = plan_for(topo)
    plan = LaunchPlan(ranks=full.ranks[:1])
    root = parse(render_svg(topo, plan))
    coloured = {int(e.get("data-cpu")) for e in by_class(root, "pu") if e.get("data-ranks")}
    assert coloured == set(full.ranks[0].cpus)


def test_shared_cpus_are_striped_per_rank() -> None:
    topo = make_topology()
    plan = plan_for(topo, shared=True)
    root = parse(render_svg(topo, plan))
    stripes = by_class(root, "pu-share")
    # every CPU of node 0 is shared by ranks 0 and 1, node 1 by ranks 2 and 3
    assert len(stripes) == 2 * len(topo.cpus)
    node0 = set(topo.node(0).cpus)
    pus = {int(e.get("data-cpu")): e.get("data-ranks") for e in by_class(root, "pu") if e.tag == f"{SVG}rect"}
    assert all(pus[c] == ("0,1" if c in node0 else "2,3") for c in pus)


def test_large_machine_stays_within_a_legible_width() -> None:
    # 24 NUMA nodes x 8 cores x 2 threads = 384 PUs, like the SGI Altix fixture
    topo = make_topology(packages=24, cores_per_node=8, smt=2, gpus_per_node=0, nics_per_node=0)
    svg = render_svg(topo)
    root = parse(svg)
    assert len([e for e in by_class(root, "pu") if e.tag == f"{SVG}rect"]) == 384
    assert len(by_class(root, "numa")) == 24
    width = float(root.get("width"))
    assert width <= 1900
    # no PU box overlaps another
    boxes = sorted((float(e.get("x")), float(e.get("y"))) for e in by_class(root, "pu") if e.tag == f"{SVG}rect")
    assert len(set(boxes)) == 384


@pytest.mark.parametrize("fixture", ["dgx-a100-8numa-nps4-10nic.txt", "h100-8gpu-2x52c-stas00.txt"])
@pytest.mark.parametrize("mode", ["exclusive", "node"])
def test_real_plan_on_a_recorded_machine(fixture: str, mode: str) -> None:
    """What ``numarun plan --svg`` draws: the planner's own output on a real matrix."""

    from numarun.plan.binding import make_plan
    from numarun.plan.model import PlanRequest
    from numarun.topology.discover import load_topology

    topo = load_topology(str(FIXTURES / "nvidia-smi" / fixture))
    plan = make_plan(topo, PlanRequest(binding=BindingMode(mode)))
    root = parse(render_svg(topo, plan))
    pus = {int(e.get("data-cpu")): e for e in by_class(root, "pu") if e.tag == f"{SVG}rect"}
    expected: dict[int, list[int]] = {}
    for r in plan.ranks:
        for c in r.cpus:
            expected.setdefault(c, []).append(r.local_rank)
    for cpu, e in pus.items():
        want = ",".join(map(str, expected.get(cpu, []))) or None
        assert e.get("data-ranks") == want, cpu
    for cpu, ranks in expected.items():
        if len(ranks) == 1:
            assert f"fill:{RANK_COLOURS[ranks[0]]}" in pus[cpu].get("style")
    # each rank's GPU box carries that rank, and only it
    gpus = {int(e.get("data-gpu")): e.get("data-ranks") for e in by_class(root, "gpu")}
    assert gpus == {r.gpu.index: str(r.local_rank) for r in plan.ranks}
    assert len(by_class(root, "legend-rank")) == len(plan.ranks)


# --- cores as the kernel groups them, caches, ranks on cores, GPU models, NICs ---


def _pus(root: ET.Element) -> list[ET.Element]:
    return [e for e in by_class(root, "pu") if e.tag == f"{SVG}rect"]


def test_cores_are_sibling_sets_and_offline_cpus_sit_apart() -> None:
    from trees import SYSFS_DIR, extract_tree

    from numarun.topology.sysfs import read_sysfs

    # multi-die packages without die_id repeat core_id: still 48 single-thread cores
    sparse = read_sysfs(extract_tree(SYSFS_DIR / "48amd64-4pa2n6c-sparse.tar.bz2"))
    cores = by_class(parse(render_svg(sparse)), "core")
    assert len(cores) == 48 and all(len(by_class(c, "pu")) == 1 for c in cores)
    off = read_sysfs(extract_tree(SYSFS_DIR / "offline-cpu0-node0.tar.bz2"))
    root = parse(render_svg(off))
    assert len(by_class(root, "core")) == 17
    boxes = by_class(root, "offline-cpus")  # one per NUMA node that has offline CPUs
    ids = sorted(int(e.get("data-cpu")) for b in boxes for e in _pus(b))
    assert ids == [c.id for c in off.cpus if not c.online]
    assert all("offline" in e.get("class").split() for b in boxes for e in _pus(b))
    assert not any(by_class(core, "offline") for core in by_class(root, "core"))
    assert len(_pus(root)) == len(off.cpus)


def _zen4() -> Topology:
    from numarun.topology.hwloc_xml import read_hwloc_xml

    return read_hwloc_xml(
        (FIXTURES / "hwloc" / "AMD-19h-Zen4-2xEpyc-9654.xml").read_text(), "AMD-19h-Zen4-2xEpyc-9654.xml"
    )


def test_zen4_llc_boxes_hold_one_core_complex_rank_each() -> None:
    from numarun.plan.binding import make_plan
    from numarun.plan.model import PlanRequest

    topo = _zen4()
    plan = make_plan(topo, PlanRequest(binding=BindingMode.CORE_COMPLEX, cuda_visible_devices="", nproc_per_node=24))
    root = parse(render_svg(topo, plan))
    llcs = by_class(root, "llc")
    assert len(llcs) == 24  # 2 x 12 CCDs of 8 cores
    seen = set()
    for box in llcs:
        cores = by_class(box, "core")
        assert len(cores) == 8
        ranks = {c.get("data-ranks") for c in cores}
        assert len(ranks) == 1, ranks  # core-complex: one rank per cache domain
        seen |= ranks
    assert seen == {str(r) for r in range(24)}


def test_rank_numbers_on_cores_beyond_the_palette() -> None:
    from numarun.plan.binding import make_plan
    from numarun.plan.model import PlanRequest

    topo = _zen4()
    plan = make_plan(topo, PlanRequest(binding=BindingMode.EXCLUSIVE, cuda_visible_devices="", nproc_per_node=48))
    root = parse(render_svg(topo, plan))
    labels = {}
    for core in by_class(root, "core"):
        (text,) = by_class(core, "core-rank")
        assert text.text == "r" + core.get("data-ranks")
        labels[core.get("data-ranks")] = text.text
    # 48 ranks, 20 colours: the numbers still tell every rank apart
    assert len(labels) == 48 and len(set(labels.values())) == 48


def test_gpu_box_with_a_rank_keeps_its_model() -> None:
    topo = make_topology()
    svg = render_svg(topo, plan_for(topo))
    for g in topo.gpus:
        assert f">GPU{g.index} H100 80GB HBM3<" in svg and f">rank {g.index} {g.pci_bus_id}<" in svg


def test_down_nics_and_the_nccl_list_are_marked() -> None:
    import dataclasses

    from numarun.plan.binding import make_plan
    from numarun.plan.model import PlanRequest
    from numarun.topology.discover import load_topology
    from numarun.topology.model import RdmaPort

    topo = load_topology(str(FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt"))
    topo = dataclasses.replace(
        topo,
        nics=tuple(
            dataclasses.replace(n, ports=(RdmaPort(1, "DOWN", "InfiniBand"),)) if n.name == "mlx5_7" else n
            for n in topo.nics
        ),
    )
    root = parse(render_svg(topo, make_plan(topo, PlanRequest())))
    nics = {e.get("data-nic"): e.get("class").split() for e in by_class(root, "nic")}
    assert "down" in nics["mlx5_7"] and "nccl" not in nics["mlx5_7"]
    assert all("nccl" in nics[f"mlx5_{i}"] for i in range(7))
    assert "nccl" not in nics["mlx5_8"] and "nccl" not in nics["mlx5_9"]  # storage
