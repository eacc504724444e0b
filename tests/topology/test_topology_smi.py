"""nvidia-smi topo -m parsing on the recorded matrices in tests/fixtures/nvidia-smi/.

Expected values in the tables below were written by reading the fixture files and
tests/fixtures/SOURCES.md, not produced by the parser.
"""

from __future__ import annotations

import pytest
from helpers import FIXTURES

from numarun.errors import NumarunError, TopologyError
from numarun.topology.model import NicKind, Topology
from numarun.topology.smi import nic_kind, parse_topo_m, topology_from_smi

FIX = FIXTURES / "nvidia-smi"
ALL = sorted(p.name for p in FIX.glob("*.txt"))


def read(name: str) -> str:
    return (FIX / name).read_text()


# file -> (GPU count, NUMA affinity per GPU (None = N/A), NIC count)
EXPECTED = {
    "5gpu-dual-socket-mixed-numa.txt": (5, [1, 0, 0, 0, 0], 0),
    "a100-sxm4-80gb-8gpu-2numa-4nic.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 4),
    "aws-g6e.12xlarge-4xL40S.txt": (4, [0, 0, 0, 0], 0),
    "aws-p4d.24xlarge.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 0),
    "aws-p5.48xlarge.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 0),
    "consumer-2gpu-nvlink-bridge-NV2.txt": (2, [None, None], 0),
    "consumer-2gpu-pcie-PHB.txt": (2, [None, None], 0),
    "dgx-a100-8numa-nps4-10nic.txt": (8, [3, 3, 1, 1, 7, 7, 5, 5], 10),
    "gh200-480gb-aerial.txt": (1, [0], 4),
    "h100-4gpu-vm-all-PHB.txt": (4, [0, 0, 0, 0], 8),
    "h100-8gpu-13nic-mlx5_ib-penny.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 13),
    "h100-8gpu-2x48c-thunderkittens.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 0),
    "h100-8gpu-2x52c-stas00.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 0),
    "h800-8gpu-NV8-9nic-bond.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 9),
    "live-h200-vm-topo-m.txt": (1, [0], 0),
    "pcie-8gpu-pix-phb-sys-2x14c.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 0),
    "rtx4090-8gpu-2socket-2nic.txt": (8, [0, 0, 0, 0, 1, 1, 1, 1], 2),
    "tesla-p4-1gpu-numa-NA.txt": (1, [None], 0),
}

# file -> the link code between GPU0 and GPU1 (or None for 1-GPU boxes)
GPU01 = {
    "5gpu-dual-socket-mixed-numa.txt": "SYS",
    "a100-sxm4-80gb-8gpu-2numa-4nic.txt": "NV12",
    "aws-g6e.12xlarge-4xL40S.txt": "NODE",
    "aws-p4d.24xlarge.txt": "NV12",
    "aws-p5.48xlarge.txt": "NV18",
    "consumer-2gpu-nvlink-bridge-NV2.txt": "NV2",
    "consumer-2gpu-pcie-PHB.txt": "PHB",
    "dgx-a100-8numa-nps4-10nic.txt": "NV12",
    "h100-4gpu-vm-all-PHB.txt": "NV18",
    "h100-8gpu-13nic-mlx5_ib-penny.txt": "NV18",
    "h100-8gpu-2x48c-thunderkittens.txt": "NV18",
    "h100-8gpu-2x52c-stas00.txt": "NV18",
    "h800-8gpu-NV8-9nic-bond.txt": "NV8",
    "pcie-8gpu-pix-phb-sys-2x14c.txt": "PIX",
    "rtx4090-8gpu-2socket-2nic.txt": "SYS",
}


def test_every_fixture_has_an_expectation() -> None:
    assert len(ALL) == 18
    assert set(ALL) == set(EXPECTED)


@pytest.mark.parametrize("name", ALL)
def test_fixture_counts_numa_and_links(name: str) -> None:
    ngpu, numa, nnic = EXPECTED[name]
    mx = parse_topo_m(read(name), name)
    assert mx.gpus == tuple(f"GPU{i}" for i in range(ngpu))
    assert len(mx.nics) == len(mx.nic_names) == nnic
    assert mx.numa_affinity == tuple(() if n is None else (n,) for n in numa)
    assert len(mx.gpu_links) == ngpu and all(len(r) == ngpu for r in mx.gpu_links)
    assert all(mx.gpu_links[i][i] == "X" for i in range(ngpu))
    # symmetric in every recorded file
    assert all(mx.gpu_links[i][j] == mx.gpu_links[j][i] for i in range(ngpu) for j in range(ngpu))
    if nnic:
        assert len(mx.nic_links) == ngpu and all(len(r) == nnic for r in mx.nic_links)
    if ngpu > 1:
        assert mx.gpu_links[0][1] == GPU01[name]


@pytest.mark.parametrize("name", ALL)
def test_fixture_topology_json_round_trip(name: str) -> None:
    t = topology_from_smi(read(name), name)
    assert t.gpu_source == "nvidia-smi"
    assert t.source == f"nvidia-smi:{name}"
    assert Topology.from_json(t.to_json()) == t
    assert t.notes  # every smi topology carries its inferences
    # every CPU named in a GPU's affinity is a Cpu of the topology
    ids = {c.id for c in t.cpus}
    assert all(set(g.cpu_affinity) <= ids for g in t.gpus)


def test_dgx_a100_nps4_nonmonotonic_numa_and_pxb_nics() -> None:
    t = topology_from_smi(read("dgx-a100-8numa-nps4-10nic.txt"), "dgx")
    assert [g.numa_node for g in t.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert [n.id for n in t.numa_nodes] == [1, 3, 5, 7]
    assert t.node(3).cpus == tuple(range(48, 64)) + tuple(range(176, 192))
    assert [n.name for n in t.nics] == [f"mlx5_{i}" for i in range(10)]
    # NIC0/1 are PXB to GPU0/1 (node 3); NIC8/9 are SYS to every GPU -> unknown
    assert [n.numa_node for n in t.nics] == [3, 3, 1, 1, 7, 7, 5, 5, -1, -1]
    assert t.nic_links[0][:2] == ("PXB", "PXB") and t.nic_links[0][2] == "SYS"
    assert t.gpu_nic_link(2, 2) == "PXB"
    # 256 threads: SMT siblings 128 apart
    assert t.cpu(48).siblings == (48, 176)
    assert t.cpu(48).numa_node == 3 and t.cpu(176).core == 48


def test_gh200_gpu_numa_id_is_a_memory_only_node() -> None:
    mx = parse_topo_m(read("gh200-480gb-aerial.txt"), "gh200")
    assert mx.gpu_numa_id == (1,)
    t = topology_from_smi(read("gh200-480gb-aerial.txt"), "gh200")
    g = t.gpus[0]
    assert (g.numa_node, g.memory_numa_node) == (0, 1)
    assert t.node(1).memory_only and t.node(1).cpus == ()
    assert not t.node(0).memory_only and len(t.node(0).cpus) == 72
    # 0-71 is one range: no SMT pattern, siblings stay unknown
    assert all(c.siblings == () for c in t.cpus)
    assert {n.numa_node for n in t.nics} == {0}


def test_tesla_p4_numa_na_and_tab_separated() -> None:
    mx = parse_topo_m(read("tesla-p4-1gpu-numa-NA.txt"), "p4")
    assert mx.cpu_affinity == (tuple(range(8)),)
    assert mx.numa_affinity == ((),)
    assert mx.gpu_numa_id == (-1,)
    t = topology_from_smi(read("tesla-p4-1gpu-numa-NA.txt"), "p4")
    assert t.gpus[0].numa_node == -1
    assert [n.id for n in t.numa_nodes] == [0] and t.node(0).cpus == tuple(range(8))
    assert any("NUMA node 0" in n for n in t.notes)


def test_h800_noncontiguous_legend_and_bond() -> None:
    mx = parse_topo_m(read("h800-8gpu-NV8-9nic-bond.txt"), "h800")
    assert mx.nics == tuple(f"NIC{i}" for i in range(9))
    assert mx.nic_names == (
        "mlx5_0",
        "mlx5_3",
        "mlx5_4",
        "mlx5_5",
        "mlx5_6",
        "mlx5_7",
        "mlx5_8",
        "mlx5_9",
        "mlx5_bond_0",
    )
    # one PIX NIC per GPU: GPU i <-> NIC i
    assert [mx.nic_links[i][i] for i in range(8)] == ["PIX"] * 8
    t = topology_from_smi(read("h800-8gpu-NV8-9nic-bond.txt"), "h800")
    assert t.nics[8].kind is NicKind.ROCE and t.nics[8].numa_node == 0
    assert t.nics[1].kind is NicKind.INFINIBAND and t.nics[4].numa_node == 1


def test_penny_role_named_nics() -> None:
    t = topology_from_smi(read("h100-8gpu-13nic-mlx5_ib-penny.txt"), "penny")
    kinds = {n.name: n.kind for n in t.nics}
    assert kinds["mlx5_ib3"] is NicKind.INFINIBAND and kinds["mlx5_eth4"] is NicKind.ROCE
    # the 5 Ethernet NICs all sit on NUMA 1
    assert [n.numa_node for n in t.nics if "eth" in n.name] == [1] * 5


def test_live_capture_with_ansi_underline_and_legend_text() -> None:
    text = read("live-h200-vm-topo-m.txt")
    assert "\x1b[4m" in text and "Legend:" in text
    mx = parse_topo_m(text, "live")
    assert mx.cpu_affinity == (tuple(range(16)),) and mx.numa_affinity == ((0,),)
    assert mx.columns == ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def test_old_format_without_numa_columns() -> None:
    mx = parse_topo_m(read("h100-8gpu-2x52c-stas00.txt"), "stas")
    assert mx.columns == ("CPU Affinity", "NUMA Affinity")
    assert mx.gpu_numa_id == (-1,) * 8
    mx = parse_topo_m(read("consumer-2gpu-pcie-PHB.txt"), "c")
    assert mx.cpu_affinity == (tuple(range(12)),) * 2


def test_rtx4090_without_legend_keeps_column_titles() -> None:
    t = topology_from_smi(read("rtx4090-8gpu-2socket-2nic.txt"), "rtx")
    assert [n.name for n in t.nics] == ["NIC0", "NIC1"]
    assert all(n.kind is NicKind.OTHER for n in t.nics)
    # both NICs are PHB to GPU6 on node 1
    assert [n.numa_node for n in t.nics] == [1, 1]
    assert any("NIC Legend" in n for n in t.notes)


# --- SMT inference ---------------------------------------------------------------


def test_smt_aws_p4d_siblings_48_apart() -> None:
    t = topology_from_smi(read("aws-p4d.24xlarge.txt"), "p4d")
    assert t.cpu(0).siblings == (0, 48)
    assert t.cpu(48).siblings == (0, 48)
    assert t.cpu(71).siblings == (23, 71)
    assert t.cpu(24).siblings == (24, 72) and t.cpu(24).numa_node == 1
    assert len({c.core_key for c in t.cpus}) == 48
    assert t.node(0).cpus == tuple(range(24)) + tuple(range(48, 72))


def test_smt_a100_missing_cpu_255_is_its_own_core() -> None:
    t = topology_from_smi(read("a100-sxm4-80gb-8gpu-2numa-4nic.txt"), "a100")
    assert len(t.node(1).cpus) == 127
    assert t.cpu(64).siblings == (64, 192)
    assert t.cpu(126).siblings == (126, 254)
    assert t.cpu(127).siblings == (127,)
    assert t.cpu(0).siblings == (0, 128)
    assert 255 not in {c.id for c in t.cpus}


def test_smt_not_inferred_for_single_range() -> None:
    for name in ("aws-g6e.12xlarge-4xL40S.txt", "consumer-2gpu-nvlink-bridge-NV2.txt"):
        t = topology_from_smi(read(name), name)
        assert all(c.siblings == () for c in t.cpus)
        assert any("SMT siblings unknown" in n for n in t.notes)


def test_smt_not_inferred_for_interleaved_numbering() -> None:
    evens = ",".join(str(i) for i in range(0, 16, 2))
    odds = ",".join(str(i) for i in range(1, 16, 2))
    text = f"\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t{evens}\t0\nGPU1\tSYS\t X \t{odds}\t1\n"
    t = topology_from_smi(text, "interleaved")
    assert t.node(0).cpus == tuple(range(0, 16, 2))
    assert all(c.siblings == () for c in t.cpus)


def test_smt_not_inferred_when_the_gap_is_not_half_the_cpus() -> None:
    # Two ranges per node, but 10 apart on a 28-CPU box (a narrowed affinity), not 14.
    text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t0-3,10-11\t0\nGPU1\tSYS\t X \t16-19,26-27\t1\n"
    t = topology_from_smi(text, "narrowed")
    assert all(c.siblings == () for c in t.cpus)


# --- odd but valid formats -------------------------------------------------------

OLD_SOC = """\
        GPU0    GPU1    mlx5_0  CPU Affinity
GPU0     X      SOC     PHB     0-11,24-35
GPU1    SOC      X      SOC     12-23,36-47
mlx5_0  PHB     SOC      X   \n\

Legend:

  X   = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
"""


def test_old_soc_format_with_nic_columns() -> None:
    mx = parse_topo_m(OLD_SOC, "old")
    assert mx.gpu_links == (("X", "SYS"), ("SYS", "X"))
    assert mx.nics == ("mlx5_0",) and mx.nic_names == ("mlx5_0",)
    assert mx.nic_links == (("PHB",), ("SYS",))
    assert mx.numa_affinity == ((), ()) and mx.columns == ("CPU Affinity",)
    t = topology_from_smi(OLD_SOC, "old")
    assert any("SOC" in n for n in t.notes)
    assert not any("SOC" in n for n in topology_from_smi(read("aws-p4d.24xlarge.txt"), "p4d").notes)
    assert t.nics[0].kind is NicKind.INFINIBAND


def test_merged_cells_split_by_column_count() -> None:
    text = read("h800-8gpu-NV8-9nic-bond.txt")
    merged = text.replace("PIX     NODE    NODE    NODE    SYS", "PIXNODE NODE    NODE    SYS", 1)
    assert merged != text
    assert parse_topo_m(merged, "m") == parse_topo_m(text, "m")


def test_numa_affinity_range_list() -> None:
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t112-127,240-255\t6-7\t\tN/A\n"
    mx = parse_topo_m(text, "range")
    assert mx.numa_affinity == ((6, 7),)
    t = topology_from_smi(text, "range")
    assert t.gpus[0].numa_node == -1
    assert [n.id for n in t.numa_nodes] == [6, 7]
    assert any("several nodes" in n for n in t.notes)


def test_crlf_bom_and_leading_blank_lines() -> None:
    text = "\ufeff\r\n\r\n" + read("aws-p4d.24xlarge.txt").replace("\n", "\r\n")
    assert parse_topo_m(text, "crlf") == parse_topo_m(read("aws-p4d.24xlarge.txt"), "crlf")


# --- malformed inputs ------------------------------------------------------------

P4D = read("aws-p4d.24xlarge.txt")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("\n\n  \n", "empty"),
        ("\x89PNG\r\n\x1a\n\x00\x00\x00IHDR", "binary"),
        (P4D.split("\n", 4)[0] + "\n" + P4D.split("\n")[1], "truncated"),
        (P4D.replace("GPU3\tNV12\tNV12\tNV12\t X \tNV12", "GPU3\tNV12\tNV12\t X \tNV12", 1), "link cells"),
        (P4D.replace("0-23,48-71\t0\t\tN/A", "0-23,48-71\t0", 1), "affinity values"),
        (P4D.replace("GPU2\tNV12", "GPU9\tNV12", 1), "row of GPU2"),
        (P4D.replace("NV12", "NVL", 1), "bad link code"),
        (P4D.replace("0-23,48-71", "23-0", 1), "CPU Affinity"),
        (P4D.replace("\t0\t\tN/A", "\tzero\t\tN/A", 1), "NUMA Affinity"),
        (P4D.replace("\t0\t\tN/A", "\t0\t\t-3", 1), "GPU NUMA ID"),
        ("CPU Affinity\nGPU0 X 0-3\n", "GPU0"),
        ("\tGPU1\tCPU Affinity\nGPU1\t X \t0-3\n", "GPU0"),
        ("\tGPU0\tNUMA Affinity\nGPU0\t X \t0\n", "CPU Affinity"),
        ("\tGPU0\tCPU Affinity\tfoo\nGPU0\t X \t0-3\t1\n", "after the affinity columns"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\tNV1\t X \t0-3\nGPU1\tX\tNV1\t0-3\n", "not 'X'"),
    ],
)
def test_malformed_input_raises_topology_error(text: str, fragment: str) -> None:
    with pytest.raises(TopologyError) as e:
        parse_topo_m(text, "bad.txt")
    msg = str(e.value)
    assert "bad.txt" in msg
    assert fragment in msg
    assert "expected" in msg
    assert isinstance(e.value, NumarunError)


def test_error_names_the_line() -> None:
    with pytest.raises(TopologyError, match="line 4"):
        lines = P4D.split("\n")
        lines[3] = lines[3].replace("NV12", "NVL", 1)
        parse_topo_m("\n".join(lines), "bad.txt")


def test_binary_bytes_decoded_as_text_rejected() -> None:
    blob = bytes(range(256)).decode("latin-1")
    with pytest.raises(TopologyError, match="binary"):
        parse_topo_m(blob, "blob")


def test_nic_kind_rules() -> None:
    assert nic_kind("mlx5_0") is NicKind.INFINIBAND
    assert nic_kind("mlx5_eth2") is NicKind.ROCE
    assert nic_kind("mlx5_bond_0") is NicKind.ROCE
    assert nic_kind("qib0") is NicKind.INFINIBAND
    assert nic_kind("efa0") is NicKind.OTHER
