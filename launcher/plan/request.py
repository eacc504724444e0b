"""The request the planning options make (:func:`request_for`), and torchrun's words for ``--nproc-per-node``.

The options themselves (``--topology``, ``--nproc-per-node``, ``--binding``, ``--mem-policy``, ``--nic-policy``)
are declared once, with the other launch options, in :class:`numarun.options.launch.LaunchOptions`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..options.launch import LaunchOptions
from .model import PlanRequest

if TYPE_CHECKING:
    from ..topology.model import Topology
from .nic import NIC_VARIABLES

# Variables the plan may set; a value the user already set is kept and reported.
USER_ENV_VARIABLES: tuple[str, ...] = ("OMP_NUM_THREADS", "CUDA_DEVICE_ORDER", *NIC_VARIABLES)


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


def request_from_options(options: LaunchOptions, environ: Mapping[str, str]) -> PlanRequest:
    """The request of the planning options in environment ``environ``."""
    return PlanRequest(
        mesh=options.mesh,
        nnodes=options.nnodes,
        nproc_per_node=options.nproc_per_node,
        binding=options.binding,
        mem_policy=options.mem_policy,
        nic_policy=options.nic_policy,
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        cuda_device_order=environ.get("CUDA_DEVICE_ORDER"),
        user_env={k: environ[k] for k in USER_ENV_VARIABLES if k in environ},
    )


def request_for(
    options: LaunchOptions,
    environ: Mapping[str, str],
    topology: Topology,
    *,
    allowed_gpu_minors: tuple[int, ...] | None = None,
) -> PlanRequest:
    """:func:`request_from_options` with torchrun's ``--nproc-per-node`` words resolved on ``topology``.

    ``allowed_gpu_minors``: the GPUs a scheduler's device cgroup lets the ranks open (by minor number)."""
    return counted(replace(request_from_options(options, environ), allowed_gpu_minors=allowed_gpu_minors), topology)


def counted(request: PlanRequest, topology: Topology) -> PlanRequest:
    """``request`` with torchrun's word for ``--nproc-per-node`` counted on ``topology`` (:func:`resolve_nproc`)."""
    from ..topology.visible import visible_gpus

    word = request.nproc_per_node
    if not isinstance(word, str):
        return request
    num_gpus = (
        len(
            visible_gpus(
                topology,
                request.cuda_visible_devices,
                request.cuda_device_order or "PCI_BUS_ID",
                request.allowed_gpu_minors,
            )
        )
        if word in ("gpu", "auto")
        else 0
    )
    xpus = _xpu_count() if word == "xpu" else 0
    return resolve_nproc(request, num_gpus, cpus=len(topology.usable_cpus) or cpu_count(), xpus=xpus)


def _xpu_count() -> int:
    import torch

    xpu = getattr(torch, "xpu", None)
    return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0
