"""Choices of the gradient all-reduce, as the config names them (torch-free: the config layer checks them)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from ..errors import ConfigError, expected

if TYPE_CHECKING:
    import torch

__all__ = ["CommMode", "Compression", "parse_comm_mode", "parse_compression"]


class CommMode(str, enum.Enum):
    """How DDP all-reduces gradients (config ``comm.allreduce``)."""

    FLAT = "flat"
    """One all-reduce over all ranks (torch's default)."""
    HIERARCHICAL = "hierarchical"
    """Reduce-scatter in the node, all-reduce across nodes, all-gather in the node."""


class Compression(str, enum.Enum):
    """Wire format of the gradient traffic that crosses nodes (config ``comm.compression``)."""

    NONE = "none"
    BF16 = "bf16"
    """bfloat16 on the inter-node step (fp32 range, 8-bit mantissa)."""
    FP16 = "fp16"
    """float16 on the inter-node step (more mantissa, smaller range)."""

    def dtype(self) -> torch.dtype | None:
        import torch

        return {Compression.NONE: None, Compression.BF16: torch.bfloat16, Compression.FP16: torch.float16}[self]


def parse_comm_mode(value: str | CommMode) -> CommMode:
    try:
        return CommMode(str(value.value if isinstance(value, CommMode) else value).lower())
    except ValueError:
        raise ConfigError(expected(value, "flat or hierarchical", "comm.allreduce")) from None


def parse_compression(value: str | Compression | None) -> Compression:
    if value is None or value == "":
        return Compression.NONE
    try:
        return Compression(str(value.value if isinstance(value, Compression) else value).lower())
    except ValueError:
        raise ConfigError(expected(value, "none, bf16 or fp16", "comm.compression")) from None
