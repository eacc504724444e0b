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
    REASON_WORDS,
    SLOWDOWN,
    lanes_lost,
)
from .device import DeviceEvidence, GpuFigures, NicFigures
from .judge import median

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


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _peers(mine: DeviceEvidence, others: Sequence[DeviceEvidence]) -> tuple[list[GpuFigures], list[NicFigures]]:
    """The other ranks' GPUs and NICs, each once (ranks may share one: the first rank's figures), the rank's own
    left out; GPUs of the same model as the rank's where it is known (another model's clocks say nothing of this
    one's)."""
    model = mine.gpu.max_mhz if mine.gpu is not None else None
    gpus: dict[tuple[str, int | None], GpuFigures] = {}
    nics: dict[tuple[str, str | None], NicFigures] = {}
    for o in others:
        if o.gpu is not None and not (model and o.gpu.max_mhz and o.gpu.max_mhz != model):
            gpus.setdefault((o.host, o.gpu.index), o.gpu)
        if o.nic is not None:
            nics.setdefault((o.host, o.nic.name), o.nic)
    gpus.pop((mine.host, mine.gpu.index if mine.gpu is not None else None), None)
    nics.pop((mine.host, mine.nic.name if mine.nic is not None else None), None)
    return list(gpus.values()), list(nics.values())


def slowdowns(
    mine: DeviceEvidence, others: Sequence[DeviceEvidence], *, own: float, step: float
) -> list[DeviceFinding]:
    """The rank's measured slowdowns (see the module docstring), the costliest first. ``own``: its own time a
    step; ``step``: the job's step."""
    gpus, nics = _peers(mine, others)
    pcie = _pcie(mine.gpu, gpus, step) if mine.gpu is not None else None
    found = [f for f in (_clocks(mine, gpus, own), pcie, _nic_speed(mine, nics, step)) if f and f.seconds is not None]
    return sorted(found, key=lambda f: -(f.seconds or 0.0))


def _clocks(mine: DeviceEvidence, theirs: Sequence[GpuFigures], own: float) -> DeviceFinding | None:
    g = mine.gpu
    if g is None or g.mhz is None:
        return None
    ref = median([o.mhz for o in theirs if o.mhz is not None]) or median(mine.peer_mhz)
    if not ref or g.mhz >= SLOW_GPU * ref:
        return None
    held = (g.reasons or 0) & SLOWDOWN
    if g.reasons is not None and not held:
        return None  # idle, nothing else: the GPU waits for work, its time is lost elsewhere
    their_limit = median([o.power_limit_w for o in theirs if o.power_limit_w is not None])
    usual = their_limit or g.power_default_w  # the others' power limit (none known: its default)
    if held == REASON_POWER_CAP and not (
        g.power_limit_w is not None and usual is not None and usual - g.power_limit_w >= 1
    ):
        return None  # capped at the others' limit: it works more than they do, or draws more for it; no fault
    words, fix = _reasons(g, theirs, held, their_limit) if held else (["its clock event reasons were not answered"], "")
    why = f"GPU {g.index} runs at {g.mhz:,.0f} MHz against the other GPUs' {ref:,.0f} MHz: " + "; ".join(words)
    return DeviceFinding(why, fix, own * (1 - g.mhz / ref))


_POWER_FIX = "check the node's power supplies and cooling; drain it for service if it stays"
_COOLING_FIX = "check the node's cooling: fans, airflow, inlet temperature (nvidia-smi -q -d TEMPERATURE)"


def _reasons(g: GpuFigures, theirs: Sequence[GpuFigures], held: int, their_limit: float) -> tuple[list[str], str]:
    """The reasons in words (nvml_health's words and what the figures add), most serious first, and the fix of the
    most serious."""
    temp = f" at {g.temperature_c:.0f} °C" if g.temperature_c is not None else ""
    their_temp = median([o.temperature_c for o in theirs if o.temperature_c is not None])
    if their_temp and temp:
        temp += f" (the other GPUs' {their_temp:.0f} °C)"
    temp += f", its slowdown threshold {g.slowdown_c:.0f} °C" if g.slowdown_c is not None else ""
    cap = f" {g.power_limit_w:,.0f} W" if g.power_limit_w is not None else ""
    if g.power_limit_w is not None and their_limit and abs(their_limit - g.power_limit_w) >= 1:
        cap += f" (the other GPUs' {their_limit:,.0f} W)"
    target = max(their_limit, g.power_default_w or 0.0)
    cap_fix = (
        f"raise its power limit to {target:,.0f} W (nvidia-smi -i {g.index} -pl {target:.0f})"
        if g.power_limit_w is not None and target - g.power_limit_w >= 1
        else "check the node's power limit and power delivery (nvidia-smi -q -d POWER)"
    )
    said = {
        REASON_HW_SLOWDOWN: (" (HW_SLOWDOWN: over temperature, or the node's power brake)", _POWER_FIX),
        REASON_HW_POWER_BRAKE: (" (asserted by the node's power supply)", _POWER_FIX),
        REASON_HW_THERMAL: (temp, _COOLING_FIX),
        REASON_SW_THERMAL: (temp, _COOLING_FIX),
        REASON_POWER_CAP: (cap, cap_fix),
        REASON_APP_CLOCKS: (" below its maximum", f"reset its application clocks (nvidia-smi -i {g.index} -rac)"),
        REASON_SYNC_BOOST: (" (held to the slowest GPU of its group)", ""),
    }
    if held & REASON_SW_THERMAL:
        held &= ~REASON_HW_THERMAL  # one thermal slowdown, in the software's words
    found = [(word + said[bit][0], said[bit][1]) for bit, word in REASON_WORDS.items() if held & bit]
    return [word for word, _ in found], found[0][1]


def _pcie(g: GpuFigures, theirs: Sequence[GpuFigures], step: float) -> DeviceFinding | None:
    """Its PCIe link below its maximum and below :data:`SLOW_LINK` of the other GPUs' (of its model; at most its
    own maximum): a slowdown measured by its traffic; without its traffic, a fault only where it lost lanes (a GPU
    drops its link's generation whenever it idles, so a lower generation alone may be nothing)."""
    link = g.link
    if not link.below_max:
        return None
    others = [o.link.gbs for o in theirs if o.link.known]
    have, want = link.gbs, min(median(others), link.max_gbs) if others else link.max_gbs
    why = f"GPU {g.index}'s PCIe link runs at {link.text()} against {link.text(best=True)}"
    fix = (
        f"reseat GPU {g.index} or check its slot and riser: its link trained below its maximum (nvidia-smi -q -d PCIE)"
    )
    if g.pcie_mbs is None:
        return DeviceFinding(why, fix) if lanes_lost(link.width, link.max_width) and have < SLOW_LINK * want else None
    if not have or have >= SLOW_LINK * want:
        return None
    moved = g.pcie_mbs * 1e6 * step  # bytes a step, the busier direction
    cost = moved / (have * 1e9) - moved / (want * 1e9)
    return DeviceFinding(f"{why} ({have:.0f} against {want:.0f} GB/s), moving {g.pcie_mbs / 1e3:.1f} GB/s", fix, cost)


def _nic_fix(n: NicFigures) -> str:
    tool = f"ibstat {n.name}" if n.rdma else f"ethtool {n.name}"
    return f"check {n.name}'s link: its cable, transceiver and switch port ({tool})"


def _nic_speed(mine: DeviceEvidence, theirs: Sequence[NicFigures], step: float) -> DeviceFinding | None:
    n = mine.nic
    if n is None or not n.rate_gbps or n.bytes_per_s is None:
        return None
    ref = median([o.rate_gbps for o in theirs if o.rate_gbps > 0] + list(mine.peer_nic_gbps))
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
    return count > 0 and _rate(count, since) > FAULTS * median([_rate(c, s) for c, s in theirs])


def faults(mine: DeviceEvidence, others: Sequence[DeviceEvidence]) -> list[DeviceFinding]:
    """The faults of the rank's GPU and NIC during the job (see the module docstring), the GPU's first."""
    gpus, nics = _peers(mine, others)
    g = mine.gpu
    found = [_nvlink(g, gpus), _memory(g, gpus), _pcie(g, gpus, 0.0)] if g is not None else []
    out = [f for f in found if f is not None and f.seconds is None]  # a PCIe link measured is a slowdown
    return out + (_nic_faults(mine.nic, nics) if mine.nic is not None else [])


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
    uncorrected = f" ({g.ecc_uncorrected:,} uncorrected)" if g.ecc_uncorrected else ""
    parts = [
        text
        for key, text in (
            ("retired_pages", f"retired {_count(g.retired_pages, 'page')}"),
            ("remapped_rows", f"remapped {_count(g.remapped_rows, 'row')}"),
            ("ecc_errors", f"had {_count(g.ecc_errors, 'ECC error')}{uncorrected}"),
        )
        if _own(getattr(g, key), g.since_s, ((getattr(o, key), o.since_s) for o in theirs))
    ]
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

    wait = n.moved.get("port_xmit_wait", 0)
    theirs_wait = median([_rate(o.moved.get("port_xmit_wait", 0), o.since_s) for o in theirs])
    than = (
        f"{_rate(wait, n.since_s) / theirs_wait:.0f} times the other NICs'"
        if theirs_wait
        else "the other NICs' did not rise"
    )
    errors, drops = rose(LINK_ERRORS), rose(DROPS)
    found = (
        (
            errors,
            f"the link of its NIC {n.name} fails: {errors} during the job",
            f"check {n.name}'s cable and transceiver and the switch port (its link's physical layer)",
        ),
        (
            own("port_xmit_wait"),
            f"port_xmit_wait of {n.name} rose by {wait:,} during the job (congestion: {than})",
            "congestion on its path: check the fabric's routing and the switch ports on its way (other jobs' traffic)",
        ),
        (
            drops,
            f"its NIC {n.name} dropped or garbled packets during the job: {drops}",
            f"check {n.name}: its ring buffers (ethtool -g {n.name}) and its link (ethtool -S {n.name})",
        ),
    )
    return [DeviceFinding(why, fix) for hit, why, fix in found if hit]


def device_figures(mine: DeviceEvidence) -> list[str]:
    """The rank's GPU and NIC in a few words, for *cause not found*."""
    out = []
    g = mine.gpu
    if g is not None and g.mhz is not None:
        out.append(
            f"GPU {g.index} at {g.mhz:,.0f} MHz"
            + (f" (the other GPUs' {median(mine.peer_mhz):,.0f} MHz)" if mine.peer_mhz else "")
        )
    n = mine.nic
    if n is not None and n.rate_gbps:
        out.append(f"NIC {n.name} at {n.rate_gbps:g} Gb/s")
    return out
