"""The doctor's I/O beside topology discovery (SMT control, NVML health, versions), below ``root`` as a recorded
tree."""

from __future__ import annotations

import contextlib
import logging
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import TopologyError
from ..topology.fileio import read_bounded
from .checks import Probe

log = logging.getLogger(__name__)


def _text(p: Path) -> str:
    try:
        return read_bounded(p).decode(errors="replace")
    except (OSError, TopologyError):  # absent, or not a file a recorded tree should hold
        return ""


def read_smt_control(root: Path) -> str:
    return _text(root / "sys/devices/system/cpu/smt/control").strip()


def nvml_health(pynvml: Any, handle: Any) -> dict[str, Any]:
    from ..topology.nvml import _call

    def ecc(counter: int) -> Any:
        return _call(pynvml.nvmlDeviceGetTotalEccErrors, handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)

    rows = _call(pynvml.nvmlDeviceGetRemappedRows, handle)
    pending = _call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    reasons_fn = (
        getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return {
        "ecc_uncorrected_volatile": ecc(pynvml.NVML_VOLATILE_ECC),
        "ecc_uncorrected_aggregate": ecc(pynvml.NVML_AGGREGATE_ECC),
        "retired_pages_pending": pending if isinstance(pending, str) else int(pending),
        "remapped_rows": rows if isinstance(rows, str) else [int(x) for x in rows],
        "throttle_reasons": _call(reasons_fn, handle),
        "persistence_mode": _call(pynvml.nvmlDeviceGetPersistenceMode, handle),
    }


def read_nvml_health_record() -> dict[str, Any] | None:
    """The NVML record of :func:`numarun.topology.nvml.read_nvml_record` plus the health keys; None without NVML."""
    from ..topology.nvml import read_nvml_record

    record = read_nvml_record()
    if not record or not record.get("gpus"):
        return record
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # the record was read a moment ago; a failure now only skips health
        log.debug("NVML health not read: %s", e)
        return record
    try:
        for i, g in enumerate(record["gpus"]):
            g.update(nvml_health(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)))
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return record


def probe(root: Path, *, live: bool, nvml_record: dict[str, Any] | None = None) -> Probe:
    """Everything the checks need beside the Topology, from the tree at ``root``."""
    if live and nvml_record is None:
        nvml_record = read_nvml_health_record()
    return Probe(smt_control=read_smt_control(root), nvml=nvml_record)


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
