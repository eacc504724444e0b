"""Faults on this machine, through real ``numarun``, torchrun and worker processes.

Every test injects one fault (a crashing rank, a lost node, a signal, a kill in the middle
of a checkpoint save, a binding the kernel refuses) and then checks that no worker process
is left behind: each worker writes its pid, and every such pid must be gone once numarun
has exited. Timeouts guard against hangs; they are not performance bounds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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

pytestmark = pytest.mark.slow

TRAIN = str(REPO / "scripts" / "train.py")
TIMEOUT = 120  # "did not hang" guard for every wait

# Faults injected by this module, by test (the counts docs/reliability.md reports).
FAULTS = {
    "crash_restarts_from_checkpoint": 1,
    "crash_without_restart": 1,
    "node_lost": 2,
    "signal_to_numarun": 2,
    "trainer_sigterm": 1,
    "kill_during_save": 2,
    "binding_refused": 2,
}


def _env(**extra: str) -> dict[str, str]:
    return clean_env(PYTHONUNBUFFERED="1", **extra)


def _start(procs: list, args: list[str], log: Path, cwd: Path = REPO, **env: str) -> subprocess.Popen:  # type: ignore[type-arg]
    p = subprocess.Popen(
        [*numarun_cmd(), *args],
        cwd=cwd,
        env=_env(**env),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    procs.append(p)
    return p


def test_crash_restarts_from_checkpoint(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            *numarun_cmd(),
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            str(SCRIPTS / "fault_counter.py"),
            str(tmp_path),
            "12",
            "1",
            "5",
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr[-3000:]

    def steps(rank: int, attempt: int) -> tuple[int, list[int]]:
        head, *rest = (tmp_path / f"steps{rank}.{attempt}").read_text().splitlines()
        return int(head.removeprefix("resume ")), [int(s) for s in rest]

    for rank in (0, 1):
        assert (tmp_path / f"ckpt{rank}").read_text() == "12"
        start0, first = steps(rank, 0)
        resumed, second = steps(rank, 1)
        assert start0 == 0 and first == list(range(1, len(first) + 1))
        # the restart resumes from the first attempt's last checkpoint: its last logged step,
        # or the one before when the rank was stopped between logging a step and saving it
        last = first[-1] if first else 0
        assert resumed in (last, max(last - 1, 0))
        assert second == list(range(resumed + 1, 13))
    assert steps(1, 0)[1] == [1, 2, 3, 4] and steps(1, 1)[0] == 4  # rank 1 crashed at step 5
    assert leaked(pid_files(tmp_path)) == []


def test_crash_without_restart(tmp_path: Path) -> None:
    r = subprocess.run(
        [*numarun_cmd(), "--nproc-per-node", "2", str(SCRIPTS / "fault_counter.py"), str(tmp_path), "400", "1", "3"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 3, r.stderr[-3000:]
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and "rank 1 (local rank 1" in lines[0] and "exited with code 3" in lines[0]
    assert "Traceback" not in r.stderr
    # rank 0 was stopped long before its 400 steps
    assert int((tmp_path / "ckpt0").read_text()) < 400
    assert not (tmp_path / "pid0.1").exists()  # no restart
    assert leaked(pid_files(tmp_path)) == []


@pytest.mark.parametrize("lost_hosts_store", [True, False], ids=["store-host-lost", "store-client-lost"])
def test_node_lost(lost_hosts_store: bool, tmp_path: Path, procs: list) -> None:
    """Two numarun processes as two nodes (c10d on localhost), one SIGKILLed whole.

    The node started first hosts the c10d store (the other finds the port taken and
    connects as a client), so both ways a node can be lost are covered.
    """
    port = free_port()
    common = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "lost",
        "--rdzv-conf",
        "join_timeout=60,close_timeout=5",
    ]
    out = [tmp_path / "n0", tmp_path / "n1"]
    for o in out:
        o.mkdir()
    order = [1, 0] if lost_hosts_store else [0, 1]
    nodes: dict[int, subprocess.Popen] = {}  # type: ignore[type-arg]
    for n in order:
        nodes[n] = _start(
            procs,
            [*common, "--node-rank", str(n), str(SCRIPTS / "fault_allreduce.py"), str(out[n])],
            tmp_path / f"log{n}",
        )
        if n == order[0]:
            wait_until("the c10d store", lambda: listening(port), TIMEOUT, 0.05, proc=nodes[n])
    survivor, lost = nodes[0], nodes[1]
    wait_until("both nodes' workers", lambda: pid_files(out[0]) and pid_files(out[1]), TIMEOUT, 0.05, proc=survivor)
    # The whole node at once: its numarun and its workers (torchrun starts each worker in
    # its own session, so the process group alone would not reach them).
    node = [lost.pid] + [c.pid for c in psutil.Process(lost.pid).children(recursive=True)]
    for pid in node:
        os.kill(pid, signal.SIGKILL)
    lost.wait(timeout=TIMEOUT)
    code = survivor.wait(timeout=TIMEOUT)  # the bound: no hang
    log = (tmp_path / "log0").read_text()
    assert code != 0, log[-3000:]
    lines = error_lines(log)
    # (the worker's own traceback from its failed all-reduce is the user program's output)
    assert len(lines) == 1, log[-3000:]
    # Either the agent notices first (its store is gone) or the worker's all-reduce fails
    # first; c10d hands out global ranks by arrival, not by --node-rank.
    rank_failed = "local rank 0" in lines[0] and ("exited with code" in lines[0] or "killed by" in lines[0])
    store_gone = "rendezvous failed" in lines[0] and f"127.0.0.1:{port}" in lines[0]
    assert rank_failed or (lost_hosts_store and store_gone), lines[0]
    assert leaked(pid_files(out[0]) + pid_files(out[1])) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_numarun(sig: signal.Signals, tmp_path: Path, procs: list) -> None:
    p = _start(procs, ["--nproc-per-node", "2", str(SCRIPTS / "fault_allreduce.py"), str(tmp_path)], tmp_path / "log")
    wait_until("two workers", lambda: len(pid_files(tmp_path)) == 2, TIMEOUT, 0.05, proc=p)
    p.send_signal(sig)
    assert p.wait(timeout=TIMEOUT) == 128 + sig, (tmp_path / "log").read_text()[-3000:]
    assert f"stopped by {sig.name}" in (tmp_path / "log").read_text()
    assert leaked(pid_files(tmp_path)) == []


def test_trainer_sigterm_writes_a_checkpoint(tmp_path: Path, procs: list) -> None:
    run_dir = tmp_path / "run"
    p = _start(
        procs,
        ["--nproc-per-node", "2", TRAIN, "trainer.steps=100000", "trainer.progress=false", f"hydra.run.dir={run_dir}"],
        tmp_path / "log",
        cwd=tmp_path,
    )
    metrics = run_dir / "metrics.jsonl"
    wait_until(
        "two logged steps",
        lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2,
        TIMEOUT,
        0.05,
        proc=p,
    )
    workers = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
    p.send_signal(signal.SIGTERM)
    # every rank checkpointed and exited 0 on its own: a clean stop, not a failure
    assert p.wait(timeout=TIMEOUT) == 0, (tmp_path / "log").read_text()[-3000:]
    assert "stopped by SIGTERM: every worker finished cleanly" in (tmp_path / "log").read_text()
    saved = sorted((run_dir / "checkpoints").glob("step_*"))
    assert saved, (tmp_path / "log").read_text()[-3000:]
    meta = json.loads((saved[-1] / "meta.json").read_text())
    assert meta["step"] >= 2
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))
    assert leaked(workers) == []


@pytest.mark.parametrize("round_", [1, 2])
def test_kill_during_save_keeps_the_previous_checkpoint(round_: int, tmp_path: Path, procs: list) -> None:
    root = tmp_path / "ckpt"
    p = _start(procs, ["--nproc-per-node", "1", str(SCRIPTS / "fault_save.py"), "save", str(root)], tmp_path / "log")

    # Wait until at least `round_` checkpoints are complete and the next save is under way.
    def saving() -> bool:
        done = [d for d in root.glob("step_*") if (d / "meta.json").exists()] if root.exists() else []
        return len(done) >= round_ and any(root.glob(".step_*.tmp"))

    wait_until("a save in progress", saving, TIMEOUT, 0.05, proc=p)
    pid = int((tmp_path / "pid0").read_text())
    os.kill(pid, signal.SIGKILL)
    assert p.wait(timeout=TIMEOUT) != 0
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "fault_save.py"), "verify", str(root)],
        cwd=REPO,
        # a world of one: its store takes any free port (one picked beforehand could be taken by then)
        env=_env(MASTER_PORT="0"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["step"] >= round_
    assert leaked([pid]) == []


def _plan_with(tmp_path: Path, **change: object) -> Path:
    out = subprocess.run(
        [*numarun_cmd(), "plan", "--json", "--nproc-per-node", "1", "--mem-policy", "bind"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout
    plan = json.loads(out)
    plan["ranks"][0].update(change)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict"])
def test_binding_refused_by_the_kernel(strict: bool, tmp_path: Path) -> None:
    """set_mempolicy to a node outside Mems_allowed: the kernel answers EINVAL (EPERM needs a
    seccomp or capability setup this machine does not have; both take the same path)."""
    mems_allowed = _mems_allowed()
    bad_node = max(mems_allowed) + 7
    plan = _plan_with(tmp_path, mems=[bad_node], mem_policy="bind")
    out = tmp_path / "out"
    out.mkdir()
    args = [
        "--plan-file",
        str(plan),
        *(["--strict-binding"] if strict else []),
        str(SCRIPTS / "report_binding.py"),
        str(out),
    ]
    r = subprocess.run([*numarun_cmd(), *args], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert "Traceback" not in r.stderr
    if strict:
        assert r.returncode == 2, r.stderr[-3000:]
        worker, summary = error_lines(r.stderr)
        assert "set_mempolicy" in worker and str(bad_node) in worker and "exited with code 2" in summary
        assert list(out.iterdir()) == []  # the user's script never ran
    else:
        assert r.returncode == 0, r.stderr[-3000:]
        warn = [line for line in r.stderr.splitlines() if "WARNING: local rank 0" in line]
        assert len(warn) == 1 and "set_mempolicy" in warn[0] and str(bad_node) in warn[0]
        got = json.loads((out / "rank0.json").read_text())
        assert got["mempolicy"][0] == "default"  # left at the kernel default, the run went on


def _mems_allowed() -> list[int]:
    from numarun.cpuset import parse_list

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Mems_allowed_list:"):
            return sorted(parse_list(line.split(":", 1)[1].strip()))
    raise AssertionError("no Mems_allowed_list in /proc/self/status")


def test_fault_table_names_the_tests() -> None:
    """FAULTS (the figures in docs/reliability.md) lists exactly this module's fault tests."""
    import inspect

    tests = [name for name, f in globals().items() if name.startswith("test_") and inspect.isfunction(f)]
    faults = [t for t in tests if t != "test_fault_table_names_the_tests"]
    assert sorted(faults) == sorted(next(t for t in faults if t.startswith(f"test_{k}")) for k in FAULTS)
    for key, count in FAULTS.items():
        marks = getattr(globals()[next(t for t in faults if t.startswith(f"test_{key}"))], "pytestmark", [])
        params = [len(m.args[1]) for m in marks if m.name == "parametrize"]
        assert count == (params[0] if params else 1), key
