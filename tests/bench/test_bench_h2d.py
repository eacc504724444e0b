"""``numarun bench h2d``: CPU-only behaviour, the bound worker's placement, and the report's arithmetic."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.bench import h2d
from numarun.launch.child import numarun_command
from numarun.worker import affinity

NUMARUN = [sys.executable, "-m", "numarun"]


def _has_cuda() -> bool:
    # In a child, so this test process never initialises CUDA either.
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout.strip() == "True"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NUMARUN_TOPOLOGY", None)
    env.pop("NUMARUN_LOG_LEVEL", None)
    return env


@pytest.mark.slow
def test_cpu_only_machine_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    if _has_cuda():
        pytest.skip("a CUDA device is visible: the CPU-only path does not apply")
    out_json = tmp_path / "h2d.json"
    proc = subprocess.run(
        [*NUMARUN, "bench", "h2d", "--size", "1MiB", "--iters", "1", "--json", "--json-file", str(out_json)],
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == h2d.NO_CUDA_EXIT, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "no CUDA device" in lines[0] and "bench h2d" in lines[0]
    assert proc.stdout == ""
    assert not out_json.exists()


@pytest.mark.slow
def test_bad_size_is_a_one_line_usage_error() -> None:
    proc = subprocess.run(
        [*NUMARUN, "bench", "h2d", "--size", "lots"], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "'lots'" in proc.stderr


@pytest.mark.slow
def test_numarun_worker_runs_bound_to_the_plan(tmp_path: Path) -> None:
    """The 'numarun' worker starts under numarun run: its memory policy is bind to the plan's node."""
    out = tmp_path / "numarun.json"
    plan = subprocess.run(
        [*NUMARUN, "plan", "--json", "--nproc-per-node", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        check=True,
    )
    rank = json.loads(plan.stdout)["ranks"][0]
    cmd = h2d.worker_argv(label="numarun", out=str(out), size_bytes=4096, iters=1)
    assert cmd[: len(numarun_command("run"))] == numarun_command("run")
    subprocess.run(cmd, env=_env(), timeout=180, check=True, capture_output=True, cwd=tmp_path)
    result = json.loads(out.read_text())
    assert result["label"] == "numarun"
    assert result["mem_policy"] == "bind"
    assert result["mems"] == rank["mems"]
    assert result["cpus"] == rank["cpus"]
    if not result["cuda"]:
        assert "no CUDA device" in result["error"]


def test_raw_worker_is_plain_python_without_numarun() -> None:
    cmd = h2d.worker_argv(label="raw", out="/x.json", size_bytes=8, iters=2)
    assert cmd[:3] == [sys.executable, "-m", "numarun.bench.h2d"]
    assert "run" not in cmd and "--worker" in cmd and json.loads(cmd[-1])["size_bytes"] == 8


def test_page_nodes_finds_a_touched_buffer_on_an_allowed_node() -> None:
    size = 1 << 20
    buf = ctypes.create_string_buffer(size)
    ctypes.memset(buf, 1, size)
    nodes = h2d.page_nodes(ctypes.addressof(buf), size)
    assert nodes, "move_pages reported no node for touched pages"
    assert set(nodes) <= set(affinity.mems_allowed())


def test_ratios_and_table() -> None:
    bound = h2d.WorkerResult(
        label="numarun",
        cuda=True,
        size_bytes=2**30,
        iters=4,
        device="GPU X",
        gbps={"h2d_pinned": 50.0, "d2h_pinned": 40.0, "h2d_pageable": 10.0, "d2h_pageable": 20.0},
        mem_policy="bind",
        mems=(1,),
        pinned_page_nodes=(1,),
        pageable_page_nodes=(1,),
    )
    raw = h2d.WorkerResult(
        label="raw",
        cuda=True,
        size_bytes=2**30,
        iters=4,
        gbps={"h2d_pinned": 25.0, "d2h_pinned": 40.0, "h2d_pageable": 5.0, "d2h_pageable": 40.0},
    )
    r = h2d.ratios(bound.gbps, raw.gbps)
    assert r["h2d_pinned_over_pageable"] == 5.0
    assert r["d2h_pinned_over_pageable"] == 2.0
    assert r["h2d_pinned_numarun_over_raw"] == 2.0
    assert r["d2h_pageable_numarun_over_raw"] == 0.5
    title, head, rule, h2d_row, d2h_row, ratio_line, worker_line = h2d.format_table(bound, raw).splitlines()
    assert "1 GiB x 4 on GPU X" in title
    assert [c.strip() for c in head.split("  ") if c] == [
        "GB/s",
        "numarun pinned",
        "numarun pageable",
        "raw pinned",
        "raw pageable",
    ]
    assert set(rule) == {"─"} and len(rule) == len(head)  # rich's rule under the header
    assert h2d_row.split() == ["h2d", "50.00", "10.00", "25.00", "5.00"]
    assert d2h_row.split() == ["d2h", "40.00", "20.00", "40.00", "40.00"]
    assert len(h2d_row) == len(d2h_row) == len(head)  # numbers right-aligned under their headers
    assert ratio_line.startswith("ratios: h2d_pinned_over_pageable 5.000")
    assert "pinned pages on node(s) 1, pageable pages on node(s) 1" in worker_line


@pytest.mark.slow
def test_launching_side_never_imports_torch() -> None:
    """The command's own process must not create a CUDA context: it may not even import torch."""
    code = (
        "import sys, numarun.cli, numarun.commands.bench, numarun.bench.h2d\n"
        "assert 'torch' not in sys.modules, 'torch imported by the launching side'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=_env())
