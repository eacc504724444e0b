"""The step report's kernel readers and sampler on recorded trees (docs/steps.md, "Why"): a rank sharing its core
with a spinner (tests/fixtures/steps/shared-core, made by its capture.py), and the cpufreq and throttle counters of
two hwloc sysfs captures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import FIXTURES

from numarun.launch.steps import evidence
from numarun.launch.steps.evidence import CLK_TCK, RankProc, Sampler
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
