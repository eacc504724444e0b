"""The step report's kernel readers and sampler on recorded trees (docs/steps.md, "Why"): a rank sharing its core
with a spinner (tests/fixtures/steps/shared-core, made by its capture.py), and the cpufreq and throttle counters of
two hwloc sysfs captures."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES

from numarun.launch.steps import evidence
from numarun.launch.steps.cause import explain
from numarun.launch.steps.evidence import CLK_TCK, Evidence, RankProc, Sampler
from numarun.launch.steps.judge import Judgement, Point, judge
from numarun.topology import procfs

SHARED = FIXTURES / "steps" / "shared-core"
ABOUT = json.loads((SHARED / "about.json").read_text())
PIDS: dict[str, int] = ABOUT["pids"]


def test_the_sampler_names_the_process_on_the_ranks_core_and_measures_its_wait(tmp_path: Path) -> None:
    rank = RankProc(rank=1, pid=PIDS["rank"], cpus=frozenset({1}), numa=0)
    sampler = Sampler(SHARED / "t0")
    sampler.sample([rank], 100.0)
    sampler.root = SHARED / "t1"
    sampler.sample([rank], 100.0 + ABOUT["seconds"], suspects={1})
    ev = sampler.evidence(rank, 99.0, 200.0)
    assert ev is not None and ev.span_s == ABOUT["seconds"] and ev.cpus == "1" and ev.threads == 1

    def delta(pid: int) -> float:
        a, b = (procfs.read_all(SHARED / t)[pid].ticks for t in ("t0", "t1"))
        return (b - a) / CLK_TCK / ABOUT["seconds"]

    run0, wait0 = procfs.read_schedstat(rank.pid, SHARED / "t0")[rank.pid]
    run1, wait1 = procfs.read_schedstat(rank.pid, SHARED / "t1")[rank.pid]
    assert ev.main_run == pytest.approx((run1 - run0) / 1e9 / ABOUT["seconds"])
    assert ev.main_wait == pytest.approx((wait1 - wait0) / 1e9 / ABOUT["seconds"])
    assert ev.main_wait > 0.2  # three busy processes on one core: the rank waits for it
    assert [o.pid for o in ev.others] == [PIDS["spinner"]]  # its own loader worker is the job's, not another's
    spinner = ev.others[0]
    assert spinner.command == "python3 -c while True: pass" and spinner.cpus == "1"
    assert spinner.share == pytest.approx(delta(PIDS["spinner"]), abs=0.01)
    assert ev.children == 1 and ev.children_cpu == pytest.approx(delta(PIDS["worker"]))
    assert ev.children_cpus == "1" and ev.remote == 0.0  # one NUMA node
    assert 0.0 <= ev.steal < 0.05 and ev.mhz is None
    assert sampler.evidence(RankProc(rank=7, pid=1, cpus=frozenset({0})), 0, 1) is None  # never sampled


def test_frequency_and_throttle_counters_from_sysfs(sysfs_tree) -> None:  # type: ignore[no-untyped-def]
    amd = sysfs_tree("32amd64-4s2n4c-cgroup2")
    assert evidence.read_mhz(amd, 6) == (800.0, 2300.0)
    intel = sysfs_tree("32em64t-2n8c+dax+nvme+mic+dimms")
    assert evidence.read_throttle(intel, 6) == 0 and evidence.read_throttle(amd, 6) is None
    sampler = Sampler(amd)
    sampler.sample([RankProc(rank=0, pid=999999, cpus=frozenset({6, 13}))], 1.0)
    assert sampler.history[0][-1].mhz is not None and sampler.history[0][-1].max_mhz == 2300.0


def test_cpus_of() -> None:
    assert evidence.cpus_of("0-2,5", [9]) == {0, 1, 2, 5}
    assert evidence.cpus_of("", [0, 1]) == {0, 1} and evidence.cpus_of("bad", [3]) == {3}


def test_a_nic_other_than_the_plans_is_noted(tmp_path: Path) -> None:
    planned = {"NCCL_IB_HCA": "=mlx5_0", "UCX_NET_DEVICES": "mlx5_0:1", "OMP_NUM_THREADS": "8"}
    assert evidence.nic_note(planned, {"NCCL_IB_HCA": "=mlx5_0", "UCX_NET_DEVICES": "mlx5_0:1"}) == ""
    assert evidence.nic_note(planned, {"NCCL_IB_HCA": "=mlx5_3", "UCX_NET_DEVICES": "mlx5_0:1"}) == (
        "NCCL_IB_HCA==mlx5_3, the plan's =mlx5_0"
    )
    assert evidence.nic_note({"OMP_NUM_THREADS": "8"}, {}) == ""  # no NIC chosen for it: nothing to compare


# ----------------------------------------------------------------------------- under the restrictions users have

RESTRICTED = FIXTURES / "steps" / "restricted"  # made by tests/fixtures/steps/capture_restricted.py


def _evidence(tree: Path, *, numa: int = -1) -> Evidence:
    """The recorded rank's figures over its two captures (rank 1 of a job; its numa_maps read as a suspect's)."""
    about = json.loads((tree / "about.json").read_text())
    rank = RankProc(rank=1, pid=about["pids"]["rank"], cpus=frozenset({1}), numa=numa)
    sampler = Sampler(tree / "t0")
    sampler.sample([rank], 100.0, suspects={1})
    sampler.root = tree / "t1"
    sampler.sample([rank], 100.0 + about["seconds"], suspects={1})
    ev = sampler.evidence(rank, 99.0, 200.0)
    assert ev is not None
    return ev


def _slow() -> Judgement:
    """Rank 1 of two is 50 ms a step slower in its compute (rank 0 waits for it in comm)."""
    points = {
        r: [Point(s, 0.1, 0.001, c - s * 1e-6, 0.099 - c + s * 1e-6, 0.0) for s in range(1, 41)]
        for r, c in ((0, 0.048), (1, 0.098))
    }
    j = judge(points)
    assert j.culprit == 1 and j.phase == "compute"
    return j


def _other(ev: Evidence, **kw: object) -> Evidence:
    """A rank like ``ev`` on a core of its own: it runs as long, and waits next to nothing."""
    return dataclasses.replace(ev, rank=0, cpus="0", main_wait=0.0, wait=0.0, others=(), **kw)  # type: ignore[arg-type]


def test_a_proc_that_hides_other_users_processes_leaves_the_core_sharer_unnamed_and_says_why() -> None:
    """hidepid=2: the spinner on the rank's core runs as another user, so it is not in /proc. The rank's wait is
    there, no process outside the job is named, and the cause says why none is."""
    ev = _evidence(RESTRICTED / "hidepid")
    assert ev.others == () and ev.main_wait > 0.2 and ev.waits and ev.unknown == ()
    assert ev.hidden == "/proc is mounted with hidepid=invisible"
    cause = explain(_slow(), {1: ev, 0: _other(ev, main_run=ev.main_run * 0.5)})
    assert cause.found and cause.why.startswith("CPU wait: its main thread waited "), cause
    assert cause.why.endswith(
        "; other users' processes are not seen here (/proc is mounted with hidepid=invisible): one of them may run "
        "on its cores"
    )
    assert "ps -eo pid,user,psr,pcpu,comm" in cause.fix
    seen = _evidence(RESTRICTED / "open")  # the same scene where every process is seen: the spinner is named
    assert seen.hidden == "" and [b.command for b in seen.others] == ["python3 -c while True: pass"]


def test_a_kernel_without_schedstat_leaves_the_wait_out_and_says_so(tmp_path: Path) -> None:
    """No task/*/schedstat files (CONFIG_SCHEDSTATS off): the time each thread ran comes from its stat; its wait
    is not known, no contention is told from it, and *cause not found* says which figure was missing."""
    tree = tmp_path / "open"
    shutil.copytree(RESTRICTED / "open", tree)
    for f in tree.glob("t*/proc/*/task/*/schedstat"):
        f.unlink()
    ev = _evidence(tree)
    full = _evidence(RESTRICTED / "open")
    assert not ev.waits and ev.main_wait == 0.0 and ev.unknown == (evidence.NO_SCHEDSTAT,)
    assert ev.main_run == pytest.approx(full.main_run, abs=0.05)  # ticks, not nanoseconds: as long, more coarsely
    cause = explain(_slow(), {1: ev, 0: _other(ev)})
    assert not cause.found and cause.why.startswith("cause not found: compute "), cause
    assert "waited" not in cause.why and cause.why.endswith(f"not known here: {evidence.NO_SCHEDSTAT}")


def test_a_numa_maps_that_cannot_be_read_leaves_the_pages_out_and_says_why(tmp_path: Path) -> None:
    """The rank's numa_maps answers EACCES (a process numarun may not look into): the remote-memory figure is left
    out, and the cause names the file and the error."""
    denied = Path("/proc/sys/vm/compact_memory")  # write-only for everyone, root included: reading it is EACCES
    if procfs.read_or_why(denied)[1] != "Permission denied":
        pytest.skip(f"{denied} does not answer EACCES here")
    tree = tmp_path / "open"
    shutil.copytree(RESTRICTED / "open", tree)
    pid = json.loads((tree / "about.json").read_text())["pids"]["rank"]
    for t in ("t0", "t1"):
        maps = tree / t / "proc" / str(pid) / "numa_maps"
        maps.unlink()
        maps.symlink_to(denied)
    ev = _evidence(tree, numa=0)
    assert ev.remote is None and ev.unknown == (f"its pages per NUMA node (/proc/{pid}/numa_maps: Permission denied)",)
    cause = explain(_slow(), {1: ev, 0: _other(ev, main_run=ev.main_run / 4, remote=0.0)})
    assert cause.why.startswith("a shared core: pid ")  # it waits for the spinner's core: that comes first
    busy = explain(_slow(), {1: dataclasses.replace(ev, main_wait=0.0), 0: _other(ev, main_run=ev.main_run / 4)})
    assert busy.why.startswith("more work: ") and busy.why.endswith(
        f"; not known here: its pages per NUMA node (/proc/{pid}/numa_maps: Permission denied)"
    )
    assert _evidence(RESTRICTED / "open", numa=0).remote == 0.0  # read where it may be
