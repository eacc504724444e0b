"""GPU health through NVML, without CUDA: what holds a GPU's clocks down, how its PCIe link trained, its memory
errors and its NVLinks (docs/design-notes.md, "NVML health (`topology/nvml_health.py`)").

Record, then parse, as :mod:`numarun.topology.nvml`: :func:`health_answers` is the only code here that asks the
driver, and turns one GPU's answers into a plain dict (a refused call becomes ``"ERR <message>"``);
:func:`gpu_health` turns such a dict into a :class:`GpuHealth`, pure. The doctor reads the record of every GPU
once (:func:`read_health_record`); the step report asks again and again for the ranks' GPUs only, through one
:class:`NvmlSession` (NVML initialised once, the figures that cannot change while a job runs read once).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import TopologyError
from .model import normalize_bus_id
from .nvml import _call, nvml_close, nvml_open, read_nvml_record

log = logging.getLogger(__name__)

# nvmlClocksEventReasons bits (nvml.h, "Clocks Event Reasons"; the same bits as the older ClocksThrottleReasons)
REASON_APP_CLOCKS = 0x2
REASON_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SYNC_BOOST = 0x10
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80

REASON_WORDS: dict[int, str] = {
    REASON_HW_SLOWDOWN: "hardware slowdown",
    REASON_HW_POWER_BRAKE: "hardware power brake",
    REASON_HW_THERMAL: "thermal slowdown (hardware)",
    REASON_SW_THERMAL: "thermal slowdown",
    REASON_POWER_CAP: "power cap",
    REASON_APP_CLOCKS: "application clocks set",
    REASON_SYNC_BOOST: "sync boost",
}
"""The reasons that hold a busy GPU's clocks down, most serious first. Idle is no slowdown (the GPU waits for
work) and the display clock setting does not apply to a compute GPU."""
SLOWDOWN = sum(REASON_WORDS)

# PCIe bandwidth of one lane and one direction by generation, GB/s: the transfer rate less the line code
# (8b/10b to gen 2, 128b/130b from gen 3; gen 6's FLIT mode counted at its raw rate), PCI-SIG's figures.
LANE_GBS: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}

FIXED_KEYS = (
    "max_clock_sm",
    "max_clock_graphics",
    "pcie_link_max",
    "power_default_limit",
    "temperature_slowdown",
    "persistence_mode",
)
"""Answers that do not change while a job runs: :class:`NvmlSession` reads them once per GPU."""


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _ints(v: Any, n: int) -> tuple[int, ...] | None:
    if not isinstance(v, list) or len(v) < n or any(_int(x) is None for x in v[:n]):
        return None
    return tuple(v[:n])


def _watts(mw: Any) -> float | None:
    v = _int(mw)
    return v / 1000 if v is not None and v > 0 else None


def lanes_lost(width: int, max_width: int) -> bool:
    """Whether a PCIe link trained with fewer lanes than its card and slot allow: a hardware fault (the card's seat,
    its slot or riser). A lower speed alone is also how a GPU saves power while it idles."""
    return 0 < width < max_width


@dataclass(frozen=True)
class PcieGen:
    """A GPU's PCIe link as NVML counts it (generation and lanes, current against the most the GPU and its slot
    allow); 0: unknown."""

    gen: int = 0
    width: int = 0
    max_gen: int = 0
    max_width: int = 0

    @property
    def known(self) -> bool:
        return bool(self.gen and self.width and self.max_gen and self.max_width)

    @property
    def below_max(self) -> bool:
        return self.known and (self.gen < self.max_gen or self.width < self.max_width)

    @property
    def gbs(self) -> float:
        """One direction's bandwidth now, GB/s; 0 unknown."""
        return LANE_GBS.get(self.gen, 0.0) * self.width

    @property
    def max_gbs(self) -> float:
        return LANE_GBS.get(self.max_gen, 0.0) * self.max_width

    def text(self, *, best: bool = False) -> str:
        """``x8 gen3`` (``best``: the most it could train at)."""
        return f"x{self.max_width} gen{self.max_gen}" if best else f"x{self.width} gen{self.gen}"


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health figures at one moment; None (or empty) where NVML did not answer."""

    index: int
    pci_bus_id: str = ""
    sm_mhz: int | None = None
    graphics_mhz: int | None = None
    max_sm_mhz: int | None = None
    max_graphics_mhz: int | None = None
    reasons: int | None = None
    """nvmlClocksEventReasons bits (:data:`REASON_WORDS`)."""
    temperature_c: int | None = None
    slowdown_c: int | None = None
    """The temperature at which the GPU starts slowing itself down."""
    power_w: float | None = None
    power_limit_w: float | None = None
    """The enforced power limit: what the power cap holds it to."""
    power_default_w: float | None = None
    pcie: PcieGen = PcieGen()
    pcie_tx_kbs: int | None = None
    pcie_rx_kbs: int | None = None
    """Host<->GPU traffic over NVML's last 20 ms, KB/s."""
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    """Since the driver loaded (volatile)."""
    ecc_uncorrected_aggregate: int | None = None
    """Over the GPU's life."""
    retired_pages: int | None = None
    """Pages retired for single-bit and double-bit errors (before Ampere; later GPUs remap rows)."""
    retired_pending: int | None = None
    remapped_rows: tuple[int, int, int, int] | None = None
    """(correctable, uncorrectable, pending, failure), as ``nvmlDeviceGetRemappedRows`` answers."""
    nvlinks: tuple[bool | None, ...] = ()
    """Each NVLink's state (True active); () without NVLink."""
    persistence: int | None = None

    @property
    def slowdowns(self) -> tuple[str, ...]:
        """The reasons holding its clocks down, in words, most serious first."""
        return reason_words(self.reasons or 0)


def reason_words(bits: int) -> tuple[str, ...]:
    return tuple(word for bit, word in REASON_WORDS.items() if bits & bit)


def gpu_health(raw: Mapping[str, Any], pos: int = 0) -> GpuHealth:
    """Pure: one GPU's recorded answers (:func:`health_answers`' keys beside :mod:`~numarun.topology.nvml`'s) ->
    :class:`GpuHealth`; missing or ``"ERR ..."`` answers are None."""
    index = _int(raw.get("index"))
    bus = ""
    with contextlib.suppress(TopologyError):
        bus = normalize_bus_id(str(raw.get("pci_bus_id") or ""))
    link = _ints(raw.get("pcie_link"), 2) or (0, 0)
    best = _ints(raw.get("pcie_link_max"), 2) or (0, 0)
    pages = _ints(raw.get("retired_pages"), 2)
    rows = _ints(raw.get("remapped_rows"), 4)
    through = _ints(raw.get("pcie_throughput_kbs"), 2)
    links = raw.get("nvlink_state")
    return GpuHealth(
        index=index if index is not None else pos,
        pci_bus_id=bus,
        sm_mhz=_int(raw.get("clock_sm")),
        graphics_mhz=_int(raw.get("clock_graphics")),
        max_sm_mhz=_int(raw.get("max_clock_sm")),
        max_graphics_mhz=_int(raw.get("max_clock_graphics")),
        reasons=_int(raw.get("throttle_reasons")),
        temperature_c=_int(raw.get("temperature")),
        slowdown_c=_int(raw.get("temperature_slowdown")),
        power_w=_watts(raw.get("power_usage")),
        power_limit_w=_watts(raw.get("power_limit")),
        power_default_w=_watts(raw.get("power_default_limit")),
        pcie=PcieGen(*link, *best),
        pcie_tx_kbs=through[0] if through else None,
        pcie_rx_kbs=through[1] if through else None,
        ecc_corrected=_int(raw.get("ecc_corrected_volatile")),
        ecc_uncorrected=_int(raw.get("ecc_uncorrected_volatile")),
        ecc_uncorrected_aggregate=_int(raw.get("ecc_uncorrected_aggregate")),
        retired_pages=pages[0] + pages[1] if pages else None,
        retired_pending=_int(raw.get("retired_pages_pending")),
        remapped_rows=(rows[0], rows[1], rows[2], rows[3]) if rows else None,
        nvlinks=tuple(None if _int(s) is None else bool(s) for s in links) if isinstance(links, list) else (),
        persistence=_int(raw.get("persistence_mode")),
    )


def health_from_record(record: Mapping[str, Any]) -> tuple[GpuHealth, ...]:
    """Every GPU of a recorded NVML record (the doctor's) -> :class:`GpuHealth`, in the record's order."""
    gpus = record.get("gpus") if isinstance(record, Mapping) else None
    if not isinstance(gpus, list):
        return ()
    return tuple(gpu_health(g, pos) for pos, g in enumerate(gpus) if isinstance(g, Mapping))


# ----------------------------------------------------------------------------- the driver's answers


def health_answers(
    pynvml: Any, handle: Any, *, known: Mapping[str, Any] | None = None, throughput: bool | None = None
) -> dict[str, Any]:
    """One GPU's health answers as a plain dict, :data:`FIXED_KEYS` among them: read, or ``known`` (the GPU's
    answers to them already read: once per job).

    Clock event reasons come from ``nvmlDeviceGetCurrentClocksEventReasons`` (drivers from R535), else from the
    older ``...ClocksThrottleReasons``: the same bits. The PCIe link's current generation can drop while the GPU
    idles (NVML's ``nvmlDeviceGetCurrPcieLinkGeneration``: "may be reduced when the device is not in use"), so a
    reading is compared with the others' under the same job, never alone. ``nvmlDeviceGetPcieThroughput``
    "is querying a byte counter over a 20ms interval" (NVML's words): it waits that long, twice, so its traffic
    is read only where it is used (``throughput`` None: a link below its maximum), unless ``throughput`` says.
    """

    def ask(name: str, *args: Any, then: Any = None) -> Any:  # ``then``: applied to an answer, not to a refusal
        fn = getattr(pynvml, name, None)  # an older pynvml lacks the newer calls: unknown, not a failed reading
        answer = _call(fn, handle, *args) if fn is not None else f"ERR pynvml has no {name}"
        return answer if then is None or isinstance(answer, str) else then(answer)

    def pair(first: Any, second: Any) -> Any:
        return first if isinstance(first, str) else second if isinstance(second, str) else [first, second]

    events = "nvmlDeviceGetCurrentClocksEventReasons"
    uncorrected, corrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    volatile = pynvml.NVML_VOLATILE_ECC
    out: dict[str, Any] = {
        # the doctor's keys (doctor/checks.py, check_nvml)
        "ecc_uncorrected_volatile": ask("nvmlDeviceGetTotalEccErrors", uncorrected, volatile),
        "ecc_uncorrected_aggregate": ask("nvmlDeviceGetTotalEccErrors", uncorrected, pynvml.NVML_AGGREGATE_ECC),
        "retired_pages_pending": ask("nvmlDeviceGetRetiredPagesPendingStatus", then=int),
        "remapped_rows": ask("nvmlDeviceGetRemappedRows", then=lambda rows: [int(x) for x in rows]),
        "throttle_reasons": ask(events if hasattr(pynvml, events) else "nvmlDeviceGetCurrentClocksThrottleReasons"),
        # the step report's
        "ecc_corrected_volatile": ask("nvmlDeviceGetTotalEccErrors", corrected, volatile),
        "retired_pages": pair(
            ask(
                "nvmlDeviceGetRetiredPages", pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, then=len
            ),
            ask("nvmlDeviceGetRetiredPages", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, then=len),
        ),
        "clock_sm": ask("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
        "clock_graphics": ask("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_GRAPHICS),
        "temperature": ask("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
        "power_usage": ask("nvmlDeviceGetPowerUsage"),  # mW
        "power_limit": ask("nvmlDeviceGetEnforcedPowerLimit"),  # mW
        "pcie_link": pair(ask("nvmlDeviceGetCurrPcieLinkGeneration"), ask("nvmlDeviceGetCurrPcieLinkWidth")),
        "nvlink_state": _nvlink_states(pynvml, handle),
    }
    out.update(
        known
        if known is not None
        else {
            "max_clock_sm": ask("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM),
            "max_clock_graphics": ask("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_GRAPHICS),
            "pcie_link_max": pair(ask("nvmlDeviceGetMaxPcieLinkGeneration"), ask("nvmlDeviceGetMaxPcieLinkWidth")),
            "power_default_limit": ask("nvmlDeviceGetPowerManagementDefaultLimit"),  # mW
            "temperature_slowdown": ask(
                "nvmlDeviceGetTemperatureThreshold", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "persistence_mode": ask("nvmlDeviceGetPersistenceMode"),
        }
    )
    now, best = _ints(out["pcie_link"], 2), _ints(out.get("pcie_link_max"), 2)
    if throughput or (throughput is None and now and best and (now[0] < best[0] or now[1] < best[1])):
        out["pcie_throughput_kbs"] = pair(
            ask("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_TX_BYTES),
            ask("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_RX_BYTES),
        )
    return out


def _nvlink_states(pynvml: Any, handle: Any) -> Any:
    """Each link's state, 1 active, 0 not, None unanswered (links past the GPU's last); ``"ERR ..."`` when link 0
    is refused: no NVLink at all (a PCIe GPU, most VMs)."""
    states: list[int | None] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = _call(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        if isinstance(state, str) and link == 0:
            return state
        states.append(None if isinstance(state, str) else int(bool(state)))
    while states and states[-1] is None:
        states.pop()
    return states


def read_health_record(*, throughput: bool | None = None) -> dict[str, Any] | None:
    """The NVML record of :func:`numarun.topology.nvml.read_nvml_record` with every GPU's health answers beside;
    None without NVML (the doctor's reading; ``throughput`` as :func:`health_answers` has it)."""
    return read_nvml_record(lambda pynvml, handle: health_answers(pynvml, handle, throughput=throughput))


class GpuSource(Protocol):
    """Where a sampler gets one GPU's health answers: the live driver or a recording."""

    def read(self, index: int, bus_id: str = "") -> Mapping[str, Any] | None:
        """The answers of the GPU with NVML index ``index`` (its bus id preferred when known); None if unknown."""
        ...


class NvmlSession:
    """NVML initialised once for a reader that asks again and again (the step report's sampler): handles kept,
    :data:`FIXED_KEYS` read once per GPU; shut down when it is collected."""

    def __init__(self, pynvml: Any) -> None:
        self._nvml = pynvml
        self._handles: dict[tuple[int, str], Any] = {}
        self._fixed: dict[tuple[int, str], dict[str, Any]] = {}
        weakref.finalize(self, nvml_close, pynvml)

    @classmethod
    def open(cls) -> NvmlSession | None:
        """A session, or None without pynvml or an NVIDIA driver."""
        pynvml = nvml_open("no GPU health figures")
        return None if pynvml is None else cls(pynvml)

    def read(self, index: int, bus_id: str = "") -> dict[str, Any] | None:
        key = (index, bus_id)
        try:
            handle = self._handles.get(key)
            if handle is None:
                # by bus id: the plan's index is NVML's only when both counted the same GPUs
                handle = (
                    self._nvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
                    if bus_id
                    else self._nvml.nvmlDeviceGetHandleByIndex(index)
                )
                self._handles[key] = handle
            answers = health_answers(self._nvml, handle, known=self._fixed.get(key))
        except Exception as e:  # a GPU gone (fallen off the bus) answers nothing: its figures stop
            log.debug("NVML health of GPU %s: %s", index, e)
            return None
        self._fixed.setdefault(key, {k: answers[k] for k in FIXED_KEYS if k in answers})
        return {"index": index, "pci_bus_id": bus_id, **answers}
