"""The step report's GPU and NIC sampler (launch/steps/device.py) on recorded readings: each rank's figures over a
span, what moved since the job's start, the node's other devices beside; and its place in the kernel's sampler."""

from __future__ import annotations

import json

import pytest
from devices import NICS, T0, RecordedNvml, node_evidence, recording, sampled
from helpers import FIXTURES

from numarun.jsonable import from_jsonable, loads, to_jsonable
from numarun.launch.steps.device import DeviceSampler, RankDevice, rank_device
from numarun.launch.steps.evidence import Evidence, RankProc, Sampler
from numarun.plan.model import GpuRef, RankBinding

SHARED = FIXTURES / "steps" / "shared-core"
RANK_PID: int = json.loads((SHARED / "about.json").read_text())["pids"]["rank"]


def test_a_healthy_node_over_the_span() -> None:
    ev = node_evidence("healthy")
    mine = ev[3]
    assert mine.gpu is not None and mine.nic is not None
    g = mine.gpu
    assert (g.index, g.since_s, g.mhz, g.max_mhz, g.reasons) == (3, 60.0, 1980.0, 1980, 0)
    assert (g.temperature_c, g.slowdown_c, g.power_w, g.power_limit_w) == (59, 89, 597.0, 700.0)
    assert g.pcie == (5, 16, 5, 16) and g.pcie_mbs is None  # its link at its best: its traffic is not read
    x8 = node_evidence("pcie-x8")[3].gpu
    assert x8 is not None and x8.pcie == (3, 8, 5, 16) and x8.pcie_mbs == 6550.0  # the busier direction, MB/s
    assert (g.ecc_errors, g.retired_pages, g.remapped_rows) == (0, 0, 0)
    assert (g.nvlinks, g.nvlink_up, g.nvlink_lost) == (18, tuple(range(18)), ())
    assert mine.peer_mhz == (1980.0, 1980.0, 1980.0)  # GPUs 0-2
    n = mine.nic
    assert (n.name, n.port, n.rdma, n.up, n.rate_gbps) == ("mlx5_0", 1, True, True, 200.0)
    assert n.bytes_per_s == 10e9 and n.moved == {"port_xmit_wait": 150_000}  # old symbol errors did not move
    assert mine.peer_nic_gbps == (200.0, 200.0)  # mlx5_1, mlx5_2: its own, rank 0's too, is no peer


def test_what_moved_during_the_job() -> None:
    memory = node_evidence("memory-errors")[3].gpu
    assert memory is not None and (memory.ecc_errors, memory.ecc_uncorrected, memory.remapped_rows) == (13, 1, 1)
    pages = node_evidence("retired-pages")[3].gpu
    assert pages is not None and (pages.retired_pages, pages.ecc_errors, pages.mhz) == (2, 41, 1530.0)
    links = node_evidence("nvlink-down")[3].gpu
    assert links is not None and links.nvlink_lost == (5,) and 5 not in links.nvlink_up
    nics = node_evidence("healthy", ("mlx5_0", "mlx5_4", "mlx5_5", "eth3"))
    assert nics[1].nic is not None and nics[1].nic.moved == {"port_xmit_wait": 48_150_000}
    assert nics[2].nic is not None and nics[2].nic.moved == {
        "symbol_error": 1250,
        "link_error_recovery": 3,
        "link_downed": 1,
        "port_rcv_errors": 17,
        "port_xmit_wait": 150_000,
    }
    assert nics[3].nic is not None and nics[3].nic.moved == {"rx_dropped": 48_000, "rx_errors": 310}
    assert nics[3].nic.bytes_per_s == 5e9 and nics[3].nic.rate_gbps == 100.0


def test_clocks_are_the_spans_mean_and_reasons_any_seen() -> None:
    data = recording("healthy")
    capped = recording("power-cap")["readings"][1]
    sampler = DeviceSampler(RecordedNvml(data["readings"][0]))
    rank = RankDevice(3, "00000000:5D:00.0")
    sampler.sample(NICS / "t0", [rank], T0)
    sampler.gpus = RecordedNvml(capped)
    sampler.sample(NICS / "t1", [rank], T0 + 60)
    both = sampler.evidence(rank, T0, T0 + 60)
    assert both is not None and both.gpu is not None
    assert (both.gpu.mhz, both.gpu.reasons) == ((1980 + 1410) / 2, 0x4)
    last = sampler.evidence(rank, T0 + 60, T0 + 60)
    assert last is not None and last.gpu is not None and last.gpu.mhz == 1410.0
    assert last.gpu.since_s == 60.0  # the counters still count from the job's first reading


def test_a_device_read_once_however_many_ranks_share_it() -> None:
    sampler, ranks, end = sampled("healthy", ("mlx5_0", "mlx5_0", "mlx5_0", "mlx5_0"))
    assert list(sampler.nic_history) == [("mlx5_0", 0)] and len(sampler.nic_history["mlx5_0", 0]) == 2
    assert len(sampler.gpu_history) == 4
    ev = sampler.evidence(ranks[0], T0, end)
    assert ev is not None and ev.peer_nic_gbps == ()  # one NIC for the node: nothing to compare here


def test_no_devices_no_evidence() -> None:
    sampler = DeviceSampler()
    sampler.sample(NICS / "t0", [None, RankDevice(nic="eth9")], T0)
    assert sampler.evidence(None, 0, 1) is None
    assert sampler.evidence(RankDevice(nic="eth9"), 0, 1) is None  # no such interface
    assert sampler.evidence(RankDevice(gpu=0), 0, 1) is None  # no GPU source: never read


def test_without_a_driver_the_live_sampler_tries_once_and_keeps_the_nics() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    sampler = DeviceSampler(live=True)
    rank = RankDevice(0, "", "mlx5_0")
    sampler.sample(NICS / "t0", [rank], T0)
    assert sampler.gpus is None and not sampler.live  # not asked again every tick
    sampler.sample(NICS / "t1", [rank], T0 + 60)
    ev = sampler.evidence(rank, T0, T0 + 60)
    assert ev is not None and ev.gpu is None and ev.nic is not None


def test_cpu_ranks_never_open_nvml() -> None:
    sampler = DeviceSampler(live=True)
    sampler.sample(NICS / "t0", [RankDevice(nic="eth0")], T0)
    assert sampler.live and sampler.gpus is None


def test_a_ranks_devices_come_from_its_plan_row() -> None:
    gpu = GpuRef(index=3, pci_bus_id="0000:5d:00.0", numa_node=1)
    row = RankBinding(local_rank=3, gpu=gpu, cpus=(0,), mems=(), nic="mlx5_3", env={}, nic_port=1)
    assert rank_device(row) == RankDevice(3, "0000:5d:00.0", "mlx5_3", 1)
    cpu_only = RankBinding(local_rank=0, gpu=None, cpus=(0,), mems=(), nic=None, env={})
    assert rank_device(cpu_only) is None and rank_device(None) is None
    assert rank_device(RankBinding(0, None, (0,), (), "eth0", {})) == RankDevice(nic="eth0")


def test_the_kernel_sampler_carries_the_device_figures_through_the_store() -> None:
    """Evidence with its device figures is JSON through the store, as the judging node reads it."""
    data = recording("thermal")
    device = RankDevice(3, "00000000:5D:00.0", "mlx5_0")
    rank = RankProc(rank=3, pid=RANK_PID, cpus=frozenset({1}), numa=0, device=device)
    sampler = Sampler(SHARED / "t0")
    sampler.devices = DeviceSampler(RecordedNvml(data["readings"][0]))
    sampler.sample([rank], 100.0)
    sampler.root = SHARED / "t1"
    sampler.devices.gpus = RecordedNvml(data["readings"][1])
    sampler.sample([rank], 102.0)
    ev = sampler.evidence(rank, 99.0, 200.0)
    assert ev is not None and ev.device is not None and ev.device.nic is None  # no NIC in a /proc tree
    assert ev.device.gpu is not None and ev.device.gpu.reasons == 0x20 and ev.device.gpu.temperature_c == 92
    back = from_jsonable(Evidence, loads(json.dumps(to_jsonable(ev))))
    assert back == ev
    assert from_jsonable(Evidence, {"rank": 1, "span_s": 1.0, "cpus": "0"}).device is None  # an older node's
