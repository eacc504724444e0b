"""The DDP measuring scripts run: ddp_phases.py under numarun, netns-train.sh's input checks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

PHASES = re.compile(
    r"^PHASES (\S+) .*: F ([\d.]+) B ([\d.]+) O ([\d.]+) step ([\d.]+) s \| first_cross (\S+) s link (\S+) s "
    r"bytes ([\d.]+) MB per rank$",
    re.M,
)

pytestmark = pytest.mark.slow


def _phases(tmp_path: Path, *options: str) -> re.Match[str]:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "--nproc-per-node",
            "2",
            "--standalone",
            "--binding",
            "none",
            str(REPO / "scripts" / "ddp_phases.py"),
            "--d-model",
            "64",
            "--layers",
            "1",
            "--steps",
            "3",
            *options,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    found = PHASES.search(r.stdout)
    assert found, r.stdout[-2000:]
    return found


def test_ddp_phases_times_the_hierarchical_stream(tmp_path: Path) -> None:
    m = _phases(tmp_path, "--comm", "hierarchical", "--compression", "bf16", "--chunk-mb", "0.01")
    assert m.group(1) == "hierarchical-bf16"
    f, b, o, step = (float(m.group(i)) for i in range(2, 6))
    # each step is at least each of its phases, so the medians are ordered the same way
    assert min(f, b, o) > 0 and step >= max(f, b, o)
    assert m.group(6) != "nan" and m.group(7) != "nan"  # the stream's chunks were seen
    # one node: nothing crosses nodes, but each chunk goes through the step (bf16 bytes counted)
    assert float(m.group(8)) > 0


def test_ddp_phases_flat_has_no_stream(tmp_path: Path) -> None:
    m = _phases(tmp_path, "--comm", "flat")
    assert m.group(1) == "flat" and (m.group(6), m.group(7), m.group(8)) == ("nan", "nan", "0.00")


NETNS = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")),
    reason="netns-train.sh needs root and iproute2 (ip, tc)",
)


@NETNS
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PHASES": "1", "MODES": "hier-bf16-sync"}, "bad mode 'hier-bf16-sync' with PHASES=1"),
        ({"MODES": "hier-fp8"}, "bad mode 'hier-fp8' in MODES"),
        ({"SHAPES": "4x2"}, "bad shape '4x2' in SHAPES"),
        ({"NODE_CPUS": "half"}, "bad NODE_CPUS 'half'"),
    ],
)
def test_netns_train_refuses_bad_knobs_before_making_namespaces(env: dict[str, str], message: str) -> None:
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "netns-train.sh")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == before


@NETNS
def test_netns_train_gives_each_node_its_own_cpus(tmp_path: Path) -> None:
    """Two namespace nodes, one tiny PHASES run: node 0's ranks on the first half of the
    host's CPUs, node 1's on the second (all of them with NODE_CPUS=shared)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: one per node")
    half = len(cpus) // 2
    for mode, node0, node1 in (("split", cpus[:half], cpus[half : 2 * half]), ("shared", cpus, cpus)):
        env = {
            **os.environ,
            "PHASES": "1",
            "SHAPES": "2x2",
            "MODES": "hier-bf16",
            "ROUNDS": "1",
            "STEPS": "2",
            "PHASES_ARGS": "--d-model 64 --layers 1",
            "NODE_CPUS": mode,
            "OUT": str(tmp_path / mode),
        }
        r = subprocess.run(
            ["bash", str(REPO / "scripts" / "netns-train.sh")], env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert PHASES.search(r.stdout.replace("2x2 round 0 ", "")), r.stdout
        line = next(ln for ln in r.stdout.splitlines() if " CPUS " in ln)
        got = dict(item.split(":") for item in line.split(" CPUS ")[1].split())
        want = [node0, node0, node1, node1]  # ranks 0, 1 on node 0; 2, 3 on node 1
        assert got == {str(i): ",".join(map(str, c)) for i, c in enumerate(want)}, line


def test_bench_checkpoint_prints_the_checksum_cost(tmp_path: Path) -> None:
    """scripts/bench_checkpoint.py under numarun: save, checksum, verification and load timed side by side."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "--nproc-per-node",
            "2",
            "--standalone",
            "--binding",
            "none",
            str(REPO / "scripts" / "bench_checkpoint.py"),
            "--rounds",
            "2",
            "--dir",
            str(tmp_path / "b"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.search(r"^CHECKSUM save=([\d.]+)% resume=([\d.]+)%$", r.stdout, re.M)
    assert found, r.stdout[-2000:]
    assert re.search(r"^save +[\d.]+ ms +of which checksums +[\d.]+ ms", r.stdout, re.M), r.stdout[-2000:]
    saved = list((tmp_path / "b" / "ck").glob("step_*/meta.json"))
    assert saved and all("checksums" in p.read_text() for p in saved)


def test_bench_pp_memory_sets_pipeline_stages_beside_ddp(tmp_path: Path) -> None:
    """scripts/bench_pp_memory.py: per-rank peaks of pp=2 and DDP from one invocation, and their ratios."""
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench_pp_memory.py"),
            "--d-model",
            "64",
            "--layers",
            "2",
            "--steps",
            "1",
            "--binding",
            "none",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "pp=2: 1F1B, 2 stages (in+0 | 1+out), 2 microbatches" in r.stdout, r.stdout
    rows = [ln.split() for ln in r.stdout.splitlines() if re.match(r"^ +[01] ", ln)]
    assert [row[0] for row in rows] == ["0", "1"] and all(float(v) > 0 for row in rows for v in row[1:3]), r.stdout
    assert re.search(r"^PP_MEMORY peak=[\d.]+ above_start=[\d.]+$", r.stdout, re.M), r.stdout


def test_bench_job_start_times_the_per_node_path() -> None:
    """scripts/bench_job_start.py runs the product's per-node job start on synthetic Slurm answers."""
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_job_start.py"), "--nodes", "8,300", "--runs", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = re.findall(r"^ +(\d+) +([\d.]+) ms +[\d.]+ ms +0 \(2 for the whole job\)$", r.stdout, re.M)
    assert [n for n, _ in rows] == ["8", "300"], r.stdout


def test_bench_sweep_times_both_launchers_side_by_side() -> None:
    """scripts/bench_sweep.py runs one Hydra sweep under the basic launcher and under numarun's, and prints the
    ratio."""
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_sweep.py"), "--jobs", "2", "--seconds", "0.2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^  hydra/launcher=basic +[\d.]+ s", r.stdout, re.M), r.stdout
    assert re.search(r"^  hydra/launcher=numarun +[\d.]+ s", r.stdout, re.M), r.stdout
    assert re.search(r"^  numarun / basic +[\d.]+x$", r.stdout, re.M), r.stdout
