"""Planning inside what a scheduler gave (numarun.plan.scheduled, numarun.topology.devices): GPUs by
minor number, a task's own GPU from its device cgroup, CPUs never wider than the task's. Pure or
on recorded trees; no process is started."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path

import pytest
from trees import FIXTURES, extract_tree

from numarun.errors import VisibleDevicesError
from numarun.plan.binding import make_plan
from numarun.plan.model import MemPolicy, PlanRequest
from numarun.plan.scheduled import (
    allowed_minors,
    narrow,
    own_binding,
    own_gpu_refs,
    renumbered,
    task_plan,
    with_usable_cpus,
)
from numarun.topology.devices import cgroup_cpus, gpu_device_access
from numarun.topology.discover import load_topology
from numarun.topology.model import Topology
from numarun.topology.nvml import reading_from_record
from numarun.topology.visible import visible_gpus

MINORS_TREE = FIXTURES / "constructed" / "2gpu-minors-reversed.tar.gz"
BUS_3B, BUS_86 = "0000:3b:00.0", "0000:86:00.0"


@pytest.fixture(scope="module")
def tree() -> Path:
    return extract_tree(MINORS_TREE)


@pytest.fixture(scope="module")
def topo(tree) -> Topology:
    return load_topology(str(tree))


def test_minor_numbers_come_from_the_drivers_information_file(topo):
    assert [(g.pci_bus_id, g.minor) for g in topo.gpus] == [(BUS_3B, 1), (BUS_86, 0)]
    # a JSON snapshot keeps them; an old snapshot without them reads as unknown
    again = Topology.from_json(topo.to_json())
    assert [g.minor for g in again.gpus] == [1, 0]
    data = json.loads(topo.to_json())
    for g in data["gpus"]:
        del g["minor"]
    assert [g.minor for g in Topology.from_json(json.dumps(data)).gpus] == [-1, -1]


def test_nvml_reports_minor_numbers():
    record = json.loads((FIXTURES / "nvml" / "constructed-4gpu-nvlink-pairs.json").read_text())
    assert [g.minor for g in reading_from_record(record).gpus] == [2, 3, 0, 1]
    record["gpus"][0]["minor_number"] = "ERR NVMLError_NotSupported: Not Supported"
    assert reading_from_record(record).gpus[0].minor == -1


def test_the_schedulers_gpu_is_found_by_minor_not_by_pci_position(topo):
    # Slurm's GPU 0 is /dev/nvidia0: the GPU at 86, the second in PCI order
    (gpu,) = visible_gpus(topo, "0", "PCI_BUS_ID", allowed_minors=(0,))
    assert gpu.pci_bus_id == BUS_86
    # both allowed: CUDA numbers them in PCI order, whatever their minors
    assert [g.pci_bus_id for g in visible_gpus(topo, "0,1", "PCI_BUS_ID", allowed_minors=(0, 1))] == [BUS_3B, BUS_86]
    with pytest.raises(VisibleDevicesError, match=r"minor number\(s\) \[5\]"):
        visible_gpus(topo, None, "PCI_BUS_ID", allowed_minors=(5,))


def test_a_plan_on_the_steps_gpu_binds_next_to_it(topo):
    plan = make_plan(topo, PlanRequest(cuda_visible_devices="0", allowed_gpu_minors=(0,)))
    (rank,) = plan.ranks
    assert rank.gpu.pci_bus_id == BUS_86 and rank.cpus == (1,) and rank.mems == (1,) and rank.gpu.cuda_index == 0


def test_a_source_without_minors_takes_the_index_with_a_warning(caplog):
    smi = load_topology(str(FIXTURES / "nvidia-smi" / "consumer-2gpu-pcie-PHB.txt"))
    assert all(g.minor == -1 for g in smi.gpus)
    (gpu,) = visible_gpus(smi, "0", "PCI_BUS_ID", allowed_minors=(1,))
    assert gpu.index == 1 and "records no GPU minor numbers" in caplog.text


def test_device_files_tell_which_gpus_the_cgroup_allows(tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    for m in (0, 1):
        (tmp_path / "dev" / f"nvidia{m}").write_text("")
    real_open = os.open

    def cgroup_open(path, flags, *a):  # the device cgroup refuses nvidia0, as Slurm's ConstrainDevices does
        if str(path).endswith("nvidia0"):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", cgroup_open)
    access = gpu_device_access(tmp_path, [0, 1, 2])
    assert access == {0: False, 1: True, 2: None}
    assert allowed_minors(access) == frozenset({1})
    assert allowed_minors({0: True, 1: True}) is None and allowed_minors({0: None}) is None


def test_renumbered_cuda_visible_devices_read_as_the_steps_gpus():
    assert renumbered("0", (1,)) == frozenset({1})
    assert renumbered("0,1", (1, 3)) == frozenset({1, 3})
    assert renumbered("1,3", (1, 3)) is None and renumbered("0", (0,)) is None
    assert renumbered("GPU-1234", (1,)) is None and renumbered(None, (1,)) is None and renumbered("5", (1,)) is None


def test_a_task_with_its_own_gpu_takes_that_gpus_row(topo):
    # the node's plan, as every task makes it: both GPUs, one rank each
    plan = make_plan(topo, PlanRequest(nproc_per_node=2, allowed_gpu_minors=(0, 1)))
    assert [r.gpu.pci_bus_id for r in plan.ranks] == [BUS_3B, BUS_86]
    # local rank 0 was given /dev/nvidia0 (the GPU at 86): it takes rank 1's row, with CUDA index 0
    own = own_gpu_refs(topo, {0}, "0")
    binding = own_binding(plan, local_rank=0, own_gpus=own)
    assert binding.local_rank == 0 and binding.gpu.pci_bus_id == BUS_86 and binding.gpu.cuda_index == 0
    assert binding.cpus == (1,)
    # without a GPU of its own: its local rank's row
    assert own_binding(plan, local_rank=1).gpu.pci_bus_id == BUS_86
    mine = task_plan(plan, binding)
    assert mine.rank(0) == binding and len(mine.ranks) == 2


def test_narrow_never_widens(topo):
    plan = make_plan(topo, PlanRequest(nproc_per_node=2, allowed_gpu_minors=(0, 1)))
    row = plan.ranks[1]  # GPU 86, cpu 1, memory node 1
    assert narrow(row, topo, {0, 1}) == row
    kept = narrow(row, topo, {0})  # the scheduler bound the task to cpu 0: kept, memory follows it
    assert kept.cpus == (0,) and kept.mems == (0,) and kept.env["OMP_NUM_THREADS"] == "1"
    assert "none of the planned 1" in kept.fallback
    unbound = dataclasses.replace(row, mems=(), mem_policy=MemPolicy.NONE)
    assert narrow(unbound, topo, {0}).mems == ()


def test_the_steps_cpuset_replaces_this_tasks_affinity(topo):
    one = dataclasses.replace(topo, cpus=tuple(dataclasses.replace(c, allowed=c.id == 0) for c in topo.cpus))
    assert one.usable_cpus == (0,)
    assert with_usable_cpus(one, [0, 1]).usable_cpus == (0, 1)


@pytest.mark.parametrize(
    ("cgroup", "files", "want"),
    [
        (
            "3:cpuset:/slurm/uid_0/job_1/step_0\n0::/\n",
            {"sys/fs/cgroup/cpuset/slurm/uid_0/job_1/step_0/cpuset.effective_cpus": "2-3\n"},
            (2, 3),
        ),
        (
            "3:cpuset:/slurm/job_1/step_0/task_0\n",
            {"sys/fs/cgroup/cpuset/slurm/job_1/step_0/cpuset.cpus": "0,4\n"},
            (0, 4),
        ),
        ("0::/system.slice/job\n", {"sys/fs/cgroup/system.slice/job/cpuset.cpus.effective": "1-2\n"}, (1, 2)),
        ("0::/a/b\n", {"sys/fs/cgroup/a/cpuset.cpus.effective": "5\n"}, (5,)),
        ("0::/\n", {}, None),
        (  # the hierarchies where the mount table says, not where they usually are
            "3:cpuset:/job\n0::/\n",
            {
                "proc/self/mounts": "cgroup /cg/cs cgroup rw,cpuset 0 0\ncgroup2 /cg/v2 cgroup2 rw 0 0\n",
                "cg/cs/job/cpuset.effective_cpus": "7\n",
                "sys/fs/cgroup/cpuset/job/cpuset.effective_cpus": "1\n",
            },
            (7,),
        ),
    ],
)
def test_cgroup_cpus_v1_and_v2(tmp_path, cgroup, files, want):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert cgroup_cpus(tmp_path) == want
