"""No rank outlives its launcher, and every signal to numarun has a stated meaning.

Real ``numarun``, torchrun and worker processes (gloo, CPU). Each test checks that the
workers are gone once numarun is, and that numarun's private ``numarun-*`` directory (the
plan file, the workers' records, torchrun's logs) is removed on that exit path too:
``TMPDIR`` points into the test's own directory so that only this run's directory counts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import (
    REPO,
    SCRIPTS,
    clean_env,
    error_lines,
    free_port,
    leaked,
    listening,
    numarun_cmd,
    pid_files,
    wait_until,
)

TRAIN = str(REPO / "scripts" / "train.py")
TIMEOUT = 120  # "did not hang" guard for every wait

pytestmark = pytest.mark.slow


def _start(procs: list, args: list[str], tmp: Path, cwd: Path | None = None) -> subprocess.Popen:  # type: ignore[type-arg]
    (tmp / "tmp").mkdir(exist_ok=True)
    p = subprocess.Popen(
        [*numarun_cmd(), *args],
        cwd=cwd or tmp,
        env=clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp / "tmp")),
        stdout=open(tmp / "log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    procs.append(p)
    return p


def _private_dirs(tmp: Path) -> list[Path]:
    """numarun-* directories still there shortly after numarun exited (the cleaner runs on EOF)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and list((tmp / "tmp").glob("numarun-*")):
        time.sleep(0.1)
    return list((tmp / "tmp").glob("numarun-*"))


def _workers(p: subprocess.Popen) -> list[int]:  # type: ignore[type-arg]
    return [c.pid for c in psutil.Process(p.pid).children(recursive=True) if "entry.py" in " ".join(c.cmdline())]


def test_kill_minus_9_of_numarun_ends_every_worker(tmp_path: Path, procs: list) -> None:
    p = _start(procs, ["--nproc-per-node", "2", str(SCRIPTS / "fault_allreduce.py"), str(tmp_path)], tmp_path)
    wait_until("two workers", lambda: len(pid_files(tmp_path)) == 2, TIMEOUT, 0.05, proc=p)
    workers = pid_files(tmp_path)
    assert list((tmp_path / "tmp").glob("numarun-*/plan.json"))  # the private plan file exists while it runs
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=TIMEOUT)
    assert leaked(workers) == []  # the parent-death signal, not a reaper in numarun
    assert _private_dirs(tmp_path) == []


def _signal_a_training_run(tmp_path: Path, procs: list, sig: signal.Signals) -> tuple[int, str, Path, list[int]]:
    """Start a long trainer run with 2 ranks, send ``sig`` to numarun once two steps are logged;
    returns (exit code, log, run dir, the worker pids)."""
    run_dir = tmp_path / "run"
    p = _start(
        procs,
        ["--nproc-per-node", "2", TRAIN, "trainer.steps=100000", "trainer.progress=false", f"hydra.run.dir={run_dir}"],
        tmp_path,
    )
    metrics = run_dir / "metrics.jsonl"
    wait_until(
        "two logged steps",
        lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2,
        TIMEOUT,
        0.05,
        proc=p,
    )
    workers = _workers(p)
    p.send_signal(sig)
    code = p.wait(timeout=TIMEOUT)
    return code, (tmp_path / "log").read_text(), run_dir, workers


def test_usr1_is_forwarded_and_the_trainer_checkpoints_and_ends(tmp_path: Path, procs: list) -> None:
    code, log, run_dir, workers = _signal_a_training_run(tmp_path, procs, signal.SIGUSR1)
    assert code == 0, log[-3000:]
    assert "got SIGUSR1: sending it to 2 worker(s)" in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGUSR1" and summary["steps_done"] < 100000
    assert (run_dir / "checkpoints" / f"step_{summary['steps_done']:08d}" / "meta.json").is_file()
    assert leaked(workers) == [] and _private_dirs(tmp_path) == []


def test_usr2_to_a_script_without_a_handler_ends_its_workers(tmp_path: Path, procs: list) -> None:
    p = _start(procs, ["--nproc-per-node", "2", str(SCRIPTS / "fault_allreduce.py"), str(tmp_path)], tmp_path)
    wait_until("two workers", lambda: len(pid_files(tmp_path)) == 2, TIMEOUT, 0.05, proc=p)
    workers = pid_files(tmp_path)
    p.send_signal(signal.SIGUSR2)
    code = p.wait(timeout=TIMEOUT)
    log = (tmp_path / "log").read_text()
    # the workers die of SIGUSR2's default action; numarun reports it and ends, never 140
    assert code == 1, log[-3000:]
    lines = error_lines(log)
    assert len(lines) == 1 and "killed by SIGUSR2" in lines[0], log[-3000:]
    assert leaked(workers) == [] and _private_dirs(tmp_path) == []


def test_sigterm_to_the_trainer_is_a_clean_stop(tmp_path: Path, procs: list) -> None:
    code, log, run_dir, workers = _signal_a_training_run(tmp_path, procs, signal.SIGTERM)
    assert code == 0, log[-3000:]
    assert "numarun: stopped by SIGTERM: every worker finished cleanly" in log and not error_lines(log)
    assert json.loads((run_dir / "summary.json").read_text())["stopped_by"] == "SIGTERM"
    assert leaked(workers) == [] and _private_dirs(tmp_path) == []


def test_sigterm_during_rendezvous(tmp_path: Path, procs: list) -> None:
    """Node 0 of two waits for a node that never comes: SIGTERM then is 143, one line, nothing left."""
    port = free_port()
    p = _start(
        procs,
        [
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--nproc-per-node",
            "1",
            "--master-port",
            str(port),
            str(SCRIPTS / "fault_allreduce.py"),
            str(tmp_path),
        ],
        tmp_path,
    )
    # numarun's private directory and the store come up side by side: wait for both, in whichever order
    wait_until(
        "the rendezvous store and numarun's private directory",
        lambda: listening(port) and list((tmp_path / "tmp").glob("numarun-*")),
        TIMEOUT,
        0.05,
        proc=p,
    )
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=TIMEOUT)
    log = (tmp_path / "log").read_text()
    assert code == 128 + signal.SIGTERM, log[-3000:]
    lines = error_lines(log)
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and "Traceback" not in log, log[-3000:]
    assert _private_dirs(tmp_path) == [] and pid_files(tmp_path) == []


def test_a_worker_whose_launcher_is_gone_ends_at_once(tmp_path: Path) -> None:
    """The launcher died before the worker armed its parent-death signal: the worker sees a
    parent that is not the launcher and ends without running the script."""
    entry = REPO / "launcher" / "worker" / "entry.py"
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = clean_env(PYTHONUNBUFFERED="1", NUMARUN_LAUNCHER_PID="1" if os.getppid() != 1 else "2", LOCAL_RANK="0")
    r = subprocess.run(
        [sys.executable, str(entry), str(script)], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert r.returncode == 1 and "the launcher (pid" in r.stderr and "is gone" in r.stderr
    assert not marker.exists()
    # with the right launcher pid (this test process is the parent), it runs
    env["NUMARUN_LAUNCHER_PID"] = str(os.getpid())
    r = subprocess.run(
        [sys.executable, str(entry), str(script)], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert r.returncode == 0, r.stderr
    assert marker.exists()
