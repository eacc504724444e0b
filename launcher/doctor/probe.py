"""The doctor's I/O beside topology discovery (SMT control, NVML health, versions), below ``root`` as a recorded
tree."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import TopologyError
from ..topology.fileio import read_bounded
from .checks import Probe


def probe(root: Path, *, live: bool, nvml_record: dict[str, Any] | None = None) -> Probe:
    """Everything the checks need beside the Topology, from the tree at ``root``: SMT control, and live the NVML
    record of :func:`numarun.topology.nvml.read_nvml_record` plus every GPU's health answers
    (:mod:`numarun.topology.nvml_health`, which the step report reads too; None without NVML)."""
    if live and nvml_record is None:
        from ..topology.nvml_health import read_health_record

        nvml_record = read_health_record()
    try:
        smt = read_bounded(root / "sys/devices/system/cpu/smt/control").decode(errors="replace")
    except (OSError, TopologyError):  # absent, or not a file a recorded tree should hold
        smt = ""
    return Probe(smt_control=smt.strip(), nvml=nvml_record)


def versions(nvml_record: Mapping[str, Any] | None, *, live: bool) -> dict[str, str]:
    """Driver, CUDA, NCCL and torch versions, which the nodes of a job must share; torch's only when ``live`` (slow
    import)."""
    out = {"python": platform.python_version(), "driver": str((nvml_record or {}).get("driver", ""))}
    if not live:
        return out
    import torch

    out["torch"] = torch.__version__
    out["cuda"] = str(torch.version.cuda or "")
    try:
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else ()
        out["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # a CPU build has no NCCL to ask
        out["nccl"] = ""
    return out
