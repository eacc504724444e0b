"""scripts/gpu_check.py: its parsing and comparisons on the recorded H200 VM, its self-test, and the shell script."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES, REPO

from numarun.topology.smi import parse_topo_m

CAPTURE = FIXTURES / "live-h200-vm" / "capture.json"
SYSFS = FIXTURES / "live-h200-vm" / "sysfs.tar.gz"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gc = _load()


@pytest.fixture(scope="module")
def capture() -> dict[str, Any]:
    return json.loads(CAPTURE.read_text())


def _failed(checks: list[Any]) -> set[str]:
    return {c.name for c in checks if not c.ok}


def test_smi_q_matches_the_nvml_answers_of_the_same_machine(capture: dict[str, Any]) -> None:
    gpus = gc.parse_smi_q(capture["smi_q"])
    nvml = capture["nvml"]["gpus"]
    assert [g.bus_id for g in gpus] == [gc.normalize_bus_id(n["pci_bus_id"]) for n in nvml]
    assert [g.memory_mib * 2**20 for g in gpus] == [n["memory_total"] for n in nvml]


def test_query_csv_parses_and_rejects() -> None:
    # The --format=csv,noheader layout: one "<bus id>, <N> MiB" line per GPU.
    text = "00000000:18:00.0, 81559 MiB\n00000001:3B:00.0, 143771 MiB\n"
    gpus = gc.parse_query_csv(text)
    assert [(g.bus_id, g.memory_mib) for g in gpus] == [("0000:18:00.0", 81559), ("0001:3b:00.0", 143771)]
    with pytest.raises(ValueError, match="line 1"):
        gc.parse_query_csv("00000000:18:00.0, [N/A]\n")


def test_recorded_h200_passes_the_topology_checks() -> None:
    checks = gc.recorded_h200_checks(CAPTURE, SYSFS)
    assert {c.name for c in checks} >= {
        "gpu_source",
        "gpu_count",
        "gpu0.bus_id",
        "gpu0.memory",
        "gpu0.numa_node",
        "gpu0.cpu_affinity",
    }
    assert _failed(checks) == set()


def test_topology_checks_catch_each_mismatch(capture: dict[str, Any]) -> None:
    from numarun.topology.discover import merge_nvml
    from numarun.topology.nvml import reading_from_record
    from numarun.topology.sysfs import read_sysfs
    from tests.conftest import extract_tree

    topo = merge_nvml(read_sysfs(extract_tree(SYSFS)), reading_from_record(capture["nvml"])).to_dict()
    smi = gc.parse_smi_q(capture["smi_q"])
    matrix = parse_topo_m(capture["smi_topo_m"], "capture")
    assert _failed(gc.check_topology(topo, smi, matrix)) == set()

    sysfs_only = dict(topo, gpu_source="sysfs")
    assert _failed(gc.check_topology(sysfs_only, smi, matrix)) == {"gpu_source"}
    moved = copy.deepcopy(topo)
    moved["gpus"][0]["pci_bus_id"] = "0000:00:07.0"
    assert _failed(gc.check_topology(moved, smi, matrix)) == {"gpu0.bus_id"}
    small = copy.deepcopy(topo)
    small["gpus"][0]["memory_bytes"] = 80 * 2**30
    assert _failed(gc.check_topology(small, smi, matrix)) == {"gpu0.memory"}
    far = copy.deepcopy(topo)
    far["gpus"][0]["numa_node"] = 1
    far["gpus"][0]["cpu_affinity"] = [0, 1]
    assert _failed(gc.check_topology(far, smi, matrix)) == {"gpu0.numa_node", "gpu0.cpu_affinity"}
    assert "gpu_count" in _failed(gc.check_topology(dict(topo, gpus=[]), smi, matrix))


def _rank() -> dict[str, Any]:
    return {
        "local_rank": 0,
        "cpus": [0, 1, 2, 3],
        "mems": [1],
        "mem_policy": "bind",
        "env": {"OMP_NUM_THREADS": "4"},
        "gpu": {"index": 0, "pci_bus_id": "0000:00:06.0", "uuid": "GPU-381924f5-1540-0531-4bd2-4c06232c81ae"},
    }


def _report() -> dict[str, Any]:
    return {
        "cpus": [0, 1, 2, 3],
        "thread_cpus": {"10": [0, 1, 2, 3], "11": [0, 1, 2, 3]},
        "mem_policy": "bind",
        "mems": [1],
        "omp_num_threads": "4",
        "plan_rank": {"cpus": [0, 1, 2, 3], "mems": [1]},
        "gpu": {"name": "NVIDIA H200", "uuid": "381924f5-1540-0531-4bd2-4c06232c81ae", "pci_bus_id": "0000:00:06.0"},
    }


def test_binding_checks_pass_and_catch_each_mismatch() -> None:
    assert _failed(gc.check_binding(_rank(), _report())) == set()
    cases = {
        "cpus": {"cpus": [0, 1, 2, 3, 4]},
        "threads": {"thread_cpus": {"10": [0, 1, 2, 3], "12": list(range(16))}},
        "mem_policy": {"mem_policy": "default"},
        "mems": {"mems": [0]},
        "omp_num_threads": {"omp_num_threads": "1"},
        "job_plan": {"plan_rank": {"cpus": [4, 5], "mems": [1]}},
        "gpu": {"gpu": {"name": "other", "uuid": "1111", "pci_bus_id": "0000:00:06.0"}},
    }
    for name, change in cases.items():
        assert _failed(gc.check_binding(_rank(), {**_report(), **change})) == {name}, name
    unbound = dict(_rank(), mem_policy="none")
    assert _failed(gc.check_binding(unbound, {**_report(), "mem_policy": "default", "mems": []})) == set()


def test_train_ratio_and_median_after_warmup() -> None:
    rows = [
        {"step": 1, "tokens_per_s": 10.0},
        {"step": 2, "tokens_per_s": 900.0},
        {"step": 3, "tokens_per_s": 1000.0},
        {"step": 4, "tokens_per_s": 1100.0},
    ]
    assert gc.median_tokens_per_s(rows, warmup=1) == 1000.0
    with pytest.raises(ValueError):
        gc.median_tokens_per_s(rows, warmup=4)
    checks, ratio = gc.check_train([990.0, 1000.0, 1010.0], [1000.0, 1000.0, 1020.0])
    assert ratio == pytest.approx(1.0) and checks[0].ok
    checks, ratio = gc.check_train([900.0, 950.0, 980.0], [1000.0, 1000.0, 1000.0])
    assert ratio == pytest.approx(0.95) and not checks[0].ok
    assert not gc.check_train([], [1.0])[0][0].ok


def _h2d_doc(**bound: float) -> dict[str, Any]:
    gbps = {"h2d_pinned": 55.0, "d2h_pinned": 55.0, "h2d_pageable": 8.3, "d2h_pageable": 14.3}
    return {
        "numarun": {
            "gbps": {**gbps, **bound},
            "mems": [0],
            "mem_policy": "bind",
            "pinned_page_nodes": [0],
            "pageable_page_nodes": [0],
            "size_bytes": 2**30,
            "iters": 10,
        },
        "raw": {"gbps": gbps},
    }


def test_h2d_checks() -> None:
    assert _failed(gc.check_h2d(_h2d_doc())) == set()
    assert _failed(gc.check_h2d(_h2d_doc(h2d_pinned=40.0))) == {"h2d_pinned_vs_raw"}
    assert _failed(gc.check_h2d(_h2d_doc(d2h_pinned=14.0))) == {"d2h_pinned_vs_raw", "d2h_pinned_vs_pageable"}
    elsewhere = _h2d_doc()
    elsewhere["numarun"]["pinned_page_nodes"] = [1]
    assert _failed(gc.check_h2d(elsewhere)) == {"pinned_pages_on_bound_node"}
    unknown = _h2d_doc()
    unknown["numarun"]["pinned_page_nodes"] = []  # move_pages cannot see the driver's mapping
    assert _failed(gc.check_h2d(unknown)) == set()
    unbound = _h2d_doc()
    unbound["numarun"]["pageable_page_nodes"] = [0, 1]
    assert _failed(gc.check_h2d(unbound)) == {"pageable_pages_on_bound_node"}
    unbound["numarun"]["pageable_page_nodes"] = []
    assert _failed(gc.check_h2d(unbound)) == {"pageable_pages_on_bound_node"}


def test_markdown_summary_carries_the_figures() -> None:
    result = {
        "versions": {"date": "D", "gpu": "NVIDIA H200, 580.159.04, 143771 MiB", "torch": "2.11.0 12.8"},
        "train": {
            "warmup_steps": 12,
            "rounds": 2,
            "ratio": 0.995,
            "tokens_per_s": {"numarun": [1234.0, 1250.0], "torchrun": [1240.0, 1255.0]},
        },
        "h2d": _h2d_doc(),
    }
    checks = gc.check_h2d(result["h2d"]) + [gc.Check("train", "ratio", False, "numarun | torchrun")]
    md = gc.render_markdown(result, checks)
    assert md.startswith("### GPU check, D: FAIL (1 of 7)")
    assert "NVIDIA H200, 580.159.04" in md and "2.11.0 12.8" in md
    assert "| numarun | 1234 | 1250 |" in md and "**0.995**" in md
    assert "| h2d | 55.00 | 8.30 | 55.00 | 8.30 |" in md
    assert "numarun / torchrun |" in md  # a '|' inside a detail cannot split the table row
    cut = dict(
        result,
        train={"warmup_steps": 12, "rounds": 3, "ratio": None, "tokens_per_s": {"numarun": [1234.0], "torchrun": []}},
    )
    md = gc.render_markdown(cut, checks)
    assert "| numarun | 1234 |" in md and "| torchrun | - |" in md and "ratio numarun" not in md


def test_nic_rule_wants_one_hca_list_per_node() -> None:
    same = [{"env": {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}}, {"env": {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}}]
    assert _failed(gc.check_nic_rule(same)) == set()
    assert _failed(gc.check_nic_rule([{"env": {}}, {"env": {}}])) == set()
    each = [{"env": {"NCCL_IB_HCA": "=mlx5_0"}}, {"env": {"NCCL_IB_HCA": "=mlx5_1"}}]
    (check,) = gc.check_nic_rule(each)
    assert not check.ok and "'=mlx5_0', '=mlx5_1'" in check.detail
    assert _failed(gc.check_nic_rule([{"env": {"NCCL_IB_HCA": "=mlx5_0"}}, {"env": {}}])) == {"nic_rule"}
    assert _failed(gc.check_nic_rule([])) == {"nic_rule"}


def test_doctor_checks() -> None:
    healthy = {"findings": [{"severity": "warning", "check": "persistence", "device": "gpu0", "message": "off"}]}
    assert _failed(gc.check_doctor(healthy, 0)) == set()
    sick = {"findings": [{"severity": "error", "check": "pcie_link", "device": "0000:00:06.0", "message": "x8 of x16"}]}
    checks = gc.check_doctor(sick, 1)
    assert _failed(checks) == {"error0.pcie_link"}
    assert "x8 of x16" in checks[1].detail
    assert _failed(gc.check_doctor(sick, 0)) == {"ran", "error0.pcie_link"}  # an error must set exit 1
    assert _failed(gc.check_doctor({"no": "findings"}, 0)) == {"ran"}


def test_health_checks_print_each_gpu_and_catch_each_gap() -> None:
    """The health step on a recorded node (constructed: four H100s, GPU 3 power-capped) and on the H200 VM's
    reading, which was recorded before the health answers."""
    record = json.loads((FIXTURES / "nvml" / "constructed-health-power-cap.json").read_text())["readings"][1]
    lines = gc.health_lines(record)
    assert len(lines) == 4 and lines[3].startswith("GPU 3 0000:5d:00.0: SM 1410 of 1980 MHz, slowdowns power cap")
    assert "PCIe x16 gen5 of x16 gen5" in lines[0] and "NVLink 18 of 18 up" in lines[0]
    sampled = {i: {"index": i, "mhz": 1980.0, "since_s": 1.0} for i in range(4)}
    assert _failed(gc.check_health(record, sampled)) == set()
    assert _failed(gc.check_health(record, {**sampled, 2: None})) == {"sampler_gpu2"}
    bare = json.loads((FIXTURES / "nvml" / "h200-vm.json").read_text())
    assert _failed(gc.check_health(bare, {0: sampled[0]})) == {"gpu0"}
    assert "SM ? of ? MHz" in gc.health_lines(bare)[0]
    assert _failed(gc.check_health(None, {})) == {"gpus"}


@pytest.mark.slow
def test_gpu_check_sh_self_test_imports_numarun_from_this_tree(tmp_path: Path) -> None:
    """The wrapper's set-up (link, PYTHONPATH, import check) with this venv's Python, no wheels needed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMARUN_TOPOLOGY")}
    env.update(PYTHON=sys.executable, NUMARUN_GPU_SITE=str(tmp_path / "site"), NUMARUN_WHEELS=str(tmp_path / "none"))
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-check.sh"), "--self-test", "--skip", "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "numarun").resolve() == (REPO / "launcher").resolve()
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("self-test: PASS")  # scripts/gpu_check.py --self-test, run by the wrapper
    for name in (
        "topo.gpu0.bus_id",
        "binding.cpus",
        "binding.threads",
        "binding.mem_policy",
        "binding.job_plan",
        "binding.nic_rule",
    ):
        assert any(line.startswith(f"PASS {name}:") for line in lines), name


@pytest.mark.slow
def test_shell_scripts_parse() -> None:
    for script in ("gpu-check.sh", "fetch-gpu-wheels.sh"):
        subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], check=True, timeout=30)


@pytest.mark.slow
def test_results_are_written_after_each_step(tmp_path: Path) -> None:
    """A run cut short still leaves gpu-check.json/.md; here every step but binding is skipped."""
    env = dict(os.environ)
    env.pop("NUMARUN_TOPOLOGY", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "gpu_check.py"),
            "--out",
            str(tmp_path),
            "--skip",
            "topo",
            "--skip",
            "train",
            "--skip",
            "h2d",
            "--skip",
            "doctor",
            "--skip",
            "mesh",
            "--skip",
            "hang",
            "--skip",
            "layout",
            "--skip",
            "steps",
            "--skip",
            "nccl",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "gpu-check.json").read_text())
    assert result["passed"] is True
    assert {c["name"] for c in result["checks"]} >= {"cpus", "threads", "mem_policy", "mems"}
    assert result["binding"]["report"]["cpus"] == result["binding"]["plan"]["ranks"][0]["cpus"]
    assert (tmp_path / "gpu-check.md").read_text().startswith("### GPU check, ")


@pytest.mark.slow
def test_gpu_check_sh_refuses_a_host_without_nvidia_smi(tmp_path: Path) -> None:
    if any((Path(d) / "nvidia-smi").exists() for d in os.environ.get("PATH", "").split(os.pathsep) if d):
        pytest.skip("nvidia-smi is on PATH")
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-check.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OUT": str(tmp_path)},
    )
    assert proc.returncode == 3
    assert "no nvidia-smi" in proc.stderr
    assert not (tmp_path / "gpu-check.json").exists()


def test_mesh_checks_pass_and_catch_each_mismatch() -> None:
    plan = {"mesh": {"spec": "dp_shard=1", "names": ["dp_shard"]}, "ranks": [{"gpu": {"pci_bus_id": "0000:1a:00.0"}}]}
    env = {"NUMARUN_MESH": "dp_shard=1", "NUMARUN_MESH_SHAPE": "1"}
    report = {"gpu": {"pci_bus_id": "0000:1a:00.0"}, "mesh_env": env}
    fabric = ["ERR NVMLError_NotSupported: Not Supported"]
    assert not _failed(gc.check_mesh(plan, report, fabric))
    assert _failed(gc.check_mesh({**plan, "mesh": None}, report, fabric)) >= {"plan_has_layout"}
    assert _failed(gc.check_mesh(plan, {**report, "gpu": {"pci_bus_id": "0000:1b:00.0"}}, fabric)) == {
        "rank_drives_planned_gpu"
    }
    assert _failed(gc.check_mesh(plan, {**report, "mesh_env": {}}, fabric)) == {"rank_env"}
    assert _failed(gc.check_mesh(plan, report, [])) == {"nvml_fabric_info"}


def test_step_report_checks_pass_and_catch_each_failure() -> None:
    from numarun.worker.steps import StepRecord

    def rec(step: int, gpu_s: float | None = 0.05, peak: int = 300 << 20) -> StepRecord:
        return StepRecord(1, step, step * 0.1, step * 0.1 + 0.1, peak_bytes=peak, gpu_s=gpu_s)

    good = [rec(1, None), *(rec(i) for i in range(2, 10))]
    verdict = "numarun: => rank 1 holds the job back: compute, 40 ms a step above the other ranks; ..."
    checks = gc.check_steps(good, verdict, on=[0.100, 0.101], off=[0.100, 0.100], exits=[0, 0, 0, 0])
    assert all(c.ok for c in checks), checks
    failed = {
        c.name
        for c in gc.check_steps(
            [*good, rec(10, None), rec(11, peak=1 << 20)],
            "numarun: => no rank holds the job back (...)",
            on=[0.2],
            off=[0.1],
            exits=[0, 1],
        )
        if not c.ok
    }
    assert failed == {"ran", "gpu_events", "peak_memory", "slow_rank_named", "cost"}
