"""The topology model (numarun.topology.model) round-trips through JSON exactly and rejects malformed snapshots
clearly."""

import pytest

from numarun.errors import TopologyError
from numarun.topology.model import Cpu, Gpu, Nic, NicKind, NumaNode, Topology, link_rank, normalize_bus_id


def small_topology() -> Topology:
    return Topology(
        hostname="h",
        numa_nodes=(NumaNode(0, (0, 1, 2, 3), 1 << 30, (10, 21)), NumaNode(1, (), 1 << 34, (21, 10), memory_only=True)),
        cpus=tuple(Cpu(i, 0, i // 2, numa_node=0, siblings=(i - i % 2, i - i % 2 + 1), llc=0) for i in range(4)),
        gpus=(Gpu(0, "0000:18:00.0", 0, "H200", "GPU-1", memory_numa_node=1, cpu_affinity=(0, 1, 2, 3)),),
        nics=(Nic("mlx5_0", "0000:19:00.0", 0, NicKind.INFINIBAND, ("ib0",), 400000),),
        gpu_links=(("X",),),
        nic_links=(("PIX",),),
        allowed_mems=(0, 1),
        source="test",
    )


def test_topology_round_trip_exact():
    t = small_topology()
    again = Topology.from_json(t.to_json())
    assert again == t
    assert again.to_json() == t.to_json()


def test_topology_lookups():
    t = small_topology()
    assert t.usable_cpus == (0, 1, 2, 3)
    assert t.node_distance(0, 1) == 21
    assert t.cpu(3).core_key == (2, 3)
    assert t.gpu_nic_link(0, 0) == "PIX"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"schema_version": 99}', "schema_version 99"),
        ('{"schema_version": 1, "hostname": "h", "numa_nodes": "x", "cpus": []}', "numa_nodes"),
        ('{"schema_version": 1, "hostname": "h", "cpus": []}', "missing key 'numa_nodes'"),
    ],
)
def test_topology_bad_snapshot(text, fragment):
    with pytest.raises(TopologyError) as e:
        Topology.from_json(text, "snap.json")
    assert "snap.json" in str(e.value) and fragment in str(e.value)


def test_topology_snapshot_bytes_not_utf8():
    # json.loads decodes bytes itself; its UnicodeDecodeError carries no .msg/.lineno
    with pytest.raises(TopologyError) as e:
        Topology.from_json(b'{"hostname": "\xc3"}', "snap.json")  # type: ignore[arg-type]
    assert "snap.json" in str(e.value) and "not UTF-8" in str(e.value)


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("18:00.0", "0000:18:00.0"),
        ("0000:3B:00.1", "0000:3b:00.1"),
        ("10000:00:04.0", "10000:00:04.0"),
    ],
)
def test_normalize_bus_id(raw, norm):
    assert normalize_bus_id(raw) == norm


def test_normalize_bus_id_rejects():
    with pytest.raises(TopologyError):
        normalize_bus_id("GPU0")


def test_link_rank_order():
    codes = ["X", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS", ""]
    assert [link_rank(c) for c in codes] == sorted(link_rank(c) for c in codes)
    assert link_rank("SOC") == link_rank("SYS")
