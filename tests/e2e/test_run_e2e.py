"""``numarun`` end to end on this machine: real numarun, torchrun and worker processes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS, error_lines, run_numarun

from numarun.launch.torchrun import ENTRY_FILE

pytestmark = pytest.mark.slow


def numarun(*args: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess[str]:
    return run_numarun(*args, cwd=cwd, **env)


def test_ranks_get_exactly_the_plan(tmp_path: Path) -> None:
    plan = json.loads(numarun("plan", "--json", "--nproc-per-node", "2").stdout)
    r = numarun("--nproc-per-node", "2", str(SCRIPTS / "report_binding.py"), str(tmp_path), "--lr=3", "x=1", "--", "-m")
    assert r.returncode == 0, r.stderr
    for want in plan["ranks"]:
        rank = want["local_rank"]
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["torch_loaded_before_script"] is False
        assert got["argv"] == [str(SCRIPTS / "report_binding.py"), str(tmp_path), "--lr=3", "x=1", "--", "-m"]
        assert got["cpus"] == want["cpus"]
        assert all(cpus == want["cpus"] for cpus in got["task_cpus"].values())
        assert got["mempolicy"] == [want["mem_policy"] if want["mems"] else "default", want["mems"]]
        assert set(want["mems"]) <= set(got["mems_allowed"])
        assert {k: got["env"].get(k) for k in want["env"]} == want["env"]
        # torchrun's own variables are kept
        assert got["env"]["LOCAL_RANK"] == str(rank) and got["env"]["RANK"] == str(rank)
        assert got["env"]["WORLD_SIZE"] == "2" and got["env"]["LOCAL_WORLD_SIZE"] == "2"
        assert got["env"]["MASTER_ADDR"] and got["env"]["MASTER_PORT"]
        assert Path(got["env"]["NUMARUN_PLAN"]).name == "plan.json"
        assert got["binding_local_rank"] == rank
    # the private plan file is gone once numarun exits
    assert not Path(got["env"]["NUMARUN_PLAN"]).parent.exists()
    info = [line for line in r.stderr.splitlines() if line.startswith("numarun: INFO: rank ")]
    assert sorted(line.split(":")[2].strip() for line in info) == ["rank 0", "rank 1"]


def test_module_form_keeps_a_value_the_user_set(tmp_path: Path) -> None:
    r = numarun(
        "--nproc_per_node=1", "-m", "report_binding", str(tmp_path), "--module", cwd=SCRIPTS, OMP_NUM_THREADS="5"
    )
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got["name"] == "__main__" and got["file"] == str(SCRIPTS / "report_binding.py")
    assert got["argv"] == [str(SCRIPTS / "report_binding.py"), str(tmp_path), "--module"]
    assert got["env"]["OMP_NUM_THREADS"] == "5"


def test_unmodified_ddp_script_trains_as_under_torchrun(tmp_path: Path, torchrun_ddp: dict) -> None:
    under_numarun = tmp_path / "numarun.json"
    r = numarun("--nproc-per-node", "2", "--standalone", "tests/support/scripts/ddp_train.py", str(under_numarun))
    assert r.returncode == 0, r.stderr
    a = json.loads(under_numarun.read_text())
    assert a["world_size"] == torchrun_ddp["world_size"] == 2
    assert a["params"] == torchrun_ddp["params"]


def test_dry_run_prints_plan_and_command_and_runs_nothing(tmp_path: Path) -> None:
    r = numarun(
        "--dry-run",
        "--nproc-per-node",
        "2",
        "--max_restarts=1",
        str(SCRIPTS / "report_binding.py"),
        str(tmp_path),
        "--lr=3",
        "x=1",
    )
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()) == []
    assert "exclusive" in r.stdout and "rank" in r.stdout
    command = [line for line in r.stdout.splitlines() if " torchrun " in line]
    assert len(command) == 1
    words = shlex.split(command[0])
    i = words.index("torchrun")
    assert "NUMARUN_PLAN=plan.json" in words[:i]
    assert words[i + 1 :] == [
        "--nproc-per-node=2",
        "--local-addr=127.0.0.1",
        "--max-restarts=1",
        ENTRY_FILE,
        str(SCRIPTS / "report_binding.py"),
        str(tmp_path),
        "--lr=3",
        "x=1",
    ]


def test_strict_binding_with_an_impossible_plan(tmp_path: Path) -> None:
    plan = json.loads(numarun("plan", "--json", "--nproc-per-node", "1").stdout)
    allowed = sorted(os.sched_getaffinity(0))
    bad = allowed[-1] + 1
    plan["ranks"][0]["cpus"] = [bad]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    out = tmp_path / "out"
    out.mkdir()
    strict = numarun("--plan-file", str(plan_file), "--strict-binding", str(SCRIPTS / "report_binding.py"), str(out))
    assert strict.returncode != 0
    worker, summary = error_lines(strict.stderr)  # the worker's line, then numarun's
    assert worker.startswith("numarun: error: local rank 0: sched_setaffinity") and str(bad) in worker
    assert "rank 0 (local rank 0" in summary and "exited with code 2" in summary
    assert list(out.iterdir()) == []
    loose = numarun("--plan-file", str(plan_file), str(SCRIPTS / "report_binding.py"), str(out))
    assert loose.returncode == 0, loose.stderr
    assert [line for line in loose.stderr.splitlines() if "WARNING: local rank 0" in line]
    assert json.loads((out / "rank0.json").read_text())["cpus"] == allowed


def test_missing_script_is_one_line_exit_2() -> None:
    missing = numarun("--nproc-per-node", "1", "no/such/script.py")
    assert missing.returncode == 2 and error_lines(missing.stderr) == [missing.stderr.strip()]
    assert "no/such/script.py" in missing.stderr


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """numarun's own main() in this process: for mistakes caught before anything starts."""
    from numarun.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_user_mistakes_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in [k for k in os.environ if k.startswith(("NUMARUN_", "PET_"))]:
        monkeypatch.delenv(k)
    monkeypatch.chdir(REPO)
    code, _, err = _cli(
        capsys,
        "--nproc-per-node",
        str(len(os.sched_getaffinity(0)) + 1),
        str(SCRIPTS / "exit_rank.py"),
        "0",
        "0",
    )
    assert code == 2 and err.count("\n") == 1 and "nproc-per-node" in err
    plan_file = tmp_path / "plan.json"
    code, out, _ = _cli(capsys, "plan", "--json", "--nproc-per-node", "1")
    assert code == 0
    plan_file.write_text(out)
    code, _, err = _cli(
        capsys, "--plan-file", str(plan_file), "--nproc-per-node", "2", str(SCRIPTS / "exit_rank.py"), "0", "0"
    )
    assert code == 2 and err.count("\n") == 1 and "has 1 rank;" in err
    code, _, err = _cli(capsys, "--plan-file", str(tmp_path / "nope.json"), str(SCRIPTS / "exit_rank.py"), "0", "0")
    assert code == 2 and err.count("\n") == 1 and "nope.json" in err
    code, _, err = _cli(capsys, "--run-path", str(SCRIPTS / "exit_rank.py"), "0", "0")
    assert code == 2 and err.count("\n") == 1 and "--run-path" in err
