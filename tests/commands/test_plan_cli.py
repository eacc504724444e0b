"""``numarun plan`` as a real subprocess: golden tables and JSON, the JSON contract, bad input.

Golden files live in tests/golden/plan/. After an intended change of the plan or the table,
regenerate them with ``NUMARUN_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/commands/test_plan_cli.py``
and review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow  # every test here starts processes

GOLDEN = REPO / "tests" / "golden" / "plan"
NUMARUN = [sys.executable, "-m", "numarun"]
SMI = "tests/fixtures/nvidia-smi"

# name -> (fixture relative to the repo root, extra flags)
GOLDEN_CASES = {
    "p4d-2socket-8gpu": (f"{SMI}/aws-p4d.24xlarge.txt", []),
    "rtx4090-2socket-8gpu-node": (f"{SMI}/rtx4090-8gpu-2socket-2nic.txt", ["--binding", "node"]),
    "dgx-a100-nps4-8numa": (f"{SMI}/dgx-a100-8numa-nps4-10nic.txt", []),
    "dgx-a100-nps4-per-rank-nic": (f"{SMI}/dgx-a100-8numa-nps4-10nic.txt", ["--nic-policy", "per-rank"]),
    "h800-9nic-preferred": (
        f"{SMI}/h800-8gpu-NV8-9nic-bond.txt",
        ["--mem-policy", "preferred", "--nproc-per-node", "6"],
    ),
    "tesla-p4-vm-numa-unknown": (f"{SMI}/tesla-p4-1gpu-numa-NA.txt", []),
    "h100-vm-all-phb": (f"{SMI}/h100-4gpu-vm-all-PHB.txt", ["--binding", "core-complex"]),
    "gh200": (f"{SMI}/gh200-480gb-aerial.txt", []),
}

_USER_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "OMP_NUM_THREADS",
    "NCCL_IB_HCA",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "NUMARUN_TOPOLOGY",
)


def run_plan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in _USER_VARS}
    base.update(env or {})
    return subprocess.run([*NUMARUN, "plan", *args], cwd=REPO, env=base, capture_output=True, text=True, timeout=120)


from golden import check_golden as _check_golden  # noqa: E402


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_table(name: str) -> None:
    fixture, flags = GOLDEN_CASES[name]
    table = run_plan("--topology", fixture, *flags)
    assert table.returncode == 0, table.stderr
    _check_golden(GOLDEN / f"{name}.txt", table.stdout)


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_json(name: str) -> None:
    fixture, flags = GOLDEN_CASES[name]
    js = run_plan("--topology", fixture, *flags, "--json")
    assert js.returncode == 0, js.stderr
    _check_golden(GOLDEN / f"{name}.json", js.stdout)


def test_json_contract() -> None:
    out = run_plan("--topology", f"{SMI}/dgx-a100-8numa-nps4-10nic.txt", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert len(data["ranks"]) == 8
    for i, r in enumerate(data["ranks"]):
        assert r["local_rank"] == i
        assert {"index", "pci_bus_id", "numa_node"} <= set(r["gpu"])
        assert r["cpus"] and all(isinstance(c, int) for c in r["cpus"])
        assert r["mems"] == [r["numa_node"]]
        assert isinstance(r["nic"], str) and r["env"]["UCX_NET_DEVICES"] == r["nic"] + ":1"
        assert r["env"]["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{k}" for k in range(8))  # one per node
        assert r["env"]["OMP_NUM_THREADS"] == str(len(r["cpus"]) // 2)  # SMT 2, all siblings usable


def test_environment_is_honoured() -> None:
    fixture = f"{SMI}/aws-p4d.24xlarge.txt"
    out = run_plan(
        "--json",
        env={
            "NUMARUN_TOPOLOGY": fixture,
            "CUDA_VISIBLE_DEVICES": "6,1",
            "OMP_NUM_THREADS": "5",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        },
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [(r["gpu"]["index"], r["gpu"]["cuda_index"], r["numa_node"]) for r in data["ranks"]] == [
        (6, 0, 1),
        (1, 1, 0),
    ]
    assert all("OMP_NUM_THREADS" not in r["env"] and "CUDA_DEVICE_ORDER" not in r["env"] for r in data["ranks"])
    assert any("OMP_NUM_THREADS is set by the user" in w for w in data["warnings"])
    # alone on its node, each rank gets all 24 cores / 48 threads of it
    assert [len(r["cpus"]) for r in data["ranks"]] == [48, 48]
    cpu_only = json.loads(
        run_plan(
            "--json", "--nproc-per-node", "4", env={"NUMARUN_TOPOLOGY": fixture, "CUDA_VISIBLE_DEVICES": ""}
        ).stdout
    )
    assert [r["gpu"] for r in cpu_only["ranks"]] == [None] * 4
    assert [r["numa_node"] for r in cpu_only["ranks"]] == [0, 0, 1, 1]


def test_svg_is_written(tmp_path: Path) -> None:
    svg = tmp_path / "plan.svg"
    out = run_plan("--topology", f"{SMI}/aws-p4d.24xlarge.txt", "--svg", str(svg))
    assert out.returncode == 0, out.stderr
    assert svg.read_text().lstrip().startswith("<") and "</svg>" in svg.read_text()
    assert "rank" in out.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--binding", "foo"], "'foo': expected one of node, socket, exclusive, core-complex, none"),
        (["--nproc-per-node", "0"], "'0': expected a positive integer"),
        (["--nproc-per-node", "x"], "'x': expected a positive integer"),
        (["--mem-policy", "interleave"], "'interleave': expected one of bind, preferred, none"),
        (["--topology", f"{SMI}/aws-p4d.24xlarge.txt", "--nproc-per-node", "9"], "9: only 8 GPUs"),
        (
            [
                "--topology",
                f"{SMI}/pcie-8gpu-pix-phb-sys-2x14c.txt",
                "--binding",
                "exclusive",
                "--nproc-per-node",
                "8",
                "--topology",
                f"{SMI}/tesla-p4-1gpu-numa-NA.txt",
            ],
            "8: only 1 GPUs",
        ),
        (["--topology", "tests/no-such-file"], "'tests/no-such-file' does not exist"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    out = run_plan(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_too_few_cores_exit_2_with_numbers() -> None:
    out = run_plan(
        "--topology", f"{SMI}/tesla-p4-1gpu-numa-NA.txt", "--nproc-per-node", "9", env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "has 8 usable physical cores for 9 ranks" in out.stderr
    shared = run_plan(
        "--topology",
        f"{SMI}/tesla-p4-1gpu-numa-NA.txt",
        "--nproc-per-node",
        "9",
        "--binding",
        "node",
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert shared.returncode == 0, shared.stderr
