"""The reference trainer through real ``numarun`` processes on CPU (gloo).

A handful of short runs: ddp and fsdp (2 ranks), resume, SIGUSR1, batch_size=auto, and a
user's own @hydra.main script (the layouts, hsdp and tp on two nodes among them, are held to
a one-rank run in test_train_layouts.py and test_train_pipeline.py). Every run has a timeout
so none can hang CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS

pytestmark = pytest.mark.slow

TRAIN = str(REPO / "scripts" / "train.py")
HYDRA_APP = str(SCRIPTS / "hydra_app.py")
TIMEOUT = 240
QUIET = ["trainer.progress=false"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_CONFIG", "NUMARUN_RUN_DIR"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def numarun(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT
    )


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run_dir)}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="module")
def ddp8(base: Path) -> Path:
    ok(
        numarun(
            [
                "--nproc-per-node",
                "2",
                TRAIN,
                "parallel=ddp",
                "trainer.steps=8",
                "optim.lr=0.004",
                "trainer.batch_size=8",
                f"hydra.run.dir={base / 'ddp8'}",
                *QUIET,
            ],
            base,
        )
    )
    return base / "ddp8"


@pytest.fixture(scope="module")
def fsdp8(base: Path) -> Path:
    ok(
        numarun(
            [
                "--nproc-per-node",
                "2",
                TRAIN,
                "parallel=fsdp",
                "trainer.steps=8",
                "optim.lr=0.004",
                "trainer.batch_size=8",
                f"hydra.run.dir={base / 'fsdp8'}",
                *QUIET,
            ],
            base,
        )
    )
    return base / "fsdp8"


def test_ddp_trains_and_overrides_reach_the_job(ddp8: Path) -> None:
    rows = metrics(ddp8)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert all(r["lr"] == pytest.approx(0.004) for r in rows)  # optim.lr=0.004 reached the workers
    assert rows[-1]["loss"] < rows[0]["loss"]
    s = summary(ddp8)
    assert s["world_size"] == 2 and s["batch_size"] == 8 and s["parallel"] == "ddp"
    assert len(s["peak_mem_mb_per_rank"]) == 2 and min(s["peak_mem_mb_per_rank"]) > 0
    assert s["samples_per_s_mean"] > 0
    assert (Path(s["checkpoint"]) / "meta.json").is_file()
    # the log line's phases (this rank's recent steps, from the step report's recorder); no MFU on a CPU
    assert all(set(r["phases"]) == {"input", "compute", "comm", "optim"} for r in rows[1:]) and "mfu" not in rows[-1]
    assert sum(rows[-1]["phases"].values()) == pytest.approx(1.0, abs=0.01)
    kept = list(ddp8.glob("numarun_steps.*/steps.jsonl"))  # the step report keeps its files in the run dir
    assert len(kept) == 1 and len(kept[0].read_text().splitlines()) == 16


def test_fsdp_matches_ddp_step_by_step(ddp8: Path, fsdp8: Path) -> None:
    a, b = losses(ddp8), losses(fsdp8)
    assert a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-4), step
    assert b[8] < b[1]


def test_one_rank_with_grad_accum_matches_two_ranks(base: Path, ddp8: Path) -> None:
    # the same global batch of 8: one rank in two micro-batches of 4 = two ranks of 4 each
    run_dir = base / "accum"
    ok(
        numarun(
            [
                "--nproc-per-node",
                "1",
                TRAIN,
                "trainer.steps=8",
                "optim.lr=0.004",
                "trainer.batch_size=8",
                "trainer.grad_accum=2",
                f"hydra.run.dir={run_dir}",
                *QUIET,
            ],
            base,
        )
    )
    a, b = losses(ddp8), losses(run_dir)
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-4), step


def test_resume_continues_with_the_same_losses(base: Path, fsdp8: Path) -> None:
    ck = base / "ck"
    common = [
        "--nproc-per-node",
        "2",
        TRAIN,
        "parallel=fsdp",
        "optim.lr=0.004",
        "trainer.batch_size=8",
        f"trainer.checkpoint_dir={ck}",
        *QUIET,
    ]
    ok(numarun([*common, "trainer.steps=4", f"hydra.run.dir={base / 'first'}"], base))
    assert (ck / "step_00000004" / "meta.json").is_file()
    ok(numarun([*common, "trainer.steps=8", "trainer.resume=true", f"hydra.run.dir={base / 'resumed'}"], base))
    resumed, whole = losses(base / "resumed"), losses(fsdp8)
    assert sorted(resumed) == [5, 6, 7, 8]
    for step in resumed:
        assert resumed[step] == pytest.approx(whole[step], abs=1e-6), step
    s = summary(base / "resumed")
    assert s["start_step"] == 4 and s["resumed_from"].endswith("step_00000004")


def _worker_pids(proc: subprocess.Popen) -> list[int]:
    import psutil

    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if any(part.endswith("worker/entry.py") for part in child.cmdline()):
                found.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def test_sigusr1_saves_a_checkpoint_and_exits_0(base: Path) -> None:
    run_dir = base / "signal"
    cmd = [
        sys.executable,
        "-m",
        "numarun",
        "--nproc-per-node",
        "1",
        TRAIN,
        "trainer.steps=1000000",
        f"hydra.run.dir={run_dir}",
        *QUIET,
    ]
    proc = subprocess.Popen(cmd, cwd=base, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT  # a guard against hanging, not a performance bound
        while time.monotonic() < deadline and proc.poll() is None:
            if (run_dir / "metrics.jsonl").exists() and len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        pids = _worker_pids(proc)
        assert pids, "no worker found"
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    s = summary(run_dir)
    assert s["stopped_by"] == "SIGUSR1"
    last = metrics(run_dir)[-1]["step"]
    assert s["steps_done"] == last and 2 <= last < 1000000
    meta = json.loads((run_dir / "checkpoints" / f"step_{last:08d}" / "meta.json").read_text())
    assert meta["step"] == last


def test_batch_size_auto_reports_each_size(base: Path) -> None:
    run_dir = base / "auto"
    ok(
        numarun(
            [
                "--nproc-per-node",
                "1",
                TRAIN,
                "trainer.batch_size=auto",
                "trainer.auto_max_batch=16",
                "trainer.memory_limit_mb=100000",
                "trainer.steps=2",
                f"hydra.run.dir={run_dir}",
                *QUIET,
            ],
            base,
        )
    )
    search = json.loads((run_dir / "batch_size_search.json").read_text())
    assert [r["batch_size"] for r in search["sizes"]] == [1, 2, 4, 8, 16]
    assert all(r["fits"] and r["samples_per_s"] > 0 for r in search["sizes"])
    assert search["chosen"] == 16 and summary(run_dir)["batch_size"] == 16
    # a limit below what the process already holds: nothing fits, one clear line
    proc = numarun(
        [
            "--nproc-per-node",
            "1",
            TRAIN,
            "trainer.batch_size=auto",
            "trainer.memory_limit_mb=1",
            f"hydra.run.dir={base / 'auto_none'}",
            *QUIET,
        ],
        base,
    )
    assert proc.returncode != 0
    assert "bad trainer.batch_size 'auto'" in proc.stderr
    search = json.loads((base / "auto_none" / "batch_size_search.json").read_text())
    assert search["chosen"] == 0 and not search["sizes"][0]["fits"]


def test_user_hydra_app_shares_one_run_dir(base: Path) -> None:
    cwd = base / "app"
    cwd.mkdir()
    ok(numarun(["--nproc-per-node", "2", HYDRA_APP, "lr=0.5", "name=x"], cwd))
    run_dirs = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    assert len(run_dirs) == 1
    run_dir = run_dirs[0]
    records = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rec in records:
        assert rec["config"] == {"lr": 0.5, "name": "x", "optim": {"momentum": 0.9}}
        assert rec["output_dir"] == str(run_dir) and rec["world_size"] == 2
    assert sorted(p.name for p in (run_dir / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert not list(run_dir.rglob("*/.hydra/*"))  # no per-rank .hydra anywhere below
