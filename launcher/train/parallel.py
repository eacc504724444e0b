"""Spread the model over the ranks by the layout's dimensions (config group ``parallel``; docs/trainer.md).

One mesh over ``pp, dp_replicate, dp_shard, cp, tp`` (``init_device_mesh``, row-major: tp innermost), and each
parallelism applied by dimension name in a fixed order, as torchtitan's parallelize functions do: the model split
into this rank's pipeline stages (``pp``), then in each stage tensor parallelism (``tp``: ``parallelize_module``),
then the data dimensions (FSDP2 ``fully_shard`` on the (dp_replicate, dp_shard) mesh: sharded, replicated or
both), then the stages handed to a ``torch.distributed.pipelining`` schedule. A layout with only replicas
(no pp, tp or shards) gets DistributedDataParallel, with numarun.comm's hooks for ``comm.allreduce=hierarchical``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ..config.schema import CommMode
from ..layout import DIMS, Layout
from .stages import PipelinePlan

log = logging.getLogger(__name__)


def tp_plan(model: nn.Module) -> dict[str, Any]:
    """Column/row-parallel styles for every block :mod:`numarun.train.models` a module (or stage) holds."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"col": ColwiseParallel, "row": RowwiseParallel}
    return {
        f"blocks.{key}.{name}": styles[style]()
        for key in getattr(model, "blocks", {})
        for name, style in getattr(type(model), "TP_STYLES", {}).items()
    }


def stage_module(model: nn.Module, blocks: Sequence[int], *, first: bool, last: bool) -> nn.Module:
    """The part of ``model`` one pipeline stage runs: the input layer on the first stage, ``blocks``, the output
    layer on the last; the rest None. The modules are ``model``'s own (no copy), under their own names, so that a
    parameter is called the same in every layout (checkpoints and the tensor-parallel plan name them)."""
    part = type(model).__new__(type(model))
    nn.Module.__init__(part)
    for key, value in vars(model).items():
        if not key.startswith("_") and key != "training":
            object.__setattr__(part, key, value)  # widths and names the forward reads
    held: nn.ModuleDict = getattr(model, "blocks")  # noqa: B009  (typed: nn.Module.__getattr__ says Tensor | Module)
    for name in getattr(type(model), "INPUT"):  # noqa: B009
        setattr(part, name, getattr(model, name) if first else None)
    part.blocks = nn.ModuleDict({str(i): held[str(i)] for i in blocks})
    for name in getattr(type(model), "OUTPUT"):  # noqa: B009
        setattr(part, name, getattr(model, name) if last else None)
    return part.train(model.training)


@dataclass(frozen=True, eq=False)
class Pipeline:
    """This rank's stages and the schedule that runs them."""

    plan: PipelinePlan
    schedule: Any
    stage_indices: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Parallelized:
    """The model as this rank trains it."""

    layout: Layout
    """Resolved: every degree known."""
    parts: tuple[nn.Module, ...]
    """What this rank trains: the whole model (maybe DDP- or FSDP-wrapped), or its pipeline stages' modules."""
    mesh: Any
    """The DeviceMesh over :data:`~numarun.layout.DIMS`."""
    dp_rank: int
    dp_size: int
    pipeline: Pipeline | None = None

    @property
    def loss_ranks(self) -> int:
        """How many ranks compute the loss (the last stage's tp x dp ranks), each of dp's shares tp times."""
        return (
            self.layout.size("dp_replicate")
            * self.layout.size("dp_shard")
            * self.layout.size("cp")
            * self.layout.size("tp")
        )

    def forward_backward(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        scale: float,
        sync: bool,
        autocast: AbstractContextManager[Any],
    ) -> torch.Tensor | None:
        """Forward and backward of one (accumulation) micro-batch, the loss scaled by ``scale`` before backward;
        ``sync``: the last micro-batch of the step (data-parallel gradients are reduced on it). Returns the scaled
        loss (detached) where this rank computes it, else None."""
        from .models import loss_fn

        if self.pipeline is None:
            model = self.parts[0]
            guard: AbstractContextManager[Any] = nullcontext()
            # DDP and FSDP2 reduce the gradients once, on the last micro-batch (typed: nn.Module.__getattr__)
            if hasattr(model, "no_sync") and not sync:
                guard = getattr(model, "no_sync")()  # noqa: B009
            elif hasattr(model, "set_requires_gradient_sync"):
                getattr(model, "set_requires_gradient_sync")(sync)  # noqa: B009
            with guard:
                with autocast:
                    loss = loss_fn(model(x), y) * scale
                loss.backward()
            return loss.detach()
        # the schedule computes the loss of each of its microbatches with loss_fn * scale (set at build)
        p = self.pipeline
        has_last = p.plan.num_stages - 1 in p.stage_indices
        losses: list[torch.Tensor] | None = [] if has_last else None
        args = (x,) if 0 in p.stage_indices else ()  # the first stage takes the input
        with autocast:
            p.schedule.step(*args, target=y if has_last else None, losses=losses)
        if losses is None:
            return None
        return torch.stack([t.detach().float() for t in losses]).sum()

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]


def build_mesh(layout: Layout, ctx: Any) -> Any:
    """The mesh over :data:`DIMS`: numarun.init()'s own when the launcher declared this layout (it hands the
    trainer's layout as the job's mesh, and placed the ranks for it), else a new one of the same form."""
    from torch.distributed.device_mesh import init_device_mesh

    declared = getattr(ctx, "mesh_layout", None)
    if declared is not None and (declared.names, declared.shape) == (layout.names, layout.shape):
        log.debug("the trainer's layout %s is the job's mesh: numarun.init()'s DeviceMesh serves", layout.text)
        return ctx.mesh
    return init_device_mesh(ctx.device.type, layout.shape, mesh_dim_names=layout.names)


def parallelize(
    model: nn.Module, ctx: Any, cfg: Any, layout: Layout, pipeline_plan: PipelinePlan | None
) -> Parallelized:
    """``model`` (built alike on every rank) spread over the ranks as ``layout`` says; ``layout`` resolved and its
    pipeline planned by :func:`numarun.train.preflight.check_layout` (every rule already checked)."""
    device = ctx.device
    rank = ctx.rank
    mesh = build_mesh(layout, ctx)
    coords = layout.coords(rank)
    dp_rank, dp_size = layout.dp_rank(rank), layout.dp
    if pipeline_plan is not None:
        indices = pipeline_plan.stages_of(coords["pp"])
        last = pipeline_plan.num_stages - 1
        parts = [stage_module(model, pipeline_plan.blocks_of(s), first=s == 0, last=s == last) for s in indices]
    else:
        indices = ()
        parts = [model]
    del model  # the blocks of other stages go with it
    only_replicas = layout.size("pp") == layout.size("tp") == layout.size("dp_shard") == layout.size("cp") == 1
    wrapped: list[nn.Module] = []
    for part in parts:
        part = part.to(device)
        if layout.size("tp") > 1:
            from torch.distributed.tensor.parallel import parallelize_module

            parallelize_module(part, mesh["tp"], tp_plan(part))
        if dp_size > 1 and only_replicas:
            part = _ddp(part, ctx, cfg.comm)
        elif dp_size > 1:
            # FSDP2 on the 2D (dp_replicate, dp_shard) mesh: sharded over dp_shard, replicated over dp_replicate
            # (either may be 1). Per block first, so that only one block's parameters are gathered at a time.
            from torch.distributed.fsdp import fully_shard

            dp_mesh, reshard = mesh["dp_replicate", "dp_shard"], bool(cfg.parallel.reshard_after_forward)
            for block in [*getattr(part, "blocks", {}).values(), part]:
                fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
        wrapped.append(part)
    pipeline = _pipeline(pipeline_plan, wrapped, indices, mesh, device, cfg) if pipeline_plan is not None else None
    log.info(
        "rank %d: layout %s at %s%s",
        rank,
        layout.text,
        ",".join(f"{d}={coords[d]}" for d in DIMS),
        f"; stages {list(indices)} of {pipeline_plan.describe()}" if pipeline_plan is not None else "",
    )
    return Parallelized(
        layout=layout, parts=tuple(wrapped), mesh=mesh, dp_rank=dp_rank, dp_size=dp_size, pipeline=pipeline
    )


def _ddp(model: nn.Module, ctx: Any, comm_cfg: Any) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..comm.allreduce import apply_comm, ddp_bucket_mb

    device = ctx.device
    bucket_mb = ddp_bucket_mb(getattr(comm_cfg, "bucket_mb", None), comm_cfg.allreduce)
    bucket: dict[str, Any] = {"bucket_cap_mb": bucket_mb} if bucket_mb is not None else {}
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **bucket)
    if comm_cfg.allreduce != CommMode.FLAT.value or comm_cfg.compression:
        chunk_mb = getattr(comm_cfg, "chunk_mb", None)
        apply_comm(
            ddp,
            comm_cfg.allreduce,
            comm_cfg.compression,
            ctx,
            overlap=bool(getattr(comm_cfg, "overlap", True)),
            chunk_bytes=None if chunk_mb is None else int(float(chunk_mb) * 2**20),
        )
    return ddp


def _pipeline(
    plan: PipelinePlan, parts: list[nn.Module], indices: tuple[int, ...], mesh: Any, device: torch.device, cfg: Any
) -> Pipeline:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    from .models import loss_fn

    t = cfg.trainer
    microbatch = (
        int(t.batch_size) // (mesh["dp_replicate"].size() * mesh["dp_shard"].size() * t.grad_accum) // plan.microbatches
    )
    group = mesh["pp"].get_group()
    last = plan.num_stages - 1
    # static shapes (both given): no metadata exchange before the first step
    stages = [
        PipelineStage(
            part,
            s,
            plan.num_stages,
            device,
            input_args=_example(part, "input" if s == 0 else "hidden", microbatch, device),
            output_args=_example(part, "output" if s == last else "hidden", microbatch, device),
            group=group,
        )
        for part, s in zip(parts, indices, strict=True)
    ]
    scale = 1.0 / (plan.microbatches * t.grad_accum)  # a mean over the step's samples, as one rank's loss is

    def scaled_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output, target) * scale

    cls = get_schedule_class(plan.schedule)
    # scale_grads=False: the loss carries the 1/microbatches (and 1/grad_accum) itself, as torchtitan's does
    schedule = cls(
        stages if plan.looped else stages[0], n_microbatches=plan.microbatches, loss_fn=scaled_loss, scale_grads=False
    )
    return Pipeline(plan=plan, schedule=schedule, stage_indices=indices)


def _example(part: Any, where: str, batch: int, device: torch.device) -> torch.Tensor:
    # the model whose ``example`` describes the stage's tensors (through an FSDP or DDP wrapper)
    t = getattr(part, "module", part).example(where, batch).to(device)
    # the metadata records requires_grad: activations and outputs carry gradients back
    return t.requires_grad_(True) if t.is_floating_point() else t


def clip_grad_norm(par: Parallelized, max_norm: float) -> float:
    """The norm of the whole model's gradient, over every stage, shard and replica; scales the gradients to
    ``max_norm`` when it is larger (``max_norm`` <= 0: only measures). One all-reduce of one number.

    Each rank adds its gradients' local squares, each divided by the number of ranks holding that same
    piece: the ranks of its stage (world / pp) over the ranks it is sharded across (the product of the mesh
    dimensions its DTensor placement shards). The sum over the world is then the sum over every element once.
    """
    from torch.distributed.tensor import DTensor

    params = [p for p in par.parameters() if p.grad is not None]
    stage_ranks = dist.get_world_size() // par.layout.size("pp")
    device = params[0].grad.device if params and params[0].grad is not None else torch.device("cpu")
    local = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        g = p.grad
        assert g is not None  # params holds only parameters with a gradient
        if isinstance(g, DTensor):
            # Shard or FSDP2's _StridedShard over a TP shard (not a Shard subclass, is_shard() False)
            sharded = math.prod(
                size
                for size, placement in zip(g.device_mesh.shape, g.placements, strict=True)
                if not (placement.is_replicate() or placement.is_partial())
            )
            local += g.to_local().double().pow(2).sum() * (sharded / stage_ranks)
        else:
            local += g.double().pow(2).sum() / stage_ranks
    dist.all_reduce(local)
    total = float(local.sqrt())
    if 0 < max_norm < total:
        factor = max_norm / (total + 1e-6)
        for p in params:
            assert p.grad is not None
            p.grad.mul_(factor)
    return total
