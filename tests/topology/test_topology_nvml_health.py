"""NVML health: pure parsing of recorded answers (tests/fixtures/nvml/: the real H200 VM reading, the doctor's
constructed faults, the constructed health recordings) and the live layer on a machine without an NVIDIA driver."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from devices import RecordedNvml
from helpers import FIXTURES

from numarun.topology import nvml_health
from numarun.topology.nvml_health import (
    REASON_WORDS,
    SLOWDOWN,
    GpuHealth,
    NvmlSession,
    PcieGen,
    gpu_health,
    health_from_record,
    reason_words,
)

NVML = FIXTURES / "nvml"


def load(name: str) -> dict[str, Any]:
    return json.loads((NVML / name).read_text())


def reading(scenario: str, which: int = 1) -> dict[str, Any]:
    return load(f"constructed-health-{scenario}.json")["readings"][which]


def test_a_healthy_h100_reading() -> None:
    g = health_from_record(reading("healthy"))[0]
    assert (g.index, g.pci_bus_id) == (0, "0000:18:00.0")
    assert (g.sm_mhz, g.graphics_mhz, g.max_sm_mhz, g.max_graphics_mhz) == (1980, 1980, 1980, 1980)
    assert g.reasons == 0 and g.slowdowns == ()
    assert (g.temperature_c, g.slowdown_c) == (56, 89)
    assert (g.power_w, g.power_limit_w, g.power_default_w) == (612.0, 700.0, 700.0)
    assert g.pcie == PcieGen(5, 16, 5, 16) and not g.pcie.below_max and g.pcie.gbs == pytest.approx(63.0, abs=0.1)
    assert (g.pcie_tx_kbs, g.pcie_rx_kbs) == (None, None)  # read only for a link below its maximum
    assert (g.ecc_corrected, g.ecc_uncorrected, g.ecc_uncorrected_aggregate) == (0, 0, 0)
    assert g.retired_pages is None  # an H100 remaps rows: NVML refuses the retired pages
    assert g.remapped_rows == (0, 0, 0, 0) and g.retired_pending == 0 and g.persistence == 1
    assert g.nvlinks == (True,) * 18


def test_each_constructed_fault_reads_as_recorded() -> None:
    capped = health_from_record(reading("power-cap"))[3]
    assert (capped.sm_mhz, capped.power_limit_w, capped.slowdowns) == (1410, 300.0, ("power cap",))
    hot = health_from_record(reading("thermal"))[3]
    assert (hot.temperature_c, hot.slowdowns) == (92, ("thermal slowdown",))
    assert health_from_record(reading("hw-slowdown"))[3].slowdowns == ("hardware slowdown",)
    link = health_from_record(reading("pcie-x8"))[3].pcie
    assert link.below_max and (link.text(), link.text(best=True)) == ("x8 gen3", "x16 gen5")
    assert link.gbs == pytest.approx(7.88, abs=0.01) and link.max_gbs == pytest.approx(63.0, abs=0.1)
    assert (
        health_from_record(reading("pcie-x8"))[3].pcie_tx_kbs,
        reading("pcie-x8")["gpus"][2].get("pcie_throughput_kbs"),
    ) == (6_550_000, None)
    memory = health_from_record(reading("memory-errors"))[3]
    assert (memory.ecc_corrected, memory.ecc_uncorrected, memory.remapped_rows) == (12, 1, (0, 1, 1, 0))
    assert health_from_record(reading("nvlink-down"))[3].nvlinks[5] is False
    v100 = health_from_record(reading("retired-pages"))[3]
    assert (v100.retired_pages, v100.remapped_rows, v100.max_sm_mhz) == (2, None, 1530)


def test_the_real_h200_reading_has_no_health_answers_and_the_doctors_faults_parse() -> None:
    """The H200 VM was recorded before the health keys: every figure unknown, nothing invented."""
    bare = health_from_record(load("h200-vm.json"))[0]
    assert bare == GpuHealth(index=0, pci_bus_id="0000:00:06.0")
    faults = health_from_record(load("constructed-h200-faults.json"))[0]
    assert (faults.ecc_uncorrected, faults.ecc_uncorrected_aggregate, faults.retired_pending) == (3, 3, 1)
    assert faults.remapped_rows == (0, 2, 1, 0) and faults.persistence == 0
    assert faults.reasons == 65 and faults.slowdowns == ("thermal slowdown (hardware)",)  # idle is no slowdown


def test_refused_and_malformed_answers_are_unknown() -> None:
    raw = {
        "index": 2,
        "pci_bus_id": "not a bus id",
        "clock_sm": "ERR NVMLError_NotSupported: Not Supported",
        "throttle_reasons": True,
        "power_usage": -1,
        "pcie_link": "ERR NVMLError_NotSupported: Not Supported",
        "pcie_link_max": [5],
        "remapped_rows": [0, 1, "x", 0],
        "retired_pages": ["ERR", 0],
        "nvlink_state": [1, "ERR NVMLError_InvalidArgument", 0],
    }
    g = gpu_health(raw)
    assert (g.index, g.pci_bus_id, g.sm_mhz, g.reasons, g.power_w) == (2, "", None, None, None)
    assert g.pcie == PcieGen() and not g.pcie.known and not g.pcie.below_max
    assert g.remapped_rows is None and g.retired_pages is None
    assert g.nvlinks == (True, None, False)
    assert gpu_health({}, 5).index == 5 and health_from_record({"gpus": "none"}) == ()


def test_reasons_in_words_most_serious_first() -> None:
    assert reason_words(0x1 | 0x100) == ()  # idle, display clock: no slowdown of a compute GPU
    assert reason_words(0x4 | 0x8 | 0x20) == ("hardware slowdown", "thermal slowdown", "power cap")
    assert SLOWDOWN == sum(REASON_WORDS) == 0xFE


def test_a_recording_answers_by_bus_id_else_by_index() -> None:
    source = RecordedNvml(reading("power-cap"))
    assert source.read(3)["clock_sm"] == 1410  # type: ignore[index]
    assert source.read(0, "0000:5d:00.0")["index"] == 3  # type: ignore[index]  # the bus id wins
    assert source.read(9) is None and source.read(0, "0000:99:00.0") is None
    assert RecordedNvml({}).read(0) is None


def test_no_driver_no_session_and_no_health_record() -> None:
    """This machine has pynvml but no NVIDIA driver: the live layer must say None, never raise."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    assert NvmlSession.open() is None
    assert nvml_health.read_health_record() is None


@pytest.mark.slow
def test_import_does_not_load_pynvml_or_torch() -> None:
    """The agent imports the step report's sampler: NVML is loaded at its first GPU rank only, CUDA never."""
    code = (
        "import sys, numarun.topology.nvml_health, numarun.launch.steps.evidence; "
        "print('pynvml' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"]
