"""A rank killed for memory is named so, with the limit, where it was read and what was used
(numarun.launch.oom): from recorded cgroup v1 and v2 trees, and for real in a memory cgroup."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import SCRIPTS, clean_env, error_lines, numarun_cmd, run_numarun

from numarun.launch import oom
from numarun.topology.procfs import cgroup_dirs

# this project's CI host: hybrid cgroups, the memory controller on v1 (recorded from a real run)
V1 = {
    "proc/self/mounts": "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n",
    "proc/self/cgroup": "4:memory:/process_api/6ef7/foom\n3:cpuset:/\n0::/\n",
    "sys/fs/cgroup/memory/process_api/6ef7/foom/memory.limit_in_bytes": "734003200\n",
    "sys/fs/cgroup/memory/process_api/6ef7/foom/memory.max_usage_in_bytes": "734003200\n",
    "sys/fs/cgroup/memory/process_api/6ef7/foom/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    "sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": "9223372036854771712\n",  # no limit
    "proc/vmstat": "pgfault 1\noom_kill 3\n",
    "proc/meminfo": "MemTotal:       24683520 kB\n",
}
V1_KILLED = {
    "sys/fs/cgroup/memory/process_api/6ef7/foom/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
    "proc/vmstat": "pgfault 9\noom_kill 4\n",
}
KMSG = (
    "Memory cgroup out of memory: Killed process 1704 (python) total-vm:771284kB, anon-rss:538624kB, "
    "file-rss:12288kB, shmem-rss:0kB, UID:0 pgtables:1304kB oom_score_adj:0"
)

# a Slurm step confined by cgroup v2 (Documentation/admin-guide/cgroup-v2.rst formats)
V2 = {
    "proc/self/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n",
    "proc/self/cgroup": "0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n",
    "sys/fs/cgroup/system.slice/slurmstepd.scope/job_5/step_0/user/task_0/memory.max": "max\n",
    "sys/fs/cgroup/system.slice/slurmstepd.scope/job_5/step_0/user/task_0/memory.events": "low 0\nhigh 0\nmax 12\noom "
    "0\noom_kill 0\noom_group_kill 0\n",
    "sys/fs/cgroup/system.slice/slurmstepd.scope/job_5/memory.max": "2147483648\n",
    "sys/fs/cgroup/system.slice/slurmstepd.scope/job_5/memory.peak": "2147483648\n",
    "proc/vmstat": "oom_kill 0\n",
}
V2_KILLED = {
    "sys/fs/cgroup/system.slice/slurmstepd.scope/job_5/step_0/user/task_0/memory.events": "low 0\nhigh 0\nmax 40\noom "
    "1\noom_kill 1\noom_group_kill 0\n",
    "proc/vmstat": "oom_kill 1\n",
}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_cgroup_v1_kill_names_the_limit_the_peak_and_the_rank_held(tmp_path: Path) -> None:
    root = _tree(tmp_path, V1)
    before = oom.kills(root)
    assert dict(before.counts) == {
        "/sys/fs/cgroup/memory/process_api/6ef7/foom/memory.oom_control": 0,
        "/proc/vmstat": 3,
    }
    assert oom.explain(before, 1704, signum=9, root=root, environ={}, kernel_log=KMSG) == ""  # nothing rose: not memory
    _tree(root, V1_KILLED)
    got = oom.explain(before, 1704, signum=9, root=root, environ={}, kernel_log=KMSG)
    assert got == (
        ": out of memory (limit 700 MiB: /sys/fs/cgroup/memory/process_api/6ef7/foom/memory.limit_in_bytes; "
        "the rank held 538 MiB when killed (the kernel's log); the cgroup's peak 700 MiB "
        "(/sys/fs/cgroup/memory/process_api/6ef7/foom/memory.max_usage_in_bytes); the kernel's OOM killer: "
        "oom_kill 0 -> 1 in /sys/fs/cgroup/memory/process_api/6ef7/foom/memory.oom_control)"
    )
    assert "held" not in oom.explain(
        before, 999, signum=9, root=root, environ={}, kernel_log=KMSG
    )  # another pid's line
    assert oom.explain(before, 1704, signum=15, root=root, environ={}, kernel_log=KMSG) == ""  # SIGTERM: never memory


def test_inside_a_pid_namespace_the_one_kill_since_the_start_is_the_ranks(tmp_path: Path) -> None:
    """In a container the kernel's log names the host's pid (91704), never the rank's (12): the line is the rank's
    when it is the only kill logged since the run started; before that stamp, or one of several, it is not."""
    import dataclasses

    root = _tree(tmp_path, V1)
    (root / "proc/self/ns").mkdir(parents=True)
    (root / "proc/self/ns/pid").symlink_to("pid:[4026532117]")  # not the host's (4026531836)
    before = dataclasses.replace(oom.kills(root), since_us=5_000_000)
    _tree(root, V1_KILLED)
    host_line = KMSG.replace("1704", "91704")
    got = oom.explain(before, 12, signum=9, root=root, environ={}, kernel_log=f"4000000;{KMSG}\n6000000;{host_line}")
    assert (
        "the rank held 538 MiB when killed (the kernel's log: the one kill since the run started; in a PID "
        "namespace the kernel names the host's pid)"
    ) in got, got
    two = f"6000000;{host_line}\n7000000;{host_line.replace('91704', '91705')}"
    assert "held" not in oom.explain(before, 12, signum=9, root=root, environ={}, kernel_log=two)
    assert "held" not in oom.explain(before, 12, signum=9, root=root, environ={}, kernel_log=f"4000000;{host_line}")
    (root / "proc/self/ns/pid").unlink()
    (root / "proc/self/ns/pid").symlink_to("pid:[4026531836]")  # the host's namespace: a pid is a pid
    assert "held" not in oom.explain(before, 12, signum=9, root=root, environ={}, kernel_log=f"6000000;{host_line}")
    assert oom.in_pid_namespace(Path("/")) is (os.readlink("/proc/self/ns/pid") != "pid:[4026531836]")


def test_a_cgroup_v2_kill_under_slurm_names_the_jobs_limit_and_slurms_setting(tmp_path: Path) -> None:
    root = _tree(tmp_path, V2)
    before = oom.kills(root)
    _tree(root, V2_KILLED)
    got = oom.explain(before, 77, signum=9, root=root, environ={"SLURM_MEM_PER_NODE": "2048"}, kernel_log="")
    assert got.startswith(
        ": out of memory (limit 2048 MiB: /sys/fs/cgroup/system.slice/slurmstepd.scope/job_5/memory.max; "
        "Slurm --mem: SLURM_MEM_PER_NODE=2048 MB; the cgroup's peak 2048 MiB"
    ), got
    assert got.endswith(
        "oom_kill 0 -> 1 in /sys/fs/cgroup/system.slice/slurmstepd.scope/job_5/step_0/user/task_0/memory.events)"
    )


def test_the_hosts_oom_killer_is_told_from_proc_vmstat(tmp_path: Path) -> None:
    files = {k: v for k, v in V1.items() if "foom" not in k}
    files["proc/self/cgroup"] = "4:memory:/\n0::/\n"
    root = _tree(tmp_path, files)
    before = oom.kills(root)
    assert dict(before.counts) == {"/proc/vmstat": 3}
    _tree(root, {"proc/vmstat": "oom_kill 5\n"})
    assert oom.explain(before, 1, signum=9, root=root, environ={}, kernel_log=None) == (
        ": out of memory (no memory cgroup limit below the host's 24105 MiB (/proc/meminfo); "
        "the kernel's OOM killer: oom_kill 3 -> 5 in /proc/vmstat)"
    )


@pytest.fixture
def memory_cgroup(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A memory cgroup of 700 MiB below this process's own (v1 memory.limit_in_bytes, or v2 memory.max)."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    mounts, own = Path("/proc/self/mounts").read_text(), Path("/proc/self/cgroup").read_text()
    version, parent = next(
        (
            (v, d)
            for v, d in cgroup_dirs(mounts, own, "memory")
            if (Path(d) / ("memory.max" if v == 2 else "memory.limit_in_bytes")).exists()
        ),
        (0, ""),
    )
    cg = Path(parent) / f"numarun-test-{os.getpid()}"
    limit = cg / ("memory.max" if version == 2 else "memory.limit_in_bytes")
    if not parent:
        pytest.skip("no memory controller in this process's cgroups")
    cg.mkdir()
    if not limit.exists():  # cgroup v2 enables a controller for children only where no process sits
        cg.rmdir()
        pytest.skip(f"no memory controller in a cgroup below {parent}")
    try:
        limit.write_text(str(700 << 20))
        for name in ("memory.swap.max", "memory.memsw.limit_in_bytes"):  # no swap to escape to
            try:
                (cg / name).write_text("0" if name == "memory.swap.max" else str(700 << 20))
            except OSError:
                pass
        yield cg
    finally:
        cg.rmdir()


@pytest.mark.slow
def test_a_rank_past_its_memory_cgroups_limit_is_named_out_of_memory(memory_cgroup: Path, tmp_path: Path) -> None:
    r = subprocess.run(
        [
            "sh",
            "-c",
            f'echo $$ > {memory_cgroup}/cgroup.procs && exec "$@"',
            "sh",
            *numarun_cmd(),
            "--nproc-per-node",
            "2",
            str(SCRIPTS / "oom_hog.py"),
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    (line,) = error_lines(r.stderr)
    assert "rank 1 (local rank 1, pid " in line and ") was killed by SIGKILL: out of memory (limit 700 MiB: " in line, (
        line
    )
    assert str(memory_cgroup) in line and "oom_kill 0 -> 1 in " in line, line


@pytest.mark.slow
def test_a_sigkill_without_a_kill_count_rising_is_not_called_out_of_memory(tmp_path: Path) -> None:
    r = run_numarun("--nproc-per-node", "2", str(SCRIPTS / "oom_hog.py"), "--self-kill", cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    (line,) = error_lines(r.stderr)
    assert "rank 1 (local rank 1, pid " in line and "was killed by SIGKILL" in line and "memory" not in line, line
