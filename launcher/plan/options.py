"""The planning flags shared by ``numarun plan`` and ``numarun run``, and the request they make.

``add_plan_options(parser)`` registers ``--topology``, ``--nproc-per-node``, ``--binding``
(alias ``--numa-binding``, torchrun's spelling), ``--mem-policy``, ``--nic-policy`` and ``--mesh``;
``request_from_args(options, environ)`` turns their values plus the user's environment into a
:class:`PlanRequest`.
"""

from __future__ import annotations

import argparse
import enum
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..argtypes import MAX_LOCAL_RANKS
from ..errors import UsageError
from .model import BindingMode, MemPolicy, NicPolicy, PlanRequest

if TYPE_CHECKING:
    from ..topology.model import Topology
from .nic import NIC_VARIABLES

# Variables the plan may set; a value the user already set is kept and reported.
USER_ENV_VARIABLES: tuple[str, ...] = ("OMP_NUM_THREADS", "CUDA_DEVICE_ORDER", *NIC_VARIABLES)


def _choices(enum_cls: type[enum.Enum]) -> str:
    return ", ".join(m.value for m in enum_cls)


NPROC_KEYWORDS = ("auto", "cpu", "gpu", "xpu")
"""torchrun's words for ``--nproc-per-node`` (torch.distributed.run.determine_local_world_size)."""


def parse_nproc(text: str) -> int | str | None:
    """``"4"`` -> 4; torchrun's ``auto``/``cpu``/``gpu``/``xpu`` kept as words (see :func:`resolve_nproc`)."""
    if text in NPROC_KEYWORDS:
        return text
    try:
        value = int(text) if len(text) <= 30 else 0
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LOCAL_RANKS:  # each rank is a binding and a process: bounded before any is made
        raise argparse.ArgumentTypeError(
            f"bad --nproc-per-node {text!r}: expected a positive integer up to {MAX_LOCAL_RANKS} "
            f"or one of {', '.join(NPROC_KEYWORDS)}"
        )
    return value


def cpu_count() -> int:
    """CPUs this process may use, as torch counts them for ``--nproc-per-node cpu``."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_nproc(request: PlanRequest, num_gpus: int, *, cpus: int, xpus: int = 0) -> PlanRequest:
    """The request with torchrun's word for ``--nproc-per-node`` turned into a rank count.

    As torchrun defines them: ``gpu`` one rank per visible GPU (an error without one);
    ``auto`` one per visible GPU, else one per usable CPU; ``cpu`` one per usable CPU (ranks
    bound to CPUs only); ``xpu`` one per XPU torch sees (numarun binds those ranks to CPUs
    and memory only). ``num_gpus`` counts the visible GPUs.
    """
    word = request.nproc_per_node
    if not isinstance(word, str):
        return request
    if word == "gpu":
        if not num_gpus:
            raise UsageError("bad --nproc-per-node 'gpu': no GPU is visible here; expected a number, cpu or auto")
        return replace(request, nproc_per_node=num_gpus)
    if word == "auto":
        return replace(request, nproc_per_node=num_gpus or cpus)
    if word == "xpu":
        if not xpus:
            raise UsageError("bad --nproc-per-node 'xpu': torch sees no XPU here; expected a number, cpu, gpu or auto")
        return replace(request, nproc_per_node=xpus, cuda_visible_devices="")
    return replace(request, nproc_per_node=cpus, cuda_visible_devices="")  # cpu


def parse_binding(text: str) -> BindingMode:
    try:
        return BindingMode(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --binding {text!r}: expected one of {_choices(BindingMode)}") from None


def parse_mem_policy(text: str) -> MemPolicy:
    try:
        return MemPolicy(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --mem-policy {text!r}: expected one of {_choices(MemPolicy)}") from None


def parse_nic_policy(text: str) -> NicPolicy:
    try:
        return NicPolicy(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --nic-policy {text!r}: expected one of {_choices(NicPolicy)}") from None


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    """Register the planning flags on ``parser`` (dests: topology, nproc_per_node, binding, mem_policy, nic_policy)."""
    parser.add_argument(
        "--topology", metavar="PATH", default=None,
        help="topology source: a machine root holding sys/ and proc/, a 'numarun topo --json' snapshot, "
        "hwloc XML, or saved 'nvidia-smi topo -m' text (default: $NUMARUN_TOPOLOGY, else this machine)",
    )
    parser.add_argument(
        "--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=parse_nproc, default=None, metavar="N",
        help="local ranks: a number, or torchrun's auto (one per GPU, else per CPU), gpu, cpu or xpu "
        "(default: one per visible GPU, or 1 without GPUs)",
    )
    parser.add_argument(
        "--binding", "--numa-binding", "--numa_binding", dest="binding", type=parse_binding,
        default=BindingMode.EXCLUSIVE, metavar="MODE",
        help=f"CPU binding: {_choices(BindingMode)} (default exclusive)",
    )
    parser.add_argument(
        "--mem-policy", dest="mem_policy", type=parse_mem_policy, default=MemPolicy.BIND, metavar="POLICY",
        help=f"memory policy per rank: {_choices(MemPolicy)} (default bind)",
    )
    parser.add_argument(
        "--nic-policy", dest="nic_policy", type=parse_nic_policy, default=NicPolicy.NODE, metavar="POLICY",
        help="NCCL_IB_HCA/NCCL_SOCKET_IFNAME: 'node' = one list of the node's compute NICs for every rank "
        "(default); 'per-rank' = each rank's closest NIC only",
    )
    # read by numarun.plan.layout.parse_mesh where the plan is made, so that a bad value names its source
    parser.add_argument(
        "--mesh", dest="mesh", default=None, metavar="SPEC",
        help="parallel layout, outermost first, e.g. pp=2,dp_shard=-1,tp=4 (names pp, dp_replicate, dp_shard, cp, tp; "
        "-1: the rest): each local rank drives the GPU that puts tp's groups on the fastest links, then cp's, "
        "dp_shard's and dp_replicate's (docs/layouts.md)",
    )


def request_from_args(args: Any, environ: Mapping[str, str]) -> PlanRequest:
    """The request for ``args`` (the planning options' values, by dest) in environment ``environ``."""
    mesh = getattr(args, "mesh", None)
    where = args.setting("mesh").where if mesh is not None and callable(getattr(args, "setting", None)) else "--mesh"
    nnodes = getattr(args, "nnodes", None)
    return PlanRequest(
        mesh=None if mesh is None else str(mesh), mesh_where=where,
        nnodes=str(nnodes) if nnodes is not None else "1",
        nproc_per_node=getattr(args, "nproc_per_node", None),
        binding=getattr(args, "binding", BindingMode.EXCLUSIVE),
        mem_policy=getattr(args, "mem_policy", MemPolicy.BIND),
        nic_policy=getattr(args, "nic_policy", NicPolicy.NODE),
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        cuda_device_order=environ.get("CUDA_DEVICE_ORDER"),
        user_env={k: environ[k] for k in USER_ENV_VARIABLES if k in environ},
    )


def request_for(
    args: Any, environ: Mapping[str, str], topology: Topology, *,
    allowed_gpu_minors: tuple[int, ...] | None = None,
) -> PlanRequest:
    """:func:`request_from_args` with torchrun's ``--nproc-per-node`` words resolved on ``topology``.

    ``allowed_gpu_minors``: the GPUs a scheduler's device cgroup lets the ranks open (by minor number)."""
    from ..topology.visible import visible_gpus

    request = replace(request_from_args(args, environ), allowed_gpu_minors=allowed_gpu_minors)
    word = request.nproc_per_node
    if not isinstance(word, str):
        return request
    num_gpus = 0
    if word in ("gpu", "auto"):
        num_gpus = len(visible_gpus(topology, request.cuda_visible_devices, request.cuda_device_order or "PCI_BUS_ID",
                                    request.allowed_gpu_minors))
    xpus = _xpu_count() if word == "xpu" else 0
    return resolve_nproc(request, num_gpus, cpus=len(topology.usable_cpus) or cpu_count(), xpus=xpus)


def _xpu_count() -> int:
    import torch

    xpu = getattr(torch, "xpu", None)
    return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0
