"""What a GPU node's devices say about each rank while it runs: its GPU (NVML) and its NIC (sysfs), sampled on the
step report's ticks beside the kernel's figures (:class:`~numarun.launch.steps.evidence.Sampler` calls
:meth:`DeviceSampler.sample` and :meth:`DeviceSampler.evidence`).

Read on every tick, for the ranks' own GPUs and NICs only, each once however many ranks share it:

* its GPU's SM clock, clock event reasons, temperature, power draw and limit, PCIe link and traffic, ECC error
  counts, retired pages, remapped rows and NVLink states (:mod:`numarun.topology.nvml_health`): NVML, never CUDA,
  so the agent never creates a CUDA context; NVML is initialised once, at the first tick with a GPU rank;
* its NIC's speed, state and counters (:mod:`numarun.topology.nic_health`).

A device's first reading is the job's baseline: its counters are cumulative, and what counts is how far they
moved while the job ran. Clocks, power and traffic are averaged over the readings of the span judged.
"""

from __future__ import annotations

import functools
import operator
import socket
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ...plan.model import RankBinding
from ...topology.nic_health import DROPS, LINK_ERRORS, NicReading, read_nic
from ...topology.nvml_health import GpuHealth, GpuSource, NvmlSession, PcieGen, gpu_health

HISTORY = 240
"""Readings kept per device, as the kernel's figures keep samples per rank (evidence.HISTORY)."""
NIC_FAULTS = (*LINK_ERRORS, "port_xmit_wait", *DROPS)
"""The NIC counters whose moving during the job is kept (its data counters give its traffic instead)."""


@dataclass(frozen=True)
class RankDevice:
    """The GPU and NIC the plan gave a rank."""

    gpu: int = -1
    """NVML index; -1 none."""
    gpu_bus: str = ""
    nic: str = ""
    """An RDMA device (``mlx5_0``) or an interface (``eth0``); "" none."""
    nic_port: int = 0
    """Its RDMA port; 0 the first (or an interface)."""


def rank_device(binding: RankBinding | None) -> RankDevice | None:
    """The devices of a rank's plan row; None when the plan gave it neither a GPU nor a NIC."""
    if binding is None or (binding.gpu is None and not binding.nic):
        return None
    gpu = binding.gpu
    return RankDevice(gpu.index if gpu else -1, gpu.pci_bus_id if gpu else "", binding.nic or "", binding.nic_port)


@dataclass(frozen=True)
class GpuFigures:
    """A rank's GPU over a span of its steps, and what moved since the job's start (JSON through the store)."""

    index: int
    since_s: float = 0.0
    """Seconds from the job's start (its first reading) to the span's end: the counters below moved in them."""
    mhz: float | None = None
    """Its SM clock, the mean of the span's readings."""
    max_mhz: float | None = None
    reasons: int | None = None
    """Clock event reasons seen in the span's readings (nvml_health.REASON_WORDS); None unanswered."""
    temperature_c: float | None = None
    """The highest of the span."""
    slowdown_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None
    pcie: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Its PCIe link: generation and lanes (the best of the span: an idle link drops its generation), most
    generation and lanes; 0 unknown."""
    pcie_mbs: float | None = None
    """Host<->GPU traffic, the busier direction, MB/s (the mean of the span's readings)."""
    ecc_errors: int = 0
    ecc_uncorrected: int = 0
    retired_pages: int = 0
    remapped_rows: int = 0
    nvlinks: int = 0
    """Links NVML answered for; 0 no NVLink."""
    nvlink_up: tuple[int, ...] = ()
    """Its active links at the span's end."""
    nvlink_lost: tuple[int, ...] = ()
    """Links active at the job's start and not at the span's end."""

    @property
    def link(self) -> PcieGen:
        return PcieGen(*self.pcie)


@dataclass(frozen=True)
class NicFigures:
    """A rank's NIC over a span of its steps, and what moved since the job's start."""

    name: str
    port: int = 0
    rdma: bool = False
    since_s: float = 0.0
    up: bool | None = None
    rate_gbps: float = 0.0
    bytes_per_s: float | None = None
    """Its traffic over the span, the busier direction; None where sysfs does not count it."""
    moved: dict[str, int] = field(default_factory=dict)
    """:data:`NIC_FAULTS` counters that rose since the job's start, and by how much."""


@dataclass(frozen=True)
class DeviceEvidence:
    """A rank's GPU and NIC over a span of its steps, and its node's other ranks' for comparison."""

    host: str
    gpu: GpuFigures | None = None
    nic: NicFigures | None = None
    peer_mhz: tuple[float, ...] = ()
    """The SM clocks of the other GPUs of this node's ranks over the same span."""
    peer_nic_gbps: tuple[float, ...] = ()
    """The speeds of the other NICs of this node's ranks."""


def _mean(values: Iterable[float | None]) -> float | None:
    """The mean of the known values, to 0.1; None when none is."""
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 1) if known else None


def _moved(first: int | None, last: int | None) -> int:
    """How far a counter rose; 0 unknown or reset (a driver reload, a cleared counter)."""
    return max(0, last - first) if first is not None and last is not None else 0


class DeviceSampler:
    """Readings of the ranks' GPUs and NICs (:meth:`sample`, every report tick) and each rank's
    :class:`DeviceEvidence` over a span (:meth:`evidence`). ``gpus``: where GPU answers come from; None with
    ``live``: the driver, opened at the first tick that has a GPU rank (never without one)."""

    def __init__(self, gpus: GpuSource | None = None, *, live: bool = False) -> None:
        self.gpus = gpus
        self.live = live and gpus is None
        self.host = socket.gethostname()
        self.gpu_history: dict[tuple[int, str], deque[tuple[float, GpuHealth]]] = {}
        self.nic_history: dict[tuple[str, int], deque[tuple[float, NicReading]]] = {}
        self._gpu_start: dict[tuple[int, str], tuple[float, GpuHealth]] = {}
        self._nic_start: dict[tuple[str, int], tuple[float, NicReading]] = {}
        self._devices: tuple[RankDevice, ...] = ()

    def sample(self, root: Path, devices: Iterable[RankDevice | None], t: float) -> None:
        """One reading of each GPU and NIC of ``devices`` at time ``t`` (monotonic seconds); NICs below ``root``."""
        self._devices = tuple(dict.fromkeys(d for d in devices if d is not None))
        gpus = sorted({(d.gpu, d.gpu_bus) for d in self._devices if d.gpu >= 0})
        if gpus and self.gpus is None and self.live:
            self.live = False  # one try: a node without a driver is not asked every tick
            self.gpus = NvmlSession.open()
        source = self.gpus
        for key in gpus if source is not None else ():
            raw = source.read(*key) if source is not None else None
            if raw is not None:
                health = gpu_health(raw)
                self._gpu_start.setdefault(key, (t, health))
                self.gpu_history.setdefault(key, deque(maxlen=HISTORY)).append((t, health))
        for nic in sorted({(d.nic, d.nic_port) for d in self._devices if d.nic}):
            reading = read_nic(root, *nic)
            if reading is not None:
                self._nic_start.setdefault(nic, (t, reading))
                self.nic_history.setdefault(nic, deque(maxlen=HISTORY)).append((t, reading))

    def evidence(self, device: RankDevice | None, start: float, end: float) -> DeviceEvidence | None:
        """The rank's devices between the readings at ``start`` and ``end`` (the kernel sampler's bracket);
        None when neither was read."""
        if device is None:
            return None
        # a device never read (none given: -1, "") has no history, and no figures
        gpu = self._gpu((device.gpu, device.gpu_bus), start, end)
        nic = self._nic((device.nic, device.nic_port), start, end)
        if gpu is None and nic is None:
            return None
        clocks = [
            f.mhz
            for key in sorted({(d.gpu, d.gpu_bus) for d in self._devices} - {(device.gpu, device.gpu_bus)})
            if (f := self._gpu(key, start, end)) and f.mhz is not None
        ]
        rates = [
            n.rate_gbps
            for key in sorted({(d.nic, d.nic_port) for d in self._devices} - {(device.nic, device.nic_port)})
            if (n := self._nic(key, start, end)) and n.rate_gbps > 0
        ]
        return DeviceEvidence(self.host, gpu, nic, tuple(round(c, 1) for c in clocks), tuple(rates))

    def _gpu(self, key: tuple[int, str], start: float, end: float) -> GpuFigures | None:
        hist = self.gpu_history.get(key)
        if not hist:
            return None
        span = [h for t, h in hist if start <= t <= end] or [hist[-1][1]]
        t0, first = self._gpu_start[key]
        t1, last = next(((t, h) for t, h in reversed(hist) if t <= end), hist[-1])
        reasons = [h.reasons for h in span if h.reasons is not None]
        best = max(((h.pcie.gen, h.pcie.width) for h in span), default=(0, 0))
        temps = [h.temperature_c for h in span if h.temperature_c is not None]
        ecc = _moved(first.ecc_corrected, last.ecc_corrected)
        uncorrected = _moved(first.ecc_uncorrected, last.ecc_uncorrected)
        rows = (first.remapped_rows or (0, 0, 0, 0), last.remapped_rows or (0, 0, 0, 0))
        return GpuFigures(
            index=key[0],
            since_s=round(t1 - t0, 3),
            mhz=_mean(h.sm_mhz for h in span),
            max_mhz=last.max_sm_mhz,
            reasons=functools.reduce(operator.or_, reasons) if reasons else None,
            temperature_c=max(temps) if temps else None,
            slowdown_c=last.slowdown_c,
            power_w=_mean(h.power_w for h in span),
            power_limit_w=last.power_limit_w,
            power_default_w=last.power_default_w,
            pcie=(*best, last.pcie.max_gen, last.pcie.max_width),
            pcie_mbs=_mean(
                max(h.pcie_tx_kbs, h.pcie_rx_kbs) / 1000
                for h in span
                if h.pcie_tx_kbs is not None and h.pcie_rx_kbs is not None
            ),
            ecc_errors=ecc + uncorrected,
            ecc_uncorrected=uncorrected,
            retired_pages=_moved(first.retired_pages, last.retired_pages),
            remapped_rows=_moved(rows[0][0] + rows[0][1], rows[1][0] + rows[1][1]),
            nvlinks=len(last.nvlinks),
            nvlink_up=tuple(k for k, s in enumerate(last.nvlinks) if s),
            nvlink_lost=tuple(
                k for k, s in enumerate(first.nvlinks) if s and k < len(last.nvlinks) and last.nvlinks[k] is False
            ),
        )

    def _nic(self, key: tuple[str, int], start: float, end: float) -> NicFigures | None:
        hist = self.nic_history.get(key)
        if not hist:
            return None
        span = [(t, r) for t, r in hist if start <= t <= end] or [hist[-1]]
        (ta, a), (tb, b) = span[0], span[-1]
        t0, first = self._nic_start[key]
        sa, sb = a.sent_received(), b.sent_received()
        rate = (
            max(_moved(sa[0], sb[0]), _moved(sa[1], sb[1])) / (tb - ta)
            if sa is not None and sb is not None and tb > ta
            else None
        )
        moved = {k: d for k in NIC_FAULTS if (d := _moved(first.counters.get(k), b.counters.get(k)))}
        return NicFigures(
            name=b.name,
            port=b.port,
            rdma=b.rdma,
            since_s=round(tb - t0, 3),
            up=b.up,
            rate_gbps=b.rate_gbps,
            bytes_per_s=round(rate, 1) if rate is not None else None,
            moved=moved,
        )
