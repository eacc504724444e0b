"""Batches that depend only on (seed, step, data-parallel rank): a resumed run sees the same data without loader state.

Step ``s`` takes the global indices ``[s*B, (s+1)*B)``, each data-parallel rank its slice, in ``grad_accum``
micro-batches; DataLoader workers pin themselves to the rank's CPUs.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..config.schema import DataKind, ModelKind
from ..errors import ConfigError

log = logging.getLogger(__name__)


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + index) % (2**63 - 1))


class SyntheticVectors(Dataset):
    """MLP data: x ~ N(0, 1); label = argmax of a fixed random linear "teacher" (learnable)."""

    def __init__(self, *, input_dim: int, num_classes: int, num_samples: int, seed: int) -> None:
        self.num_samples, self.seed = num_samples, seed
        self.teacher = torch.randn(input_dim, num_classes, generator=_generator(seed, -1))
        self.input_dim = input_dim

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.input_dim, generator=_generator(self.seed, index % self.num_samples))
        return x, (x @ self.teacher).argmax()


class SyntheticTokens(Dataset):
    """GPT data: arithmetic sequences mod vocab (random start and stride 1..3): learnable."""

    def __init__(self, *, vocab_size: int, seq_len: int, num_samples: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.num_samples, self.seed = vocab_size, seq_len, num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(self.seed, index % self.num_samples)
        start = torch.randint(self.vocab_size, (1,), generator=g)
        stride = torch.randint(1, 4, (1,), generator=g)
        seq = (start + stride * torch.arange(self.seq_len + 1)) % self.vocab_size
        return seq[:-1], seq[1:]


class TokenFile(Dataset):
    """A memory-mapped file of token ids (uint16 or int32, native order); sample ``i`` is the ``seq_len + 1`` tokens
    at a position drawn from (seed, i). The map is opened lazily in each process."""

    def __init__(self, path: str, *, dtype: str, seq_len: int, vocab_size: int, seed: int) -> None:
        import numpy as np

        self.path, self.seq_len, self.seed, self.vocab_size = path, seq_len, seed, vocab_size
        from .preflight import check_token_file

        self.np_dtype = np.dtype(np.uint16 if dtype == "uint16" else np.int32)
        # the id scan ran once in the launcher
        self.num_tokens = check_token_file(path, dtype=dtype, seq_len=seq_len, vocab_size=vocab_size, scan=False)
        self._map: Any = None

    def __len__(self) -> int:
        return self.num_tokens - self.seq_len - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np

        if self._map is None:
            self._map = np.memmap(self.path, dtype=self.np_dtype, mode="r")
        start = int(torch.randint(len(self), (1,), generator=_generator(self.seed, index)))
        window = torch.from_numpy(self._map[start : start + self.seq_len + 1].astype(np.int64))
        if int(window.max()) >= self.vocab_size:
            raise ConfigError(
                f"bad token id {int(window.max())} in {self.path!r}: expected ids < model.vocab_size={self.vocab_size}"
            )
        return window[:-1], window[1:]


class StepBatchSampler(Sampler[list[int]]):
    """Yields, for steps ``start_step+1 .. steps``, this rank's ``grad_accum`` micro-batches of indices."""

    def __init__(
        self, *, start_step: int, steps: int, global_batch: int, dp_rank: int, dp_size: int, grad_accum: int
    ) -> None:
        if global_batch % (dp_size * grad_accum):
            raise ConfigError(
                f"bad trainer.batch_size {global_batch}: expected a multiple of data-parallel ranks x "
                f"trainer.grad_accum = {dp_size} x {grad_accum}"
            )
        self.start_step, self.steps = start_step, steps
        self.global_batch, self.dp_rank, self.dp_size, self.grad_accum = global_batch, dp_rank, dp_size, grad_accum

    def __len__(self) -> int:
        return (self.steps - self.start_step) * self.grad_accum

    def indices(self, step: int) -> list[list[int]]:
        """Micro-batches of step ``step`` (1-based) for this rank."""
        local = self.global_batch // self.dp_size
        first = (step - 1) * self.global_batch + self.dp_rank * local
        micro = local // self.grad_accum
        return [list(range(first + m * micro, first + (m + 1) * micro)) for m in range(self.grad_accum)]

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step + 1, self.steps + 1):
            yield from self.indices(step)


def pin_worker(cpus: tuple[int, ...], worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: stay on the rank's CPUs, one compute thread per worker."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(1)


def rank_cpus() -> tuple[int, ...]:
    """The CPUs of this rank: its plan binding under numarun, else the current affinity."""
    try:
        from ..worker import current_binding

        binding = current_binding()
    except Exception:  # plain torchrun or python: no plan
        binding = None
    if binding is not None and binding.cpus:
        return tuple(binding.cpus)
    return tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()


def build_dataset(data_cfg: Any, model_cfg: Any, *, seed: int) -> Dataset:
    if data_cfg.kind == DataKind.TOKENS:
        return TokenFile(
            data_cfg.path, dtype=data_cfg.dtype, seq_len=model_cfg.seq_len, vocab_size=model_cfg.vocab_size, seed=seed
        )
    if model_cfg.kind == ModelKind.GPT:
        return SyntheticTokens(
            vocab_size=model_cfg.vocab_size, seq_len=model_cfg.seq_len, num_samples=data_cfg.num_samples, seed=seed
        )
    return SyntheticVectors(
        input_dim=model_cfg.input_dim, num_classes=model_cfg.num_classes, num_samples=data_cfg.num_samples, seed=seed
    )


def build_loader(
    dataset: Dataset, sampler: StepBatchSampler, *, num_workers: int, cpus: tuple[int, ...] | None = None
) -> DataLoader:
    """A DataLoader over ``sampler``'s micro-batches; workers pinned to ``cpus`` (default: the rank's)."""
    cpus = rank_cpus() if cpus is None else cpus
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        persistent_workers=False,
        worker_init_fn=functools.partial(pin_worker, cpus) if num_workers > 0 else None,
    )
