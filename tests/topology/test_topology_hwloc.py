"""hwloc XML reader: counts checked against the XML itself, read here with ElementTree."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from trees import HWLOC_XML_DIR, SYSFS_DIR

from numarun.errors import TopologyError
from numarun.topology.hwloc_xml import parse_hwloc_set, read_hwloc_xml
from numarun.topology.model import NicKind, Topology

XMLS = sorted(HWLOC_XML_DIR.glob("*.xml")) + sorted(SYSFS_DIR.glob("*.xml"))


def _objects(path: Path, typ: str) -> list[ET.Element]:
    return [o for o in ET.parse(path).getroot().iter("object") if o.get("type") == typ]


@pytest.mark.parametrize("path", XMLS, ids=[p.stem for p in XMLS])
def test_counts_from_the_xml(path: Path) -> None:
    t = read_hwloc_xml(path.read_text(), str(path))
    pus = sorted(int(o.get("os_index", "")) for o in _objects(path, "PU"))
    # PUs hwloc hid (disallowed/offline) are kept with core -1; the PU objects are the rest.
    assert sorted(c.id for c in t.cpus if c.core >= 0) == pus
    assert sorted(n.id for n in t.numa_nodes) == sorted(int(o.get("os_index", "")) for o in _objects(path, "NUMANode"))
    assert len({c.package for c in t.cpus if c.package >= 0}) == len(_objects(path, "Package"))
    assert len({(c.package, c.die, c.core_key) for c in t.cpus if c.core >= 0}) == len(_objects(path, "Core"))
    # Every PU is in the cpuset of its NUMA node, as the XML says.
    for n in t.numa_nodes:
        el = next(o for o in _objects(path, "NUMANode") if int(o.get("os_index", "")) == n.id)
        assert n.cpus == parse_hwloc_set(el.get("complete_cpuset", el.get("cpuset", "")))
        assert n.memory_bytes == int(el.get("local_memory", "0"))
    assert Topology.from_json(t.to_json()) == t


def test_gpus_with_names_and_uuids() -> None:
    path = HWLOC_XML_DIR / "nvidiaDGX2.xml"
    t = read_hwloc_xml(path.read_text(), str(path))
    nvml = [o for o in _objects(path, "OSDev") if o.get("name", "").startswith("nvml")]
    assert len(t.gpus) == len(nvml) == 16
    uuids = {i.get("value") for o in nvml for i in o.findall("info") if i.get("name") == "NVIDIAUUID"}
    assert {g.uuid for g in t.gpus} == uuids
    assert all(g.name.startswith("Tesla V100") for g in t.gpus)
    assert [g.index for g in t.gpus] == list(range(16))
    assert all(len(g.pci_path) >= 2 and g.pci_path[-1] == g.pci_bus_id for g in t.gpus)
    # Two GPUs behind the same PLX switch share their PCI path down to it.
    assert t.gpus[0].pci_path[:4] == t.gpus[1].pci_path[:4]


def test_interleaved_numbering_and_rdma_netdevs() -> None:
    path = HWLOC_XML_DIR / "24em64t-2n6c2t-pci.xml"
    t = read_hwloc_xml(path.read_text(), str(path))
    assert t.node(0).cpus == tuple(range(0, 24, 2))  # package 0 = even PUs (cpuset 0x555555)
    mlx = [n for n in t.nics if n.name == "mlx4_0"]
    assert mlx and mlx[0].kind is NicKind.INFINIBAND and "ib0" in mlx[0].netdevs
    assert "ib0" not in {n.name for n in t.nics}
    # The on-board ATI ES1000 VGA is not a GPU; the three NVIDIA cards are.
    assert {g.vendor for g in t.gpus} == {"nvidia"} and len(t.gpus) == 3


def test_disallowed_pus_and_nodes() -> None:
    path = HWLOC_XML_DIR / "irregulargroups-disallowed.xml"
    t = read_hwloc_xml(path.read_text(), str(path))
    top = ET.parse(path).getroot().find("object")
    assert top is not None
    assert t.usable_cpus == parse_hwloc_set(top.get("allowed_cpuset", ""))
    assert t.allowed_mems == parse_hwloc_set(top.get("allowed_nodeset", ""))
    assert len(t.usable_cpus) < len(t.cpus)


def test_cgroup_xml_keeps_hidden_cpus_as_not_allowed() -> None:
    path = SYSFS_DIR / "32amd64-4s2n4c-cgroup2.xml"
    t = read_hwloc_xml(path.read_text(), str(path))
    top = ET.parse(path).getroot().find("object")
    assert top is not None
    assert [c.id for c in t.cpus] == list(parse_hwloc_set(top.get("complete_cpuset", "")))
    assert t.usable_cpus == parse_hwloc_set(top.get("allowed_cpuset", ""))


def test_numa_latency_matrix() -> None:
    path = HWLOC_XML_DIR / "192em64t-24n8c2t.xml"
    t = read_hwloc_xml(path.read_text(), str(path))
    assert len(t.numa_nodes) == 24
    for n in t.numa_nodes:
        assert len(n.distances) == 24 and n.distances[n.id] == 10


def test_compact_zero_words_in_sets() -> None:
    assert parse_hwloc_set("0x00000001,,0x00000001") == (0, 64)
    assert parse_hwloc_set("0xf...f,0x00000003") == (0, 1)
    with pytest.raises(TopologyError):
        parse_hwloc_set("0xzz")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("<topology><object type='Machine'/></topology>", ["1.x"]),
        ("<topology version='2.0'>", ["not XML"]),
        ("<lstopo version='2.0'/>", ["<lstopo>"]),
        ("<topology version='2.0'></topology>", ["no <object>"]),
        (
            "<topology version='2.0'><object type='Machine' cpuset='0x1'><object type='PU'/></object></topology>",
            ["PU without os_index"],
        ),
    ],
)
def test_unsupported_or_broken_xml(text: str, words: list[str]) -> None:
    with pytest.raises(TopologyError) as ei:
        read_hwloc_xml(text, origin="x.xml")
    for w in words:
        assert w in str(ei.value)
    assert "x.xml" in str(ei.value) and "lstopo" in str(ei.value)


def _hwloc_form(ids: set[int], *, compact: bool) -> str:
    """Write a set the way hwloc does: 32-bit words, most significant first; with
    ``compact`` the zero words between others are left empty."""
    value = sum(1 << i for i in ids)
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if not value:
            break
    out = [f"0x{w:08x}" for w in reversed(words)]
    if compact:
        out = [o if (o != "0x00000000" or k in (0, len(out) - 1)) else "" for k, o in enumerate(out)]
    return ",".join(out)


@given(st.sets(st.integers(min_value=0, max_value=700), max_size=60), st.booleans())
def test_hwloc_set_round_trip(ids: set[int], compact: bool) -> None:
    assert parse_hwloc_set(_hwloc_form(ids, compact=compact)) == tuple(sorted(ids))
