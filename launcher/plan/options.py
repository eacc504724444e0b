"""The planning flags shared by ``numarun plan`` and ``numarun run``, and the request they make.

``add_plan_options(parser)`` registers ``--topology``, ``--nproc-per-node``, ``--binding``
(alias ``--numa-binding``, torchrun's spelling), ``--mem-policy`` and ``--nic-policy``;
``request_from_args(args, environ)`` turns them plus the user's environment into a
:class:`PlanRequest`. The environment is read here, in the command layer, never in planning.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from ..envvars import VISIBLE_GPUS
from .model import BindingMode, MemPolicy, NicPolicy, PlanRequest
from .nic import NIC_VARIABLES

# Variables the plan may set; a value the user already set is kept and reported.
USER_ENV_VARIABLES: tuple[str, ...] = ("OMP_NUM_THREADS", "CUDA_DEVICE_ORDER", *NIC_VARIABLES)


def _choices(enum_cls: type) -> str:
    return ", ".join(m.value for m in enum_cls)


def parse_nproc(text: str) -> int | None:
    """``"4"`` -> 4; ``"auto"``/``"gpu"`` -> None (one rank per visible GPU, or 1)."""
    if text in ("auto", "gpu"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"bad --nproc-per-node {text!r}: expected a positive integer or 'auto'")
    return value


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
        help="local ranks (default: one per visible GPU, or 1 without GPUs)",
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


def request_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> PlanRequest:
    """The request for ``args`` (from :func:`add_plan_options`) in environment ``environ``."""
    return PlanRequest(
        nproc_per_node=getattr(args, "nproc_per_node", None),
        binding=getattr(args, "binding", BindingMode.EXCLUSIVE),
        mem_policy=getattr(args, "mem_policy", MemPolicy.BIND),
        nic_policy=getattr(args, "nic_policy", NicPolicy.NODE),
        # the node's own GPU indices when a scheduler's device cgroup renumbered CUDA's view
        cuda_visible_devices=environ.get(VISIBLE_GPUS, environ.get("CUDA_VISIBLE_DEVICES")),
        cuda_device_order=environ.get("CUDA_DEVICE_ORDER"),
        user_env={k: environ[k] for k in USER_ENV_VARIABLES if k in environ},
    )
