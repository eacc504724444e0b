"""Reference models, tiny by default: an MLP classifier and a small GPT-style decoder.

Layer names are stable (the tensor-parallel plan and checkpoints name them); widths are read from the weights at
run time, so one forward serves a full layer and a column-sharded one. Each model is an input layer, ``blocks``
(a ModuleDict keyed "0", "1"...: the names of a ModuleList, kept when a pipeline stage holds only some blocks)
and an output layer; a pipeline stage is the model with the parts it does not hold set to None
(:func:`numarun.train.pipeline.stage_module`), so every parameter keeps its name in every layout.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import errors
from ..config.schema import ModelKind


class MlpBlock(nn.Module):
    """Residual feed-forward block: ``up`` (column-shardable), GELU, ``down`` (row-shardable)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def _blocks(blocks: Any) -> nn.ModuleDict:
    return nn.ModuleDict({str(i): b for i, b in enumerate(blocks)})


class Mlp(nn.Module):
    """Vectors -> class logits."""

    INPUT = ("inp",)
    """The modules of the input layer (a pipeline's first stage holds them)."""
    OUTPUT = ("head",)
    """The modules of the output layer (the last stage's)."""
    TP_STYLES = {"up": "col", "down": "row"}  # each block's modules split by tensor parallelism (parallel.tp_plan)

    def __init__(self, *, input_dim: int, hidden_dim: int, num_layers: int, num_classes: int) -> None:
        super().__init__()
        self.inp: nn.Module | None = nn.Linear(input_dim, hidden_dim)
        self.blocks = _blocks(MlpBlock(hidden_dim) for _ in range(num_layers))
        self.head: nn.Module | None = nn.Linear(hidden_dim, num_classes)
        self.input_dim, self.hidden_dim, self.num_classes = input_dim, hidden_dim, num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inp is not None:
            x = self.inp(x)
        for block in self.blocks.values():
            x = block(x)
        return self.head(x) if self.head is not None else x

    def example(self, where: str, batch: int) -> torch.Tensor:
        """A tensor of the shape and dtype that flows in at ``where`` (input, hidden or output)."""
        if where == "input":
            return torch.zeros(batch, self.input_dim)
        return torch.zeros(batch, self.hidden_dim if where == "hidden" else self.num_classes)


class Attention(nn.Module):
    """Causal self-attention; q/k/v column-shardable by heads, ``proj`` row-shardable."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.head_dim = d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # heads from the output width: fewer local heads when q/k/v are column-sharded
        q, k, v = (m(x).view(b, t, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class GptBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, vocab)."""

    INPUT = ("tok", "pos")
    OUTPUT = ("ln_f", "head")
    TP_STYLES = {"attn.q": "col", "attn.k": "col", "attn.v": "col", "fc": "col", "attn.proj": "row", "fc_proj": "row"}

    def __init__(
        self, *, vocab_size: int, seq_len: int, d_model: int, n_heads: int, n_layers: int, dropout: float
    ) -> None:
        super().__init__()
        self.seq_len, self.d_model, self.vocab_size, self.n_heads = seq_len, d_model, vocab_size, n_heads
        self.tok: nn.Module | None = nn.Embedding(vocab_size, d_model)
        self.pos: nn.Module | None = nn.Embedding(seq_len, d_model)
        self.blocks = _blocks(GptBlock(d_model, n_heads, dropout) for _ in range(n_layers))
        self.ln_f: nn.Module | None = nn.LayerNorm(d_model)
        self.head: nn.Module | None = nn.Linear(d_model, vocab_size, bias=False)
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "fc_proj.weight")):
                # GPT-2's scaled init of residual projections keeps early losses stable
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None and self.pos is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        if self.ln_f is not None and self.head is not None:
            x = self.head(self.ln_f(x))
        return x

    def example(self, where: str, batch: int) -> torch.Tensor:
        """A tensor of the shape and dtype that flows in at ``where`` (input, hidden or output)."""
        if where == "input":
            return torch.zeros(batch, self.seq_len, dtype=torch.long)
        return torch.zeros(batch, self.seq_len, self.d_model if where == "hidden" else self.vocab_size)


def build_model(cfg: Any) -> nn.Module:
    """The model named by ``cfg.kind`` (the ``model`` config group)."""
    if cfg.kind == ModelKind.MLP:
        return Mlp(
            input_dim=cfg.input_dim, hidden_dim=cfg.hidden_dim, num_layers=cfg.num_layers, num_classes=cfg.num_classes
        )
    if cfg.kind == ModelKind.GPT:
        return Gpt(
            vocab_size=cfg.vocab_size,
            seq_len=cfg.seq_len,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            n_layers=cfg.n_layers,
            dropout=cfg.dropout,
        )
    raise errors.ConfigError(f"bad model.kind {cfg.kind!r}: expected mlp or gpt")


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for both models (GPT logits are flattened over positions)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
