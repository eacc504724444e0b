"""The trainer's log line beside the loss (docs/trainer.md): each phase's share and, on a GPU, the MFU from the
model's FLOPs (6 per matrix parameter per token, attention's 12 x layers x width x sequence more) and the GPU's
peak."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from numarun.train.flops import flops_per_sample, mfu, peak_flops, phase_text


def test_a_gpt_steps_flops_are_palms_formula() -> None:
    gpt = SimpleNamespace(kind="gpt", d_model=768, n_layers=12, seq_len=1024, vocab_size=50304, n_heads=12)
    n = 12 * 12 * 768**2 + 50304 * 768  # GPT-2 small's matrices: 124 M with the head
    assert flops_per_sample(gpt) == 1024 * (6 * n + 12 * 12 * 768 * 1024)
    assert n == pytest.approx(124e6, rel=0.01)
    mlp = SimpleNamespace(kind="mlp", input_dim=32, hidden_dim=64, num_layers=2, num_classes=8)
    assert flops_per_sample(mlp) == 6 * (32 * 64 + 2 * 8 * 64 * 64 + 64 * 8)
    assert flops_per_sample(SimpleNamespace(kind="other")) is None


def test_mfu_against_the_gpus_peak() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "fp32") == 378e12 and peak_flops("NVIDIA H200", "bf16") == 989.4e12
    assert peak_flops("Some GPU", "bf16") is None
    # 8 GPUs at 989.4 TFLOP/s, a step of 2 s doing 40% of what they could
    assert mfu(flops_per_step=0.4 * 8 * 2 * 989.4e12, step_s=2.0, ranks=8, peak=989.4e12) == pytest.approx(0.4)
    assert mfu(flops_per_step=1e12, step_s=1.0, ranks=1, peak=None) is None  # a CPU, or a GPU not in the table


def test_the_phases_text() -> None:
    assert phase_text({"input": 0.01, "compute": 0.8, "comm": 0.17, "optim": 0.02}) == (
        "input 1 %  compute 80 %  comm 17 %  optim 2 %"
    )
    assert phase_text({}) == ""
