"""Plan every recorded machine in every mode and check the plan invariants.

Machines: the ``nvidia-smi topo -m`` matrices (tests/fixtures/nvidia-smi) and the real
``/sys`` + ``/proc`` trees (tests/fixtures/hwloc-linux-sysfs, live-h200-vm), read by the
project's own readers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import FIXTURES
from topo_helpers import check_invariants
from trees import extract_tree

from numarun.errors import PlanError
from numarun.plan.binding import make_plan
from numarun.plan.model import BindingMode, MemPolicy, PlanRequest
from numarun.topology.model import Topology
from numarun.topology.smi import topology_from_smi
from numarun.topology.sysfs import read_sysfs

SMI = sorted((FIXTURES / "nvidia-smi").glob("*.txt"))
TREES = sorted((FIXTURES / "hwloc-linux-sysfs").glob("*.tar.bz2")) + sorted(
    (FIXTURES / "live-h200-vm").glob("sysfs.tar.*")
)
MODES = list(BindingMode)


SHORTAGE = re.compile(
    r"bad --nproc-per-node for binding '(exclusive|core-complex)': (?:NUMA node (\d+)|the shared CPU "
    r"pool) has (\d+) usable physical cores for (\d+) ranks; expected at least one core per rank"
)


def _check_shortage(topo: Topology, request: PlanRequest, message: str) -> None:
    """Only a real shortage of cores may refuse a plan, and it must say so with the right numbers: counted
    again here, from the topology, for the NUMA node it names."""
    m = SHORTAGE.match(message)
    assert m, message
    assert m.group(1) == request.binding.value, message
    have, ranks = int(m.group(3)), int(m.group(4))
    usable = set(topo.usable_cpus)
    if m.group(2) is not None:
        cores = {c.core_key for c in topo.cpus if c.id in usable and c.numa_node == int(m.group(2))}
    else:
        cores = {c.core_key for c in topo.cpus if c.id in usable}
    assert (have == len(cores)) if m.group(2) is not None else (have <= len(cores)), (message, len(cores))
    assert have < ranks <= (request.nproc_per_node or len(topo.gpus) or 1), message


def test_a_shortage_is_checked_against_the_topology() -> None:
    topo = topology_from_smi((FIXTURES / "nvidia-smi" / "aws-p4d.24xlarge.txt").read_text(), "p4d")
    request = PlanRequest(cuda_visible_devices="", nproc_per_node=4 * len(topo.usable_cpus))
    with pytest.raises(PlanError) as e:
        make_plan(topo, request)
    _check_shortage(topo, request, str(e.value))
    with pytest.raises(AssertionError):  # a count the topology does not have is caught
        _check_shortage(topo, request, re.sub(r"has \d+ usable", "has 1 usable", str(e.value)))
    with pytest.raises(AssertionError):  # as is any other refusal
        _check_shortage(
            topo, request, "bad --nproc-per-node for binding 'exclusive': no usable physical cores for 2 ranks"
        )


def test_fixtures_are_present() -> None:
    assert len(SMI) >= 17 and len(TREES) >= 12


@pytest.fixture(scope="session")
def trees() -> dict[str, Topology]:
    """Each tarball unpacked once (cached by conftest) and read once."""
    return {f"{t.parent.name}/{t.name}": read_sysfs(extract_tree(t)) for t in TREES}


def _plan_checked(topo: Topology, request: PlanRequest) -> None:
    try:
        plan = make_plan(topo, request)
    except PlanError as e:
        _check_shortage(topo, request, str(e))
        return
    check_invariants(topo, plan)
    cvd = request.cuda_visible_devices
    n_gpus = len(topo.gpus) if cvd is None else len([x for x in cvd.split(",") if x.strip()])
    assert len(plan.ranks) == (request.nproc_per_node or n_gpus or 1)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("path", SMI, ids=lambda p: p.stem)
def test_smi_machines(path: Path, mode: BindingMode) -> None:
    topo = topology_from_smi(path.read_text(), str(path))
    _plan_checked(topo, PlanRequest(binding=mode))
    _plan_checked(
        topo, PlanRequest(binding=mode, mem_policy=MemPolicy.PREFERRED, nproc_per_node=max(1, len(topo.gpus) // 2))
    )
    nodes = sum(1 for n in topo.numa_nodes if not n.memory_only)
    _plan_checked(topo, PlanRequest(binding=mode, cuda_visible_devices="", nproc_per_node=2 * nodes))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", [f"{t.parent.name}/{t.name}" for t in TREES])
def test_sysfs_machines(trees: dict[str, Topology], name: str, mode: BindingMode) -> None:
    topo = trees[name]
    _plan_checked(topo, PlanRequest(binding=mode))
    nodes = sum(1 for n in topo.numa_nodes if not n.memory_only and set(n.cpus) & set(topo.usable_cpus))
    _plan_checked(topo, PlanRequest(binding=mode, cuda_visible_devices="", nproc_per_node=max(2, nodes)))
    if len(topo.gpus) > 1:
        _plan_checked(topo, PlanRequest(binding=mode, cuda_visible_devices=f"{len(topo.gpus) - 1},0"))


def test_cgroup_tree_uses_only_allowed_cpus_and_mems(trees: dict[str, Topology]) -> None:
    # Slurm job restricted to CPUs 0-5 and mems 0-5 (cpuset.cpus.effective)
    topo = trees["hwloc-linux-sysfs/32amd64-4s2n4c-cgroup2.tar.bz2"]
    plan = make_plan(topo, PlanRequest(cuda_visible_devices="", nproc_per_node=3))
    cpus = sorted(c for r in plan.ranks for c in r.cpus)
    assert cpus == list(topo.usable_cpus) == [0, 1, 2, 3, 4, 5]
    assert all(set(r.mems) <= set(topo.allowed_mems) for r in plan.ranks)


def test_power9_gpu_memory_nodes_never_bound(trees: dict[str, Topology]) -> None:
    topo = trees["hwloc-linux-sysfs/nvidiagpunumanodes.tar.bz2"]
    assert any(n.memory_only for n in topo.numa_nodes)
    plan = make_plan(topo, PlanRequest())
    assert len(plan.ranks) == len(topo.gpus) == 6
    memory_only = {n.id for n in topo.numa_nodes if n.memory_only}
    assert all(r.mems and not set(r.mems) & memory_only for r in plan.ranks)
    assert all(r.fallback for r in plan.ranks)  # the GPUs' numa_node is -1 there


def test_nps4_dgx_gets_one_nic_per_gpu_on_its_numa_node() -> None:
    path = FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt"
    topo = topology_from_smi(path.read_text(), str(path))
    plan = make_plan(topo, PlanRequest())
    nics = [r.nic for r in plan.ranks]
    assert len(set(nics)) == 8 and "mlx5_8" not in nics and "mlx5_9" not in nics
    assert [r.numa_node for r in plan.ranks] == [3, 3, 1, 1, 7, 7, 5, 5]
    # one list for the node (NVIDIA/nccl#1478); the rank's own NIC goes to UCX only
    assert {r.env["NCCL_IB_HCA"] for r in plan.ranks} == {"=" + ",".join(f"mlx5_{i}" for i in range(8))}
    assert all(r.env["UCX_NET_DEVICES"] == f"{r.nic}:1" for r in plan.ranks)
