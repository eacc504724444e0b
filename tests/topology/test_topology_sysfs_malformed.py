"""Broken trees: a copy of the real H200 VM capture with one file damaged per test.

Each case must end in a TopologyError that names the file and the expected form, or in
the default documented in ``numarun.topology.sysfs`` (recorded in ``Topology.notes``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from numarun.errors import NumarunError, TopologyError
from numarun.topology.sysfs import read_sysfs

NODE0 = "sys/devices/system/node/node0"
CPU3 = "sys/devices/system/cpu/cpu3"
GPU = "sys/bus/pci/devices/0000:00:06.0"


@pytest.fixture()
def tree(h200_tree: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "root"
    shutil.copytree(h200_tree, dest, symlinks=True)
    return dest


def _write(root: Path, rel: str, data: bytes | str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.mark.parametrize(
    ("rel", "data", "words"),
    [
        (f"{NODE0}/cpulist", "0-\n", ["cpulist", "'0-'", "expected"]),  # truncated
        (f"{NODE0}/cpulist", "3-1\n", ["cpulist", "'3-1'", "ascending"]),
        (f"{NODE0}/cpulist", b"\x7fELF\x00\x01\x02garbage", ["cpulist", "binary"]),
        (f"{NODE0}/cpulist", b"\xff\xfe0-15", ["cpulist", "not text"]),
        (f"{CPU3}/topology/core_id", "three\n", ["core_id", "'three'", "integer"]),
        (f"{CPU3}/topology/physical_package_id", "", ["physical_package_id", "integer"]),  # empty
        (f"{CPU3}/topology/thread_siblings_list", "3-", ["thread_siblings_list", "'3-'"]),
        ("proc/self/status", "Name:\tx\nCpus_allowed_list:\t0-a\n", ["status", "Cpus_allowed_list", "'0-a'"]),
        (f"{GPU}/class", b"\x00\x01\x02\x03", ["class", "binary"]),
    ],
    ids=[
        "truncated",
        "reversed",
        "binary",
        "not-utf8",
        "core-id-word",
        "empty-package",
        "siblings",
        "status",
        "pci-class",
    ],
)
def test_bad_file_is_a_clear_error(tree: Path, rel: str, data: bytes | str, words: list[str]) -> None:
    _write(tree, rel, data)
    with pytest.raises(TopologyError) as ei:
        read_sysfs(tree)
    msg = str(ei.value)
    assert isinstance(ei.value, NumarunError)
    for w in words:
        assert w in msg, msg
    assert "\n" not in msg


def test_missing_cpulist_is_an_error(tree: Path) -> None:
    (tree / NODE0 / "cpulist").unlink()
    (tree / NODE0 / "cpumap").unlink()
    with pytest.raises(TopologyError, match="node0/cpulist"):
        read_sysfs(tree)


def test_cpumap_used_when_cpulist_missing(tree: Path) -> None:
    (tree / NODE0 / "cpulist").unlink()
    t = read_sysfs(tree)
    assert t.numa_nodes[0].cpus == tuple(range(16))


def test_missing_core_id_is_an_error(tree: Path) -> None:
    (tree / CPU3 / "topology/core_id").unlink()
    with pytest.raises(TopologyError, match="cpu3/topology/core_id"):
        read_sysfs(tree)


def test_missing_cpu_dir_is_an_error(tree: Path) -> None:
    shutil.rmtree(tree / "sys/devices/system/cpu")
    with pytest.raises(TopologyError, match="sys/devices/system/cpu"):
        read_sysfs(tree)


def test_empty_cpulist_is_a_cpu_less_node(tree: Path) -> None:
    _write(tree, f"{NODE0}/cpulist", "\n")
    t = read_sysfs(tree)
    assert t.numa_nodes[0].memory_only and t.numa_nodes[0].cpus == ()
    assert all(c.numa_node == -1 for c in t.cpus)


def test_missing_node_dir_gives_one_node(tree: Path) -> None:
    shutil.rmtree(tree / "sys/devices/system/node")
    t = read_sysfs(tree)
    assert [n.id for n in t.numa_nodes] == [0]
    assert t.numa_nodes[0].cpus == tuple(range(16))
    assert t.numa_nodes[0].memory_bytes > 0  # from proc/meminfo
    assert any("sys/devices/system/node" in n for n in t.notes)


def test_missing_topology_dir_means_offline(tree: Path) -> None:
    shutil.rmtree(tree / CPU3 / "topology")
    t = read_sysfs(tree)
    c = t.cpu(3)
    assert not c.online and c.package == -1 and c.numa_node == 0
    assert 3 not in t.usable_cpus and len(t.usable_cpus) == 15
    assert any("cpu3" in n for n in t.notes)


@pytest.mark.parametrize("content", ["", "Node 0 MemTotal: lots\n", b"\x01\x02\x03".decode()])
def test_bad_meminfo_defaults_to_zero(tree: Path, content: str) -> None:
    _write(tree, f"{NODE0}/meminfo", content)
    t = read_sysfs(tree)
    assert t.numa_nodes[0].memory_bytes == 0
    assert any("memory" in n for n in t.notes)


@pytest.mark.parametrize("content", ["", "10 x\n", "10 20 30\n"])
def test_bad_distance_defaults_to_unknown(tree: Path, content: str) -> None:
    _write(tree, f"{NODE0}/distance", content)
    t = read_sysfs(tree)
    assert t.numa_nodes[0].distances == ()
    assert any("distance" in n for n in t.notes)


def test_missing_status_allows_all(tree: Path) -> None:
    (tree / "proc/self/status").unlink()
    t = read_sysfs(tree)
    assert t.usable_cpus == tuple(range(16))
    assert any("Cpus_allowed_list" in n for n in t.notes)


def test_status_restricts_cpus(tree: Path) -> None:
    _write(tree, "proc/self/status", "Name:\tx\nCpus_allowed_list:\t2-5\nMems_allowed_list:\t0\n")
    t = read_sysfs(tree)
    assert t.usable_cpus == (2, 3, 4, 5)
    assert not t.cpu(0).allowed and t.cpu(0).online


def test_cgroup_narrows_status(tree: Path) -> None:
    _write(tree, "sys/fs/cgroup/cpuset.cpus.effective", "4-7\n")
    t = read_sysfs(tree)
    assert t.usable_cpus == (4, 5, 6, 7)


@pytest.mark.parametrize("content", ["garbage\n", "-1\n", ""])
def test_bad_pci_numa_node_is_unknown(tree: Path, content: str) -> None:
    _write(tree, f"{GPU}/numa_node", content)
    t = read_sysfs(tree)
    assert t.gpus[0].numa_node == -1


def test_pci_numa_node_read(tree: Path) -> None:
    _write(tree, f"{GPU}/numa_node", "0\n")
    assert read_sysfs(tree).gpus[0].numa_node == 0


@pytest.mark.parametrize("content", ["-1\n", "fast\n", ""])
def test_bad_nic_speed_is_zero(tree: Path, content: str) -> None:
    _write(tree, "sys/class/net/eth0/speed", content)
    t = read_sysfs(tree)
    assert t.nics[0].speed_mbps == 0


def test_nic_speed_read(tree: Path) -> None:
    _write(tree, "sys/class/net/eth0/speed", "25000\n")
    assert read_sysfs(tree).nics[0].speed_mbps == 25000


def test_bmc_vga_is_not_a_gpu(tree: Path) -> None:
    # An ASPEED AST2500 (vendor 0x1a03, VGA class) as found on most server boards.
    bmc = "sys/bus/pci/devices/0000:00:07.0"
    _write(tree, f"{bmc}/vendor", "0x1a03\n")
    _write(tree, f"{bmc}/device", "0x2000\n")
    _write(tree, f"{bmc}/class", "0x030000\n")
    amd = "sys/bus/pci/devices/0000:00:08.0"
    _write(tree, f"{amd}/vendor", "0x1002\n")
    _write(tree, f"{amd}/device", "0x740f\n")
    _write(tree, f"{amd}/class", "0x038000\n")
    # An ATI ES1000: AMD's vendor id and the VGA class, but an on-board chip (the rule hwloc's reader shares)
    es1000 = "sys/bus/pci/devices/0000:00:09.0"
    _write(tree, f"{es1000}/vendor", "0x1002\n")
    _write(tree, f"{es1000}/device", "0x515e\n")
    _write(tree, f"{es1000}/class", "0x030000\n")
    t = read_sysfs(tree)
    assert [(g.pci_bus_id, g.vendor) for g in t.gpus] == [("0000:00:06.0", "nvidia"), ("0000:00:08.0", "amd")]


def test_trailing_nul_is_accepted(tree: Path) -> None:
    # hwloc's captures end some files with a NUL byte (the Kunpeng tree does).
    _write(tree, f"{NODE0}/cpulist", b"0-15\n\x00")
    assert read_sysfs(tree).numa_nodes[0].cpus == tuple(range(16))


def test_symlink_loop_is_an_error(tree: Path) -> None:
    net = tree / "sys/class/net/eth0"
    shutil.rmtree(net)
    net.symlink_to("eth0")  # points at itself
    with pytest.raises(TopologyError, match="symlink loop"):
        read_sysfs(tree)
