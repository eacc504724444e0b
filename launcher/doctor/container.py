"""What a container (or a scheduler) lets the ranks do: read under ``root`` (:func:`read_confinement`), then
checked purely (:func:`check_confinement`); each finding names its fix in the runtime's own words. The
/dev/shm rule is :func:`shm_needed` (docs/containers.md says why)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..cpuset import format_list
from ..envvars import INIT
from ..jobenv.container import Container, Fix, detect_container, fix
from ..plan.model import MemPolicy, PlanRequest
from ..topology.model import NicKind, Topology
from .model import Finding, Severity

MIB = 1 << 20
NCCL_SHM_PER_PEER = 2 * ((4 << 20) + 4_915_200 + (512 << 10))
"""NCCL's shared-memory transport, per ordered pair of GPU ranks on a node: two channels, each with the
SIMPLE (4 MiB), LL128 (4.7 MiB) and LL (512 KiB) buffers of NCCL's defaults."""
DATALOADER_SHM_PER_RANK = 256 * MIB
"""What a rank's DataLoader workers hand it through /dev/shm: a few prefetched batches."""


@dataclass(frozen=True)
class Confinement:
    """What the doctor reads about this process's confinement; None/"" where unknown or not probed."""

    container: Container | None = None
    mem_refused: str = ""
    shm_bytes: int | None = None
    memlock_bytes: int | None = None
    """RLIMIT_MEMLOCK's soft limit; -1 unlimited."""
    gpu_access: Mapping[int, bool | None] = field(default_factory=dict)
    """GPU minor -> may ``/dev/nvidia<minor>`` be opened (None: absent)."""
    nvidia_visible_devices: str | None = None
    cgroup: str = ""
    """``v1``, ``v2`` or ``hybrid``."""
    cpuset: tuple[int, ...] | None = None
    pid1: bool = False


def _read(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def _size(text: str) -> int | None:
    """``65536k`` -> bytes (tmpfs's ``size=``); None for a percentage or garbage."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = text.strip().lower()
    scale = units.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in units else text
    return int(digits) * scale if digits.isdigit() else None


def read_confinement(root: Path, environ: Mapping[str, str], *, live: bool, topo: Topology) -> Confinement:
    """The confinement of this process (``live``) or of the recorded tree at ``root``."""
    from ..topology.devices import cgroup_cpus, gpu_device_access

    mounts = [line.split() for line in _read(root / "proc/self/mounts").splitlines()]
    shm = None
    for fields in mounts:
        if len(fields) >= 4 and fields[1] == "/dev/shm":
            shm = next((_size(o[5:]) for o in fields[3].split(",") if o.startswith("size=")), None)
    if live:
        with contextlib.suppress(OSError):
            st = os.statvfs("/dev/shm")
            shm = st.f_blocks * st.f_frsize
    memlock = None
    for line in _read(root / "proc/self/limits").splitlines():
        if line.startswith("Max locked memory"):
            soft = line[len("Max locked memory") :].split()[0]
            memlock = -1 if soft == "unlimited" else int(soft) if soft.isdigit() else None
    kinds = {f[2] for f in mounts if len(f) >= 3 and f[2] in ("cgroup", "cgroup2")}
    cgroup = "hybrid" if len(kinds) == 2 else "v2" if "cgroup2" in kinds else "v1" if kinds else ""
    minors = [g.minor for g in topo.gpus if g.vendor == "nvidia" and g.minor >= 0]
    mem_refused = ""
    if live:
        from ..worker.affinity import mempolicy_refusal

        mem_refused = mempolicy_refusal()
    return Confinement(
        container=detect_container(environ if live else {}, root),
        mem_refused=mem_refused,
        shm_bytes=shm,
        memlock_bytes=memlock,
        gpu_access=gpu_device_access(root, minors) if minors else {},
        nvidia_visible_devices=environ.get("NVIDIA_VISIBLE_DEVICES") if live else None,
        cgroup=cgroup,
        cpuset=cgroup_cpus(root),
        pid1=live
        and (os.getpid() == 1 or (environ.get(INIT) == "1" and os.getppid() == 1)),  # numarun as PID 1 runs it
    )


def shm_needed(*, ranks: int, gpu_ranks: int) -> tuple[int, int]:
    """(bytes of /dev/shm a node's ranks need, of which NCCL's part): every ordered pair of GPU ranks
    its NCCL buffers, every rank its DataLoader's share."""
    nccl = gpu_ranks * max(gpu_ranks - 1, 0) * NCCL_SHM_PER_PEER
    return nccl + ranks * DATALOADER_SHM_PER_RANK, nccl


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB" if n < 1 << 30 else f"{n / (1 << 30):.1f} GiB"


def check_confinement(topo: Topology, c: Confinement, request: PlanRequest) -> list[Finding]:
    """The runtime, the refused memory policy, /dev/shm, memlock, the GPUs it may open, cgroups, PID 1."""
    out: list[Finding] = []
    where = c.container
    runtime = where.runtime if where else None
    if where is not None:
        out.append(
            Finding(
                Severity.INFO,
                "container",
                where.runtime.value,
                f"running in a {where.runtime.value} container ({', '.join(where.markers)})",
            )
        )
    if c.mem_refused and request.mem_policy is not MemPolicy.NONE:
        out.append(
            Finding(
                Severity.WARN,
                "mempolicy",
                "set_mempolicy",
                f"the memory-policy syscalls are refused here ({c.mem_refused}: EPERM from "
                "set_mempolicy/get_mempolicy): the "
                f"ranks' memory would not be bound to their NUMA node; fix: {fix(Fix.MEMPOLICY, runtime)}, or "
                "--mem-policy none",
            )
        )
    gpus = [g for g in topo.gpus if g.vendor == "nvidia"]
    openable = sorted(m for m, v in c.gpu_access.items() if v)
    confined = any(v is False or (where is not None and v is None) for v in c.gpu_access.values())
    seen = len(gpus)
    if confined:
        visible = f"; NVIDIA_VISIBLE_DEVICES={c.nvidia_visible_devices}" if c.nvidia_visible_devices is not None else ""
        files = ",".join(f"/dev/nvidia{m}" for m in openable) or "none"
        sev = Severity.WARN if not openable else Severity.INFO
        out.append(
            Finding(
                sev,
                "gpus",
                files,
                f"{seen} GPUs under /sys, {len(openable)} may be opened here ({files}{visible}): the plan uses "
                + ("those" if openable else f"none; fix: {fix(Fix.GPUS, runtime)}"),
            )
        )
    nproc = request.nproc_per_node if isinstance(request.nproc_per_node, int) else None
    gpu_ranks = len(openable) if confined else seen
    ranks = nproc or gpu_ranks or 1
    if c.shm_bytes is not None:
        need, nccl = shm_needed(ranks=ranks, gpu_ranks=min(ranks, gpu_ranks))
        if c.shm_bytes < need:
            size = f"{-(-need // (1 << 30))}g"
            out.append(
                Finding(
                    Severity.ERROR if c.shm_bytes < nccl else Severity.WARN,
                    "shm",
                    "/dev/shm",
                    f"/dev/shm holds {_mib(c.shm_bytes)}; {ranks} rank{'s' if ranks > 1 else ''} need about "
                    f"{_mib(need)} "
                    f"(NCCL's shared-memory buffers {_mib(nccl)}, DataLoader workers "
                    f"{_mib(ranks * DATALOADER_SHM_PER_RANK)}): "
                    f"they fail on it at run time; fix: {fix(Fix.SHM, runtime, size=size)}",
                )
            )
    rdma = [n.name for n in topo.nics if n.kind in (NicKind.INFINIBAND, NicKind.ROCE)]
    if c.memlock_bytes is not None and c.memlock_bytes != -1 and (rdma or where is not None):
        limit = f"memlock (RLIMIT_MEMLOCK) is {c.memlock_bytes >> 10} KiB"
        out.append(
            Finding(
                Severity.ERROR,
                "memlock",
                ",".join(rdma),
                f"{limit} with RDMA devices present: registering "
                f"NCCL's buffers fails; fix: {fix(Fix.MEMLOCK, runtime)}",
            )
            if rdma
            else Finding(
                Severity.INFO,
                "memlock",
                "-",
                f"{limit}; no RDMA device here needs more (RDMA would: {fix(Fix.MEMLOCK, runtime)})",
            )
        )
    if where is not None and (c.cgroup or c.cpuset):
        cpus = f", cpuset {format_list(c.cpuset)} ({len(c.cpuset)} CPUs)" if c.cpuset else ""
        out.append(Finding(Severity.INFO, "cgroup", c.cgroup or "?", f"cgroup {c.cgroup or 'unknown'}{cpus}"))
    if c.pid1:
        out.append(
            Finding(
                Severity.INFO,
                "pid1",
                "pid 1",
                "numarun is the container's PID 1 and does init's duties (reaps orphans, "
                f"passes on signals); a command other than numarun as PID 1 needs an init: {fix(Fix.INIT, runtime)}",
            )
        )
    return out
