"""numarun doctor on recorded trees, each edited to show one fault; healthy trees show no error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trees import FIXTURES, extract_tree, sysfs_tarballs

from numarun.cli import main as cli_main
from numarun.doctor.checks import check_nvml, check_rdma_ports
from numarun.doctor.model import Severity
from numarun.topology.model import Nic, NicKind, RdmaPort
from numarun.topology.sysfs import read_sysfs

H200_GPU = "sys/bus/pci/devices/0000:00:06.0"
IB_TREE = "32em64t-2n8c+dax+nvme+mic+dimms"
NVML = FIXTURES / "nvml"


def doctor(capsys, *args: str) -> tuple[int, dict]:
    rc = cli_main(["doctor", "--json", *args])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_symlink():
        p.unlink()
    p.write_text(text)


def of(result: dict, check: str) -> list[dict]:
    return [f for f in result["findings"] if f["check"] == check]


@pytest.fixture
def h200(tmp_path, h200_tree) -> Path:
    return copy_tree(h200_tree, tmp_path / "h200")


@pytest.fixture
def ib_tree(tmp_path, sysfs_tree) -> Path:
    return copy_tree(sysfs_tree(IB_TREE), tmp_path / "ib")


def add_ib_device(root: Path, name: str = "mlx5_0", state: str = "4: ACTIVE", link_layer: str = "InfiniBand") -> None:
    """An RDMA device on the H200 tree's PCI function 0000:00:04.0, as the kernel lays it out."""
    d = root / "sys/class/infiniband" / name
    (d / "ports/1").mkdir(parents=True)
    (d / "device").symlink_to("../../../bus/pci/devices/0000:00:04.0")
    write(root, f"sys/class/infiniband/{name}/ports/1/state", state + "\n")
    write(root, f"sys/class/infiniband/{name}/ports/1/link_layer", link_layer + "\n")
    write(root, f"sys/class/infiniband/{name}/ports/1/rate", "200 Gb/sec (4X HDR)\n")


# --- reading -------------------------------------------------------------------------


def test_pcie_link_and_modules_read_from_the_tree(h200):
    topo = read_sysfs(h200)
    link = topo.gpus[0].pcie_link
    assert (link.current_gts, link.current_width, link.max_gts, link.max_width) == (32.0, 16, 32.0, 16)
    assert not link.degraded
    assert topo.kernel_modules is None  # the capture recorded neither proc/modules nor sys/module
    write(h200, "proc/modules", "nvidia_uvm 1 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\n")
    assert read_sysfs(h200).kernel_modules == ("nvidia", "nvidia_uvm")


def test_modules_from_sys_module_when_proc_modules_is_absent(h200):
    (h200 / "sys/module/nvidia_peermem").mkdir(parents=True)
    write(h200, "sys/module/nvidia_peermem/initstate", "live\n")
    (h200 / "sys/module/pcie_aspm/parameters").mkdir(parents=True)  # built in: no initstate
    assert read_sysfs(h200).kernel_modules == ("nvidia_peermem",)


# --- healthy trees -------------------------------------------------------------------


@pytest.mark.parametrize("tarball", sysfs_tarballs(), ids=lambda p: p.name.split(".")[0])
def test_recorded_trees_show_no_error(capsys, tarball):
    rc, result = doctor(capsys, "--topology", str(extract_tree(tarball)))
    errors = [f for f in result["findings"] if f["severity"] == "error"]
    assert errors == [] and rc == 0 and result["ok"] is True


def test_h200_tree_with_its_nvml_record_is_healthy(capsys, h200):
    rc, result = doctor(capsys, "--topology", str(h200), "--nvml-record", str(NVML / "h200-vm.json"))
    assert rc == 0 and not [f for f in result["findings"] if f["severity"] == "error"]
    assert of(result, "pcie-link") == []


# --- each fault ----------------------------------------------------------------------


def test_degraded_width_is_an_error_naming_the_gpu(capsys, h200):
    write(h200, f"{H200_GPU}/current_link_width", "8\n")
    rc, result = doctor(capsys, "--topology", str(h200))
    (f,) = of(result, "pcie-link")
    assert f["severity"] == "error" and f["device"] == "0000:00:06.0"
    assert "x8" in f["message"] and "x16" in f["message"]
    assert rc == 1 and result["ok"] is False


def test_lower_speed_alone_is_a_warning(capsys, h200):
    write(h200, f"{H200_GPU}/current_link_speed", "2.5 GT/s PCIe\n")
    rc, result = doctor(capsys, "--topology", str(h200))
    (f,) = of(result, "pcie-link")
    assert f["severity"] == "warn" and "2.5 GT/s" in f["message"] and rc == 0


def test_port_down_is_an_error(capsys, ib_tree):
    rc, healthy = doctor(capsys, "--topology", str(ib_tree))
    assert of(healthy, "rdma-port") == [] and rc == 0
    port = next(ib_tree.glob("sys/devices/**/infiniband/mlx4_0/ports/1/state"))
    port.write_text("1: DOWN\n")
    rc, result = doctor(capsys, "--topology", str(ib_tree))
    (f,) = of(result, "rdma-port")
    assert f["severity"] == "error" and f["device"] == "mlx4_0:1" and "DOWN" in f["message"]
    assert rc == 1


def ib_nic(name: str, *ports: RdmaPort) -> Nic:
    return Nic(name=name, kind=NicKind.INFINIBAND, numa_node=0, ports=ports)


def test_second_port_down_beside_an_active_one_is_a_warning():
    from numarun.topology.model import Topology

    topo = Topology(
        hostname="x",
        numa_nodes=(),
        cpus=(),
        nics=(
            ib_nic("mlx5_0", RdmaPort(1, "ACTIVE", "InfiniBand"), RdmaPort(2, "DOWN", "InfiniBand")),
            ib_nic("mlx5_1", RdmaPort(1, "", "InfiniBand")),
        ),
    )
    got = {(f.device, f.severity) for f in check_rdma_ports(topo)}
    assert got == {("mlx5_0:2", Severity.WARN), ("mlx5_1:1", Severity.INFO)}


def test_unusable_link_layer_is_reported():
    from numarun.topology.model import Topology

    topo = Topology(hostname="x", numa_nodes=(), cpus=(), nics=(ib_nic("hfi1_0", RdmaPort(1, "ACTIVE", "OmniPath")),))
    (f,) = check_rdma_ports(topo)
    assert f.check == "rdma-link-layer" and f.device == "hfi1_0:1"


def test_missing_peermem_with_rdma_and_nvidia_gpus(capsys, h200):
    add_ib_device(h200)
    write(h200, "proc/modules", "nvidia 1 0 - Live 0x0\nmlx5_ib 2 0 - Live 0x0\n")
    rc, result = doctor(capsys, "--topology", str(h200))
    (f,) = of(result, "peermem")
    assert f["severity"] == "warn" and f["device"] == "mlx5_0" and "nvidia_peermem" in f["message"]
    write(h200, "proc/modules", "nvidia 1 0 - Live 0x0\nnvidia_peermem 2 0 - Live 0x0\n")
    rc, result = doctor(capsys, "--topology", str(h200))
    assert of(result, "peermem") == [] and rc == 0


def test_numa_unknown_on_a_two_node_machine(capsys, ib_tree):
    rc, healthy = doctor(capsys, "--topology", str(ib_tree))
    assert "mlx4_0" not in [f["device"] for f in of(healthy, "numa-unknown")]
    pci = next(ib_tree.glob("sys/devices/pci0000:80/0000:80:02.2/0000:82:00.0/numa_node"))
    pci.write_text("-1\n")
    rc, result = doctor(capsys, "--topology", str(ib_tree))
    (f,) = [f for f in of(result, "numa-unknown") if f["device"] == "mlx4_0"]
    assert f["severity"] == "warn" and "-1" in f["message"]


def test_numa_unknown_is_not_reported_on_a_one_node_machine(capsys, h200):
    rc, result = doctor(capsys, "--topology", str(h200))
    assert of(result, "numa-unknown") == []


def test_cpuset_too_small_for_the_ranks(capsys, h200, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU-only ranks: the count is not bounded by GPUs
    status = (h200 / "proc/self/status").read_text().replace("Cpus_allowed_list:\t0-15", "Cpus_allowed_list:\t0-1")
    write(h200, "proc/self/status", status)
    rc, result = doctor(capsys, "--topology", str(h200), "--nproc-per-node", "4")
    errors = [f for f in of(result, "cpus") if f["severity"] == "error"]
    assert errors and any(f["device"] == "0-1" and "4 ranks" in f["message"] for f in errors)
    assert rc == 1
    rc, ok = doctor(capsys, "--topology", str(h200), "--nproc-per-node", "2")
    assert rc == 0


def test_offline_cpus_and_smt(capsys, h200):
    write(h200, "sys/devices/system/cpu/online", "0-13\n")
    write(h200, "sys/devices/system/cpu/smt/control", "off\n")
    rc, result = doctor(capsys, "--topology", str(h200))
    (off,) = of(result, "cpus-offline")
    assert off["device"] == "14-15"
    (smt,) = of(result, "smt")
    assert smt["severity"] == "info" and "off" in smt["message"]


def test_disallowed_memory_node(capsys, ib_tree):
    status = ib_tree / "proc/self/status"
    text = status.read_text() if status.exists() else ""
    lines = [ln for ln in text.splitlines() if not ln.startswith("Mems_allowed_list")]
    write(ib_tree, "proc/self/status", "\n".join(lines + ["Mems_allowed_list:\t0"]) + "\n")
    rc, result = doctor(capsys, "--topology", str(ib_tree))
    assert [f["device"] for f in of(result, "mems")] == ["node1"]


# --- NVML health, on recorded records ------------------------------------------------


def test_nvml_faults_from_a_recorded_record(capsys, h200):
    rc, result = doctor(capsys, "--topology", str(h200), "--nvml-record", str(NVML / "constructed-h200-faults.json"))
    checks = {(f["check"], f["severity"]) for f in result["findings"]}
    assert ("nvml-ecc", "error") in checks
    assert ("nvml-retirement", "error") in checks
    assert ("nvml-row-remap", "error") in checks
    assert ("nvml-throttle", "warn") in checks
    assert ("nvml-persistence", "warn") in checks
    assert rc == 1
    assert all(f["device"] == "0000:00:06.0" for f in result["findings"] if f["check"].startswith("nvml"))


def test_nvml_unanswered_health_keys_are_not_findings():
    record = json.loads((NVML / "h200-vm.json").read_text())
    assert check_nvml(record) == []
    record["gpus"][0].update(
        {
            "ecc_uncorrected_volatile": "ERR NVMLError_NotSupported: Not Supported",
            "persistence_mode": 1,
            "throttle_reasons": 1,
        }
    )
    assert check_nvml(record) == []


# --- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, word",
    [
        (["--nnodes", "two"], "--nnodes"),
        (["--nnodes", "2"], "--master-addr"),
        (["--min-link-fraction", "3"], "--min-link-fraction"),
        (["--nvml-record", "/nonexistent.json"], "--nvml-record"),
        (["--nnodes", "2", "--rdzv-endpoint", "host"], "--rdzv-endpoint"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, h200, args, word):
    try:
        rc = cli_main(["doctor", "--topology", str(h200), *args])
    except SystemExit as e:  # argparse's own refusal: a value its flag's reader refuses
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and word in err and len(err.strip().splitlines()) == 1


def test_table_by_default(capsys, h200):
    write(h200, f"{H200_GPU}/current_link_width", "4\n")
    rc = cli_main(["doctor", "--topology", str(h200)])
    out = capsys.readouterr().out
    assert rc == 1 and "pcie-link" in out and "0000:00:06.0" in out and "NOT OK" in out


@pytest.mark.parametrize("word", ["auto", "gpu", "cpu"])
def test_torchruns_words_for_the_rank_count_are_counted_on_the_checked_machine(capsys, h200, word):
    """``--nproc-per-node auto`` (gpu, cpu) means what it means for 'numarun run': counted on the topology the
    doctor checks, never a traceback."""
    rc, result = doctor(capsys, "--topology", str(h200), "--nproc-per-node", word)
    assert rc == 0 and result["ok"] and not [f for f in result["findings"] if "cannot be planned" in f["message"]]
