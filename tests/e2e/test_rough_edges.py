"""Rough edges that once misled users: bench report, topo/plan wording, batch-size cap, binding line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO

from numarun.bench import allreduce as bench
from numarun.topology.discover import load_topology
from numarun.view.topo import render_text

FIX = FIXTURES
TRAIN = str(REPO / "scripts" / "train.py")


def _numarun(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "NUMARUN_LOG_LEVEL")}
    return subprocess.run(
        [sys.executable, "-m", "numarun", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**full, **(env or {})},
    )


def _strict_json(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_one_node_has_no_bound_ratio() -> None:
    assert bench.bound_ratio(num_nodes=1, local_world_size=4) is None
    assert bench.bound_ratio(num_nodes=2, local_world_size=2) == pytest.approx(2 / 3)


@pytest.mark.slow
def test_bench_allreduce_report_is_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ar.json"
    proc = _numarun(
        tmp_path,
        "bench",
        "allreduce",
        "--sizes",
        "1K",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--json",
        "--json-file",
        str(out),
        env={"PYTHONWARNINGS": "default"},
    )
    assert proc.returncode == 0, proc.stderr
    report = _strict_json(out.read_text())  # null, never NaN
    assert isinstance(report, dict) and report["bound_ratio"] is None
    assert _strict_json(proc.stdout) == report  # --json: rank 0's report on stdout, alone; the file the same
    assert "FutureWarning" not in proc.stderr, proc.stderr
    assert "set by the user" not in proc.stderr  # numarun set no OMP_NUM_THREADS of its own to complain about
    bench.render(report)  # the table --json replaces
    assert "only helps across nodes" in capsys.readouterr().out


def test_topo_names_where_gpus_were_looked_for(tmp_path: Path) -> None:
    xml = load_topology(str(FIX / "hwloc" / "192em64t-24n8c2t.xml"))
    text = render_text(xml)
    assert "hwloc XML lists no GPU" in text and "NVML" not in text
    snap = tmp_path / "node.json"
    snap.write_text(xml.to_json())
    shown = render_text(load_topology(str(snap)), snapshot=str(snap), width=400)
    assert f"source: snapshot {snap} (recorded from hwloc:" in shown


def test_plan_title_counts_one_rank(h200_tree: Path) -> None:
    from numarun.plan.binding import make_plan
    from numarun.plan.model import PlanRequest
    from numarun.view.plan import render_plan

    plan = make_plan(load_topology(str(h200_tree)), PlanRequest(nproc_per_node=1))
    first = render_plan(plan, width=160).splitlines()[0]
    assert ": 1 rank," in first


@pytest.mark.slow
def test_auto_batch_size_says_when_the_cap_stopped_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _numarun(
        tmp_path,
        "--nproc-per-node",
        "1",
        TRAIN,
        "trainer.batch_size=auto",
        "trainer.auto_max_batch=4",
        "trainer.memory_limit_mb=1000000",
        "trainer.steps=1",
        "trainer.progress=false",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, proc.stderr
    assert "stopped at trainer.auto_max_batch=4" in proc.stdout
    search = json.loads((run_dir / "batch_size_search.json").read_text())
    assert search["stopped_by"] == "auto_max_batch" and search["chosen"] == 4


@pytest.mark.slow
def test_binding_line_shows_by_default_and_follows_an_explicit_log_level(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    shown = _numarun(tmp_path, "--nproc-per-node", "1", str(script))
    quiet = _numarun(tmp_path, "--log-level", "WARNING", "--nproc-per-node", "1", str(script))
    assert shown.returncode == quiet.returncode == 0
    assert "numarun: INFO: rank 0: " in shown.stderr
    assert "rank 0: " not in quiet.stderr
