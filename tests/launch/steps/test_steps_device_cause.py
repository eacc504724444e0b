"""A GPU node's own causes of a slow rank (launch/steps/device_cause.py, through cause.explain): each recorded
fault of a GPU or a NIC named, with its fix, when its figures account for the lost time, and never on a healthy
recording, where the CPU's causes apply as before."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest
from devices import node_evidence

from numarun.launch.steps.cause import COVERS, Cause, explain
from numarun.launch.steps.device import DeviceEvidence
from numarun.launch.steps.device_cause import faults, slowdowns
from numarun.launch.steps.evidence import Busy, Evidence
from numarun.launch.steps.judge import Judgement, Point, judge

IB = ("mlx5_0", "mlx5_1", "mlx5_2")
ETH = ("eth0", "eth1", "eth2")


def _straggler(ranks: int = 4, slow: int = 3, extra: float = 0.050, work: float = 0.050) -> Judgement:
    """A synchronous job of 40 steps: rank ``slow`` computes ``extra`` more each step, the others wait in comm."""
    points: dict[int, list[Point]] = {r: [] for r in range(ranks)}
    for step in range(1, 41):
        wall = work + extra + 0.002
        for r in range(ranks):
            compute = work - 0.002 + (extra if r == slow else 0.0) + 0.0001 * ((step * (r + 3)) % 7)
            points[r].append(Point(step, wall, 0.001, compute, wall - compute - 0.002, 0.001))
    j = judge(points)
    assert j.culprit == slow and j.phase == "compute"
    return j


def _cpu(rank: int, device: DeviceEvidence | None, **kw: object) -> Evidence:
    """The kernel's figures of a rank whose CPU says nothing: every rank runs and waits alike."""
    base: dict[str, object] = dict(span_s=60.0, cpus=str(rank), numa=0, threads=8, main_run=0.5, main_wait=0.02)
    base.update(kw)
    return Evidence(rank=rank, device=device, **base)  # type: ignore[arg-type]


def _explain(devices: Mapping[int, DeviceEvidence], j: Judgement | None = None, **slow_cpu: object) -> Cause:
    j = j or _straggler()
    return explain(j, {r: _cpu(r, d, **(slow_cpu if r == j.culprit else {})) for r, d in devices.items()})


def test_a_healthy_recording_names_no_device_and_the_cpu_causes_apply() -> None:
    healthy = node_evidence("healthy")
    assert not any(slowdowns(d, list(healthy.values()), own=0.1, step=0.1) for d in healthy.values())
    assert not any(faults(d, [o for r, o in healthy.items() if o is not d]) for d in healthy.values())
    cause = _explain(healthy)
    assert not cause.found and cause.why.startswith("cause not found: compute ")
    assert "GPU 3 at 1,980 MHz (the other GPUs' 1,980 MHz); NIC mlx5_0 at 200 Gb/s" in cause.why
    spinner = Busy(4242, "python3 -c while True: pass", 0.49, "3")
    shared = _explain(healthy, main_run=0.49, main_wait=0.47, others=(spinner,))
    assert shared.found and shared.why.startswith("a shared core: pid 4242")
    more = _explain(healthy, main_run=0.99, main_wait=0.01)
    assert more.found and more.why.startswith("more work: its main thread ran")
    ethernet = _explain(node_evidence("healthy", (*ETH, "eth0")))
    assert not ethernet.found


def test_power_cap() -> None:
    cause = _explain(node_evidence("power-cap"))
    assert cause.found and cause.why == (
        "GPU 3 runs at 1,410 MHz against the other GPUs' 1,980 MHz: power cap 300 W (the other GPUs' 700 W)"
    )
    assert cause.fix == "raise its power limit to 700 W (nvidia-smi -i 3 -pl 700)"


def test_a_power_cap_at_the_others_limit_is_no_fault() -> None:
    """Capped at the same 700 W as the others: a GPU that works more than they do draws more and is capped sooner,
    so its clocks tell no fault of its own."""
    capped = node_evidence("power-cap")
    same = dict(capped)
    assert capped[3].gpu is not None
    same[3] = dataclasses.replace(capped[3], gpu=dataclasses.replace(capped[3].gpu, power_limit_w=700.0))
    assert not _explain(same).found


def test_thermal_slowdown() -> None:
    cause = _explain(node_evidence("thermal"))
    assert cause.found and cause.why == (
        "GPU 3 runs at 1,290 MHz against the other GPUs' 1,980 MHz: thermal slowdown at 92 °C (the other GPUs' 57 "
        "°C), its slowdown threshold 89 °C"
    )
    assert cause.fix == "check the node's cooling: fans, airflow, inlet temperature (nvidia-smi -q -d TEMPERATURE)"


def test_hardware_slowdown() -> None:
    cause = _explain(node_evidence("hw-slowdown"))
    assert cause.found and cause.why == (
        "GPU 3 runs at 990 MHz against the other GPUs' 1,980 MHz: hardware slowdown (HW_SLOWDOWN: over "
        "temperature, or the node's power brake)"
    )
    assert cause.fix == "check the node's power supplies and cooling; drain it for service if it stays"


def test_a_slower_gpu_counts_only_where_its_clocks_cover_the_lost_time() -> None:
    """At 1,410 MHz against 1,980 its own time is 29 % longer than it would be: enough for 50 ms lost of a 100 ms
    own time, not for 80 ms of 130."""
    capped = node_evidence("power-cap")
    j = _straggler()
    assert j.own[3] * (1 - 1410 / 1980) >= COVERS * j.lost_s and _explain(capped, j).found
    bigger = _straggler(extra=0.080)
    assert bigger.own[3] * (1 - 1410 / 1980) < COVERS * bigger.lost_s
    assert not _explain(capped, bigger).found


def test_an_idle_gpu_is_no_cause() -> None:
    """Low clocks whose only reason is idle: the GPU waits for its rank's CPU, not the other way round."""
    capped = node_evidence("power-cap")
    idle = dict(capped)
    assert capped[3].gpu is not None
    idle[3] = dataclasses.replace(capped[3], gpu=dataclasses.replace(capped[3].gpu, reasons=0x1))
    assert not _explain(idle).found
    unknown = dict(capped)
    unknown[3] = dataclasses.replace(capped[3], gpu=dataclasses.replace(capped[3].gpu, reasons=None))
    assert _explain(unknown).why.endswith("its clock event reasons were not answered")


def test_a_shared_core_comes_before_the_gpu_and_the_gpu_before_more_work() -> None:
    capped = node_evidence("power-cap")
    spinner = Busy(4242, "python3 -c while True: pass", 0.49, "3")
    assert _explain(capped, main_run=0.49, main_wait=0.47, others=(spinner,)).why.startswith("a shared core")
    assert _explain(capped, main_run=0.99, main_wait=0.01).why.startswith("GPU 3 runs at 1,410 MHz")


def test_pcie_link_downtrained() -> None:
    cause = _explain(node_evidence("pcie-x8"))
    assert cause.found and cause.why == (
        "GPU 3's PCIe link runs at x8 gen3 against x16 gen5 (8 against 63 GB/s), moving 6.5 GB/s"
    )
    assert cause.fix.startswith("reseat GPU 3 or check its slot and riser")
    pcie = node_evidence("pcie-x8")
    unmeasured = dict(pcie)
    assert pcie[3].gpu is not None
    unmeasured[3] = dataclasses.replace(pcie[3], gpu=dataclasses.replace(pcie[3].gpu, pcie_mbs=None))
    assert _explain(unmeasured).why == "GPU 3's PCIe link runs at x8 gen3 against x16 gen5"  # a fault: no time


def test_memory_errors_and_retired_pages() -> None:
    cause = _explain(node_evidence("memory-errors"))
    assert cause.found and cause.why == "GPU 3 remapped 1 row and had 13 ECC errors (1 uncorrected) during the job"
    assert cause.fix == "drain the node and reset GPU 3 (nvidia-smi -r -i 3); replace it if the errors return"
    v100 = _explain(node_evidence("retired-pages"))
    assert v100.found and v100.why == "GPU 3 retired 2 pages and had 41 ECC errors during the job"


def test_nvlink_down() -> None:
    cause = _explain(node_evidence("nvlink-down"))
    assert cause.found and cause.why == "NVLink link 5 of GPU 3 is down"
    assert cause.fix == "drain the node: GPU 3's NVLink needs service (nvidia-smi nvlink -s -i 3)"


def test_a_fault_is_named_only_where_the_cpu_leaves_the_time_to_the_devices() -> None:
    errors = node_evidence("memory-errors")
    more = _explain(errors, main_run=0.99, main_wait=0.01)
    assert more.found and more.why.startswith("more work: ")


def test_a_slower_nic() -> None:
    cause = _explain(node_evidence("healthy", (*IB, "mlx5_3")))
    assert cause.found and cause.why == "its NIC mlx5_3 runs at 100 Gb/s against the others' 200 Gb/s, moving 10.0 GB/s"
    assert cause.fix == "check mlx5_3's link: its cable, transceiver and switch port (ibstat mlx5_3)"


def test_congestion() -> None:
    cause = _explain(node_evidence("healthy", (*IB, "mlx5_4")))
    assert cause.found and cause.why == (
        "port_xmit_wait of mlx5_4 rose by 48,150,000 during the job (congestion: 321 times the other NICs')"
    )
    assert cause.fix.startswith("congestion on its path")


def test_link_errors_and_a_nic_down() -> None:
    cause = _explain(node_evidence("healthy", (*IB, "mlx5_5")))
    assert cause.found and cause.why == (
        "the link of its NIC mlx5_5 fails: symbol_error +1,250, link_error_recovery +3, link_downed +1, "
        "port_rcv_errors +17 during the job"
    )
    assert cause.fix.startswith("check mlx5_5's cable and transceiver")
    down = _explain(node_evidence("healthy", (*IB, "mlx5_6")))
    assert down.found and down.why == "its NIC mlx5_6 is down"


def test_ethernet_drops() -> None:
    cause = _explain(node_evidence("healthy", (*ETH, "eth3")))
    assert cause.found and cause.why == (
        "its NIC eth3 dropped or garbled packets during the job: rx_dropped +48,000, rx_errors +310"
    )
    assert cause.fix == "check eth3: its ring buffers (ethtool -g eth3) and its link (ethtool -S eth3)"


def test_a_fault_every_device_shares_is_no_ones() -> None:
    """Congestion on every NIC alike (a busy fabric) names none of them; nor does a NIC that carried no traffic."""
    everywhere = node_evidence("healthy", (*IB, "mlx5_4"))
    moved = {"port_xmit_wait": 48_150_000}
    busy = {}
    for r, d in everywhere.items():
        assert d.nic is not None
        busy[r] = dataclasses.replace(d, nic=dataclasses.replace(d.nic, moved=moved))
    assert not _explain(busy).found
    idle = dict(everywhere)
    assert everywhere[3].nic is not None
    idle[3] = dataclasses.replace(everywhere[3], nic=dataclasses.replace(everywhere[3].nic, bytes_per_s=0.0))
    assert not _explain(idle).found


@pytest.mark.parametrize("scenario", ["power-cap", "thermal", "hw-slowdown", "pcie-x8"])
def test_a_balanced_rank_is_never_blamed_on_its_devices(scenario: str) -> None:
    """The causes are asked of the culprit only: a healthy rank named beside a faulty GPU gets the CPU's answer."""
    ev = node_evidence(scenario)
    j = _straggler(slow=0)
    assert not explain(j, {r: _cpu(r, d) for r, d in ev.items()}).found


def test_a_nic_shared_by_every_rank_has_nothing_to_be_compared_with() -> None:
    """A one-node job: its ranks share the node's NIC, whose dropped packets are the host's, not the job's."""
    shared = node_evidence("healthy", ("eth3",) * 4)
    assert shared[3].nic is not None and shared[3].nic.moved
    assert not _explain(shared).found
