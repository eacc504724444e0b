"""The hardware rules the readers share (numarun.topology.pci, numarun.topology.procfs), and the
readers keeping to them: the GPU rule, the PCI bus order, the /proc status format."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import FIXTURES

from numarun.topology.hwloc_xml import read_hwloc_xml
from numarun.topology.model import Gpu
from numarun.topology.pci import bus_sort_key, gpu_vendor, is_onboard_vga, pci_order
from numarun.topology.procfs import cgroup2_mount, cgroup_dirs, cgroup_read, own_cgroup2_path, status_field
from numarun.worker import affinity


@pytest.mark.parametrize(
    ("vendor", "cls", "device", "expected"),
    [
        (0x10DE, 0x0302, 0x2335, "nvidia"),  # H200, 3D controller
        (0x10DE, 0x0300, 0x2684, "nvidia"),  # RTX 4090, VGA
        (0x10DE, 0x0380, 0x1234, None),  # "other display" counts for AMD only
        (0x10DE, 0x0403, 0x22BA, None),  # the GPU's HDMI audio function
        (0x10DE, 0x0680, 0x22A3, None),  # NVSwitch bridge
        (0x1002, 0x0380, 0x740F, "amd"),  # Instinct MI210
        (0x1002, 0x0300, 0x515E, None),  # ATI ES1000: on-board server VGA with AMD's id
        (0x1002, 0x0300, 0x5159, None),  # ATI RN50
        (0x1A03, 0x0300, 0x2000, None),  # ASPEED BMC VGA
        (0x102B, 0x0300, 0x0522, None),  # Matrox G200e
        (None, 0x0302, None, None),  # no vendor file
    ],
)
def test_gpu_rule(vendor: int | None, cls: int, device: int | None, expected: str | None) -> None:
    got = gpu_vendor(vendor, cls)
    if got is not None and is_onboard_vga(vendor, device):
        got = None
    assert got == expected


def test_bus_order_is_numeric_over_every_bus_id_form() -> None:
    ids = ["0000:b7:00.0", "18:00.0", "0000:18:00.1", "10000:00:04.0", "ffff:00:00.0", "00000000:1a:00.0"]
    ordered = sorted(ids, key=bus_sort_key)
    # 32-bit domains sort after 16-bit ones (as strings "10000" would sort before "ffff")
    assert ordered == ["18:00.0", "0000:18:00.1", "00000000:1a:00.0", "0000:b7:00.0", "ffff:00:00.0", "10000:00:04.0"]
    assert bus_sort_key("0000:18:00.0") == bus_sort_key("18:00.0") == (0, 0x18, 0, 0)


def test_pci_order_by_index_when_a_bus_id_is_unknown() -> None:
    a = Gpu(index=1, pci_bus_id="0000:18:00.0", numa_node=0)
    b = Gpu(index=0, pci_bus_id="0000:b7:00.0", numa_node=0)
    assert pci_order((b, a)) == (a, b)
    assert pci_order((Gpu(index=1, pci_bus_id="", numa_node=0), b)) == (b, Gpu(index=1, pci_bus_id="", numa_node=0))


def test_hwloc_reader_keeps_the_onboard_vga_out_and_numbers_in_bus_order() -> None:
    path = FIXTURES / "hwloc" / "24em64t-2n6c2t-pci.xml"
    t = read_hwloc_xml(path.read_text(), str(path))
    assert [g.index for g in t.gpus] == list(range(len(t.gpus)))
    assert list(t.gpus) == sorted(t.gpus, key=lambda g: bus_sort_key(g.pci_bus_id))
    assert all(g.vendor == "nvidia" for g in t.gpus)


STATUS = (
    "Name:\tpython\nCpus_allowed:\tff\nCpus_allowed_list:\t0-7\nMems_allowed_list:\t0\nvoluntary_ctxt_switches:\t3\n"
)


def test_status_field() -> None:
    assert status_field(STATUS, "Cpus_allowed_list") == "0-7"
    assert status_field(STATUS, "Cpus_allowed") == "ff"  # the whole key, not a prefix of a longer one
    assert status_field(STATUS, "Mems_allowed_list") == "0"
    assert status_field(STATUS, "Mems_allowed") is None
    assert status_field("", "Cpus_allowed_list") is None


def test_cgroup2_mount_and_own_path() -> None:
    """One reader of this process's cgroup v2 for discovery (a recorded or live tree) and the launcher's cage."""
    hybrid = (
        "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nsdelegate 0 0\ncgroup2 /other cgroup2 rw 0 0\n"
    )
    assert cgroup2_mount(hybrid) == "/sys/fs/cgroup/unified"  # the first one
    assert cgroup2_mount("proc /proc proc rw 0 0\n") is None
    assert (
        own_cgroup2_path("12:cpuset:/slurm/uid_0/job_5\n0::/user.slice/session-1.scope\n")
        == "/user.slice/session-1.scope"
    )
    assert own_cgroup2_path("0::/\n") == "/" and own_cgroup2_path("0::\n") == "/"
    assert own_cgroup2_path("4:memory:/x\n") is None


HYBRID_MOUNTS = (
    "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
)
HYBRID_CGROUP = "4:memory:/process_api/6ef7\n3:cpuset:/\n0::/\n"  # this project's CI host


def test_one_cgroup_walk_for_v1_and_v2() -> None:
    """Every cgroup reader (discovery's cpuset, the step's cpuset, the out-of-memory report) walks the same dirs."""
    assert cgroup_dirs(HYBRID_MOUNTS, HYBRID_CGROUP, "memory") == [
        (2, "/sys/fs/cgroup/unified"),
        (1, "/sys/fs/cgroup/memory/process_api/6ef7"),
        (1, "/sys/fs/cgroup/memory/process_api"),
        (1, "/sys/fs/cgroup/memory"),
    ]
    v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
    assert cgroup_dirs(v2, "0::/job/step\n", "cpuset") == [
        (2, "/sys/fs/cgroup/job/step"),
        (2, "/sys/fs/cgroup/job"),
        (2, "/sys/fs/cgroup"),
    ]  # no v1 hierarchy mounted
    # no mount table (a recorded tree): the usual layout; an hwloc capture's proc/self/cpuset as the path
    assert cgroup_dirs(None, None, "cpuset", fallback="/a") == [
        (2, "/sys/fs/cgroup/a"),
        (2, "/sys/fs/cgroup"),
        (1, "/sys/fs/cgroup/cpuset/a"),
        (1, "/sys/fs/cgroup/cpuset"),
    ]
    files = {
        "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": "1073741824\n",
        "/sys/fs/cgroup/memory/process_api/6ef7/memory.limit_in_bytes": "  \n",
    }  # empty: not an answer
    names = {2: ("memory.max",), 1: ("memory.limit_in_bytes",)}
    assert cgroup_read(cgroup_dirs(HYBRID_MOUNTS, HYBRID_CGROUP, "memory"), names, files.get) == (
        "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
        "1073741824",
    )
    assert cgroup_read(cgroup_dirs(v2, "0::/job\n", "memory"), names, files.get) is None


def test_worker_readback_uses_the_same_format(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(STATUS)
    assert affinity.cpus_allowed(status) == tuple(range(8))
    assert affinity.mems_allowed(status) == (0,)
    status.write_text("Name:\tpython\n")
    with pytest.raises(OSError, match="no Cpus_allowed_list"):
        affinity.cpus_allowed(status)
