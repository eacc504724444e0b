"""Checks of the trainer's inputs and outputs in the launcher, in one line each, before any run dir exists.

The layout (:func:`check_layout`): the degrees against the world size, the model and the pipeline schedule, once
the launch's shape is known (``numarun run`` checks it with the plan, before any rank starts).

The checkpoint dir can be written (a real probe: root passes ``access(2)`` on a read-only filesystem); with
``trainer.resume``, its checkpoints are trusted and for the same model; with ``data=tokens``, ``data.path``
holds whole tokens, enough of them, every id below ``model.vocab_size``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..argtypes import NodeRange
from ..errors import TRAINER_LAYOUT, ConfigError, LayoutError
from ..layout import Layout

if TYPE_CHECKING:
    from ..config.files import PreparedJob
    from .stages import PipelinePlan

log = logging.getLogger(__name__)


def check_writable_dir(path: Path, *, what: str) -> None:
    """``path`` is, or can be created as, a directory this process can write; creates nothing."""
    probe = path
    while not probe.exists() and not probe.is_symlink() and probe.parent != probe:
        probe = probe.parent
    if probe == path and path.is_symlink():
        raise ConfigError(f"bad {what} {str(path)!r}: it is a symbolic link; expected a real directory")
    if not probe.is_dir():
        raise ConfigError(
            f"bad {what} {str(path)!r}: {str(probe)!r} is not a directory; expected a writable directory path"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".numarun-probe-", dir=probe))
    except OSError as e:
        where = "it" if probe == path else f"it cannot be created in {str(probe)!r}:"
        raise ConfigError(f"bad {what} {str(path)!r}: {where} {e.strerror}; expected a writable directory") from None


def check_token_file(path: str, *, dtype: str, seq_len: int, vocab_size: int, scan: bool = True) -> int:
    """The number of tokens of a valid token file; one-line ConfigError otherwise."""
    import numpy as np

    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"bad data.path {path!r}: {e.strerror}; expected a readable token file") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"bad data.path {path!r}: not a regular file; expected a file of {dtype} token ids")
    item = np.dtype(np.uint16 if dtype == "uint16" else np.int32).itemsize
    if st.st_size % item:
        raise ConfigError(
            f"bad data.path {path!r}: {st.st_size} bytes is not a whole number of {dtype} tokens; "
            f"expected a size that is a multiple of {item} (or data.dtype=int32/uint16 to match the file)"
        )
    tokens = st.st_size // item
    if tokens < seq_len + 2:
        raise ConfigError(f"bad data.path {path!r}: {tokens} tokens; expected at least model.seq_len+2 = {seq_len + 2}")
    if scan:
        data = np.memmap(path, dtype=np.uint16 if dtype == "uint16" else np.int32, mode="r")
        chunk = 1 << 24
        for start in range(0, tokens, chunk):
            part = data[start : start + chunk]
            high, low = int(part.max()), int(part.min())
            if high >= vocab_size or low < 0:
                bad = high if high >= vocab_size else low
                at = start + int(np.argmax(part == bad))
                raise ConfigError(
                    f"bad token id {bad} at position {at} of data.path {path!r}: expected ids from 0 to "
                    f"model.vocab_size-1 = {vocab_size - 1}"
                )
        del data
    return tokens


def check_prepared(job: PreparedJob) -> None:
    """:func:`check_job` for a job the launcher composed (the ``check`` handed to :mod:`numarun.config.compose`)."""
    check_job(job.config, run_dir=job.run_dir)


def check_job(cfg: Any, *, run_dir: Path) -> None:
    """Every check of the module docstring, for one composed trainer config."""
    from ..config.schema import DataKind
    from . import checkpoint

    t = cfg.trainer
    ckpt = Path(os.path.abspath(t.checkpoint_dir)) if t.checkpoint_dir else run_dir / "checkpoints"
    if t.resume and (ckpt.exists() or ckpt.is_symlink()):
        checkpoint.check_trusted(ckpt)  # first: a planted link or file is named as such
    check_writable_dir(ckpt, what="trainer.checkpoint_dir" if t.checkpoint_dir else "checkpoint dir")
    if t.resume and ckpt.exists():
        found = checkpoint.newest_intact(ckpt, report=lambda line: log.warning("%s", line))
        if found is not None:
            meta = json.loads((found[1] / "meta.json").read_text())
            checkpoint.check_model(meta, cfg.model, found[1])
            wanted, optimizer = planned_tensors(cfg)
            checkpoint.check_holds(found[1], wanted, whole=True, optimizer=optimizer)
    if cfg.data.kind == DataKind.TOKENS:
        check_token_file(
            cfg.data.path, dtype=cfg.data.dtype, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size
        )


def planned_tensors(cfg: Any) -> tuple[dict[str, tuple[int, ...]], str]:
    """What a run of ``cfg`` loads on resume, whatever its layout, as DCP keys -> global shapes: the whole model's
    parameters and buffers (built on the meta device: no memory), and its optimizer's state for every parameter
    (which keys, read from a one-parameter optimizer of the same config stepped once; each a parameter's shape or
    a scalar); and the optimizer's name."""
    import torch

    from .models import build_model
    from .optim import build_optimizer

    with torch.device("meta"):
        model = build_model(cfg.model)
    wanted = {f"model.{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    probe = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer(torch.nn.ParameterList([probe]), cfg.optim)
    probe.grad = torch.ones_like(probe)
    opt.step()
    state = {k: v for k, v in opt.state[probe].items() if isinstance(v, torch.Tensor)}
    wanted.update(
        {
            f"optim.state.{name}.{key}": tuple(p.shape) if value.shape == probe.shape else tuple(value.shape)
            for name, p in model.named_parameters()
            if p.requires_grad
            for key, value in state.items()
        }
    )
    return wanted, type(opt).__name__


def check_layout(
    cfg: Any,
    *,
    world_size: int,
    nnodes: int | None,
    nproc_per_node: int | None,
) -> tuple[Layout, PipelinePlan | None]:
    """The resolved layout of a trainer config on ``world_size`` ranks and its pipeline (None without pipeline
    stages); one-line LayoutError for any rule it breaks (docs/trainer.md). The launcher runs it before any rank
    starts, every rank again (under plain torchrun it is the first check)."""
    from ..config.schema import CommMode, ModelKind
    from .stages import plan_pipeline

    layout = Layout.of_degrees(cfg.parallel, nnodes=nnodes, nproc_per_node=nproc_per_node).resolved(world_size)
    m = cfg.model
    if layout.size("tp") > 1:
        if m.kind == ModelKind.GPT and m.n_heads % layout.size("tp"):
            raise LayoutError(
                f"bad parallel.tp {layout.size('tp')}: model.n_heads={m.n_heads} heads cannot be split over "
                f"{layout.size('tp')} ranks; expected a tp that divides model.n_heads",
                where=TRAINER_LAYOUT,
            )
        if m.kind == ModelKind.MLP and (4 * m.hidden_dim) % layout.size("tp"):
            raise LayoutError(
                f"bad parallel.tp {layout.size('tp')}: the MLP's 4 x model.hidden_dim={4 * m.hidden_dim} "
                f"features cannot be split over {layout.size('tp')} ranks; expected a tp that divides it",
                where=TRAINER_LAYOUT,
            )
    only_replicas = layout.size("pp") == layout.size("tp") == layout.size("dp_shard") == layout.size("cp") == 1
    if cfg.comm.allreduce != CommMode.FLAT.value and not only_replicas:
        raise LayoutError(
            f"bad comm.allreduce {cfg.comm.allreduce!r} with layout {layout.text}: expected flat "
            "(the hierarchical all-reduce is DDP's: a layout of replicas only, parallel=ddp)",
            where=TRAINER_LAYOUT,
        )
    t = cfg.trainer
    local_batch = None
    if t.batch_size != "auto":
        bs, per = int(t.batch_size), layout.dp * t.grad_accum
        if bs % per:
            raise LayoutError(
                f"bad trainer.batch_size {bs}: expected a multiple of data-parallel ranks x "
                f"trainer.grad_accum = {layout.dp} x {t.grad_accum} (layout {layout.text})",
                where=TRAINER_LAYOUT,
            )
        local_batch = bs // per
    _check_read(cfg, layout, only_replicas=only_replicas)
    if layout.size("pp") == 1:
        return layout, None
    n_layers, key = (m.n_layers, "model.n_layers") if m.kind == ModelKind.GPT else (m.num_layers, "model.num_layers")
    return layout, plan_pipeline(
        cfg.parallel, pp=layout.size("pp"), n_layers=n_layers, local_batch=local_batch, layers_key=key
    )


def _check_read(cfg: Any, layout: Layout, *, only_replicas: bool) -> None:
    """A key set to a value this layout never reads (``parallel.pp_split`` without pipeline stages, a DDP knob where
    FSDP2 or one rank runs, the batch size search's limits with a batch size given): one line naming it, as for a
    value that breaks a rule: the run would not say it."""
    from ..comm.modes import Compression, parse_compression
    from ..config.schema import CommMode, ParallelConfig, TrainerConfig
    from .stages import schedule_name

    p, c, t, text = cfg.parallel, cfg.comm, cfg.trainer, layout.text
    if t.batch_size != "auto":  # the batch size search's own keys
        for key, unset in (("memory_limit_mb", None), ("auto_max_batch", TrainerConfig.auto_max_batch)):
            if t[key] != unset:
                raise ConfigError(
                    f"bad trainer.{key} {t[key]!r} with trainer.batch_size={t.batch_size}: only the search of "
                    f"trainer.batch_size=auto reads it; expected trainer.batch_size=auto, or no trainer.{key}"
                )

    def refuse(key: str, value: Any, why: str, expected: str) -> LayoutError:
        shown = str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, str) else value
        return LayoutError(f"bad {key} {shown} with layout {text}: {why}; expected {expected}", where=TRAINER_LAYOUT)

    schedule = schedule_name(p.pp_schedule, installed=False)  # a misspelt schedule is named where pp=1 too
    if layout.size("pp") == 1:
        stages = "it has no pipeline stages (parallel.pp=1), nothing reads it"
        for key in ("pp_split", "pp_microbatches", "pp_stages_per_rank"):
            if p[key] is not None:
                value = list(p[key]) if key == "pp_split" else p[key]
                raise refuse(f"parallel.{key}", value, stages, f"parallel.pp > 1, or no parallel.{key}")
        if schedule != ParallelConfig.pp_schedule:
            raise refuse("parallel.pp_schedule", p.pp_schedule, stages, "parallel.pp > 1, or no parallel.pp_schedule")
    ddp = layout.dp > 1 and only_replicas
    flat = c.allreduce == CommMode.FLAT.value
    ddp_only = "DDP's, and no DDP runs here (it does over 2 or more replicas and nothing else: parallel=ddp)"
    hierarchical_only = "it is the hierarchical all-reduce's (comm=hierarchical)"
    for broken, key, value, why, wanted in (  # in order: the first broken rule is named
        (
            not p.reshard_after_forward and not (layout.dp > 1 and not only_replicas),
            "parallel.reshard_after_forward",
            False,
            "FSDP2 shards nothing here (it does with several data-parallel ranks beside pp, tp or dp_shard)",
            "a sharded layout (parallel=fsdp, parallel=hsdp), or no parallel.reshard_after_forward",
        ),
        (
            not ddp and c.bucket_mb is not None,
            "comm.bucket_mb",
            c.bucket_mb,
            ddp_only,
            "parallel=ddp over 2 or more ranks, or no comm.bucket_mb",
        ),
        (
            not ddp and parse_compression(c.compression) is not Compression.NONE,
            "comm.compression",
            c.compression,
            ddp_only,
            "parallel=ddp over 2 or more ranks, or no comm.compression",
        ),
        (not ddp and not flat, "comm.allreduce", c.allreduce, ddp_only, "flat"),
        (
            flat and c.chunk_mb is not None,
            "comm.chunk_mb",
            c.chunk_mb,
            hierarchical_only,
            "comm=hierarchical, or no comm.chunk_mb",
        ),
        (flat and not c.overlap, "comm.overlap", False, hierarchical_only, "comm=hierarchical, or no comm.overlap"),
    ):
        if broken:
            raise refuse(key, value, why, wanted)


def check_launch_layout(cfg: Any, *, nnodes: NodeRange, nproc_per_node: int) -> Layout | None:
    """:func:`check_layout` for a job the launcher is about to start; returns the layout, resolved (None when the
    world is elastic and only the ranks, once they know it, can check it)."""
    if nnodes.elastic:
        return None
    return check_layout(cfg, world_size=nnodes.min * nproc_per_node, nnodes=nnodes.min, nproc_per_node=nproc_per_node)[
        0
    ]
