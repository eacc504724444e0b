"""``numarun topo`` as users run it: real subprocesses of the installed ``numarun`` script."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import FIXTURES
from topo_helpers import by_class, make_topology

from numarun.topology.model import RdmaPort, Topology
from numarun.view.topo import NO_GPU_LINE, cpu_summary, nic_cells, render_text

NUMARUN = str(Path(sys.executable).with_name("numarun"))
A100_SMI = FIXTURES / "nvidia-smi" / "a100-sxm4-80gb-8gpu-2numa-4nic.txt"


def numarun(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "NUMARUN_TOPOLOGY"}
    base.update(env or {})
    return subprocess.run([NUMARUN, *args], capture_output=True, text=True, env=base, cwd=cwd, timeout=120)


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("numarun")
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0]


# --- the live machine (the CI machine: no GPU) ---


@pytest.mark.slow
def test_live_json_has_the_contract_keys() -> None:
    proc = numarun("topo", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["numa_nodes"], "a Linux machine has at least one NUMA node"
    for n in data["numa_nodes"]:
        assert {"id", "cpus", "memory_bytes"} <= n.keys()
    assert len(data["cpus"]) == os.cpu_count()
    for c in data["cpus"]:
        assert {"id", "package", "core", "online", "allowed"} <= c.keys()
    allowed = {c["id"] for c in data["cpus"] if c["allowed"] and c["online"]}
    assert allowed == os.sched_getaffinity(0)
    for g in data["gpus"]:
        assert {"index", "pci_bus_id", "numa_node"} <= g.keys()
    for n in data["nics"]:
        assert {"name", "pci_bus_id", "numa_node"} <= n.keys()


@pytest.mark.slow
def test_live_view_says_plainly_when_there_are_no_gpus() -> None:
    snapshot = json.loads(numarun("topo", "--json").stdout)
    proc = numarun("topo")
    assert proc.returncode == 0, proc.stderr
    assert "NUMA nodes" in proc.stdout
    if snapshot["gpus"]:
        for g in snapshot["gpus"]:
            assert g["pci_bus_id"] in proc.stdout
        assert NO_GPU_LINE not in proc.stdout
    else:
        assert "no GPUs found" in proc.stdout


@pytest.mark.slow
def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    first = numarun("topo", "--json")
    assert first.returncode == 0, first.stderr
    snap = tmp_path / "node.json"
    snap.write_text(first.stdout)
    again = numarun("topo", "--json", "--topology", str(snap))
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout


@pytest.mark.slow
def test_env_variable_selects_the_source(tmp_path: Path) -> None:
    snap = tmp_path / "rich.json"
    snap.write_text(make_topology(hostname="from-env").to_json())
    proc = numarun("topo", env={"NUMARUN_TOPOLOGY": str(snap)})
    assert proc.returncode == 0, proc.stderr
    assert "host: from-env" in proc.stdout


# --- a richer machine, from a snapshot ---


@pytest.mark.slow
def test_rich_snapshot_view(tmp_path: Path) -> None:
    topo = make_topology(memory_only_nodes=1, offline=(15,))
    snap = tmp_path / "dgx.json"
    snap.write_text(topo.to_json())
    proc = numarun("topo", "--topology", str(snap), "--width", "160")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "no GPUs found" not in out
    for g in topo.gpus:
        assert g.pci_bus_id in out
    for n in topo.nics:
        assert n.name in out
    assert "NV12" in out and "memory-only" in out
    assert "packages: 2   cores: 8   PUs: 15   SMT: yes   offline CPUs: 1" in out


@pytest.mark.slow
def test_json_of_a_snapshot_reads_back_equal(tmp_path: Path) -> None:
    topo = make_topology(memory_only_nodes=1, stray_gpu=True)
    snap = tmp_path / "t.json"
    snap.write_text(topo.to_json())
    proc = numarun("topo", "--json", "--topology", str(snap))
    assert proc.returncode == 0, proc.stderr
    back = Topology.from_json(proc.stdout)
    assert back.gpus == topo.gpus and back.cpus == topo.cpus and back.numa_nodes == topo.numa_nodes
    assert back.nics == topo.nics and back.gpu_links == topo.gpu_links


# --- the picture ---


@pytest.mark.slow
def test_svg_is_written_atomically_and_parses(tmp_path: Path) -> None:
    topo = make_topology()
    snap = tmp_path / "t.json"
    snap.write_text(topo.to_json())
    out = tmp_path / "pics" / "topo.svg"
    out.parent.mkdir()
    proc = numarun("topo", "--topology", str(snap), "--svg", str(out))
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(out).getroot()
    assert len([e for e in by_class(root, "pu") if e.tag.endswith("rect")]) == len(topo.cpus)
    assert len(by_class(root, "gpu")) == len(topo.gpus)
    assert os.listdir(out.parent) == ["topo.svg"]  # no temp file left behind


@pytest.mark.slow
def test_svg_into_a_missing_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "nope" / "topo.svg"
    proc = numarun("topo", "--svg", str(target))
    assert_user_error(proc, str(target))
    assert proc.stdout == ""
    assert not (tmp_path / "nope").exists()


@pytest.mark.slow
def test_svg_onto_a_directory_is_refused(tmp_path: Path) -> None:
    snap = tmp_path / "t.json"
    snap.write_text(make_topology().to_json())
    proc = numarun("topo", "--topology", str(snap), "--svg", str(tmp_path))
    assert_user_error(proc, str(tmp_path))


# --- user mistakes ---


@pytest.mark.slow
def test_missing_topology_path_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "no-such-machine.json"
    assert_user_error(numarun("topo", "--topology", str(bad)), str(bad))


@pytest.mark.slow
def test_malformed_snapshot_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"schema_version": 1, "hostname": "x"')
    assert_user_error(numarun("topo", "--json", "--topology", str(bad)), str(bad))


@pytest.mark.slow
def test_bad_width_is_one_line() -> None:
    assert_user_error(numarun("topo", "--width", "3"), "3")


# --- --smi: GPUs and links from a saved nvidia-smi matrix ---


@pytest.mark.slow
def test_smi_adds_gpus_when_the_source_has_none(tmp_path: Path) -> None:
    topo = make_topology(gpus_per_node=0, nics_per_node=0)
    snap = tmp_path / "t.json"
    snap.write_text(topo.to_json())
    proc = numarun("topo", "--json", "--topology", str(snap), "--smi", str(A100_SMI))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["gpus"]) == 8
    assert data["gpu_source"] == "nvidia-smi"
    assert data["cpus"] == json.loads(topo.to_json())["cpus"]  # the CPU side stays the main source's
    assert any(code.startswith("NV") for row in data["gpu_links"] for code in row)


@pytest.mark.slow
def test_smi_missing_file_is_one_line(tmp_path: Path) -> None:
    snap = tmp_path / "t.json"
    snap.write_text(make_topology(gpus_per_node=0).to_json())
    bad = tmp_path / "smi.txt"
    assert_user_error(numarun("topo", "--topology", str(snap), "--smi", str(bad)), str(bad))


# --- the text view, in-process ---


def test_render_no_gpus_no_nics() -> None:
    topo = make_topology(gpus_per_node=0, nics_per_node=0)
    topo = Topology(hostname="cpu-only", numa_nodes=topo.numa_nodes, cpus=topo.cpus, source="live", gpu_source="none")
    out = render_text(topo)
    assert NO_GPU_LINE in out
    assert "no NICs found" in out
    assert "GPU links" not in out
    assert "0-3,8-11" in out and "4-7,12-15" in out  # node CPU ranges


def test_render_lists_allowed_cpus_and_distances() -> None:
    topo = make_topology(disallowed=(0, 1, 8))
    out = render_text(topo, width=160)
    row0 = next(line for line in out.splitlines() if "0-3,8-11" in line)
    assert "2-3,9-11" in row0 and "64.0 GiB" in row0 and "10 21" in row0
    assert "disallowed CPUs: 3" in out


def test_nearest_nic_prefers_the_gpus_own_node_and_spreads_rails() -> None:
    topo = make_topology(nics_per_node=2)
    # GPU 2 and 3 sit on node 1, whose NICs are mlx5_2 and mlx5_3: one rail each, as the plan gives
    assert nic_cells(topo) == ["mlx5_0 (NODE)", "mlx5_1 (NODE)", "mlx5_2 (NODE)", "mlx5_3 (NODE)"]
    out = render_text(topo, width=200)
    gpu_rows = [line for line in out.splitlines() if "NVIDIA H100" in line]
    assert [("mlx5_2" in r) for r in gpu_rows] == [False, False, True, False]


def test_nearest_nic_is_never_a_down_port_and_unknown_apart_from_none() -> None:
    topo = make_topology(nics_per_node=2)
    down = (RdmaPort(number=1, state="DOWN", link_layer="InfiniBand"),)
    one_down = dataclasses.replace(
        topo, nics=tuple(dataclasses.replace(n, ports=down) if n.name == "mlx5_2" else n for n in topo.nics)
    )
    assert nic_cells(one_down)[2:] == ["mlx5_3 (NODE)", "mlx5_3 (NODE)"]
    all_down = dataclasses.replace(topo, nics=tuple(dataclasses.replace(n, ports=down) for n in topo.nics))
    assert nic_cells(all_down) == ["-"] * 4
    # a GPU of unknown NUMA node without PCI paths: nothing known about how it reaches the NICs
    lost = dataclasses.replace(
        topo,
        gpus=tuple(dataclasses.replace(g, numa_node=-1, pci_path=()) for g in topo.gpus),
        nics=tuple(dataclasses.replace(n, pci_path=()) for n in topo.nics),
    )
    assert nic_cells(lost) == ["unknown"] * 4


def test_cpu_summary_counts() -> None:
    topo = make_topology(packages=2, cores_per_node=3, smt=1, offline=(5,))
    # offline CPU 5 is listed apart, not counted as a core or PU
    assert cpu_summary(topo) == {
        "packages": 2,
        "cores": 5,
        "pus": 5,
        "smt": False,
        "offline": 1,
        "disallowed": 0,
        "usable_packages": 2,
        "usable_cores": 5,
        "usable_pus": 5,
        "usable_smt": False,
    }


# --- real machines from tests/fixtures (see tests/fixtures/SOURCES.md) ---

DGX_A100_SMI = FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt"
ALTIX_XML = FIXTURES / "hwloc" / "192em64t-24n8c2t.xml"
ZEN4_XML = FIXTURES / "hwloc" / "AMD-19h-Zen4-2xEpyc-9654.xml"


@pytest.mark.slow
def test_dgx_a100_matrix_view(tmp_path: Path) -> None:
    svg = tmp_path / "dgx.svg"
    proc = numarun("topo", "--topology", str(DGX_A100_SMI), "--width", "160", "--svg", str(svg))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    rows = {
        int(line.split("│")[1]): line
        for line in out.splitlines()
        if line.startswith("│") and line.split("│")[1].strip().isdigit() and "mlx5_" in line
    }
    # from the file: GPU0,1 share a PCIe switch (PXB) with NIC0/1, GPU2,3 with NIC2/3, ...;
    # each GPU of a pair takes its own of the two rails, as the plan does; NUMA affinity 3,3,1,1,7,7,5,5
    expect = {
        0: ("mlx5_0", "3"),
        1: ("mlx5_1", "3"),
        2: ("mlx5_2", "1"),
        3: ("mlx5_3", "1"),
        4: ("mlx5_4", "7"),
        5: ("mlx5_5", "7"),
        6: ("mlx5_6", "5"),
        7: ("mlx5_7", "5"),
    }
    assert sorted(rows) == list(range(8))
    for gpu, (nic, node) in expect.items():
        cells = [c.strip() for c in rows[gpu].split("│")]
        assert f"{nic} (PXB)" in cells
        assert node in cells
    assert "16-31,144-159" in out  # node 1's CPUs from the affinity column
    root = ET.parse(svg).getroot()
    assert len(by_class(root, "gpu")) == 8
    assert len(by_class(root, "nic")) == 10
    # all 28 pairs NV12 (NVSwitch): one bus with one label instead of 28 arcs
    assert [e.text for e in by_class(root, "link-label")] == ["NV12"]
    assert len(by_class(root, "link-all")) == 1
    assert len([e for e in by_class(root, "pu") if e.tag.endswith("rect")]) == 128
    # NIC8/9 have no known NUMA node: drawn in the unknown area
    (unknown,) = by_class(root, "unknown-numa")
    assert sorted(e.get("data-nic") for e in by_class(unknown, "nic")) == ["mlx5_8", "mlx5_9"]


@pytest.mark.slow
def test_altix_24_numa_nodes_picture(tmp_path: Path) -> None:
    svg = tmp_path / "altix.svg"
    proc = numarun("topo", "--topology", str(ALTIX_XML), "--svg", str(svg))
    assert proc.returncode == 0, proc.stderr
    assert "packages: 24   cores: 192   PUs: 384   SMT: yes" in proc.stdout
    root = ET.parse(svg).getroot()
    assert len([e for e in by_class(root, "pu") if e.tag.endswith("rect")]) == 384
    assert len(by_class(root, "numa")) == 24
    assert len(by_class(root, "core")) == 192
    assert float(root.get("width")) <= 1900


@pytest.mark.slow
def test_one_numa_node_over_two_packages(tmp_path: Path) -> None:
    # a cpuid dump of 2x EPYC 9654: no OS NUMA info, so one node holds both packages
    svg = tmp_path / "zen4.svg"
    proc = numarun("topo", "--topology", str(ZEN4_XML), "--svg", str(svg))
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(svg).getroot()
    (node,) = by_class(root, "numa")
    pkgs = by_class(node, "package")
    assert len(pkgs) == 2
    for p in pkgs:
        assert len(by_class(p, "core")) == 96


def test_narrow_tables_keep_their_titles_on_one_line() -> None:
    topo = make_topology(packages=1, gpus_per_node=1, nics_per_node=1)
    lines = render_text(topo, width=120).splitlines()
    assert any(line.strip() == "GPU to NIC links" for line in lines)
    assert any(line.strip() == "GPU links" for line in lines)
