"""numarun inside a Docker-like container that a real OCI runtime (crun) starts over this host's root:
Docker's capabilities and seccomp rule for the memory-policy syscalls, 64 MiB /dev/shm, memlock
64 KiB, its own PID and UTS namespaces (tests/support/containers.py). Root only; skipped elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from containers import Crun, Spec, crun_or_skip
from helpers import REPO, SCRIPTS, error_lines

pytestmark = pytest.mark.slow

REPORT = "tests/support/scripts/report_binding.py"
UNBOUND = "memory not bound (seccomp)"


@pytest.fixture(scope="session")
def crun() -> Iterator[Crun]:
    runner = crun_or_skip()
    yield runner
    runner.close()


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory any UID may write: the containers' TMPDIR and the ranks' reports."""
    d = Path(tempfile.mkdtemp(prefix="numarun-ctr-"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _reports(d: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in d.glob("rank*.json")}


def _two_ranks(crun: Crun, scratch: Path, spec: Spec, *flags: str):
    return crun.run(["numarun", *flags, "--nproc-per-node", "2", REPORT, str(scratch)], spec)


def test_doctor_names_the_refused_memory_policy_the_small_shm_and_memlock_each_with_its_fix(crun):
    r = crun.run(["numarun", "doctor", "--json"])
    assert r.returncode == 0, r.stderr
    found = {f["check"]: f for f in json.loads(r.stdout)["findings"]}
    assert found["container"]["device"] == "docker"
    assert (
        "seccomp" in found["mempolicy"]["message"] and "docker run --cap-add SYS_NICE" in found["mempolicy"]["message"]
    )
    assert "/dev/shm holds 64 MiB" in found["shm"]["message"] and "docker run --ipc=host" in found["shm"]["message"]
    assert "64 KiB" in found["memlock"]["message"] and "docker run --ulimit memlock=-1" in found["memlock"]["message"]
    assert found["smt"]["message"].startswith("SMT is ") and "notsupported" not in found["smt"]["message"]
    assert "docker run --init" in found["pid1"]["message"]  # the container's command is its PID 1
    plan = crun.run(["numarun", "plan"])
    assert plan.returncode == 0 and "in a docker container" in plan.stdout and UNBOUND in plan.stdout
    plan = crun.run(["numarun", "plan", "--json"])
    assert json.loads(plan.stdout)["mem_unbound"] == "seccomp"
    dry = crun.run(["numarun", "--dry-run", "--nproc-per-node", "2", REPORT, "/nowhere"])
    assert dry.returncode == 0 and UNBOUND in dry.stdout


def test_two_ranks_name_the_seccomp_cause_once_and_finish(crun, scratch):
    r = _two_ranks(crun, scratch, Spec())
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if "seccomp" in ln or "set_mempolicy" in ln]
    assert UNBOUND in line and "docker run --cap-add SYS_NICE" in line
    reports = _reports(scratch)
    assert sorted(reports) == [0, 1] and all(rep["mempolicy"][0] == "?" for rep in reports.values())
    assert [reports[i]["cpus"] for i in (0, 1)] == [[0], [1]]  # the CPUs are still bound


def test_per_rank_mode_under_mpiexec_says_it_once_for_the_node(crun, scratch):
    if shutil.which("mpiexec.mpich") is None:
        if os.environ.get("NUMARUN_TEST_MPI") == "1":
            pytest.fail("NUMARUN_TEST_MPI=1 but mpiexec.mpich is not installed (scripts/test.sh installs mpich)")
        pytest.skip("mpiexec.mpich is not installed (Debian's mpich; scripts/test.sh installs it as root)")
    r = crun.run(["mpiexec.mpich", "-n", "2", "numarun", REPORT, str(scratch)], Spec(env={"TMPDIR": str(scratch)}))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(UNBOUND) == 1 and sorted(_reports(scratch)) == [0, 1]


def test_strict_binding_refuses_before_any_rank_starts(crun, scratch):
    r = _two_ranks(crun, scratch, Spec(), "--strict-binding")
    assert r.returncode == 2
    (line,) = error_lines(r.stderr)
    assert "--strict-binding" in line and "seccomp" in line and "--cap-add SYS_NICE" in line
    assert r.stderr.strip() == line and not _reports(scratch)


def test_with_cap_sys_nice_memory_is_bound(crun, scratch):
    r = _two_ranks(crun, scratch, Spec(add_caps=("CAP_SYS_NICE",)))
    assert r.returncode == 0, r.stderr
    assert "seccomp" not in r.stderr and "warning" not in r.stderr.lower()
    assert [rep["mempolicy"] for rep in _reports(scratch).values()] == [["bind", [0]], ["bind", [0]]]


def test_a_cpuset_of_one_cpu_is_what_the_plan_uses(crun):
    one = Spec(cpus="0")
    r = crun.run(["numarun", "plan", "--json"], one)
    assert r.returncode == 0, r.stderr
    assert [rank["cpus"] for rank in json.loads(r.stdout)["ranks"]] == [[0]]
    r = crun.run(["numarun", "--nproc-per-node", "2", "--binding", "exclusive", REPORT, "/nowhere"], one)
    assert r.returncode == 2
    (line,) = error_lines(r.stderr)
    assert "1 usable physical cores for 2 ranks" in line and r.stderr.strip() == line


def test_a_read_only_root_with_tmpdir_elsewhere(crun, scratch):
    r = _two_ranks(crun, scratch, Spec(readonly=True, writable=(scratch,), env={"TMPDIR": str(scratch)}))
    assert r.returncode == 0, r.stderr
    assert sorted(_reports(scratch)) == [0, 1]


def test_an_unknown_uid_without_home(crun, scratch):
    r = _two_ranks(crun, scratch, Spec(uid=54321, writable=(scratch,), env={"TMPDIR": str(scratch)}))
    assert r.returncode == 0, r.stderr
    reports = _reports(scratch)
    assert sorted(reports) == [0, 1] and all("HOME" not in rep["env"] for rep in reports.values())


def test_the_readmes_job_runs_inside(crun, scratch):
    r = crun.run(
        [
            "numarun",
            str(REPO / "scripts/train.py"),
            "launcher=cpu2",
            "parallel=fsdp",
            "model=gpt",
            "trainer.batch_size=32",
            "trainer.steps=5",
        ],
        Spec(writable=(scratch,), cwd=scratch, env={"TMPDIR": str(scratch)}),
    )
    assert r.returncode == 0, r.stderr
    assert "done: 5 steps" in r.stdout and r.stderr.count(UNBOUND) == 1


def test_a_hostname_that_resolves_to_nothing_finishes_and_the_doctor_names_it(crun, scratch):
    spec = Spec(resolvable=False, hostname="numarun-nores.invalid")
    r = _two_ranks(crun, scratch, spec)
    assert r.returncode == 0, r.stderr
    assert sorted(_reports(scratch)) == [0, 1] and "cannot be retrieved" not in r.stderr
    found = {f["check"]: f for f in json.loads(crun.run(["numarun", "doctor", "--json"], spec).stdout)["findings"]}
    assert found["hostname"]["severity"] == "warn" and "does not resolve" in found["hostname"]["message"]
    assert (
        "127.0.0.1 for a job of one node" in found["hostname"]["message"]
        and "/etc/hosts" in found["hostname"]["message"]
    )


def test_numarun_as_the_containers_pid_1_reaps_every_orphan(crun, scratch):
    """The container's command is numarun, its PID 1: each rank's three short-lived daemons are re-parented
    to it and must be reaped (a zombie keeps its /proc entry, and the rank waits for every entry to go)."""
    (scratch / "go").write_text("")
    r = crun.run(["numarun", "--nproc-per-node", "2", "tests/support/scripts/short_daemons.py", str(scratch)])
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in scratch.glob("reaped.*")) == ["reaped.0", "reaped.1"]


def test_a_hung_job_inside_without_ptrace_is_named_from_in_process_stacks(crun, scratch):
    """A container that refuses ptrace (a pod's restricted seccomp profile; Docker's also refuses reading another
    process's memory without CAP_SYS_PTRACE): py-spy cannot attach, the roll-call says so and names the stuck
    rank from the stacks the ranks dump themselves; --on-hang stop ends the job with 75."""
    from numarun.launch.hangs import EXIT_HANG, find_py_spy

    script = SCRIPTS / "hang_rank.py"
    stuck = next(i for i, line in enumerate(script.read_text().splitlines(), 1) if "# the stuck line" in line)
    r = crun.run(
        [
            "numarun",
            "--log-level",
            "WARNING",
            "--nproc-per-node",
            "2",
            "--binding",
            "node",
            "--hang-timeout",
            "5",
            "--on-hang",
            "stop",
            str(script),
            str(scratch),
            "stuck",
            "1",
        ],
        Spec(env={"TMPDIR": str(scratch)}, writable=(scratch,), ptrace=False),
    )
    assert r.returncode == EXIT_HANG, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("numarun:   ")]
    assert lines[1:] == [
        f"numarun:   rank 1 is at {script.relative_to(REPO)}:{stuck} in load_batch",
        "numarun:   => rank 1 is not where the others are",
    ], r.stderr
    assert lines[0].startswith("numarun:   rank 0 waits at ") and "in all_reduce (torch.distributed)" in lines[0]
    head = next(ln for ln in r.stderr.splitlines() if "roll-call of 2 ranks" in ln)
    if find_py_spy():
        assert "in-process Python stacks (faulthandler); py-spy could not read the ranks" in head, head
    else:
        assert "in-process Python stacks (faulthandler)" in head, head
