"""What the trainer's log line says beside the loss: each phase's share of the step (the step report's recorder,
:func:`numarun.worker.phases.shares`) and, on a GPU, the model FLOPs utilisation (pure).

MFU = the model's FLOPs per step / (the step's seconds x the ranks x one GPU's peak FLOP/s). A training step of a
dense model costs 6 FLOPs per parameter of its matrix products per token (forward 2, backward 4), and a decoder's
attention 12 x layers x width x sequence length per token more (PaLM, Chowdhery et al. 2022, appendix B).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config.schema import ModelKind, Precision
from ..worker.steps import PHASES

PEAK_TFLOPS: tuple[tuple[str, float, float], ...] = (
    # (name as CUDA reports it contains, bf16 dense, tf32 dense), NVIDIA's data sheets
    ("H100 PCIe", 756.0, 378.0),
    ("H100 NVL", 835.0, 417.5),
    ("H100", 989.4, 494.7),
    ("H200", 989.4, 494.7),
    ("GH200", 989.4, 494.7),
    ("B200", 2250.0, 1100.0),
    ("A100", 312.0, 156.0),
    ("L40S", 362.05, 183.2),
    ("A10G", 70.0, 35.0),
)
"""One GPU's dense peak in TFLOP/s, bf16 and tf32; the first entry whose name the device's contains (most specific
first)."""


def flops_per_sample(model: Any) -> float | None:
    """A training step's FLOPs per sample of the trainer's model config (``model`` group); None for a kind it does
    not know."""
    if model.kind == ModelKind.GPT:
        d, layers, t = int(model.d_model), int(model.n_layers), int(model.seq_len)
        matmul = layers * 12 * d * d + int(model.vocab_size) * d  # attention 4 d^2 and MLP 8 d^2 a layer; the head
        return float(t * (6 * matmul + 12 * layers * d * t))
    if model.kind == ModelKind.MLP:
        h = int(model.hidden_dim)
        matmul = int(model.input_dim) * h + int(model.num_layers) * 8 * h * h + h * int(model.num_classes)
        return float(6 * matmul)
    return None


def peak_flops(device_name: str, precision: str) -> float | None:
    """One GPU's dense peak FLOP/s for the trainer's precision, None for a GPU the table lacks."""
    return next(
        (
            (bf16 if precision == Precision.BF16 else tf32) * 1e12
            for name, bf16, tf32 in PEAK_TFLOPS
            if name in device_name
        ),
        None,
    )


def mfu(*, flops_per_step: float | None, step_s: float, ranks: int, peak: float | None) -> float | None:
    """The model FLOPs utilisation of a step of the whole job (``flops_per_step``: every rank's samples)."""
    if not flops_per_step or not peak or step_s <= 0 or ranks <= 0:
        return None
    return flops_per_step / (step_s * ranks * peak)


def phase_text(shares: Mapping[str, float]) -> str:
    """``input 1 %  compute 80 %  comm 17 %  optim 2 %`` ('' before the recorder has a step)."""
    return "  ".join(f"{p} {shares[p] * 100:.0f} %" for p in PHASES if p in shares)
