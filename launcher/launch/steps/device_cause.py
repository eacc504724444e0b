"""Why a GPU node's rank is slow, from its GPU's and NIC's figures (:mod:`~numarun.launch.steps.device`) against
the other ranks' (pure). :func:`~numarun.launch.steps.cause.explain` calls it and decides, by the time each
finding costs, whether it is the cause (see its docstring for where these come among the CPU causes).

Two kinds of findings:

* **slowdowns**, measured: each says how much time a step it costs (:attr:`DeviceFinding.seconds`):

  - *clocks*: its GPU's SM clock below :data:`SLOW_GPU` of the other GPUs' (of its model), held down by a reason
    NVML names (power cap, thermal slowdown, hardware slowdown or power brake, application clocks, sync boost; a
    GPU that only idles waits for its CPU, not the other way round; the power cap alone counts only where its limit
    is set below the others': at the same limit a GPU that works more than they do draws more and is capped
    sooner): costs its own time × (1 - its clock / theirs);
  - *PCIe*: its GPU's link trained below its maximum and below :data:`SLOW_LINK` of the other GPUs': costs its
    host<->GPU traffic a step × (1 / its bandwidth - 1 / theirs);
  - *NIC speed*: its NIC's link below :data:`SLOW_LINK` of the other NICs': costs its traffic a step × (1 / its
    rate - 1 / theirs).

* **faults** during the job, which have no time of their own: NVLink links down, ECC errors, retired pages or
  remapped rows, a NIC down, its link's errors, ``port_xmit_wait`` (congestion), Ethernet drops and errors. A
  counter is a fault only where it moved, per second of the job, more than :data:`FAULTS` times the other devices'
  median (a fabric congested everywhere is no one rank's); a NIC's only where there are other NICs to compare it
  with (a one-node job's ranks share theirs, and its loopback traffic is none of the NIC's) and where it carried
  traffic. A PCIe link with fewer lanes than its maximum whose traffic NVML did not give is one too (a GPU drops
  its link's generation whenever it idles: a lower generation alone may be nothing).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...topology.nic_health import DROPS, LINK_ERRORS
from ...topology.nvml_health import (
    REASON_APP_CLOCKS,
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_POWER_CAP,
    REASON_SW_THERMAL,
    REASON_SYNC_BOOST,
    SLOWDOWN,
)
from .device import DeviceEvidence, GpuFigures, NicFigures

SLOW_GPU = 0.9
"""A GPU at less than this share of the other GPUs' clock is slower."""
SLOW_LINK = 0.9
"""A PCIe link or a NIC at less than this share of the others' bandwidth is slower."""
FAULTS = 2.0
"""A fault counter is the rank's own when it moved more than this many times the others' median, per second."""


@dataclass(frozen=True)
class DeviceFinding:
    """One thing wrong with a rank's GPU or NIC, in the report's words, and its fix where one is clear."""

    why: str
    fix: str = ""
    seconds: float | None = None
    """What it costs a step, where measured; None for a fault."""


def _median(values: Iterable[float]) -> float:
    got = list(values)
    return float(statistics.median(got)) if got else 0.0


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _gpus(mine: DeviceEvidence, others: Sequence[DeviceEvidence]) -> list[GpuFigures]:
    """The other ranks' GPUs, each once (ranks may share one), of the same model as the rank's where it is known."""
    own = mine.gpu
    seen: dict[tuple[str, int], GpuFigures] = {}
    for o in others:
        g = o.gpu
        if g is None or (own is not None and (o.host, g.index) == (mine.host, own.index)):
            continue
        if own is not None and own.max_mhz and g.max_mhz and own.max_mhz != g.max_mhz:
            continue  # another model: its clocks say nothing of this one's
        seen.setdefault((o.host, g.index), g)
    return list(seen.values())


def _nics(mine: DeviceEvidence, others: Sequence[DeviceEvidence]) -> list[NicFigures]:
    own = mine.nic
    seen: dict[tuple[str, str], NicFigures] = {}
    for o in others:
        n = o.nic
        if n is not None and not (own is not None and (o.host, n.name) == (mine.host, own.name)):
            seen.setdefault((o.host, n.name), n)
    return list(seen.values())


def slowdowns(
    mine: DeviceEvidence, others: Sequence[DeviceEvidence], *, own: float, step: float
) -> list[DeviceFinding]:
    """The rank's measured slowdowns (see the module docstring), the costliest first. ``own``: its own time a
    step; ``step``: the job's step."""
    found = [f for f in (_clocks(mine, others, own), _pcie(mine, others, step), _nic_speed(mine, others, step)) if f]
    return sorted(found, key=lambda f: -(f.seconds or 0.0))


def _clocks(mine: DeviceEvidence, others: Sequence[DeviceEvidence], own: float) -> DeviceFinding | None:
    g = mine.gpu
    if g is None or g.mhz is None:
        return None
    theirs = _gpus(mine, others)
    ref = _median(o.mhz for o in theirs if o.mhz is not None) or _median(mine.peer_mhz)
    if not ref or g.mhz >= SLOW_GPU * ref:
        return None
    held = (g.reasons or 0) & SLOWDOWN
    if g.reasons is not None and not held:
        return None  # idle, nothing else: the GPU waits for work, its time is lost elsewhere
    if held == REASON_POWER_CAP and not _lower_limit(g, theirs):
        return None  # capped at the others' limit: it works more than they do, or draws more for it; no fault
    why = f"GPU {g.index} runs at {g.mhz:,.0f} MHz against the other GPUs' {ref:,.0f} MHz: "
    if not held:
        return DeviceFinding(why + "its clock event reasons were not answered", "", own * (1 - g.mhz / ref))
    words, fix = _reasons(g, theirs, held)
    return DeviceFinding(why + "; ".join(words), fix, own * (1 - g.mhz / ref))


def _lower_limit(g: GpuFigures, theirs: Sequence[GpuFigures]) -> bool:
    """Whether its power limit is set below the other GPUs' (else, none known, below its default)."""
    limits = [o.power_limit_w for o in theirs if o.power_limit_w is not None]
    usual = _median(limits) if limits else g.power_default_w
    return g.power_limit_w is not None and usual is not None and usual - g.power_limit_w >= 1


def _reasons(g: GpuFigures, theirs: Sequence[GpuFigures], held: int) -> tuple[list[str], str]:
    """The reasons in words, most serious first, and the fix of the most serious."""
    words: list[str] = []
    fixes: list[str] = []
    temp = f" at {g.temperature_c:.0f} °C" if g.temperature_c is not None else ""
    their_temp = _median(o.temperature_c for o in theirs if o.temperature_c is not None)
    if their_temp and temp:
        temp += f" (the other GPUs' {their_temp:.0f} °C)"
    if held & REASON_HW_SLOWDOWN:
        words.append("hardware slowdown (HW_SLOWDOWN: over temperature, or the node's power brake)")
    if held & REASON_HW_POWER_BRAKE:
        words.append("hardware power brake (asserted by the node's power supply)")
    if held & (REASON_HW_SLOWDOWN | REASON_HW_POWER_BRAKE):
        fixes.append("check the node's power supplies and cooling; drain it for service if it stays")
    if held & (REASON_SW_THERMAL | REASON_HW_THERMAL):
        kind = "thermal slowdown" if held & REASON_SW_THERMAL else "thermal slowdown (hardware)"
        limit = f", its slowdown threshold {g.slowdown_c:.0f} °C" if g.slowdown_c is not None else ""
        words.append(f"{kind}{temp}{limit}")
        fixes.append("check the node's cooling: fans, airflow, inlet temperature (nvidia-smi -q -d TEMPERATURE)")
    if held & REASON_POWER_CAP:
        their_limit = _median(o.power_limit_w for o in theirs if o.power_limit_w is not None)
        cap = f"power cap {g.power_limit_w:,.0f} W" if g.power_limit_w is not None else "power cap"
        if g.power_limit_w is not None and their_limit and abs(their_limit - g.power_limit_w) >= 1:
            cap += f" (the other GPUs' {their_limit:,.0f} W)"
        words.append(cap)
        target = max(their_limit, g.power_default_w or 0.0)
        if g.power_limit_w is not None and target - g.power_limit_w >= 1:
            fixes.append(f"raise its power limit to {target:,.0f} W (nvidia-smi -i {g.index} -pl {target:.0f})")
        else:
            fixes.append("check the node's power limit and power delivery (nvidia-smi -q -d POWER)")
    if held & REASON_APP_CLOCKS:
        words.append("application clocks set below its maximum")
        fixes.append(f"reset its application clocks (nvidia-smi -i {g.index} -rac)")
    if held & REASON_SYNC_BOOST:
        words.append("sync boost (held to the slowest GPU of its group)")
        fixes.append("")
    return words, fixes[0] if fixes else ""


def _pcie_ref(g: GpuFigures, theirs: Sequence[GpuFigures]) -> float:
    """The bandwidth its link should have: the other GPUs' (of its model), at most its own maximum."""
    others = [o.link.gbs for o in theirs if o.link.known]
    best = g.link.max_gbs
    return min(_median(others), best) if others else best


def _pcie_text(g: GpuFigures) -> str:
    return f"GPU {g.index}'s PCIe link runs at {g.link.text()} against {g.link.text(best=True)}"


def _pcie_fix(g: GpuFigures) -> str:
    return (
        f"reseat GPU {g.index} or check its slot and riser: its link trained below its maximum (nvidia-smi -q -d PCIE)"
    )


def _pcie(mine: DeviceEvidence, others: Sequence[DeviceEvidence], step: float) -> DeviceFinding | None:
    g = mine.gpu
    if g is None or not g.link.below_max or g.pcie_mbs is None:
        return None
    have, want = g.link.gbs, _pcie_ref(g, _gpus(mine, others))
    if not have or have >= SLOW_LINK * want:
        return None
    moved = g.pcie_mbs * 1e6 * step  # bytes a step, the busier direction
    cost = moved / (have * 1e9) - moved / (want * 1e9)
    return DeviceFinding(
        f"{_pcie_text(g)} ({have:.0f} against {want:.0f} GB/s), moving {g.pcie_mbs / 1e3:.1f} GB/s",
        _pcie_fix(g),
        cost,
    )


def _nic_fix(n: NicFigures) -> str:
    tool = f"ibstat {n.name}" if n.rdma else f"ethtool {n.name}"
    return f"check {n.name}'s link: its cable, transceiver and switch port ({tool})"


def _nic_speed(mine: DeviceEvidence, others: Sequence[DeviceEvidence], step: float) -> DeviceFinding | None:
    n = mine.nic
    if n is None or not n.rate_gbps or n.bytes_per_s is None:
        return None
    ref = _median([o.rate_gbps for o in _nics(mine, others) if o.rate_gbps > 0] + list(mine.peer_nic_gbps))
    if not ref or n.rate_gbps >= SLOW_LINK * ref:
        return None
    moved = n.bytes_per_s * step
    cost = moved * 8 / (n.rate_gbps * 1e9) - moved * 8 / (ref * 1e9)
    return DeviceFinding(
        f"its NIC {n.name} runs at {n.rate_gbps:g} Gb/s against the others' {ref:g} Gb/s, moving "
        f"{n.bytes_per_s / 1e9:.1f} GB/s",
        _nic_fix(n),
        cost,
    )


def _rate(count: int, since: float) -> float:
    return count / since if since > 0 else 0.0


def _own(count: int, since: float, theirs: Iterable[tuple[int, float]]) -> bool:
    """Whether a counter that moved ``count`` in ``since`` seconds moved more than :data:`FAULTS` × the others'."""
    return count > 0 and _rate(count, since) > FAULTS * _median(_rate(c, s) for c, s in theirs)


def faults(mine: DeviceEvidence, others: Sequence[DeviceEvidence]) -> list[DeviceFinding]:
    """The faults of the rank's GPU and NIC during the job (see the module docstring), the GPU's first."""
    out: list[DeviceFinding] = []
    g = mine.gpu
    if g is not None:
        theirs = _gpus(mine, others)
        out += [f for f in (_nvlink(g, theirs), _memory(g, theirs)) if f]
        # without its traffic, only lanes lost count: a GPU drops its link's generation whenever it idles (power
        # saving), so a lower generation alone may be nothing
        link = g.link
        if link.known and link.width < link.max_width and g.pcie_mbs is None:
            if link.gbs < SLOW_LINK * _pcie_ref(g, theirs):
                out.append(DeviceFinding(_pcie_text(g), _pcie_fix(g)))
    n = mine.nic
    if n is not None:
        out += _nic_faults(n, _nics(mine, others))
    return out


def _nvlink(g: GpuFigures, theirs: Sequence[GpuFigures]) -> DeviceFinding | None:
    with_links = [o for o in theirs if o.nvlinks]
    usual = {k for k in range(g.nvlinks) if sum(k in o.nvlink_up for o in with_links) * 2 > len(with_links)}
    down = sorted(set(g.nvlink_lost) | (usual - set(g.nvlink_up)))
    if not down:
        return None
    named = ", ".join(str(k) for k in down)
    why = (
        f"NVLink link {named} of GPU {g.index} is down"
        if len(down) == 1
        else f"NVLink links {named} of GPU {g.index} are down"
    )
    return DeviceFinding(
        why, f"drain the node: GPU {g.index}'s NVLink needs service (nvidia-smi nvlink -s -i {g.index})"
    )


def _memory(g: GpuFigures, theirs: Sequence[GpuFigures]) -> DeviceFinding | None:
    parts = []
    if _own(g.retired_pages, g.since_s, ((o.retired_pages, o.since_s) for o in theirs)):
        parts.append(f"retired {_count(g.retired_pages, 'page')}")
    if _own(g.remapped_rows, g.since_s, ((o.remapped_rows, o.since_s) for o in theirs)):
        parts.append(f"remapped {_count(g.remapped_rows, 'row')}")
    if _own(g.ecc_errors, g.since_s, ((o.ecc_errors, o.since_s) for o in theirs)):
        uncorrected = f" ({g.ecc_uncorrected:,} uncorrected)" if g.ecc_uncorrected else ""
        parts.append(f"had {_count(g.ecc_errors, 'ECC error')}{uncorrected}")
    if not parts:
        return None
    return DeviceFinding(
        f"GPU {g.index} {' and '.join(parts)} during the job",
        f"drain the node and reset GPU {g.index} (nvidia-smi -r -i {g.index}); replace it if the errors return",
    )


def _nic_faults(n: NicFigures, theirs: Sequence[NicFigures]) -> list[DeviceFinding]:
    if not theirs:
        return []  # no other NIC to tell its own counters from the host's usual (one node's ranks share theirs)
    if n.up is False and any(o.up for o in theirs):
        return [DeviceFinding(f"its NIC {n.name} is down", _nic_fix(n))]
    if n.bytes_per_s == 0:
        return []  # it carried none of the job's traffic

    def own(key: str) -> bool:
        return _own(n.moved.get(key, 0), n.since_s, ((o.moved.get(key, 0), o.since_s) for o in theirs))

    def rose(keys: Iterable[str]) -> str:
        """The counters of ``keys`` that are its own (:func:`_own`), with how far each rose: '' when none is."""
        return ", ".join(f"{k} +{n.moved[k]:,}" for k in keys if own(k))

    out = []
    if errors := rose(LINK_ERRORS):
        out.append(
            DeviceFinding(
                f"the link of its NIC {n.name} fails: {errors} during the job",
                f"check {n.name}'s cable and transceiver and the switch port (its link's physical layer)",
            )
        )
    if own("port_xmit_wait"):
        theirs_wait = _median(_rate(o.moved.get("port_xmit_wait", 0), o.since_s) for o in theirs)
        than = (
            f"{_rate(n.moved['port_xmit_wait'], n.since_s) / theirs_wait:.0f} times the other NICs'"
            if theirs_wait
            else "the other NICs' did not rise"
        )
        out.append(
            DeviceFinding(
                f"port_xmit_wait of {n.name} rose by {n.moved['port_xmit_wait']:,} during the job (congestion: {than})",
                "congestion on its path: check the fabric's routing and the switch ports on its way (other jobs' "
                "traffic)",
            )
        )
    if drops := rose(DROPS):
        out.append(
            DeviceFinding(
                f"its NIC {n.name} dropped or garbled packets during the job: {drops}",
                f"check {n.name}: its ring buffers (ethtool -g {n.name}) and its link (ethtool -S {n.name})",
            )
        )
    return out


def device_figures(mine: DeviceEvidence) -> list[str]:
    """The rank's GPU and NIC in a few words, for *cause not found*."""
    out = []
    g = mine.gpu
    if g is not None and g.mhz is not None:
        out.append(
            f"GPU {g.index} at {g.mhz:,.0f} MHz"
            + (f" (the other GPUs' {_median(mine.peer_mhz):,.0f} MHz)" if mine.peer_mhz else "")
        )
    n = mine.nic
    if n is not None and n.rate_gbps:
        out.append(f"NIC {n.name} at {n.rate_gbps:g} Gb/s")
    return out
