"""Wrap a model for the chosen parallelism (config group ``parallel``).

ddp: DistributedDataParallel (with numarun.comm's hook for ``comm.allreduce=hierarchical``); fsdp: FSDP2 on all
ranks; hsdp: FSDP2 on the ("inter", "intra") mesh, replicated across nodes; tp: ``parallelize_module`` on
"intra", gradients averaged across nodes by :func:`sync_tp_grads`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ..config.schema import CommMode, ParallelKind
from ..errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Wrapped:
    """The model to train and how its data is split."""

    model: nn.Module
    kind: ParallelKind
    dp_rank: int
    dp_size: int
    inter_group: Any = None  # tp: averages gradients across nodes (None: one node)


def tp_plan(model: nn.Module) -> dict[str, Any]:
    """Column/row-parallel styles for every block of :mod:`numarun.train.models`."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from .models import Gpt, Mlp

    plan: dict[str, Any] = {}
    if isinstance(model, Mlp):
        for i in range(len(model.blocks)):
            plan[f"blocks.{i}.up"] = ColwiseParallel()
            plan[f"blocks.{i}.down"] = RowwiseParallel()
    elif isinstance(model, Gpt):
        for i in range(len(model.blocks)):
            for name in ("attn.q", "attn.k", "attn.v", "fc"):
                plan[f"blocks.{i}.{name}"] = ColwiseParallel()
            for name in ("attn.proj", "fc_proj"):
                plan[f"blocks.{i}.{name}"] = RowwiseParallel()
    return plan


def _check_tp(model: nn.Module, tp_size: int) -> None:
    from .models import Gpt

    if isinstance(model, Gpt):
        # submodules reached through nn.Module.__getattr__ are typed Tensor | Module
        heads = model.blocks[0].attn.q.out_features // model.blocks[0].attn.head_dim if len(model.blocks) else tp_size  # type: ignore[union-attr,operator]
        if heads % tp_size:
            raise ConfigError(f"bad model.n_heads {heads}: expected a multiple of the ranks per node ({tp_size}) "
                              "with parallel=tp")


def wrap(model: nn.Module, ctx: Any, parallel_cfg: Any, comm_cfg: Any) -> Wrapped:
    kind = ParallelKind(parallel_cfg.kind)
    device = ctx.device
    model = model.to(device)
    world = ctx.world_size
    if kind is ParallelKind.DDP:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from ..comm.allreduce import apply_comm, ddp_bucket_mb

        bucket_mb = ddp_bucket_mb(getattr(comm_cfg, "bucket_mb", None), comm_cfg.allreduce)
        bucket: dict[str, Any] = {"bucket_cap_mb": bucket_mb} if bucket_mb is not None else {}
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **bucket)
        if comm_cfg.allreduce != CommMode.FLAT.value or comm_cfg.compression:
            chunk_mb = getattr(comm_cfg, "chunk_mb", None)
            apply_comm(ddp, comm_cfg.allreduce, comm_cfg.compression, ctx, overlap=bool(getattr(comm_cfg, "overlap", True)),
                       chunk_bytes=None if chunk_mb is None else int(float(chunk_mb) * 2**20))
        return Wrapped(ddp, kind, ctx.rank, world)
    if comm_cfg.allreduce != CommMode.FLAT.value:
        raise ConfigError(f"bad comm.allreduce {comm_cfg.allreduce!r} with parallel={kind.value}: "
                          "expected flat (hierarchical is for ddp)")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if kind is ParallelKind.FSDP:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
        _shard(model, mesh, parallel_cfg.reshard_after_forward, fully_shard)
        return Wrapped(model, kind, ctx.rank, world)
    mesh2d = _mesh(ctx)
    if kind is ParallelKind.HSDP:
        _shard(model, mesh2d, parallel_cfg.reshard_after_forward, fully_shard)
        return Wrapped(model, kind, ctx.rank, world)
    # tp
    from torch.distributed.tensor.parallel import parallelize_module

    tp_size = mesh2d["intra"].size()
    _check_tp(model, tp_size)
    parallelize_module(model, mesh2d["intra"], tp_plan(model))
    inter = ctx.inter_group if ctx.num_nodes > 1 else None
    return Wrapped(model, kind, ctx.node_rank, ctx.num_nodes, inter_group=inter)


def _mesh(ctx: Any) -> Any:
    mesh = getattr(ctx, "mesh", None)
    if mesh is None:
        raise ConfigError("bad layout for parallel=hsdp/tp: nodes run different numbers of ranks; "
                          "expected the same --nproc-per-node on every node")
    return mesh


def _shard(model: nn.Module, mesh: Any, reshard: bool, fully_shard: Any) -> None:
    # per block first, so that only one block's parameters are gathered at a time
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)


def sync_tp_grads(wrapped: Wrapped) -> None:
    """tp across nodes: average every gradient's local shard over the inter-node group."""
    if wrapped.inter_group is None:
        return
    from torch.distributed.tensor import DTensor

    for p in wrapped.model.parameters():
        if p.grad is None:
            continue
        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        dist.all_reduce(g, group=wrapped.inter_group)
        g.div_(wrapped.dp_size)


def grad_norm_clip(model: nn.Module, max_norm: float, kind: ParallelKind) -> float:
    """Clip the global gradient norm; returns the norm before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    if kind is not ParallelKind.TP:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)
    # tp mixes DTensor (sharded) and plain (replicated) gradients: sum squares by placement
    from torch.distributed.tensor import DTensor, Shard

    sharded = torch.zeros((), dtype=torch.float64, device=params[0].device) if params else torch.zeros(())
    replicated = torch.zeros_like(sharded)
    group = None
    for p in params:
        g = p.grad
        assert g is not None  # params holds only parameters with a gradient
        if isinstance(g, DTensor):
            sq = g.to_local().double().pow(2).sum()
            if any(isinstance(pl, Shard) for pl in g.placements):
                sharded += sq
                group = g.device_mesh.get_group()
            else:
                replicated += sq
        else:
            replicated += g.double().pow(2).sum()
    if group is not None:
        dist.all_reduce(sharded, group=group)
    total = float((sharded + replicated).sqrt())
    if max_norm > 0 and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for p in params:
            assert p.grad is not None
            p.grad.mul_(scale)
    return total
