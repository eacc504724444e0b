"""numarun's end-to-end check on a GPU host (run by scripts/gpu-check.sh), one go, about 7 minutes.

    python3 scripts/gpu_check.py [--out DIR] [--rounds 3] [--steps 60]   # on a GPU host
    python3 scripts/gpu_check.py --self-test                              # anywhere (CPU)

Checks (each a list of named pass/fail results; run in the order topo, binding, doctor, health, h2d, mesh, hang,
layout, steps, nccl, train):

1. ``topo``: ``numarun topo --json`` on the live machine found the GPUs through NVML, and each
   GPU's bus id, memory, NUMA and CPU affinity agree with ``nvidia-smi --query-gpu`` and
   ``nvidia-smi topo -m``.
2. ``binding``: a 1-GPU job under ``numarun run --strict-binding`` whose rank (this script with
   ``--probe``) reports its real CPU affinity (every thread, after importing torch), memory
   policy, OMP_NUM_THREADS and GPU, equal to ``numarun plan --json``; and NCCL's NIC rule on
   the plan of one rank per GPU: every rank of the node has the same ``NCCL_IB_HCA``.
   ``doctor``: ``numarun doctor --json`` on the live node (NVML health, PCIe links, the
   peer-memory module), when this build has the command (``numarun doctor --help``); each
   error finding is a failed check.
   ``health``: every GPU's health figures through numarun's NVML reader (numarun.topology.nvml_health: clocks and
   their event reasons, temperature, power, PCIe link, ECC, retired pages, remapped rows, NVLinks), printed, each
   GPU answering its clocks, temperature, power and PCIe link; then the step report's device sampler reads the
   GPUs twice a second apart, as the agent does while a job runs, and gives each GPU's figures over that span.
3. ``train``: the reference trainer (scripts/train.py, same GPU config and steps) under
   ``numarun`` and under plain ``torchrun``, alternated round by round; tokens/s is the median
   of the steps after warm-up, the ratio numarun/torchrun is the median over rounds.
4. ``h2d``: ``numarun bench h2d``: pinned copies from the rank's bound NUMA node vs pageable
   memory vs unbound torch.
5. ``mesh``: ``numarun plan --mesh`` on the live machine records the layout, and a rank started with
   ``--mesh`` drives the GPU its plan row names (bus id from CUDA) with the ``NUMARUN_MESH*`` variables set;
   NVML's GPU fabric info is read (an answer or the driver's refusal, never a crash).
6. ``hang``: one NCCL rank that all-reduces on its GPU, then blocks in its batch loading: ``--hang-timeout
   15 --on-hang stop`` ends it with exit 75 and a roll-call naming ``load_batch``; a healthy NCCL loop that
   sleeps most of each step under a short timeout is never reported.
7. ``layout``: the trainer's degree path on CUDA: one rank with ``parallel=fsdp`` (dp_shard) against
   ``parallel=ddp`` on the same batch, SGD without clipping: per-step losses agree.
8. ``steps``: the step report on a GPU: two ranks on the one GPU (gloo: NCCL refuses two ranks on one device), a
   DDP MLP, rank 1 doing more GPU work in its forward. Every record past the first carries the step's GPU time
   from CUDA events (read later, never synchronising) and the CUDA allocator's peak; the verdict names rank 1 with
   compute; the same job with ``--step-report off`` and ``on`` side by side, their median steps' ratio.
9. ``nccl``: the step report on NCCL, one rank per GPU (NCCL refuses two ranks on one device: a host with fewer than
   two GPUs says so and skips it): a balanced two-rank DDP job names no rank; the same job with rank 1 doing more
   work on its GPU (its stream, its host spinning in a synchronise meanwhile) names rank 1 with compute, its own
   time taken from the GPU's view; every record of rank 0 past the first carries the DDP wait's GPU time.

Writes ``gpu-check.json`` and ``gpu-check.md`` to ``--out`` (default ``$OUT``) and exits 1 when
any check fails. ``--self-test`` runs check 1 on the recorded H200 VM capture
(tests/fixtures/live-h200-vm) and check 2 live on this machine, without a GPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _importable_numarun() -> None:
    """Run from a checkout without numarun installed: import it from ``launcher/``.

    The source folder is named ``launcher``, the package ``numarun``; a temporary folder
    holding a ``numarun`` link to ``launcher/`` goes first on sys.path and PYTHONPATH, so
    that ``python -m numarun`` in the subprocesses finds the same code.
    """
    try:
        import numarun  # noqa: F401
    except ImportError:
        link_dir = Path(tempfile.mkdtemp(prefix="numarun-src."))
        (link_dir / "numarun").symlink_to(REPO / "launcher", target_is_directory=True)
        sys.path.insert(0, str(link_dir))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(link_dir), os.environ.get("PYTHONPATH")]))


_importable_numarun()

from numarun.cpuset import format_list  # noqa: E402
from numarun.fsutil import write_atomic  # noqa: E402
from numarun.topology.model import normalize_bus_id  # noqa: E402
from numarun.topology.smi import SmiMatrix, parse_topo_m  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
NUMARUN = [sys.executable, "-m", "numarun"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

GPU_TRAIN_OVERRIDES = (
    # A ~50M-parameter GPT in bf16: big enough that a step is GPU-bound, small enough that
    # six runs, their start-up and final checkpoints fit in a couple of minutes on one H200.
    "model=gpt",
    "model.vocab_size=8192",
    "model.seq_len=512",
    "model.d_model=768",
    "model.n_heads=12",
    "model.n_layers=6",
    "trainer.batch_size=32",
    "trainer.precision=bf16",
    "trainer.progress=false",
    "trainer.log_interval=1",
)
MIN_TRAIN_RATIO = 0.99
MIN_H2D_RATIO = 0.95
"""Bound pinned copies may not be slower than unbound torch's by more than run-to-run noise."""


@dataclass(frozen=True)
class Check:
    """One named comparison and its outcome."""

    step: str
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class SmiGpu:
    """One GPU as nvidia-smi lists it."""

    bus_id: str
    """Normalised (``0000:00:06.0``)."""
    memory_mib: int


# -- parsing (pure) -------------------------------------------------------------------------------


def parse_query_csv(text: str) -> tuple[SmiGpu, ...]:
    """``nvidia-smi --query-gpu=pci.bus_id,memory.total --format=csv,noheader`` output."""
    gpus = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        m = re.fullmatch(r"(\d+)\s*MiB", parts[1]) if len(parts) == 2 else None
        if m is None:
            raise ValueError(f"nvidia-smi CSV line {lineno} {line!r}: expected '<bus id>, <N> MiB'")
        gpus.append(SmiGpu(bus_id=normalize_bus_id(parts[0]), memory_mib=int(m.group(1))))
    return tuple(gpus)


def parse_smi_q(text: str) -> tuple[SmiGpu, ...]:
    """``nvidia-smi -q``: each ``GPU <bus id>`` block's ``FB Memory Usage`` / ``Total``."""
    gpus: list[SmiGpu] = []
    bus: str | None = None
    in_fb = False
    for line in text.splitlines():
        m = re.fullmatch(r"GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-7])\s*", line)
        if m:
            bus, in_fb = normalize_bus_id(m.group(1)), False
            continue
        if line.strip() == "FB Memory Usage":
            in_fb = True
            continue
        m = re.fullmatch(r"\s+Total\s*:\s*(\d+) MiB\s*", line)
        if m and in_fb and bus is not None:
            gpus.append(SmiGpu(bus_id=bus, memory_mib=int(m.group(1))))
            bus, in_fb = None, False
    return tuple(gpus)


def median_tokens_per_s(rows: Sequence[Mapping[str, Any]], *, warmup: int) -> float:
    """Median tokens/s of the steps after the first ``warmup`` (CUDA context, allocator, autotune)."""
    rates = [float(r["tokens_per_s"]) for r in rows if int(r["step"]) > warmup and r.get("tokens_per_s")]
    if not rates:
        raise ValueError(f"no tokens_per_s after step {warmup} in {len(rows)} metric rows")
    return statistics.median(rates)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- comparisons (pure) ---------------------------------------------------------------------------


def check_topology(topo: Mapping[str, Any], smi: Sequence[SmiGpu], matrix: SmiMatrix) -> list[Check]:
    """``numarun topo --json`` against nvidia-smi's list and ``topo -m`` matrix."""
    out = [
        Check(
            "topo",
            "gpu_source",
            topo.get("gpu_source") == "nvml",
            f"gpu_source {topo.get('gpu_source')!r} (expected 'nvml')",
        )
    ]
    gpus = list(topo.get("gpus") or ())
    out.append(
        Check(
            "topo",
            "gpu_count",
            len(gpus) == len(smi) == len(matrix.gpus) and len(gpus) > 0,
            f"numarun {len(gpus)}, nvidia-smi {len(smi)}, topo -m {len(matrix.gpus)}",
        )
    )
    by_bus = {s.bus_id: s for s in smi}
    for i, g in enumerate(gpus):
        bus = normalize_bus_id(g["pci_bus_id"])
        s = by_bus.get(bus)
        out.append(
            Check(
                "topo",
                f"gpu{i}.bus_id",
                s is not None,
                f"{bus} {'listed' if s else 'not listed'} by nvidia-smi ({', '.join(by_bus) or 'none'})",
            )
        )
        if s is not None:
            mib = int(g.get("memory_bytes") or 0) / 2**20
            out.append(
                Check(
                    "topo",
                    f"gpu{i}.memory",
                    abs(mib - s.memory_mib) <= 1,
                    f"numarun {mib:.0f} MiB, nvidia-smi {s.memory_mib} MiB",
                )
            )
        if i < len(matrix.gpus):
            # nvidia-smi numbers GPUs in PCI bus order, as NVML and numarun do.
            numa = matrix.numa_affinity[i]
            node = int(g.get("numa_node", -1))
            ok = node in numa if numa else node == -1
            out.append(
                Check(
                    "topo",
                    f"gpu{i}.numa_node",
                    ok,
                    f"numarun {node}, topo -m NUMA Affinity {format_list(numa) or 'N/A'}",
                )
            )
            cpus = tuple(sorted(g.get("cpu_affinity") or ()))
            want = tuple(sorted(matrix.cpu_affinity[i]))
            out.append(
                Check(
                    "topo",
                    f"gpu{i}.cpu_affinity",
                    not want or cpus == want,
                    f"numarun {format_list(cpus) or '-'}, topo -m {format_list(want) or 'N/A'}",
                )
            )
    return out


def _uuid(text: str) -> str:
    """``GPU-3819...`` (NVML) and ``3819...`` (torch) name the same GPU."""
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


_POLICY_NAMES = {"bind": "bind", "preferred": "preferred", "none": "default"}


def check_binding(rank: Mapping[str, Any], report: Mapping[str, Any]) -> list[Check]:
    """A rank's planned binding (``numarun plan --json`` ranks[i]) against what the rank reported."""
    out = []
    used = report.get("plan_rank")
    out.append(
        Check(
            "binding",
            "job_plan",
            bool(used)
            and sorted(used["cpus"]) == sorted(rank["cpus"])
            and sorted(used["mems"]) == sorted(rank["mems"]),
            "the job's plan (NUMARUN_PLAN) gives this rank "
            + (f"cpus {format_list(used['cpus'])} mems {format_list(used['mems'])}" if used else "nothing")
            + f"; numarun plan: cpus {format_list(rank['cpus'])} mems {format_list(rank['mems'])}",
        )
    )
    planned_cpus = sorted(rank["cpus"])
    got = sorted(report["cpus"])
    out.append(
        Check(
            "binding", "cpus", got == planned_cpus, f"rank runs on {format_list(got)}, plan {format_list(planned_cpus)}"
        )
    )
    threads = report.get("thread_cpus") or {}
    stray = {tid: c for tid, c in threads.items() if sorted(c) != planned_cpus}
    out.append(
        Check(
            "binding",
            "threads",
            bool(threads) and not stray,
            f"{len(threads)} threads after importing torch"
            + (
                f"; off-plan: {', '.join(f'{t}: {format_list(c)}' for t, c in stray.items())}"
                if stray
                else ", all on the plan's cpus"
            ),
        )
    )
    want_policy = _POLICY_NAMES.get(rank["mem_policy"], rank["mem_policy"])
    out.append(
        Check(
            "binding",
            "mem_policy",
            report["mem_policy"] == want_policy,
            f"rank {report['mem_policy']}, plan {rank['mem_policy']} (kernel name {want_policy})",
        )
    )
    if want_policy != "default":
        out.append(
            Check(
                "binding",
                "mems",
                sorted(report["mems"]) == sorted(rank["mems"]),
                f"rank nodes {format_list(report['mems']) or '-'}, plan {format_list(rank['mems']) or '-'}",
            )
        )
    omp = rank.get("env", {}).get("OMP_NUM_THREADS")
    if omp is not None:
        out.append(
            Check(
                "binding",
                "omp_num_threads",
                report.get("omp_num_threads") == omp,
                f"rank {report.get('omp_num_threads')}, plan {omp}",
            )
        )
    gpu = rank.get("gpu")
    if gpu is not None:
        seen = report.get("gpu") or {}
        ok = bool(seen) and (not gpu.get("uuid") or _uuid(seen.get("uuid", "")) == _uuid(gpu["uuid"]))
        if seen.get("pci_bus_id") and gpu.get("pci_bus_id"):
            ok = ok and normalize_bus_id(seen["pci_bus_id"]) == normalize_bus_id(gpu["pci_bus_id"])
        out.append(
            Check(
                "binding",
                "gpu",
                ok,
                f"rank sees {seen.get('name', 'no GPU')} {seen.get('uuid', '')} {seen.get('pci_bus_id', '')}, "
                f"plan GPU {gpu['index']} {gpu.get('uuid', '')} {gpu['pci_bus_id']}",
            )
        )
    return out


def check_nic_rule(ranks: Sequence[Mapping[str, Any]]) -> list[Check]:
    """NCCL pairs HCAs across ranks: every rank of a node gets the same NCCL_IB_HCA (NVIDIA/nccl#1478)."""
    values = {r.get("env", {}).get("NCCL_IB_HCA") for r in ranks}
    shown = ", ".join(sorted(repr(v) if v is not None else "unset" for v in values))
    return [
        Check(
            "binding",
            "nic_rule",
            len(ranks) > 0 and len(values) == 1,
            f"{len(ranks)} ranks, NCCL_IB_HCA: {shown or 'no ranks'}",
        )
    ]


def check_doctor(doc: Mapping[str, Any], exit_code: int) -> list[Check]:
    """``numarun doctor --json``: it ran and reported, and no finding is an error."""
    findings = doc.get("findings")
    if not isinstance(findings, list):
        return [Check("doctor", "ran", False, f"exit {exit_code}, no findings list in its JSON")]
    errors = [f for f in findings if str(f.get("severity", "")).lower() == "error"]
    out = [
        Check(
            "doctor",
            "ran",
            exit_code == (1 if errors else 0),
            f"exit {exit_code}, {len(findings)} findings, {len(errors)} errors",
        )
    ]
    for i, f in enumerate(errors):
        out.append(
            Check("doctor", f"error{i}.{f.get('check', '?')}", False, f"{f.get('device', '-')}: {f.get('message', '')}")
        )
    return out


def health_lines(record: Mapping[str, Any]) -> list[str]:
    """One line per GPU of an NVML health record, as numarun parses it."""
    from numarun.topology.nvml_health import health_from_record

    def known(value: Any, unit: str = "") -> str:
        return "?" if value is None else f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"

    out = []
    for g in health_from_record(record):
        reasons = ", ".join(g.slowdowns) or "none"
        if g.reasons is None:
            reasons = "?"
        links = sum(1 for s in g.nvlinks if s)
        link = f"{g.pcie.text()} of {g.pcie.text(best=True)}" if g.pcie.known else "?"
        out.append(
            f"GPU {g.index} {g.pci_bus_id}: SM {known(g.sm_mhz)} of {known(g.max_sm_mhz)} MHz, slowdowns {reasons}"
            f" (reasons {known(g.reasons)}); {known(g.temperature_c, ' °C')}"
            f" (slowdown at {known(g.slowdown_c, ' °C')});"
            f" {known(g.power_w, ' W')} of {known(g.power_limit_w, ' W')} (default {known(g.power_default_w, ' W')});"
            f" PCIe {link}, {known(g.pcie_tx_kbs)}/{known(g.pcie_rx_kbs)} KB/s;"
            f" ECC {known(g.ecc_corrected)} corrected, {known(g.ecc_uncorrected)} uncorrected;"
            f" retired pages {known(g.retired_pages)}, remapped rows {known(g.remapped_rows)};"
            f" NVLink {links} of {len(g.nvlinks)} up"
        )
    return out


def check_health(record: Mapping[str, Any] | None, sampled: Mapping[int, Any]) -> list[Check]:
    """NVML health through numarun's reader: each GPU answered its clocks, temperature, power and PCIe link; the
    step report's sampler (``sampled``: NVML index -> its GPU figures, JSON) gave each GPU a clock over its span."""
    from numarun.topology.nvml_health import health_from_record

    gpus = health_from_record(record or {})
    out = [Check("health", "gpus", bool(gpus), f"{len(gpus)} GPUs answered")]
    for g in gpus:
        figures = {
            "clock": g.sm_mhz,
            "max_clock": g.max_sm_mhz,
            "reasons": g.reasons,
            "temperature": g.temperature_c,
            "power": g.power_w,
            "power_limit": g.power_limit_w,
        }
        missing = [k for k, v in figures.items() if v is None] + ([] if g.pcie.known else ["pcie_link"])
        out.append(Check("health", f"gpu{g.index}", not missing, f"unanswered: {missing}" if missing else "answered"))
        fig = sampled.get(g.index) or {}
        ok = isinstance(fig.get("mhz"), (int, float)) and fig["mhz"] > 0 and fig.get("since_s", 0) > 0
        out.append(Check("health", f"sampler_gpu{g.index}", ok, f"the step report's figures: {fig!r}"))
    return out


def check_train(
    numarun_rates: Sequence[float], torchrun_rates: Sequence[float], *, min_ratio: float = MIN_TRAIN_RATIO
) -> tuple[list[Check], float]:
    """Median tokens/s over rounds for each launcher and their ratio."""
    if not numarun_rates or not torchrun_rates:
        return [Check("train", "ratio", False, "a launcher produced no figures")], 0.0
    n, t = statistics.median(numarun_rates), statistics.median(torchrun_rates)
    ratio = n / t if t else 0.0
    return [
        Check(
            "train",
            "ratio",
            ratio >= min_ratio,
            f"numarun {n:.0f} tok/s, torchrun {t:.0f} tok/s, ratio {ratio:.3f} (target >= {min_ratio})",
        )
    ], ratio


def check_h2d(doc: Mapping[str, Any], *, min_ratio: float = MIN_H2D_RATIO) -> list[Check]:
    """``numarun bench h2d --json`` figures: bound pinned copies vs raw torch and vs pageable."""
    bound, raw = doc["numarun"], doc["raw"]
    out = []
    for d in ("h2d", "d2h"):
        b, r, pg = bound["gbps"][f"{d}_pinned"], raw["gbps"][f"{d}_pinned"], bound["gbps"][f"{d}_pageable"]
        out.append(
            Check(
                "h2d",
                f"{d}_pinned_vs_raw",
                b >= min_ratio * r,
                f"numarun {b:.2f} GB/s, raw torch {r:.2f} GB/s, ratio {b / r if r else 0:.3f} (>= {min_ratio})",
            )
        )
        out.append(Check("h2d", f"{d}_pinned_vs_pageable", b > pg, f"pinned {b:.2f} GB/s, pageable {pg:.2f} GB/s"))
    mems = bound.get("mems") or []
    where = f"bound to {format_list(mems) or '-'} ({bound.get('mem_policy')})"
    pageable = bound.get("pageable_page_nodes") or []
    out.append(
        Check(
            "h2d",
            "pageable_pages_on_bound_node",
            bool(pageable) and set(pageable) <= set(mems),
            f"pageable pages on node(s) {format_list(pageable) or '?'}, {where}",
        )
    )
    # move_pages(2) may not see the driver's mapping of pinned memory: unknown is not a failure.
    pinned = bound.get("pinned_page_nodes") or []
    out.append(
        Check(
            "h2d",
            "pinned_pages_on_bound_node",
            not pinned or set(pinned) <= set(mems),
            f"pinned pages on node(s) {format_list(pinned) or 'unknown to move_pages'}, {where}",
        )
    )
    return out


# -- the rank's side ------------------------------------------------------------------------------


def probe(path: Path) -> None:
    """Run as the rank of a numarun job: write what the kernel says this process got."""
    from numarun.worker import affinity, current_binding

    report: dict[str, Any] = {}
    binding = current_binding()
    try:
        import torch

        torch.ones(256, 256) @ torch.ones(256, 256)  # starts torch's CPU thread pool, which must be bound too
        if torch.cuda.is_available():
            index = binding.gpu.cuda_index if binding is not None and binding.gpu is not None else 0
            props = torch.cuda.get_device_properties(index)
            torch.ones(1, device=f"cuda:{index}").sum().item()  # a real kernel on the rank's GPU
            bus = ""
            if hasattr(props, "pci_bus_id"):
                bus = f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            uuid = str(getattr(props, "uuid", "") or "")
            report["gpu"] = {
                "name": props.name,
                "uuid": uuid,
                "pci_bus_id": bus,
                "cuda_index": index,
                "count": torch.cuda.device_count(),
            }
        report["torch"] = torch.__version__
    except ImportError:
        report["torch"] = None
    got = affinity.read_back(threads=True)
    report.update(
        cpus=list(got.cpus),
        thread_cpus={str(tid): list(c) for tid, c in got.thread_cpus.items()},
        mem_policy=got.mem_policy,
        mems=list(got.mems),
        cpus_allowed_list=format_list(affinity.cpus_allowed()),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        local_rank=os.environ.get("LOCAL_RANK"),
        mesh_env={k: v for k, v in os.environ.items() if k.startswith("NUMARUN_MESH")},
        plan_rank=json.loads(json.dumps(asdict(binding), default=str)) if binding is not None else None,
    )
    write_atomic(path, json.dumps(report, indent=1) + "\n")


def probe_hang(mode: str, steps: int) -> None:
    """Run as the rank of a numarun job: NCCL all-reduces on the rank's GPU; ``stuck`` blocks in
    ``load_batch`` at step 3, ``healthy`` sleeps most of each of ``steps`` steps at one line."""
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))

    def load_batch(step: int) -> Any:
        if mode == "stuck" and step == 3:
            time.sleep(3600)  # a data source that never answers
        return torch.ones(1024, device="cuda")

    for step in range(100000 if mode == "stuck" else steps):
        if mode == "healthy":
            time.sleep(1.0)  # the line a stack snapshot alone would call hung
        batch = load_batch(step)
        dist.all_reduce(batch)
        torch.cuda.synchronize()
    dist.destroy_process_group()


def probe_steps(slow: int, steps: int) -> None:
    """Run as a rank of a two-rank job on one GPU: a DDP MLP on cuda:0 (gloo), rank ``slow`` doing eight more
    4096x4096 matrix products in its forward; writes its median step time to ``$STEPS_OUT/rank<R>.json``."""
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"  # numarun planned the ranks CPU-only: both take the one GPU
    import statistics

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    model = DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).to(dev), device_ids=[0]
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, big = torch.randn(256, 2048, device=dev), torch.randn(4096, 4096, device=dev)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        if rank == slow:
            for _ in range(8):
                big = torch.tanh(big @ big)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach())  # a CUDA tensor through gloo: the host waits for it
        times.append(time.perf_counter() - t)
    out = Path(os.environ["STEPS_OUT"])
    (out / f"rank{rank}.json").write_text(json.dumps({"step_s": statistics.median(times[len(times) // 5 :])}))
    del model, opt
    dist.destroy_process_group()


def probe_nccl(slow: int, steps: int) -> None:
    """Run as a rank of a job of one rank per GPU (NCCL): a DDP MLP on the rank's GPU; rank ``slow`` (-1: none) does
    eight more 4096x4096 matrix products in its forward and waits for them in a synchronise (its host spins while its
    stream works)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dev = torch.device("cuda", local)
    model = DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).to(dev), device_ids=[local]
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, big = torch.randn(256, 2048, device=dev), torch.randn(4096, 4096, device=dev)
    for _ in range(steps):
        if rank == slow:
            for _ in range(8):
                big = torch.tanh(big @ big)
            torch.cuda.synchronize()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    del model, opt
    dist.destroy_process_group()


def step_nccl(result: dict[str, Any], work: Path, *, steps: int = 80) -> list[Check]:
    gpus = 0
    if shutil.which("nvidia-smi"):
        gpus = len(_run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], timeout=60).split())
    if gpus < 2:
        return [Check("nccl", "skipped", True, f"NCCL needs a GPU per rank; this host has {gpus}")]
    me = str(Path(__file__).resolve())
    out: dict[str, Any] = {}
    checks = []
    for slow, want in ((-1, "=> no rank holds the job back"), (1, "=> rank 1 holds the job back: compute")):
        logs = work / f"nccl-{slow}"
        logs.mkdir()
        cmd = [*NUMARUN, "run", "--standalone", "--nproc-per-node", "2", "--log-dir", str(logs)]
        cmd += [me, "--probe-nccl", str(slow), "--steps-n", str(steps)]
        print(f"+ two NCCL ranks, {'rank 1 slower on its GPU' if slow >= 0 else 'balanced'}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=work, env=_env())
        verdict = next((ln for ln in proc.stderr.splitlines() if "=> " in ln), "")
        out[str(slow)] = {"exit": proc.returncode, "verdict": verdict, "stderr": proc.stderr[-4000:]}
        name = "balanced_no_rank" if slow < 0 else "slow_gpu_named"
        checks.append(Check("nccl", name, proc.returncode == 0 and want in verdict, verdict.strip()))
        if slow >= 0:
            from numarun.worker.steps import read_records

            kept = next(logs.glob("numarun_steps.*/steps.jsonl"), None)
            waits = (
                [r for r in read_records(kept.read_text().splitlines()) if r.rank == 0 and r.step > 1] if kept else []
            )
            timed = sum("gpu_comm_s" in r.extra and r.gpu_s is not None for r in waits)
            checks.append(
                Check("nccl", "ddp_wait_on_gpu", bool(waits) and timed == len(waits), f"{timed} of {len(waits)}")
            )
    result["nccl"] = out
    return checks


# -- the checks, live -----------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NUMARUN_TOPOLOGY", None)  # live machine, always
    return env


def _run(cmd: Sequence[str], *, timeout: float, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=dict(env or _env()))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def step_topo(result: dict[str, Any]) -> list[Check]:
    topo = json.loads(_run([*NUMARUN, "topo", "--json"], timeout=120))
    csv = _run(["nvidia-smi", "--query-gpu=pci.bus_id,memory.total", "--format=csv,noheader"], timeout=60)
    topo_m = _run(["nvidia-smi", "topo", "-m"], timeout=60)
    result["topo"] = {"numarun": topo, "nvidia_smi_csv": csv, "nvidia_smi_topo_m": topo_m}
    return check_topology(topo, parse_query_csv(csv), parse_topo_m(topo_m, "nvidia-smi topo -m"))


def step_binding(result: dict[str, Any], work: Path) -> list[Check]:
    plan = json.loads(_run([*NUMARUN, "plan", "--json", "--nproc-per-node", "1"], timeout=120))
    report_file = work / "probe.json"
    _run(
        [
            *NUMARUN,
            "run",
            "--standalone",
            "--nproc-per-node",
            "1",
            "--strict-binding",
            str(Path(__file__).resolve()),
            "--probe",
            str(report_file),
        ],
        timeout=180,
        cwd=work,
    )
    report = json.loads(report_file.read_text())
    per_gpu = json.loads(_run([*NUMARUN, "plan", "--json"], timeout=120))  # one rank per GPU (1 without)
    result["binding"] = {"plan": plan, "report": report, "plan_per_gpu": per_gpu}
    return check_binding(plan["ranks"][0], report) + check_nic_rule(per_gpu["ranks"])


def step_doctor(result: dict[str, Any]) -> list[Check]:
    """``numarun doctor --json`` where this build has it; otherwise noted as skipped, not failed."""
    probe = subprocess.run([*NUMARUN, "doctor", "--help"], capture_output=True, text=True, timeout=120, env=_env())
    if probe.returncode != 0:
        result.setdefault("skipped", []).append("doctor: this build has no 'numarun doctor'")
        print("skip doctor: 'numarun doctor --help' failed", flush=True)
        return []
    print("+ " + " ".join([*NUMARUN, "doctor", "--json"]), flush=True)
    proc = subprocess.run([*NUMARUN, "doctor", "--json"], capture_output=True, text=True, timeout=180, env=_env())
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result["doctor"] = {"exit": proc.returncode, "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}
        return [
            Check("doctor", "ran", False, f"exit {proc.returncode}, output is not JSON: {proc.stderr.strip()[-300:]}")
        ]
    result["doctor"] = {"exit": proc.returncode, "report": doc}
    return check_doctor(doc, proc.returncode)


def step_health(result: dict[str, Any]) -> list[Check]:
    """Live GPU health through numarun.topology.nvml_health, printed; NVML missing is noted as skipped (the topo step
    fails then)."""
    from numarun.jsonable import to_jsonable
    from numarun.launch.steps.device import DeviceSampler, RankDevice
    from numarun.topology.nvml_health import health_from_record, read_health_record

    record = read_health_record(throughput=True)  # every answer asked once, the slow PCIe counter too
    if not record or not record.get("gpus"):
        result.setdefault("skipped", []).append("health: NVML unavailable (no pynvml or no NVIDIA driver)")
        print("skip health: NVML unavailable", flush=True)
        return []
    for line in health_lines(record):
        print(f"  {line}", flush=True)
    devices = [RankDevice(g.index, g.pci_bus_id) for g in health_from_record(record)]
    sampler = DeviceSampler(live=True)
    t0 = time.monotonic()
    sampler.sample(Path("/"), devices, t0)
    time.sleep(1.0)
    t1 = time.monotonic()
    sampler.sample(Path("/"), devices, t1)
    sampled = {}
    for d in devices:
        ev = sampler.evidence(d, t0, t1)
        sampled[d.gpu] = to_jsonable(ev.gpu) if ev is not None and ev.gpu is not None else None
        print(f"  step report, GPU {d.gpu}: {sampled[d.gpu]}", flush=True)
    result["health"] = {"record": record, "sampled": sampled}
    return check_health(record, sampled)


def step_train(
    result: dict[str, Any],
    work: Path,
    *,
    rounds: int,
    steps: int,
    min_ratio: float,
    overrides: Sequence[str] = GPU_TRAIN_OVERRIDES,
) -> list[Check]:
    warmup = max(2, steps // 5)
    overrides = [*overrides, f"trainer.steps={steps}"]
    rates: dict[str, list[float]] = {"numarun": [], "torchrun": []}
    # Filled in as rounds finish, so a failed or cut-short run keeps the rounds done.
    result["train"] = {
        "overrides": overrides,
        "warmup_steps": warmup,
        "rounds": rounds,
        "tokens_per_s": rates,
        "ratio": None,
    }
    for r in range(rounds):
        for who in ("numarun", "torchrun") if r % 2 == 0 else ("torchrun", "numarun"):
            run_dir = work / f"train-{who}-{r}"
            head = (
                [*NUMARUN, "run", "--standalone", "--nproc-per-node", "1"]
                if who == "numarun"
                else [*TORCHRUN, "--standalone", "--nproc-per-node", "1"]
            )
            _run(
                [*head, str(REPO / "scripts" / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
                timeout=150,
                cwd=work,
            )
            rate = median_tokens_per_s(read_metrics(run_dir / "metrics.jsonl"), warmup=warmup)
            rates[who].append(rate)
            print(f"round {r}: {who} {rate:.0f} tok/s", flush=True)
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    checks, ratio = check_train(rates["numarun"], rates["torchrun"], min_ratio=min_ratio)
    result["train"]["ratio"] = round(ratio, 4)
    return checks


def step_h2d(result: dict[str, Any], work: Path, *, size: str, iters: int) -> list[Check]:
    out = work / "h2d.json"
    argv = [*NUMARUN, "bench", "h2d", "--size", size, "--iters", str(iters), "--json-file", str(out)]
    text = _run(argv, timeout=300)
    print(text, flush=True)
    doc = json.loads(out.read_text())
    result["h2d"] = doc
    return check_h2d(doc)


def check_mesh(plan: Mapping[str, Any], report: Mapping[str, Any], fabric: Sequence[Any]) -> list[Check]:
    """A live ``plan --mesh dp_shard=-1`` against what its rank saw."""
    mesh = plan.get("mesh") or {}
    out = [
        Check(
            "mesh",
            "plan_has_layout",
            bool(mesh) and "dp_shard" in (mesh.get("names") or ()),
            f"plan mesh {mesh.get('spec')!r} names {mesh.get('names')!r}",
        )
    ]
    row = plan["ranks"][0]
    want = normalize_bus_id(row["gpu"]["pci_bus_id"]) if row.get("gpu") and row["gpu"].get("pci_bus_id") else ""
    got = (report.get("gpu") or {}).get("pci_bus_id") or ""
    out.append(
        Check(
            "mesh",
            "rank_drives_planned_gpu",
            bool(want) and got and normalize_bus_id(got) == want,
            f"plan {want or '-'}, CUDA {got or '-'}",
        )
    )
    env = report.get("mesh_env") or {}
    out.append(
        Check(
            "mesh",
            "rank_env",
            env.get("NUMARUN_MESH") == mesh.get("spec") and "NUMARUN_MESH_SHAPE" in env,
            f"rank saw {env!r}",
        )
    )
    ok = bool(fabric) and all(isinstance(f, (dict, str)) for f in fabric)
    out.append(Check("mesh", "nvml_fabric_info", ok, f"per GPU: {fabric!r}"))
    return out


def step_mesh(result: dict[str, Any], work: Path) -> list[Check]:
    plan = json.loads(_run([*NUMARUN, "plan", "--json", "--nproc-per-node", "1", "--mesh", "dp_shard=-1"], timeout=120))
    report_file = work / "probe-mesh.json"
    _run(
        [
            *NUMARUN,
            "run",
            "--standalone",
            "--nproc-per-node",
            "1",
            "--mesh",
            "dp_shard=-1",
            str(Path(__file__).resolve()),
            "--probe",
            str(report_file),
        ],
        timeout=180,
        cwd=work,
    )
    report = json.loads(report_file.read_text())
    from numarun.topology.nvml import read_nvml_record

    reading = read_nvml_record() or {}
    fabric = [g.get("fabric") for g in reading.get("gpus", [])]
    result["mesh"] = {"plan": plan.get("mesh"), "report": report, "fabric": fabric}
    return check_mesh(plan, report, fabric)


def step_hang(result: dict[str, Any], work: Path) -> list[Check]:
    me = str(Path(__file__).resolve())
    head = [*NUMARUN, "run", "--standalone", "--nproc-per-node", "1"]
    print("+ stuck NCCL rank, --hang-timeout 15 --on-hang stop", flush=True)
    t0 = time.monotonic()
    stuck = subprocess.run(
        [*head, "--hang-timeout", "15", "--on-hang", "stop", me, "--probe-hang", "stuck"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=work,
        env=_env(),
    )
    stuck_s = time.monotonic() - t0
    print("+ healthy NCCL loop, --hang-timeout 6, 25 steps of 1 s", flush=True)
    healthy = subprocess.run(
        [*head, "--hang-timeout", "6", me, "--probe-hang", "healthy", "--hang-steps", "25"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=work,
        env=_env(),
    )
    result["hang"] = {
        "stuck": {"exit": stuck.returncode, "seconds": round(stuck_s, 1), "stderr": stuck.stderr[-6000:]},
        "healthy": {"exit": healthy.returncode, "stderr": healthy.stderr[-3000:]},
    }
    named = [ln for ln in stuck.stderr.splitlines() if "load_batch" in ln]
    return [
        Check("hang", "stuck_exit_75", stuck.returncode == 75, f"exit {stuck.returncode} after {stuck_s:.0f} s"),
        Check("hang", "rollcall_names_load_batch", bool(named), named[0].strip() if named else stuck.stderr[-300:]),
        Check(
            "hang",
            "healthy_not_reported",
            healthy.returncode == 0 and "hang:" not in healthy.stderr,
            f"exit {healthy.returncode}; {'no report' if 'hang:' not in healthy.stderr else 'reported'}",
        ),
    ]


def step_steps(result: dict[str, Any], work: Path, *, steps: int = 60) -> list[Check]:
    me = str(Path(__file__).resolve())
    runs: dict[str, dict[str, Any]] = {}
    last_on: tuple[subprocess.CompletedProcess[str], Path] | None = None
    for setting in ("off", "on", "off", "on"):  # alternated: the ratio of medians is the report's cost on a GPU
        logs = work / f"steps-{setting}-{len(runs)}"
        logs.mkdir()
        env = {**_env(), "CUDA_VISIBLE_DEVICES": "", "NUMARUN_STEP_INTERVAL": "1", "STEPS_OUT": str(logs)}
        cmd = [*NUMARUN, "run", "--standalone", "--nproc-per-node", "2", "--log-dir", str(logs)]
        cmd += ["--step-report", setting, me, "--probe-steps", "1", "--steps-n", str(steps)]
        print(f"+ two ranks on one GPU, rank 1 slower, --step-report {setting}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=work, env=env)
        medians = [json.loads(f.read_text())["step_s"] for f in sorted(logs.glob("rank*.json"))]
        runs[f"{setting}{len(runs)}"] = {"exit": proc.returncode, "stderr": proc.stderr[-4000:], "step_s": medians}
        if setting == "on":
            last_on = (proc, logs)
    assert last_on is not None
    proc, logs = last_on
    result["steps"] = runs
    kept = next(logs.glob("numarun_steps.*/steps.jsonl"), None)
    from numarun.worker.steps import read_records

    return check_steps(
        list(read_records(kept.read_text().splitlines())) if kept else [],
        proc.stderr,
        on=[x for k, v in runs.items() if k.startswith("on") for x in v["step_s"]],
        off=[x for k, v in runs.items() if k.startswith("off") for x in v["step_s"]],
        exits=[v["exit"] for v in runs.values()],
    )


def check_steps(
    records: Sequence[Any], stderr: str, *, on: Sequence[float], off: Sequence[float], exits: Sequence[int]
) -> list[Check]:
    """The step report's GPU checks on what the ``on`` runs wrote (their records, numarun's stderr) and every run's
    median steps."""
    later = [r for r in records if r.step > 1]
    verdict = next((ln for ln in stderr.splitlines() if "=> " in ln), "")
    ratio = statistics.median(on) / statistics.median(off) if on and off else float("nan")
    peak = min((r.peak_bytes or 0 for r in later), default=0)
    return [
        Check("steps", "ran", bool(exits) and all(x == 0 for x in exits), f"exits {list(exits)}"),
        Check(
            "steps",
            "gpu_events",
            bool(later) and all(r.gpu_s is not None and r.gpu_s > 0 for r in later),
            f"{sum(r.gpu_s is not None for r in later)} of {len(later)} records with the step's GPU time",
        ),
        Check(
            "steps",
            "peak_memory",
            peak >= 4 * 2048 * 2048 * 4,  # the model's parameters, in the CUDA allocator
            f"smallest peak {peak / 2**20:.0f} MiB",
        ),
        Check("steps", "slow_rank_named", "=> rank 1 holds the job back: compute" in verdict, verdict.strip()),
        Check(
            "steps",
            "cost",
            ratio <= 1.02,
            f"median step with the report on / off: {ratio:.4f} (goal <= 1.01; passes to 1.02, two runs each)",
        ),
    ]


LAYOUT_OVERRIDES = (
    "model=gpt",
    "model.n_layers=2",
    "model.d_model=256",
    "model.n_heads=4",
    "optim=sgd",
    "optim.grad_clip=0",
    "trainer.batch_size=8",
    "trainer.steps=6",
    "trainer.log_interval=1",
    "trainer.progress=false",
    "trainer.precision=fp32",
)


def step_layout(result: dict[str, Any], work: Path) -> list[Check]:
    losses: dict[str, list[float]] = {}
    for preset in ("ddp", "fsdp"):
        run_dir = work / f"layout-{preset}"
        _run(
            [
                *NUMARUN,
                "run",
                "--standalone",
                "--nproc-per-node",
                "1",
                str(REPO / "scripts" / "train.py"),
                *LAYOUT_OVERRIDES,
                f"parallel={preset}",
                f"hydra.run.dir={run_dir}",
            ],
            timeout=200,
            cwd=work,
        )
        losses[preset] = [float(r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    result["layout"] = losses
    a, b = losses["ddp"], losses["fsdp"]
    worst = max((abs(x - y) / max(abs(x), 1e-9) for x, y in zip(a, b)), default=float("inf"))
    return [
        Check(
            "layout",
            "fsdp_matches_ddp_on_cuda",
            len(a) == len(b) > 0 and worst <= 1e-4,
            f"{len(a)} steps, worst relative difference {worst:.2e} (ddp {a[:3]}, fsdp {b[:3]})",
        )
    ]


def versions() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    try:
        info["gpu"] = _run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], timeout=60
        ).strip()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        info["gpu"] = f"unknown ({e})"
    try:
        info["torch"] = _run(
            [sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], timeout=120
        ).strip()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        info["torch"] = f"unknown ({e})"
    return info


def render_markdown(result: Mapping[str, Any], checks: Sequence[Check]) -> str:
    """The summary pasted into docs/gpu.md."""
    v = result.get("versions", {})
    failed = [c for c in checks if not c.ok]
    lines = [
        f"### GPU check, {v.get('date', '?')}: {'PASS' if not failed else f'FAIL ({len(failed)} of {len(checks)})'}",
        "",
        f"- GPU (name, driver, memory): {v.get('gpu', '?')}",
        f"- torch (CUDA): {v.get('torch', '?')}; Python {v.get('python', '?')}; kernel {v.get('kernel', '?')};"
        f" {v.get('cpus', '?')} CPUs",
        "",
        "| step | check | result | detail |",
        "|---|---|---|---|",
    ]
    for c in checks:
        lines.append(f"| {c.step} | {c.name} | {'pass' if c.ok else '**FAIL**'} | {c.detail.replace('|', '/')} |")
    train = result.get("train")
    if train and any(train["tokens_per_s"].values()):
        done = max(len(x) for x in train["tokens_per_s"].values())
        lines += [
            "",
            f"Training tokens/s (median of steps after {train['warmup_steps']}, per round):",
            "",
            "| launcher | " + " | ".join(f"round {i}" for i in range(done)) + " |",
            "|---|" + "---|" * done,
        ]
        for who, rates in train["tokens_per_s"].items():
            cells = [f"{x:.0f}" for x in rates] + ["-"] * (done - len(rates))
            lines.append(f"| {who} | " + " | ".join(cells) + " |")
        if train.get("ratio") is not None:
            lines.append(f"\nratio numarun / torchrun: **{train['ratio']:.3f}**")
    h2d = result.get("h2d")
    if h2d:
        b, r = h2d["numarun"]["gbps"], h2d["raw"]["gbps"]
        lines += [
            "",
            f"Copy bandwidth, GB/s ({h2d['numarun']['size_bytes'] // 2**20} MiB x {h2d['numarun']['iters']}):",
            "",
            "| direction | numarun pinned | numarun pageable | raw pinned | raw pageable |",
            "|---|---|---|---|---|",
        ]
        for d in ("h2d", "d2h"):
            figures = (b[f"{d}_pinned"], b[f"{d}_pageable"], r[f"{d}_pinned"], r[f"{d}_pageable"])
            lines.append(f"| {d} | " + " | ".join(f"{x:.2f}" for x in figures) + " |")
    skipped = result.get("skipped")
    if skipped:
        lines += ["", "Skipped:", ""] + [f"- {x}" for x in skipped]
    errors = result.get("errors")
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in errors]
    return "\n".join(lines) + "\n"


def run_all(args: argparse.Namespace) -> int:
    out_dir = Path(args.out) if args.out else None
    result: dict[str, Any] = {"versions": versions(), "errors": []}
    checks: list[Check] = []
    t0 = time.monotonic()
    md = ""
    with tempfile.TemporaryDirectory(prefix="numarun-gpu-check.") as d:
        work = Path(d)
        steps = {
            "topo": lambda: step_topo(result),
            "binding": lambda: step_binding(result, work),
            "doctor": lambda: step_doctor(result),
            "health": lambda: step_health(result),
            # h2d before train: it is short, and a time limit hitting the long step keeps its figures.
            "h2d": lambda: step_h2d(result, work, size=args.h2d_size, iters=args.h2d_iters),
            "mesh": lambda: step_mesh(result, work),
            "hang": lambda: step_hang(result, work),
            "layout": lambda: step_layout(result, work),
            "steps": lambda: step_steps(result, work),
            "nccl": lambda: step_nccl(result, work),
            "train": lambda: step_train(
                result,
                work,
                rounds=args.rounds,
                steps=args.steps,
                min_ratio=args.min_ratio,
                overrides=args.train_override or GPU_TRAIN_OVERRIDES,
            ),
        }
        for name, fn in steps.items():
            if name in args.skip:
                continue
            started = time.monotonic()
            try:
                got = fn()
            except Exception as e:  # one failed step must not hide the others' figures
                got = [Check(name, "ran", False, f"{type(e).__name__}: {e}")]
                result["errors"].append(f"{name}: {type(e).__name__}: {e}")
            for c in got:
                print(f"{'PASS' if c.ok else 'FAIL'} {c.step}.{c.name}: {c.detail}", flush=True)
            checks += got
            result.setdefault("seconds", {})[name] = round(time.monotonic() - started, 1)
            # After every step: a run cut short by a time limit still leaves what it measured.
            md = _write(out_dir, result, checks, total=time.monotonic() - t0)
    print(md)
    return 0 if result["passed"] else 1


def _write(out_dir: Path | None, result: dict[str, Any], checks: Sequence[Check], *, total: float) -> str:
    result.setdefault("seconds", {})["total"] = round(total, 1)
    result["checks"] = [asdict(c) for c in checks]
    result["passed"] = all(c.ok for c in checks) and bool(checks)
    md = render_markdown(result, checks)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(out_dir / "gpu-check.json", json.dumps(result, indent=1, default=str) + "\n")
        write_atomic(out_dir / "gpu-check.md", md)
    return md


# -- self-test: the same comparisons on recorded data, and the binding check live ----------------


def recorded_h200_checks(capture_file: Path, sysfs_tarball: Path) -> list[Check]:
    """Check 1 on the recorded H200 VM: sysfs tree + NVML answers vs its nvidia-smi outputs."""
    from numarun.topology.archive import safe_extract
    from numarun.topology.discover import merge_nvml
    from numarun.topology.nvml import reading_from_record
    from numarun.topology.sysfs import read_sysfs

    capture = json.loads(capture_file.read_text())
    with tempfile.TemporaryDirectory(prefix="numarun-selftest.") as d:
        with tarfile.open(sysfs_tarball) as tf:
            safe_extract(tf, Path(d))
        topo = merge_nvml(read_sysfs(Path(d)), reading_from_record(capture["nvml"]))
    return check_topology(
        topo.to_dict(), parse_smi_q(capture["smi_q"]), parse_topo_m(capture["smi_topo_m"], "capture smi_topo_m")
    )


def self_test(args: argparse.Namespace) -> int:
    checks = recorded_h200_checks(Path(args.capture), Path(args.sysfs))
    with tempfile.TemporaryDirectory(prefix="numarun-selftest.") as d:
        result: dict[str, Any] = {}
        checks += step_binding(result, Path(d))
        if "doctor" not in args.skip:
            checks += step_doctor(result)
    for c in checks:
        print(f"{'PASS' if c.ok else 'FAIL'} {c.step}.{c.name}: {c.detail}")
    ok = all(c.ok for c in checks)
    print(f"self-test: {'PASS' if ok else 'FAIL'} ({sum(c.ok for c in checks)}/{len(checks)})")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--self-test", action="store_true", help="recorded H200 data + the binding check on this machine")
    p.add_argument("--probe", metavar="FILE", help="(as a job's rank) write this process's binding to FILE")
    p.add_argument("--probe-hang", choices=("stuck", "healthy"), help="(as a job's rank) the NCCL hang worker")
    p.add_argument("--hang-steps", type=int, default=25, help="steps of the healthy hang worker")
    p.add_argument("--probe-steps", type=int, metavar="SLOW", help="(as a job's rank) the step report's GPU worker")
    p.add_argument("--probe-nccl", type=int, metavar="SLOW", help="(as a job's rank) the step report's NCCL worker")
    p.add_argument("--steps-n", type=int, default=60, help="steps of the step report's GPU worker")
    p.add_argument("--out", default=os.environ.get("OUT"), help="directory for gpu-check.json/.md (default $OUT)")
    p.add_argument("--rounds", type=int, default=3, help="training rounds per launcher (default 3)")
    p.add_argument("--steps", type=int, default=60, help="training steps per run (default 60)")
    p.add_argument("--min-ratio", type=float, default=MIN_TRAIN_RATIO, help="numarun/torchrun tokens/s target")
    p.add_argument(
        "--train-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="trainer overrides replacing the GPU config (repeat; for trying the script on a CPU)",
    )
    p.add_argument("--h2d-size", default="1GiB")
    p.add_argument("--h2d-iters", type=int, default=10)
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=("topo", "binding", "doctor", "health", "train", "h2d", "mesh", "hang", "layout", "steps", "nccl"),
    )
    p.add_argument("--capture", default=str(FIXTURES / "live-h200-vm" / "capture.json"))
    p.add_argument("--sysfs", default=str(FIXTURES / "live-h200-vm" / "sysfs.tar.gz"))
    args = p.parse_args(argv)
    if args.probe:
        probe(Path(args.probe))
        return 0
    if args.probe_hang:
        probe_hang(args.probe_hang, args.hang_steps)
        return 0
    if args.probe_steps is not None:
        probe_steps(args.probe_steps, args.steps_n)
        return 0
    if args.probe_nccl is not None:
        probe_nccl(args.probe_nccl, args.steps_n)
        return 0
    if args.self_test:
        return self_test(args)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
