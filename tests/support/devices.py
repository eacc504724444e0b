"""A GPU node's recorded device readings (tests/fixtures/nvml/constructed-health-*.json and
tests/fixtures/nics/constructed-node, each made by the script beside it) sampled as the step report samples them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from helpers import FIXTURES

from numarun.errors import TopologyError
from numarun.launch.steps.device import DeviceEvidence, DeviceSampler, RankDevice
from numarun.topology.model import normalize_bus_id

NICS = FIXTURES / "nics" / "constructed-node"
T0 = 100.0
"""When the first reading is taken (monotonic seconds); the second comes the recording's seconds later."""


class RecordedNvml:
    """A recorded NVML record answering as :class:`numarun.topology.nvml_health.NvmlSession` does: by bus id, else
    by index."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        gpus = record.get("gpus") if isinstance(record, Mapping) else None
        self.gpus: Sequence[Mapping[str, Any]] = [g for g in gpus if isinstance(g, Mapping)] if gpus else []

    def read(self, index: int, bus_id: str = "") -> Mapping[str, Any] | None:
        for pos, g in enumerate(self.gpus):
            if bus_id:
                with contextlib.suppress(TopologyError):
                    if normalize_bus_id(str(g.get("pci_bus_id", ""))) == normalize_bus_id(bus_id):
                        return g
            elif g.get("index", pos) == index:
                return g
        return None


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
