"""CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER resolution on real recorded topologies."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES

from numarun.errors import VisibleDevicesError
from numarun.topology.model import Topology
from numarun.topology.nvml import gpus_from_nvml_record
from numarun.topology.pci import pci_order
from numarun.topology.smi import topology_from_smi
from numarun.topology.visible import visible_gpus


@pytest.fixture
def nvml4() -> Topology:
    """4 GPUs with UUIDs and bus ids (constructed NVML reading), listed out of bus order."""
    rec = json.loads((FIXTURES / "nvml" / "constructed-4gpu-nvlink-pairs.json").read_text())
    gpus = gpus_from_nvml_record(rec)
    base = topology_from_smi((FIXTURES / "nvidia-smi" / "consumer-2gpu-pcie-PHB.txt").read_text(), "x")
    return dataclasses.replace(base, gpus=(gpus[2], gpus[0], gpus[3], gpus[1]), gpu_links=(), gpu_source="nvml")


@pytest.fixture
def smi8() -> Topology:
    return topology_from_smi((FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt").read_text(), "dgx")


def idx(gpus) -> list[int]:
    return [g.index for g in gpus]


def test_unset_gives_all_in_pci_order(nvml4: Topology) -> None:
    assert idx(visible_gpus(nvml4, None, "PCI_BUS_ID")) == [0, 1, 2, 3]
    assert idx(pci_order(nvml4.gpus)) == [0, 1, 2, 3]


def test_smi_topology_without_bus_ids_uses_index_order(smi8: Topology) -> None:
    assert idx(visible_gpus(smi8, None, None)) == list(range(8))
    assert idx(visible_gpus(smi8, "6, 1,3", None)) == [6, 1, 3]


def test_indices_keep_the_given_order(nvml4: Topology) -> None:
    got = visible_gpus(nvml4, "3,0,2", "PCI_BUS_ID")
    assert [g.pci_bus_id for g in got] == ["0000:af:00.0", "0000:18:00.0", "0000:86:00.0"]


@pytest.mark.parametrize("value", ["", "  ", "-1"])
def test_none_visible(nvml4: Topology, value: str) -> None:
    assert visible_gpus(nvml4, value, "PCI_BUS_ID") == ()


def test_full_and_prefix_uuids(nvml4: Topology) -> None:
    full = "GPU-2222aaaa-0000-1111-2222-333344445552"
    assert idx(visible_gpus(nvml4, f"{full},GPU-0000", "PCI_BUS_ID")) == [2, 0]
    assert idx(visible_gpus(nvml4, "gpu-1111AAAA", "PCI_BUS_ID")) == [1]
    assert idx(visible_gpus(nvml4, "1,GPU-3", "PCI_BUS_ID")) == [1, 3]


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("4", "valid GPU indices are 0-3"),
        ("0,7", "'7' is out of range"),
        ("0,-1", "out of range"),
        ("GPU-9999", "matches no GPU"),
        ("GPU-", "neither a GPU index nor a GPU UUID"),
        ("1,1", "again"),
        ("0,GPU-0000aaaa", "again"),
        ("MIG-4f4e5a5e-1c1d-5f4e-8c39-8a0f0f4e5e5e", "MIG instances are not supported for binding"),
        ("GPU-0000aaaa/1/0", "MIG instances are not supported for binding"),
        ("0,,1", "neither a GPU index nor a GPU UUID"),
        ("zero", "neither a GPU index nor a GPU UUID"),
    ],
)
def test_errors(nvml4: Topology, value: str, fragment: str) -> None:
    with pytest.raises(VisibleDevicesError) as e:
        visible_gpus(nvml4, value, "PCI_BUS_ID")
    assert fragment in str(e.value)
    assert repr(value) in str(e.value)


def test_ambiguous_uuid_prefix(nvml4: Topology) -> None:
    # two GPUs whose UUIDs share "GPU-0000aaa"
    twins = dataclasses.replace(
        nvml4,
        gpus=tuple(
            dataclasses.replace(g, uuid="GPU-0000aaab-0000-1111-2222-333344445551") if g.index == 1 else g
            for g in nvml4.gpus
        ),
    )
    with pytest.raises(VisibleDevicesError, match="matches several GPUs"):
        visible_gpus(twins, "GPU-0000aaa", "PCI_BUS_ID")
    assert idx(visible_gpus(twins, "GPU-0000aaab", "PCI_BUS_ID")) == [1]


def test_uuid_on_a_source_without_uuids(smi8: Topology) -> None:
    with pytest.raises(VisibleDevicesError, match="no GPU UUIDs"):
        visible_gpus(smi8, "GPU-381924f5", None)


def test_no_gpus_at_all(caplog: pytest.LogCaptureFixture) -> None:
    t = topology_from_smi((FIXTURES / "nvidia-smi" / "tesla-p4-1gpu-numa-NA.txt").read_text(), "p4")
    t = dataclasses.replace(t, gpus=(), gpu_links=())
    assert visible_gpus(t, None, None) == ()
    # as under torchrun: a CUDA_VISIBLE_DEVICES naming GPUs on a machine without any runs CPU ranks
    for value in ("0", "GPU-abc", "0,1"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="numarun.topology.visible"):
            assert visible_gpus(t, value, None) == ()
        assert "has none: running CPU-only ranks" in caplog.text and "0--1" not in caplog.text


def test_warns_on_mixed_models_without_pci_order(nvml4: Topology, caplog: pytest.LogCaptureFixture) -> None:
    mixed = dataclasses.replace(
        nvml4, gpus=tuple(dataclasses.replace(g, name="NVIDIA L4") if g.index == 3 else g for g in nvml4.gpus)
    )
    with caplog.at_level(logging.WARNING, logger="numarun.topology.visible"):
        visible_gpus(mixed, "0", None)
    assert "FASTEST_FIRST" in caplog.text and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="numarun.topology.visible"):
        visible_gpus(mixed, "0", "PCI_BUS_ID")
        visible_gpus(nvml4, "0", None)  # identical models: orders agree
    assert caplog.text == ""


def _numarun(args: list[str], cuda_visible_devices: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("numarun")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "numarun"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NUMARUN_"))}
    env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    return subprocess.run(cmd + args, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.slow
def test_numarun_plan_honours_cuda_visible_devices() -> None:
    smi = str(FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt")
    out = _numarun(["plan", "--topology", smi, "--json"], "4,0")
    assert out.returncode == 0, out.stderr
    ranks = json.loads(out.stdout)["ranks"]
    # DGX A100 NPS4: GPU4 sits on NUMA 7, GPU0 on NUMA 3 (fixture text)
    assert [(r["gpu"]["index"], r["gpu"]["cuda_index"], r["numa_node"]) for r in ranks] == [(4, 0, 7), (0, 1, 3)]


@pytest.mark.slow
def test_numarun_plan_rejects_bad_cuda_visible_devices() -> None:
    smi = str(FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt")
    out = _numarun(["plan", "--topology", smi], "0,9")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'9'" in lines[0] and "0-7" in lines[0]
