"""The worker bootstrap, run for real: ``python <numarun>/worker/entry.py`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS

from numarun.errors import BindingError
from numarun.launch.torchrun import ENTRY_FILE
from numarun.plan.model import LaunchPlan, MemPolicy, RankBinding
from numarun.worker import affinity
from numarun.worker.bootstrap import apply_env, parse_argv

REPORT = SCRIPTS / "report_binding.py"
ALLOWED = tuple(sorted(os.sched_getaffinity(0)))
MEMS = affinity.mems_allowed()


def _binding(local_rank: int = 0, **kw: object) -> RankBinding:
    base: dict = dict(
        local_rank=local_rank,
        gpu=None,
        cpus=(ALLOWED[-1],),
        mems=(MEMS[0],),
        nic=None,
        env={"OMP_NUM_THREADS": "3", "NUMARUN_TEST_PLANNED": "from-plan"},
        mem_policy=MemPolicy.BIND,
    )
    base.update(kw)
    return RankBinding(**base)


def _write_plan(tmp_path: Path, *ranks: RankBinding) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(LaunchPlan(ranks=ranks).to_json())
    return path


def _env(plan: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMARUN_") and k != "OMP_NUM_THREADS"}
    env.update(LOCAL_RANK="0", RANK="0", PYTHONPATH=str(REPO))
    if plan is not None:
        env["NUMARUN_PLAN"] = str(plan)
    env.update(extra)
    return env


def _bootstrap(args: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-u", ENTRY_FILE, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _report(out: Path, rank: int = 0) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


def test_parse_argv() -> None:
    assert parse_argv(["s.py", "--module", "x=1"]) == ("script", "s.py", ["--module", "x=1"])
    assert parse_argv(["--module", "pkg.mod", "-m"]) == ("module", "pkg.mod", ["-m"])
    assert parse_argv(["--no-python", "/bin/true", "a"]) == ("exec", "/bin/true", ["a"])
    with pytest.raises(BindingError):
        parse_argv(["--module"])


def test_apply_env_keeps_what_the_user_set() -> None:
    b = _binding(env={"OMP_NUM_THREADS": "4", "NCCL_IB_HCA": "mlx5_0"})
    # started by numarun: the launcher says which plan variables the user set
    environ = {"OMP_NUM_THREADS": "1", "NCCL_IB_HCA": "mine", "NUMARUN_USER_ENV": "NCCL_IB_HCA"}
    assert apply_env(b, environ) == ((("OMP_NUM_THREADS", "4"),), ("NCCL_IB_HCA",))
    assert environ["OMP_NUM_THREADS"] == "4" and environ["NCCL_IB_HCA"] == "mine"
    # started by hand: whatever is already set is the user's
    environ = {"NCCL_IB_HCA": "mine"}
    assert apply_env(b, environ) == ((("OMP_NUM_THREADS", "4"),), ("NCCL_IB_HCA",))
    assert environ == {"NCCL_IB_HCA": "mine", "OMP_NUM_THREADS": "4"}


@pytest.mark.slow
def test_binds_before_the_script_and_runs_it_as_python_would(tmp_path: Path) -> None:
    plan = _write_plan(tmp_path, _binding(0, cpus=(ALLOWED[0],)), _binding(1))
    plain, bound = tmp_path / "plain", tmp_path / "bound"
    plain.mkdir(), bound.mkdir()
    args = ["tests/support/scripts/report_binding.py", str(bound), "--lr=3", "x=1", "--module"]
    r = _bootstrap(args, _env(plan, LOCAL_RANK="1", RANK="1"))
    assert r.returncode == 0, r.stderr
    direct = subprocess.run(
        [sys.executable, "-u", "tests/support/scripts/report_binding.py", str(plain), "--lr=3", "x=1", "--module"],
        env=_env(None, LOCAL_RANK="1", RANK="1"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert direct.returncode == 0, direct.stderr
    got, want = _report(bound, 1), _report(plain, 1)
    for key in ("name", "file", "path0"):
        assert got[key] == want[key], key
    assert got["argv"] == want["argv"][:1] + [str(bound), "--lr=3", "x=1", "--module"]
    assert got["torch_loaded_before_script"] is False
    # local rank 1's binding, on every thread and on threads started later
    assert got["cpus"] == [ALLOWED[-1]]
    assert all(m == [ALLOWED[-1]] for m in got["task_cpus"].values())
    assert got["new_thread_cpus"] == [ALLOWED[-1]]
    assert got["mempolicy"] == ["bind", [MEMS[0]]]
    assert got["env"]["OMP_NUM_THREADS"] == "3" and got["env"]["NUMARUN_TEST_PLANNED"] == "from-plan"
    assert got["binding_local_rank"] == 1
    assert want["mempolicy"] == ["default", []] and want["binding_local_rank"] is None
    lines = [line for line in r.stderr.splitlines() if line.startswith("numarun:")]
    assert lines == [f"numarun: INFO: rank 1: gpu - cpus {ALLOWED[-1]} mems {MEMS[0]} (bind) nic - OMP 3"]


@pytest.mark.slow
def test_module_form_matches_python_dash_m(tmp_path: Path) -> None:
    plan = _write_plan(tmp_path, _binding(0, mem_policy=MemPolicy.PREFERRED))
    plain, bound = tmp_path / "plain", tmp_path / "bound"
    plain.mkdir(), bound.mkdir()
    r = _bootstrap(["--module", "report_binding", str(bound), "-m", "x"], _env(plan), cwd=SCRIPTS)
    assert r.returncode == 0, r.stderr
    direct = subprocess.run(
        [sys.executable, "-m", "report_binding", str(plain), "-m", "x"],
        env=_env(None),
        cwd=SCRIPTS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert direct.returncode == 0, direct.stderr
    got, want = _report(bound), _report(plain)
    for key in ("name", "file", "path0"):
        assert got[key] == want[key], key
    assert got["argv"] == [want["argv"][0], str(bound), "-m", "x"]
    assert got["mempolicy"] == ["preferred", [MEMS[0]]]


@pytest.mark.slow
def test_mem_policy_none_leaves_the_default(tmp_path: Path) -> None:
    plan = _write_plan(tmp_path, _binding(0, mems=(), mem_policy=MemPolicy.NONE))
    r = _bootstrap([str(REPORT), str(tmp_path)], _env(plan))
    assert r.returncode == 0, r.stderr
    assert _report(tmp_path)["mempolicy"] == ["default", []]


def _impossible_cpu() -> int:
    bad = ALLOWED[-1] + 1
    while bad in ALLOWED:
        bad += 1
    return bad


@pytest.mark.slow
def test_bind_failure_warns_once_and_binds_what_it_can(tmp_path: Path) -> None:
    bad = _impossible_cpu()
    plan = _write_plan(tmp_path, _binding(0, cpus=(ALLOWED[0], bad)))
    r = _bootstrap([str(REPORT), str(tmp_path)], _env(plan))
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "sched_setaffinity" in warnings[0] and str(bad) in warnings[0]
    assert _report(tmp_path)["cpus"] == [ALLOWED[0]]


@pytest.mark.slow
def test_strict_binding_fails_with_one_line_and_runs_nothing(tmp_path: Path) -> None:
    plan = _write_plan(tmp_path, _binding(0, cpus=(_impossible_cpu(),)))
    r = _bootstrap([str(REPORT), str(tmp_path)], _env(plan, NUMARUN_STRICT_BINDING="1"))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("numarun: error: local rank 0: sched_setaffinity")
    assert not (tmp_path / "rank0.json").exists()


@pytest.mark.slow
def test_unreadable_plan_is_one_line(tmp_path: Path) -> None:
    r = _bootstrap([str(REPORT), str(tmp_path)], _env(tmp_path / "missing.json"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "NUMARUN_PLAN" in r.stderr
    (tmp_path / "bad.json").write_text("{}")
    r = _bootstrap([str(REPORT), str(tmp_path)], _env(tmp_path / "bad.json"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "numarun plan --json" in r.stderr


@pytest.mark.slow
def test_without_a_plan_the_script_runs_unbound(tmp_path: Path) -> None:
    r = _bootstrap([str(REPORT), str(tmp_path)], _env(None))
    assert r.returncode == 0, r.stderr
    got = _report(tmp_path)
    assert got["cpus"] == list(ALLOWED) and got["binding_local_rank"] is None


@pytest.mark.slow
def test_no_python_execs_the_program_bound(tmp_path: Path) -> None:
    plan = _write_plan(tmp_path, _binding(0))
    r = _bootstrap(
        ["--no-python", "grep", "-E", "^(Cpus_allowed_list|Mems_allowed_list)", "/proc/self/status"], _env(plan)
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["Cpus_allowed_list:", str(ALLOWED[-1]), "Mems_allowed_list:", str(MEMS[0])]


@pytest.mark.slow
def test_script_main_module_supports_spawn_and_exit_codes(tmp_path: Path) -> None:
    plan = _write_plan(tmp_path, _binding(0))
    r = _bootstrap(["tests/support/scripts/spawn_pool.py"], _env(plan))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[2, 4]"
    failing = tmp_path / "fails.py"
    failing.write_text("import sys\nprint(__name__, sys.argv[1:])\nraise SystemExit(int(sys.argv[1]))\n")
    r = _bootstrap([str(failing), "5"], _env(plan))
    assert (r.returncode, r.stdout) == (5, "__main__ ['5']\n")
    failing.write_text("raise ValueError('boom')\n")
    r = _bootstrap([str(failing)], _env(plan))
    assert r.returncode == 1 and r.stderr.rstrip().endswith("ValueError: boom")


EXIT_SCRIPT = """
import atexit, sys, threading, time
out = open(sys.argv[1], "w")  # left open: its buffer must still reach the file
out.write("buffered")
log = sys.argv[1] + ".events"
def note(what):
    with open(log, "a") as f:
        f.write(what + "\\n")
atexit.register(note, "atexit")
def slow():
    time.sleep(0.3)
    note("thread")
threading.Thread(target=slow).start()
mode = sys.argv[2]
if mode == "code":
    sys.exit(3)
if mode == "message":
    sys.exit("bad input: expected x")
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode, code", [("end", 0), ("code", 3), ("message", 1)])
def test_exit_is_pythons_without_module_teardown(tmp_path: Path, mode: str, code: int) -> None:
    """Threads joined, atexit run, open files flushed, exit codes and messages as python's."""
    script = tmp_path / "exits.py"
    script.write_text(EXIT_SCRIPT)
    out = tmp_path / "out.txt"
    r = _bootstrap([str(script), str(out), mode], _env(None))
    assert r.returncode == code, r.stderr
    assert out.read_text() == "buffered"
    assert (tmp_path / "out.txt.events").read_text() == "thread\natexit\n"
    if mode == "message":
        assert "bad input: expected x" in r.stderr
    plain = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "plain.txt"), mode], capture_output=True, text=True, timeout=60
    )
    assert plain.returncode == code and (tmp_path / "plain.txt.events").read_text() == "thread\natexit\n"


def test_a_restart_is_announced_once_per_node(caplog: pytest.LogCaptureFixture) -> None:
    from numarun.worker.bootstrap import announce_restart

    env = {
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "5",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
    }
    with caplog.at_level("WARNING", logger="numarun.worker.bootstrap"):
        announce_restart(env)
        announce_restart({**env, "LOCAL_RANK": "1"})  # the node's other ranks stay quiet
        announce_restart({**env, "TORCHELASTIC_RESTART_COUNT": "0"})  # the first start is no restart
    assert [r.getMessage() for r in caplog.records] == [
        "restart 2 of 5 (--max-restarts): the workers of node 1 were started again after a failure"
    ]


def test_each_restart_sees_the_agent_store_under_its_own_prefix() -> None:
    """A key left by the attempt before a restart (a dead peer's address) is not seen after it."""
    import torch.distributed as dist

    from numarun.comm.context import restart_store

    server = dist.TCPStore("127.0.0.1", 0, 1, True)
    env = {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(server.port),
        "TORCHELASTIC_RESTART_COUNT": "0",
    }
    first = restart_store(env, world_size=1, timeout=None)
    first.set("rank_1", "127.0.0.1:40001")
    again = restart_store(env, world_size=1, timeout=None)
    assert again.check(["rank_1"])  # the same attempt shares its keys
    after = restart_store({**env, "TORCHELASTIC_RESTART_COUNT": "1"}, world_size=1, timeout=None)
    assert not after.check(["rank_1"])
    assert restart_store({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}, world_size=1, timeout=None) is None
