"""The binding watcher: numa_maps parsing on recorded text, drift found and repaired in a real worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS
from trees import FIXTURES

from numarun.worker.binding_watch import Watcher, drifted_threads, parse_numa_maps, remote_share

MAPS = FIXTURES / "numa_maps"
REPIN = str(SCRIPTS / "repin_thread.py")


def test_numa_maps_recorded_on_one_node():
    per_node = parse_numa_maps((MAPS / "live-vm-python.txt").read_text())
    assert list(per_node) == [0]
    assert per_node[0] >= 32 << 20  # the 32 MiB array is resident
    assert remote_share(per_node, [0]) == 0.0


def test_numa_maps_two_nodes_with_huge_pages():
    per_node = parse_numa_maps((MAPS / "constructed-2node.txt").read_text())
    page = 4096
    assert per_node == {0: (150 + 1000 + 10) * page + 2 * 2048 * 1024, 1: (50 + 3000) * page}
    share = remote_share(per_node, [0])
    assert share == pytest.approx(per_node[1] / (per_node[0] + per_node[1]))
    assert remote_share(per_node, [0, 1]) == 0.0
    assert remote_share({}, [0]) == 0.0


def test_drifted_threads_are_those_off_the_bound_cpus():
    me = threading.get_native_id()
    assert me not in [tid for tid, _, _ in drifted_threads(frozenset(os.sched_getaffinity(0)))]
    moved = {tid: (name, cpus) for tid, name, cpus in drifted_threads(frozenset({-1}))}
    assert moved[me] == (threading.current_thread().name, tuple(sorted(os.sched_getaffinity(0))))


def test_watcher_reads_this_process_and_warns_once(caplog, tmp_path):
    maps = tmp_path / "numa_maps"
    maps.write_text((MAPS / "constructed-2node.txt").read_text())
    mine = os.sched_getaffinity(0)
    w = Watcher(mine, [0], interval=1.0, strict=False, numa_maps=str(maps))
    with caplog.at_level("WARNING", logger="numarun.worker.bootstrap.watch"):
        w.check_once()
        w.check_once()
    assert w.figures()["remote_memory_share"] == pytest.approx(0.5827, abs=0.001)
    assert [r.message.count("remote-memory") for r in caplog.records] == [1]  # once per kind


def _run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "REPIN_WAIT": "2", "PYTHONUNBUFFERED": "1"}
    env.pop("NUMARUN_TOPOLOGY", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "run",
            "--nproc-per-node",
            "1",
            "--binding",
            "node",
            "--watch-interval",
            "0.2",
            *flags,
            REPIN,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )


def _lines(out: str) -> dict[str, str]:
    return {
        line.split()[0]: (line.split() + [""])[1]
        for line in out.splitlines()
        if line.split() and line.split()[0] in ("bound", "moved", "final")
    }


@pytest.mark.slow
def test_a_thread_that_repins_itself_is_reported(tmp_path):
    p = _run(tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    got = _lines(p.stdout)
    if got["bound"] == got["moved"]:
        pytest.skip("one CPU only: a thread cannot leave its binding")
    assert "binding drift (affinity)" in p.stderr and "'repinner'" in p.stderr
    assert p.stderr.count("binding drift (affinity)") == 1
    assert got["final"] == got["moved"]  # reported, not repaired


@pytest.mark.slow
def test_strict_binding_puts_the_thread_back(tmp_path):
    p = _run(tmp_path, "--strict-binding")
    assert p.returncode == 0, p.stderr[-3000:]
    got = _lines(p.stdout)
    if got["bound"] == got["moved"]:
        pytest.skip("one CPU only: a thread cannot leave its binding")
    assert "'repinner'" in p.stderr and "put back" in p.stderr
    assert got["final"] == got["bound"]


@pytest.mark.slow
def test_no_watch_turns_it_off(tmp_path):
    p = _run(tmp_path, "--no-watch")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "binding drift" not in p.stderr


@pytest.mark.slow
def test_bad_watch_interval_is_exit_2(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "numarun", "run", "--watch-interval", "-1", "--nproc-per-node", "1", REPIN],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode == 2 and "--watch-interval" in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_trainer_writes_the_watchers_figures(tmp_path):
    run_dir = tmp_path / "run"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NUMARUN_CONFIG", "NUMARUN_RUN_DIR", "NUMARUN_TOPOLOGY"))
    }
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "run",
            "--nproc-per-node",
            "1",
            "--watch-interval",
            "0.1",
            str(REPO / "scripts" / "train.py"),
            "trainer.steps=4",
            "trainer.progress=false",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(len(r["threads_repaired"]) == 1 and len(r["remote_memory_share"]) == 1 for r in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["threads_repaired"] == [0]
    share = summary["remote_memory_share"][0]
    assert share is not None and 0.0 <= share <= 1.0
