"""NVML: pure parsing of recorded readings (tests/fixtures/nvml/) and the real I/O layer
on a machine without an NVIDIA driver."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from helpers import FIXTURES

from numarun.errors import TopologyError
from numarun.topology.nvml import (
    NVML_LEVEL_CODES,
    gpus_from_nvml_record,
    level_code,
    links_from_nvml_record,
    nvml_to_smi_codes,
    read_nvml_gpus,
    read_nvml_record,
    reading_from_record,
)

FIX = FIXTURES / "nvml"


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def test_h200_recorded_reading() -> None:
    r = reading_from_record(load("h200-vm.json"))
    assert r.driver_version == "580.159.04"
    assert len(r.gpus) == 1
    g = r.gpus[0]
    assert g.pci_bus_id == "0000:00:06.0"
    assert g.name == "NVIDIA H200"
    assert g.uuid == "GPU-381924f5-1540-0531-4bd2-4c06232c81ae"
    assert g.memory_bytes == 150754820096
    # nvmlDeviceGetNumaNodeId is NotSupported on this VM; memory affinity word 1 = node 0
    assert g.numa_node == 0
    assert g.memory_numa_node == -1
    assert g.cpu_affinity == tuple(range(16))  # word 65535
    assert r.gpu_links == (("X",),)
    assert any("NumaNodeId" in n for n in r.notes)


def test_constructed_nvlink_pairs() -> None:
    rec = load("constructed-4gpu-nvlink-pairs.json")
    assert "_constructed" in rec
    gpus = gpus_from_nvml_record(rec)
    assert [g.pci_bus_id for g in gpus] == ["0000:18:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    assert gpus[0].cpu_affinity == tuple(range(16)) + tuple(range(32, 48))
    assert gpus[2].cpu_affinity == tuple(range(16, 32)) + tuple(range(48, 64))
    links = links_from_nvml_record(rec)
    # two active links per pair (the inactive and NotSupported ones do not count)
    assert links[0][1] == links[1][0] == "NV2"
    assert links[2][3] == links[3][2] == "NV2"
    assert links[0][2] == "SYS"
    # GPU3's common-ancestor call with GPU0 failed: unknown, not guessed
    assert links[3][0] == "" and links[0][3] == "SYS"
    assert [links[i][i] for i in range(4)] == ["X"] * 4
    r = reading_from_record(rec)
    assert any("link level" in n for n in r.notes)


def test_constructed_gh200_memory_node_and_two_words() -> None:
    g = gpus_from_nvml_record(load("constructed-gh200.json"))[0]
    assert g.pci_bus_id == "0009:01:00.0"
    assert g.cpu_affinity == tuple(range(72))  # crosses the first 64-bit word
    assert (g.numa_node, g.memory_numa_node) == (0, 1)


def test_level_codes() -> None:
    assert [level_code(x) for x in (0, 10, 20, 30, 40, 50)] == ["X", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert level_code("ERR NVMLError_NotSupported") == ""
    assert level_code(None) == "" and level_code(35) == ""
    assert set(NVML_LEVEL_CODES.values()) == {"X", "PIX", "PXB", "PHB", "NODE", "SYS"}


def test_nvml_to_smi_codes_nvlink_wins_over_pcie() -> None:
    levels = [[0, 40, 50], [40, 0, 50], [50, 50, 0]]
    counts = [[0, 12, 0], [12, 0, 0], [0, 0, 0]]
    assert nvml_to_smi_codes(levels, counts) == (
        ("X", "NV12", "SYS"),
        ("NV12", "X", "SYS"),
        ("SYS", "SYS", "X"),
    )
    assert nvml_to_smi_codes(levels)[0] == ("X", "NODE", "SYS")


def test_multiple_memory_nodes_leave_numa_unknown() -> None:
    rec = copy.deepcopy(load("h200-vm.json"))
    rec["gpus"][0]["memory_affinity_words"] = [0b11]
    r = reading_from_record(rec)
    assert r.gpus[0].numa_node == -1
    assert any("no single NUMA node" in n for n in r.notes)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.pop("gpus"),
        lambda r: r.__setitem__("gpus", "nope"),
        lambda r: r["gpus"][0].__setitem__("pci_bus_id", "not-a-bus"),
        lambda r: r["gpus"][0].pop("pci_bus_id"),
        lambda r: r["gpus"][0].__setitem__("cpu_affinity_words", [-1]),
    ],
)
def test_bad_records_raise_topology_error(mutate) -> None:
    rec = copy.deepcopy(load("h200-vm.json"))
    mutate(rec)
    with pytest.raises(TopologyError, match="expected"):
        reading_from_record(rec)


def test_no_driver_gives_none() -> None:
    # This machine has pynvml but no NVIDIA driver: the real I/O path must say None.
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    assert read_nvml_record() is None
    assert read_nvml_gpus() is None


@pytest.mark.slow
def test_import_does_not_load_pynvml_or_torch() -> None:
    code = "import sys, numarun.topology.nvml; print('pynvml' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"]


def test_nvml_and_smi_of_the_same_live_machine_agree() -> None:
    """The H200 VM was captured both ways; both sources must place GPU0 alike."""
    from numarun.topology.smi import topology_from_smi

    smi_path = FIXTURES / "nvidia-smi" / "live-h200-vm-topo-m.txt"
    smi = topology_from_smi(smi_path.read_text(), "live").gpus
    nvml = gpus_from_nvml_record(load("h200-vm.json"))
    assert len(smi) == len(nvml) == 1
    assert (smi[0].numa_node, smi[0].cpu_affinity) == (nvml[0].numa_node, nvml[0].cpu_affinity)
    assert smi[0].memory_numa_node == nvml[0].memory_numa_node == -1
