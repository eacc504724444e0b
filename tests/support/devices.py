"""A GPU node's recorded device readings (tests/fixtures/nvml/constructed-health-*.json and
tests/fixtures/nics/constructed-node, each made by the script beside it) sampled as the step report samples them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from helpers import FIXTURES

from numarun.launch.steps.device import DeviceEvidence, DeviceSampler, RankDevice
from numarun.topology.nvml_health import RecordedNvml

NICS = FIXTURES / "nics" / "constructed-node"
T0 = 100.0
"""When the first reading is taken (monotonic seconds); the second comes the recording's seconds later."""


def recording(scenario: str) -> dict[str, Any]:
    """``healthy``, ``power-cap``, ``thermal``, ``hw-slowdown``, ``pcie-x8``, ``memory-errors``, ``nvlink-down``,
    ``retired-pages``: four GPUs read twice, GPU 3 at fault."""
    return json.loads((FIXTURES / "nvml" / f"constructed-health-{scenario}.json").read_text())


def devices(scenario: str, nics: Sequence[str]) -> list[RankDevice]:
    """One rank per GPU of the recording, rank r on GPU r (by its bus id) and NIC ``nics[r]``."""
    gpus = recording(scenario)["readings"][0]["gpus"]
    return [RankDevice(g["index"], g["pci_bus_id"], nic) for g, nic in zip(gpus, nics)]


def sampled(scenario: str, nics: Sequence[str]) -> tuple[DeviceSampler, list[RankDevice], float]:
    """A sampler that read the node twice: (it, the ranks' devices, the time of the second reading)."""
    data = recording(scenario)
    ranks = devices(scenario, nics)
    sampler = DeviceSampler(RecordedNvml(data["readings"][0]))
    sampler.sample(NICS / "t0", ranks, T0)
    sampler.gpus = RecordedNvml(data["readings"][1])
    end = T0 + data["seconds"]
    sampler.sample(NICS / "t1", ranks, end)
    return sampler, ranks, end


def node_evidence(
    scenario: str, nics: Sequence[str] = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_0")
) -> dict[int, DeviceEvidence]:
    """Each rank's :class:`DeviceEvidence` over the two readings (rank 3 shares rank 0's NIC unless told)."""
    sampler, ranks, end = sampled(scenario, nics)
    out = {}
    for r, d in enumerate(ranks):
        ev = sampler.evidence(d, T0, end)
        assert ev is not None
        out[r] = ev
    return out
