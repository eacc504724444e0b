"""The slots a packed sweep runs its jobs on (numarun.plan.pack), on recorded 8-GPU machines and CPU hosts."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import FIXTURES

from numarun.cpuset import format_list
from numarun.errors import PlanError
from numarun.plan.binding import make_plan
from numarun.plan.model import BindingMode, PlanRequest
from numarun.plan.pack import confined_cpus, pack, slot_topology
from numarun.topology.discover import load_topology
from numarun.topology.model import Topology

# NVSwitch (NV18 all to all), 2 GPUs and 2 IB rails per PCIe switch, 2 NUMA nodes of 56 cores + HT
NVSWITCH = FIXTURES / "nvidia-smi" / "h100-8gpu-13nic-mlx5_ib-penny.txt"
# no NVLink: PIX pairs under PCIe switches, PHB within a socket, 2 NUMA nodes of 14 cores + HT
PCIE = FIXTURES / "nvidia-smi" / "pcie-8gpu-pix-phb-sys-2x14c.txt"
CPUS = FIXTURES / "hwloc" / "24em64t-2n6c2t-pci.xml"


def slots(topology: Topology, ranks: int, **kw: object) -> list[tuple[str, str, str, str]]:
    return [
        (format_list(s.gpus), format_list(s.cpus), format_list(s.mems), ",".join(s.nics))
        for s in pack(topology, ranks, **kw)
    ]  # type: ignore[arg-type]


def test_nvswitch_machine_8x1_4x2_2x4() -> None:
    t = load_topology(str(NVSWITCH))
    assert slots(t, 1) == [
        ("0", "0-13,112-125", "0", "mlx5_ib0"),
        ("1", "14-27,126-139", "0", "mlx5_ib1"),
        ("2", "28-41,140-153", "0", "mlx5_ib2"),
        ("3", "42-55,154-167", "0", "mlx5_ib3"),
        ("4", "56-69,168-181", "1", "mlx5_ib4"),
        ("5", "70-83,182-195", "1", "mlx5_ib5"),
        ("6", "84-97,196-209", "1", "mlx5_ib6"),
        ("7", "98-111,210-223", "1", "mlx5_ib7"),
    ]
    assert slots(t, 2) == [  # the two GPUs of each PCIe switch (they share its two rails)
        ("0-1", "0-27,112-139", "0", "mlx5_ib0,mlx5_ib1"),
        ("2-3", "28-55,140-167", "0", "mlx5_ib2,mlx5_ib3"),
        ("4-5", "56-83,168-195", "1", "mlx5_ib4,mlx5_ib5"),
        ("6-7", "84-111,196-223", "1", "mlx5_ib6,mlx5_ib7"),
    ]
    assert slots(t, 4) == [
        ("0-3", "0-55,112-167", "0", "mlx5_ib0,mlx5_ib1,mlx5_ib2,mlx5_ib3"),
        ("4-7", "56-111,168-223", "1", "mlx5_ib4,mlx5_ib5,mlx5_ib6,mlx5_ib7"),
    ]


def test_pcie_switch_machine_8x1_4x2_2x4() -> None:
    t = load_topology(str(PCIE))
    assert slots(t, 1) == [
        ("0", "0-3,28-31", "0", ""),
        ("1", "4-7,32-35", "0", ""),
        ("2", "8-10,36-38", "0", ""),
        ("3", "11-13,39-41", "0", ""),
        ("4", "14-17,42-45", "1", ""),
        ("5", "18-21,46-49", "1", ""),
        ("6", "22-24,50-52", "1", ""),
        ("7", "25-27,53-55", "1", ""),
    ]
    assert slots(t, 2) == [
        ("0-1", "0-6,28-34", "0", ""),
        ("2-3", "7-13,35-41", "0", ""),
        ("4-5", "14-20,42-48", "1", ""),
        ("6-7", "21-27,49-55", "1", ""),
    ]
    assert slots(t, 4) == [("0-3", "0-13,28-41", "0", ""), ("4-7", "14-27,42-55", "1", "")]


def test_slots_follow_the_topology_not_the_gpu_numbers() -> None:
    """The PCIe machine with its GPUs numbered across the sockets (0,2,4,6 on NUMA 0): the PIX pairs
    and NUMA nodes still decide."""
    t = load_topology(str(PCIE))
    order = [0, 4, 1, 5, 2, 6, 3, 7]
    gpus = tuple(replace(t.gpus[o], index=i) for i, o in enumerate(order))
    links = tuple(tuple(t.gpu_links[a][b] for b in order) for a in order)
    shuffled = replace(t, gpus=gpus, gpu_links=links)
    assert [s[0] for s in slots(shuffled, 2)] == ["0,2", "4,6", "1,3", "5,7"]
    assert [s[0] for s in slots(shuffled, 4)] == ["0,2,4,6", "1,3,5,7"]
    assert [(s[0], s[2]) for s in slots(shuffled, 1)][:2] == [("0", "0"), ("2", "0")]


def test_cpu_slots_are_cores_of_one_numa_node_first() -> None:
    # 2 NUMA nodes x 6 cores x 2 threads; CUDA_VISIBLE_DEVICES= (empty): CPU-only jobs
    t = load_topology(str(CPUS))
    got = slots(t, 4, cuda_visible_devices="")
    assert len(got) == 3 and [s[2] for s in got] == ["0", "1", "0-1"]  # the leftover cores of both nodes last
    cpus = [set(s.cpus) for s in pack(t, 4, cuda_visible_devices="")]
    assert all(not (a & b) for i, a in enumerate(cpus) for b in cpus[i + 1 :])  # disjoint
    assert [len(s) for s in cpus] == [8, 8, 8]  # 4 whole cores, hyperthreads kept together
    assert len(pack(t, 1, cuda_visible_devices="")) == 12 and len(pack(t, 1, cuda_visible_devices="", limit=5)) == 5


def test_a_job_larger_than_the_node_is_refused_in_one_line() -> None:
    with pytest.raises(PlanError, match=r"^bad nproc_per_node 9 .* 8 visible GPUs; expected at most 8$"):
        pack(load_topology(str(PCIE)), 9)
    with pytest.raises(PlanError, match="12 usable cores and no visible GPU; expected at most 12"):
        pack(load_topology(str(CPUS)), 13, cuda_visible_devices="")
    # CUDA_VISIBLE_DEVICES narrows the GPUs packed
    t = load_topology(str(NVSWITCH))
    assert [s[0] for s in slots(t, 2, cuda_visible_devices="2,3,6,7")] == ["2-3", "6-7"]
    with pytest.raises(PlanError, match="4 visible GPUs"):
        pack(t, 8, cuda_visible_devices="0,1,2,3")


def test_a_job_plans_inside_its_slot() -> None:
    t = load_topology(str(NVSWITCH))
    slot = pack(t, 2)[3]
    request = PlanRequest(nproc_per_node=2, cuda_visible_devices="6,7", cuda_device_order="PCI_BUS_ID")
    plan = make_plan(slot_topology(t, slot, request.binding), request)
    assert [r.gpu.index for r in plan.ranks if r.gpu] == [6, 7] and [r.nic for r in plan.ranks] == [
        "mlx5_ib6",
        "mlx5_ib7",
    ]
    assert {c for r in plan.ranks for c in r.cpus} <= set(slot.cpus) == set(confined_cpus(slot, request.binding) or ())
    assert not set(plan.ranks[0].cpus) & set(plan.ranks[1].cpus)


def test_an_unbound_job_keeps_its_slots_gpus_and_every_cpu() -> None:
    """binding none leaves a job's CPUs alone, as in a run: its ranks' CPUs are the node's, its GPUs the slot's."""
    t = load_topology(str(NVSWITCH))
    slot = pack(t, 2)[3]
    request = PlanRequest(
        nproc_per_node=2, binding=BindingMode.NONE, cuda_visible_devices="6,7", cuda_device_order="PCI_BUS_ID"
    )
    plan = make_plan(slot_topology(t, slot, request.binding), request)
    assert confined_cpus(slot, request.binding) is None
    assert [r.gpu.index for r in plan.ranks if r.gpu] == [6, 7]
    assert all(r.cpus == t.usable_cpus for r in plan.ranks)
