"""Discovery on real recorded /sys + /proc trees, checked against hwloc's own expected output.

Every ``hwloc-linux-sysfs/*.tar.bz2`` has a ``.test`` descriptor naming the ``lstopo`` output
hwloc expects for it (``.console`` text or ``.xml``). The counts we compare against are parsed
from those files here, never written down by hand.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from trees import SYSFS_DIR, extract_tree, sysfs_tarballs

from numarun.topology.hwloc_xml import parse_hwloc_set
from numarun.topology.model import NicKind, Topology
from numarun.topology.sysfs import read_sysfs

# --- hwloc's expected outputs -------------------------------------------------------


def _descriptors() -> list[dict[str, object]]:
    out = []
    for test in sorted(SYSFS_DIR.glob("*.test")):
        d: dict[str, object] = {"env": []}
        for line in test.read_text().splitlines():
            m = re.match(r"^(source|target|env):\s*(.*)$", line)
            if m:
                if m.group(1) == "env":
                    d["env"].append(m.group(2))  # type: ignore[union-attr]
                else:
                    d[m.group(1)] = m.group(2).strip()
        out.append(d)
    return out


def expected_target(tarball: Path) -> Path:
    """The expected output to compare with. numarun keeps GPU-memory NUMA nodes (they are
    real allocation targets), so where hwloc has a variant run with
    HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1 (``-kept.console``) that one is the right reference."""
    cands = [d for d in _descriptors() if d.get("source") == tarball.name]
    assert cands, f"no .test descriptor for {tarball.name}"
    kept = [d for d in cands if any("HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1" in e for e in d["env"])]  # type: ignore[union-attr]
    return SYSFS_DIR / str((kept or cands)[0]["target"])


def console_counts(path: Path) -> dict[str, object]:
    nodes, pus = [], []
    packages = cores = 0
    for line in path.read_text().splitlines():
        s = line.strip()
        if re.match(r"^NUMANode\b", s):
            nodes.append(int(re.search(r"P#(\d+)", s).group(1)))  # type: ignore[union-attr]
        elif s.startswith("Package L#"):
            packages += 1
        elif s.startswith("Core L#"):
            cores += 1
        elif s.startswith("PU L#"):
            pus.append(int(re.search(r"P#(\d+)", s).group(1)))  # type: ignore[union-attr]
    return {"nodes": sorted(nodes), "packages": packages, "cores": cores, "pus": sorted(pus)}


def xml_counts(path: Path) -> dict[str, object]:
    root = ET.parse(path).getroot()
    objs = list(root.iter("object"))
    machine = objs[0]
    return {
        "nodes": sorted(int(o.get("os_index", "-1")) for o in objs if o.get("type") == "NUMANode"),
        "packages": sum(o.get("type") == "Package" for o in objs),
        "cores": sum(o.get("type") == "Core" for o in objs),
        "pus": sorted(int(o.get("os_index", "-1")) for o in objs if o.get("type") == "PU"),
        "all_cpus": parse_hwloc_set(machine.get("complete_cpuset", "")),
        "all_nodes": parse_hwloc_set(machine.get("complete_nodeset", "")),
        "allowed_cpus": parse_hwloc_set(machine.get("allowed_cpuset", "")),
        "allowed_nodes": parse_hwloc_set(machine.get("allowed_nodeset", "")),
    }


def our_counts(t: Topology) -> dict[str, object]:
    """What lstopo shows by default: online, allowed PUs; nodes this process may use; a
    package when it holds a usable PU or an allowed memory node."""
    usable = [c for c in t.cpus if c.online and c.allowed]
    mems = set(t.allowed_mems or [n.id for n in t.numa_nodes])
    pkgs = {c.package for c in usable}
    for n in t.numa_nodes:
        if n.id in mems:
            pkgs.update(t.cpu(c).package for c in n.cpus if t.cpu(c).package >= 0)
    return {
        "nodes": sorted(mems),
        "packages": len(pkgs),
        "cores": len({(c.package, c.die, c.core_key) for c in usable}),
        "pus": sorted(c.id for c in usable),
    }


TARBALLS = sysfs_tarballs()


def test_every_hwloc_tarball_is_covered() -> None:
    assert len(TARBALLS) == len({d["source"] for d in _descriptors()})


@pytest.mark.parametrize("tarball", TARBALLS, ids=[t.name.removesuffix(".tar.bz2") for t in TARBALLS])
def test_counts_match_hwloc_expected_output(tarball: Path) -> None:
    t = read_sysfs(extract_tree(tarball))
    target = expected_target(tarball)
    ours = our_counts(t)
    if target.suffix == ".xml":
        exp = xml_counts(target)
        # The XML also records what hwloc hid: the full CPU and node sets.
        assert sorted(c.id for c in t.cpus) == list(exp["all_cpus"])  # type: ignore[arg-type]
        assert sorted(n.id for n in t.numa_nodes) == list(exp["all_nodes"])  # type: ignore[arg-type]
        assert ours["pus"] == list(exp["allowed_cpus"])  # type: ignore[arg-type]
        assert ours["nodes"] == list(exp["allowed_nodes"])  # type: ignore[arg-type]
    else:
        exp = console_counts(target)
    for key in ("nodes", "packages", "cores", "pus"):
        assert ours[key] == exp[key], f"{key}: ours {ours[key]} vs hwloc {exp[key]} ({target.name})"


@pytest.mark.parametrize("tarball", TARBALLS, ids=[t.name.removesuffix(".tar.bz2") for t in TARBALLS])
def test_json_round_trip(tarball: Path) -> None:
    t = read_sysfs(extract_tree(tarball))
    assert Topology.from_json(t.to_json()) == t


# --- the hard cases, one by one ----------------------------------------------------


def test_offline_cpu0_and_node0(sysfs_tree) -> None:
    # The tree's cpu/online reads "4-20": CPUs 0-3 and 21-23 are offline (24 CPUs in all),
    # and NUMA node 0 is offline (no node0 directory; cpu0 still links to it).
    root = sysfs_tree("offline-cpu0-node0")
    assert (root / "sys/devices/system/cpu/online").read_text().strip() == "4-20"
    t = read_sysfs(root)
    offline = {c.id for c in t.cpus if not c.online}
    assert offline == {0, 1, 2, 3, 21, 22, 23}
    assert 0 in [c.id for c in t.cpus]  # kept, not dropped
    cpu0 = t.cpu(0)
    assert (cpu0.package, cpu0.core, cpu0.numa_node) == (-1, -1, -1)
    assert [n.id for n in t.numa_nodes] == [1]
    # The distance file still has node 0's column; it is realigned to the nodes that exist.
    assert t.numa_nodes[0].distances == (10,)
    assert t.cpu(21).numa_node == 1 and not t.cpu(21).online


def test_sparse_numa_ids(sysfs_tree) -> None:
    t = read_sysfs(sysfs_tree("48amd64-4pa2n6c-sparse"))
    ids = [n.id for n in t.numa_nodes]
    assert ids == [0, 1, 2, 33, 34, 45, 72, 73]
    for n in t.numa_nodes:
        assert len(n.distances) == len(ids)
        assert n.distances[ids.index(n.id)] == 10
        assert all(t.cpu(c).numa_node == n.id for c in n.cpus)
    assert t.node_distance(33, 34) == t.node(33).distances[ids.index(34)]


def test_cgroup_v2_restricts_allowed_cpus_and_mems(sysfs_tree) -> None:
    root = sysfs_tree("32amd64-4s2n4c-cgroup2")
    eff = root / "cgroup/unified/uid_2008/job_15389/step_0"
    t = read_sysfs(root)
    assert len(t.cpus) == 32
    assert t.usable_cpus == tuple(range(6)) == tuple(int(x) for x in range(6))
    assert (eff / "cpuset.cpus.effective").read_text().strip() == "0-5"
    assert t.allowed_mems == (0, 1, 2, 3, 4, 5)
    assert all(c.online for c in t.cpus)
    assert not t.cpu(6).allowed


def test_gpu_memory_numa_nodes(sysfs_tree) -> None:
    t = read_sysfs(sysfs_tree("nvidiagpunumanodes"))
    gpu_nodes = [n for n in t.numa_nodes if n.memory_only]
    assert [n.id for n in gpu_nodes] == [250, 251, 252, 253, 254, 255]
    assert all(n.cpus == () and n.memory_bytes > 0 for n in gpu_nodes)
    assert [n.id for n in t.numa_nodes if not n.memory_only] == [0, 8]
    # hwloc's -kept output says which GPU's memory each node is.
    kept = (SYSFS_DIR / "nvidiagpunumanodes-kept.console").read_text()
    expected = {bus: int(node) for node, bus in re.findall(r"P#(\d+)[^\n]*PCIBusID=([0-9a-f:.]+)", kept)}
    assert len(expected) == 6
    assert t.gpu_source == "sysfs"
    assert {g.pci_bus_id: g.memory_numa_node for g in t.gpus} == expected
    assert all(g.vendor == "nvidia" for g in t.gpus)
    assert [g.index for g in t.gpus] == list(range(6))


def test_32bit_pci_domain_kept(sysfs_tree) -> None:
    from numarun.topology.sysfs import _pci_chain, _Reader

    root = sysfs_tree("2pa-pcidomain32bits")
    r = _Reader(root)
    assert _pci_chain(r, root / "sys/bus/pci/devices/10000:00:04.0") == ("10000:00:04.0",)
    t = read_sysfs(root)
    assert [n.name for n in t.nics] == ["ens3"]  # virtio NIC behind 0000:00:03.0
    assert t.nics[0].pci_bus_id == "0000:00:03.0"


def _expected_nics(xml: Path) -> set[tuple[str, str]]:
    """(name, PCI bus id) of hwloc's network and OpenFabrics OSDevs under a PCI device."""
    out = set()

    def walk(el: ET.Element, bus: str) -> None:
        if el.get("type") == "PCIDev":
            bus = el.get("pci_busid", bus)
        if el.get("type") == "OSDev" and int(el.get("osdev_type", "0")) & 16 and bus:
            out.add((el.get("name", ""), bus))
        for ch in el.findall("object"):
            walk(ch, bus)

    walk(ET.parse(xml).getroot(), "")
    return out


@pytest.mark.parametrize("name", ["32em64t-2n8c+dax+nvme+mic+dimms", "40intel64-2g2n4c+pcilocality"])
def test_nics_match_hwloc(sysfs_tree, name: str) -> None:
    t = read_sysfs(sysfs_tree(name))
    ours = set()
    for n in t.nics:
        ours.add((n.name, n.pci_bus_id))
        if n.kind in (NicKind.INFINIBAND, NicKind.ROCE):
            ours.update((d, n.pci_bus_id) for d in n.netdevs)
    assert ours == _expected_nics(SYSFS_DIR / f"{name}.xml")
    rdma = [n for n in t.nics if n.kind is NicKind.INFINIBAND]
    assert len(rdma) == 1 and rdma[0].netdevs == ("ib0",) and rdma[0].speed_mbps > 0
    # ib0 belongs to the RDMA device; virtual interfaces (lo, br0, VLANs) are not NICs.
    assert not {"ib0", "lo", "br0", "eth0.1015", "mic0"} & {n.name for n in t.nics}


def test_live_h200_capture(h200_tree: Path) -> None:
    t = read_sysfs(h200_tree)
    assert len(t.numa_nodes) == 1 and t.numa_nodes[0].memory_bytes > 0
    assert len(t.cpus) == 16 and t.usable_cpus == tuple(range(16))
    assert t.allowed_mems == (0,)
    assert (h200_tree / "sys/bus/pci/devices/0000:00:06.0").is_dir()
    assert [g.pci_bus_id for g in t.gpus] == ["0000:00:06.0"]
    g = t.gpus[0]
    assert g.vendor == "nvidia" and g.numa_node == -1 and g.cpu_affinity == tuple(range(16))
    assert t.gpu_source == "sysfs"
    # eth0 is virtio behind 0000:00:03.0 (the symlink is recorded in links.json); ifb*/lo are virtual.
    assert [(n.name, n.pci_bus_id, n.kind) for n in t.nics] == [("eth0", "0000:00:03.0", NicKind.ETHERNET)]
    assert Topology.from_json(t.to_json()) == t


def test_live_machine_reads() -> None:
    t = read_sysfs(Path("/"))
    assert t.source == "live"
    assert t.cpus and t.numa_nodes
    import os

    assert set(t.usable_cpus) <= set(os.sched_getaffinity(0))
    assert set(t.usable_cpus) & set(os.sched_getaffinity(0))
    assert Topology.from_json(t.to_json()) == t
