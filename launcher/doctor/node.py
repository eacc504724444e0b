"""One node's doctor run: load the Topology as ``plan`` does, read what the checks need beside it (SMT control, NVML
health, versions), check, measure."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import jsonable
from ..errors import TopologyError, UsageError
from ..launch.net import host_view
from ..plan.model import PlanRequest
from ..topology.fileio import read_bounded
from ..topology.model import NicKind, Topology
from .checks import check_hostname, check_node
from .model import Finding, NodeReport, Severity, sort_findings

log = logging.getLogger(__name__)

MEASURE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Inputs:
    topology: str | None  # as --topology: None for the live machine
    request: PlanRequest
    nvml_record: str | None = None  # a recorded NVML record (JSON) instead of the driver's
    measure: bool = False
    compare: bool = False  # several nodes: read the versions they must share (imports torch)
    endpoint: str | None = None  # several nodes: node 0's address (the hostname check names the address toward it)


def tree_root(topo: Topology, source: str | None) -> Path | None:
    """The machine root the Topology was read from (None for a snapshot that is not a tree)."""
    if topo.source == "live":
        return Path("/")
    if not topo.source.startswith("sysfs:") or source is None:
        return None
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    from ..topology.archive import extract_tree

    return extract_tree(path)


def load_nvml_record(path: str) -> dict[str, Any]:
    try:
        data = jsonable.loads(Path(path).read_text())  # nesting bounded: a ValueError, not a RecursionError
    except (OSError, ValueError) as e:
        raise UsageError(
            f"bad --nvml-record {path!r}: {e}; expected a JSON NVML record (tests/fixtures/nvml/ shape)"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise UsageError(f"bad --nvml-record {path!r}: expected a JSON object with a 'gpus' list")
    return data


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


def measure(topo: Topology) -> dict[str, Any]:
    """Bandwidths from a child process (the launcher must not initialise CUDA)."""
    spec = {
        str(n.id): [c for c in n.cpus if topo.cpu(c).online and topo.cpu(c).allowed]
        for n in topo.numa_nodes
        if not topo.allowed_mems or n.id in topo.allowed_mems
    }
    code = (
        "import importlib.util,sys,os;p=sys.argv[1];"
        "s=importlib.util.spec_from_file_location('numarun',os.path.join(p,'__init__.py'),submodule_search_locations=[p]);"
        "m=importlib.util.module_from_spec(s);sys.modules['numarun']=m;s.loader.exec_module(m);"
        "from numarun.doctor.measure import main;sys.exit(main(sys.argv[2:]))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(Path(__file__).resolve().parent.parent), json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=MEASURE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"measurement took over {MEASURE_TIMEOUT_S:g} s"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["measurement failed"])[-1]}
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"error": "measurement printed no result"}


def run_node(inputs: Inputs, *, node_rank: int = 0) -> tuple[NodeReport, Topology]:
    from ..plan.request import counted
    from ..topology.discover import load_topology

    topo = load_topology(inputs.topology)
    live = topo.source == "live"
    record = load_nvml_record(inputs.nvml_record) if inputs.nvml_record else None
    if live and record is None:
        from ..topology.nvml_health import read_health_record

        # every GPU's health answers (numarun.topology.nvml_health, which the step report reads too; None without NVML)
        record = read_health_record()
    root = tree_root(topo, inputs.topology)
    request = counted(inputs.request, topo)  # torchrun's words (auto, gpu, cpu) on the machine checked
    smt, confined = "", []
    if root is not None:
        from .container import check_confinement, read_confinement

        with contextlib.suppress(OSError, TopologyError):  # absent, or not a file a recorded tree should hold
            smt = read_bounded(root / "sys/devices/system/cpu/smt/control").decode(errors="replace").strip()
        confined = check_confinement(topo, read_confinement(root, os.environ, live=live, topo=topo), request)
    findings = list(sort_findings([*check_node(topo, request, smt, record), *confined]))
    if root is None:
        findings.append(
            Finding(
                Severity.INFO,
                "source",
                topo.source,
                "not a machine tree: RDMA ports, SMT and kernel modules not checked",
            )
        )
    if live and record is None and any(g.vendor == "nvidia" for g in topo.gpus):
        findings.append(
            Finding(Severity.INFO, "nvml", "nvml", "NVML not available: GPU health (ECC, throttling) not checked")
        )
    if live:
        findings += check_hostname(*host_view(inputs.endpoint), multi_node=inputs.endpoint is not None)
    figures = measure(topo) if inputs.measure and live else {}
    fact = {
        "gpu_count": len(topo.gpus),
        "gpu_models": sorted({g.name for g in topo.gpus}),
        "compute_nics": sorted(n.name for n in topo.nics if n.kind in (NicKind.INFINIBAND, NicKind.ROCE)),
        **{k: v for k, v in versions(record, live=live and inputs.compare).items() if v},
    }
    host = os.environ.get("SLURMD_NODENAME") or (
        socket.gethostname() if live else topo.hostname
    )  # what --exclude takes
    return NodeReport(node_rank, host, tuple(findings), fact, figures), topo
