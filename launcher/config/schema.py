"""Structured configs: the types and defaults of every key a job config may hold (OmegaConf; no Hydra import).

Hydra merges ``configs/`` into :class:`JobConfig`, so a wrong key or type fails while composing; the trainer
reads the run dir's ``config.yaml`` back with :func:`load_job_config`.
"""

# ruff: noqa: UP045  (Optional[...] kept: OmegaConf reads these annotations at runtime)
from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..argtypes import MAX_LOCAL_RANKS, MAX_NODES
from ..comm.modes import CommMode, parse_compression
from ..errors import TRAINER_LAYOUT, ConfigError, LayoutError, UsageError, first_line
from ..layout import Layout


class ModelKind(str, enum.Enum):
    """Which reference model the trainer builds."""

    MLP = "mlp"
    """Linear+GELU layers classifying synthetic vectors."""
    GPT = "gpt"
    """A small decoder-only transformer predicting the next token."""


class DataKind(str, enum.Enum):
    """Where batches come from."""

    SYNTHETIC = "synthetic"
    """Random samples generated from (seed, sample index): no files, deterministic."""
    TOKENS = "tokens"
    """A flat binary file of token ids (uint16 or int32) read through a memory map."""


class ParallelKind(str, enum.Enum):
    """The preset a ``parallel`` group started from (``parallel=<preset>``): a set of degrees, which the degree
    keys override (``parallel=fsdp parallel.pp=2``). The trainer reads only the degrees."""

    DDP = "ddp"
    """dp_replicate=-1: a full replica per rank, gradients all-reduced (DistributedDataParallel)."""
    FSDP = "fsdp"
    """dp_shard=-1: FSDP2 ``fully_shard`` of parameters, gradients and optimizer state over all ranks."""
    HSDP = "hsdp"
    """dp_replicate=nnodes, dp_shard=-1: FSDP2 sharded inside the node, replicated across nodes."""
    TP = "tp"
    """tp=nproc_per_node, dp_replicate=-1: tensor parallel inside the node, replicas across nodes."""


class Precision(str, enum.Enum):
    """Numeric precision of the forward pass."""

    FP32 = "fp32"
    BF16 = "bf16"
    """``torch.autocast`` to bfloat16 (CPU and GPU); parameters and optimizer stay float32."""


class OptimKind(str, enum.Enum):
    """Which optimizer the trainer builds."""

    ADAMW = "adamw"
    """AdamW: fused on GPU; the per-tensor path under TP (DTensor and plain parameters mixed)."""
    SGD = "sgd"


class Schedule(str, enum.Enum):
    """Learning-rate schedule after warm-up."""

    CONSTANT = "constant"
    """Keep ``optim.lr``: the schedule does not depend on ``trainer.steps``, so a run can be extended."""
    COSINE = "cosine"
    """Cosine decay to ``optim.min_lr`` at ``trainer.steps``."""


def _launcher_config() -> type:
    """The launch options a job config sets, below the command line and the environment; null: not set.

    A key per launch option that declares one (:func:`numarun.options.launch.config_keys`)."""
    from ..options.launch import config_keys

    made = make_dataclass("LauncherConfig", [(k, Optional[t], field(default=None)) for k, t in config_keys()])
    made.__module__, made.__doc__ = __name__, _launcher_config.__doc__
    return made


if TYPE_CHECKING:
    LauncherConfig = Any
else:
    LauncherConfig = _launcher_config()


@dataclass
class ModelConfig:
    kind: str = ModelKind.MLP.value
    # MLP
    input_dim: int = 32
    hidden_dim: int = 64
    num_layers: int = 2
    num_classes: int = 8
    # GPT
    vocab_size: int = 256
    seq_len: int = 32
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    dropout: float = 0.0


@dataclass
class DataConfig:
    kind: str = DataKind.SYNTHETIC.value
    path: Optional[str] = None  # Token file for ``kind: tokens``
    dtype: str = "uint16"  # Token file element type: uint16 or int32
    num_workers: int = 0  # DataLoader worker processes per rank; they pin themselves to the rank's CPUs
    num_samples: int = 4096  # Synthetic dataset size (samples are drawn by index, so any size works)


@dataclass
class ParallelConfig:
    """The layout (docs/trainer.md): a degree per dimension, outermost first, each an integer >= 1, -1 for the
    rest of the world (at most one), or ``nnodes`` / ``nproc_per_node``."""

    kind: str = ParallelKind.FSDP.value  # the preset's name (parallel=ddp|fsdp|hsdp|tp); informative only
    pp: Any = 1  # pipeline stages' ranks
    dp_replicate: Any = 1  # data-parallel replicas
    dp_shard: Any = -1  # data-parallel shards (FSDP2)
    cp: Any = 1  # context parallelism: not built, 1 only
    tp: Any = 1  # tensor parallelism inside a stage
    pp_schedule: str = "1F1B"  # a name torch.distributed.pipelining's get_schedule_class accepts
    pp_microbatches: Optional[int] = None  # None: one per stage of the pipeline
    pp_stages_per_rank: Optional[int] = None  # None: 1 for single-stage schedules, 2 for looped/V ones
    pp_split: Optional[list[int]] = None  # blocks per stage (None: an even split, embedding and head as layers)
    reshard_after_forward: bool = (
        True  # FSDP2: free the gathered parameters after forward (ZeRO-3) or keep them (ZeRO-2)
    )


@dataclass
class OptimConfig:
    kind: str = OptimKind.ADAMW.value
    lr: float = 3e-3
    min_lr: float = 3e-4
    weight_decay: float = 0.0
    momentum: float = 0.9
    warmup_steps: int = 0
    schedule: str = Schedule.CONSTANT.value
    grad_clip: float = 1.0  # Clip the global gradient norm (0 disables)


@dataclass
class TrainerConfig:
    steps: int = 20
    batch_size: Any = 16  # Global batch size (an int, or "auto": the largest that fits, searched at start)
    grad_accum: int = 1
    precision: str = Precision.FP32.value
    compile: bool = False
    seed: int = 1234
    log_interval: int = 1
    checkpoint_dir: Optional[str] = None  # None: ``<run dir>/checkpoints``
    checkpoint_interval: int = 0  # Save every N steps (0: only at the end and on SIGUSR1/SIGTERM)
    resume: bool = False  # Continue from the latest checkpoint in ``checkpoint_dir`` when there is one
    progress: bool = True  # A rich progress bar on rank 0 (when stderr is a terminal)
    memory_limit_mb: Optional[int] = None  # batch_size=auto on CPU: a rank's peak RSS (None: RAM / local ranks)
    auto_max_batch: int = 4096  # batch_size=auto: the largest size tried


@dataclass
class CommConfig:
    allreduce: str = CommMode.FLAT.value
    compression: Optional[str] = None  # Compression of the inter-node step (e.g. bf16), passed to numarun.comm
    overlap: bool = True  # Hierarchical DDP: reduce each bucket while backward goes on (false: inside the hook)
    bucket_mb: Optional[float] = None  # DDP's bucket_cap_mb (None: DDP's default, 25, with flat; 2 with hierarchical)
    chunk_mb: Optional[float] = None  # hierarchical: pipelining chunk in MiB (None: 1; 0: one shot per bucket)


@dataclass
class SlurmConfig:
    partition: Optional[str] = None
    time: str = "01:00:00"
    account: Optional[str] = None
    gpus_per_node: Optional[int] = None
    requeue_limit: int = 3  # How often the job requeues itself near its time limit (``--requeue-limit``; 0: never)
    signal_before: int = 120  # seconds before the time limit the job is signalled, to checkpoint and requeue


@dataclass
class JobConfig:
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


# str, checked here: OmegaConf would match Enum names (CORE_COMPLEX), not torch's values ("core-complex")
ENUM_KEYS: dict[str, type[enum.Enum]] = {
    "model.kind": ModelKind,
    "data.kind": DataKind,
    "parallel.kind": ParallelKind,
    "trainer.precision": Precision,
    "comm.allreduce": CommMode,
    "optim.kind": OptimKind,
    "optim.schedule": Schedule,
}


def _whole(n: Any, low: int) -> bool:
    """A whole number >= ``low`` (OmegaConf lets a nested list through a ``list[int]`` field)."""
    return isinstance(n, int) and not isinstance(n, bool) and n >= low


Rule = tuple[str, Callable[[Any], object], str]
"""(key, whether its value holds, the form expected otherwise)."""


def _refuse_unless(cfg: Any, rules: Iterable[Rule]) -> None:
    """The first value of ``rules`` that does not hold, as a ConfigError naming the key and the expected form."""
    for key, holds, expected in rules:
        section, name = key.split(".")
        if not holds(value := cfg[section][name]):
            raise ConfigError(f"bad {key} {value!r}: expected {expected}")


def check_values(cfg: Any) -> None:
    """Checks the types cannot express; raises ConfigError naming the key and the expected form."""
    _refuse_unless(
        cfg,
        (
            (
                key,
                functools.partial(operator.contains, [m.value for m in kind]),
                f"one of {', '.join(m.value for m in kind)}",
            )
            for key, kind in ENUM_KEYS.items()
        ),
    )
    parse_compression(cfg.comm.compression)
    Layout.of_degrees(cfg.parallel, nnodes=1, nproc_per_node=1)  # values only: the job's shape is checked with the plan
    if cfg.parallel.cp != 1:
        raise LayoutError(
            f"bad parallel.cp {cfg.parallel.cp!r}: context parallelism is not built; expected parallel.cp=1",
            where=TRAINER_LAYOUT,
        )
    positive = "an integer >= 1"
    _refuse_unless(
        cfg,
        (
            ("parallel.pp_microbatches", lambda v: v is None or v >= 1, f"{positive}, or null"),
            ("parallel.pp_stages_per_rank", lambda v: v is None or v >= 1, f"{positive}, or null"),
            (
                "parallel.pp_split",
                lambda v: v is None or (len(v) and all(_whole(n, 0) for n in v)),
                "a list of block counts >= 0, one per stage",
            ),
            ("trainer.batch_size", lambda v: v == "auto" or _whole(v, 1), "a positive integer or 'auto'"),
            *(
                (key, lambda v: v >= 1, positive)
                for key in (
                    "trainer.steps",
                    "trainer.grad_accum",
                    "trainer.log_interval",
                    "model.num_layers",
                    "model.n_layers",
                    "model.n_heads",
                )
            ),
            (
                "launcher.nproc_per_node",
                lambda v: v is None or 1 <= v <= MAX_LOCAL_RANKS,
                f"an integer from 1 to {MAX_LOCAL_RANKS} or null",
            ),
            (
                "launcher.nnodes",
                lambda v: v is None or 1 <= v <= MAX_NODES,
                f"an integer from 1 to {MAX_NODES} or null",
            ),
        ),
    )
    _check_launcher(cfg.launcher)
    _refuse_unless(
        cfg,
        (
            ("comm.bucket_mb", lambda v: v is None or v > 0, "a size in MiB > 0, e.g. 25, or null"),
            ("comm.chunk_mb", lambda v: v is None or v >= 0, "a size in MiB >= 0 (0: one shot), or null"),
            ("trainer.checkpoint_interval", lambda v: v >= 0, "an integer >= 0"),
            (
                "model.d_model",
                lambda v: not v % cfg.model.n_heads,
                f"a multiple of model.n_heads={cfg.model.n_heads}",
            ),
            ("data.dtype", lambda v: v in ("uint16", "int32"), "uint16 or int32"),
        ),
    )
    if cfg.data.kind == DataKind.TOKENS:
        if not cfg.data.path:
            raise ConfigError("bad data.path None: expected a token file path with data=tokens")
        if cfg.model.kind != ModelKind.GPT:
            raise ConfigError(f"bad model {cfg.model.kind!r} for data=tokens: expected model=gpt")


def _check_launcher(launcher: Any) -> None:
    """Each value of the ``launcher`` group read as its option reads it (null: not set)."""
    from ..options.launch import DECLARED

    for o in DECLARED:
        if o.config is not None and launcher[o.dest] is not None:
            try:
                o.read(launcher[o.dest], f"launcher.{o.dest}")
            except UsageError as e:
                raise ConfigError(str(e)) from None


def load_job_config(path: str | Path) -> Any:
    """The saved ``config.yaml`` of a run dir, typed as :class:`JobConfig` (an OmegaConf DictConfig)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(
            f"bad job config {str(path)!r}: {e.strerror}; expected a config.yaml saved by numarun"
        ) from None
    return load_job_config_text(text, origin=str(path))


def load_job_config_text(text: str, origin: str = "config") -> Any:
    """YAML text merged into :class:`JobConfig` and checked; ConfigError on any mismatch."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.merge(OmegaConf.structured(JobConfig), OmegaConf.create(text))
    except (OmegaConfBaseException, ValueError) as e:
        raise ConfigError(
            f"bad job config {origin!r}: {first_line(e)}; expected the keys and types of JobConfig"
        ) from None
    check_values(cfg)
    return cfg
