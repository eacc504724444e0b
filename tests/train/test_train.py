"""Trainer parts in one process: data by step, token files, pinned loader workers, models, checkpoints dirs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from numarun.config.schema import load_job_config_text
from numarun.errors import ConfigError
from numarun.train import checkpoint
from numarun.train.data import StepBatchSampler, SyntheticTokens, SyntheticVectors, TokenFile, build_loader
from numarun.train.loop import lr_at
from numarun.train.models import build_model, loss_fn


def test_step_batches_split_the_global_batch_without_overlap() -> None:
    samplers = [
        StepBatchSampler(start_step=0, steps=3, global_batch=8, dp_rank=r, dp_size=2, grad_accum=2) for r in (0, 1)
    ]
    for step in (1, 2, 3):
        parts = [s.indices(step) for s in samplers]
        flat = sorted(i for p in parts for micro in p for i in micro)
        assert flat == list(range((step - 1) * 8, step * 8))
        assert all(len(micro) == 2 for p in parts for micro in p)


def test_resumed_sampler_starts_where_the_first_stopped() -> None:
    whole = list(StepBatchSampler(start_step=0, steps=6, global_batch=4, dp_rank=1, dp_size=2, grad_accum=1))
    resumed = list(StepBatchSampler(start_step=4, steps=6, global_batch=4, dp_rank=1, dp_size=2, grad_accum=1))
    assert resumed == whole[4:]


def test_batch_not_divisible_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="trainer.batch_size 6"):
        StepBatchSampler(start_step=0, steps=1, global_batch=6, dp_rank=0, dp_size=4, grad_accum=1)


def test_synthetic_samples_depend_only_on_seed_and_index() -> None:
    a = SyntheticVectors(input_dim=4, num_classes=3, num_samples=100, seed=1)
    b = SyntheticVectors(input_dim=4, num_classes=3, num_samples=100, seed=1)
    c = SyntheticVectors(input_dim=4, num_classes=3, num_samples=100, seed=2)
    assert torch.equal(a[7][0], b[7][0]) and not torch.equal(a[7][0], a[8][0])
    assert not torch.equal(a[7][0], c[7][0])
    x, y = SyntheticTokens(vocab_size=50, seq_len=8, num_samples=10, seed=0)[3]
    assert torch.equal(x[1:], y[:-1])  # next-token targets


@pytest.mark.parametrize("dtype", ["uint16", "int32"])
def test_token_file_windows_come_from_the_file(tmp_path: Path, dtype: str) -> None:
    tokens = (np.arange(1000) * 7 % 500).astype(dtype)
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    ds = TokenFile(str(path), dtype=dtype, seq_len=16, vocab_size=500, seed=3)
    assert len(ds) == 1000 - 17
    for i in (0, 5, 99):
        x, y = ds[i]
        start = int(np.where((np.lib.stride_tricks.sliding_window_view(tokens, 16) == x.numpy()).all(axis=1))[0][0])
        assert torch.equal(y, torch.from_numpy(tokens[start + 1 : start + 17].astype(np.int64)))
    too_small = TokenFile(str(path), dtype=dtype, seq_len=16, vocab_size=100, seed=3)
    with pytest.raises(ConfigError, match="vocab_size=100"):
        [too_small[i] for i in range(50)]


def test_token_file_missing_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.path"):
        TokenFile(str(tmp_path / "none.bin"), dtype="uint16", seq_len=4, vocab_size=10, seed=0)


class _Affinity(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(sorted(os.sched_getaffinity(0)) + [torch.get_num_threads()])


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 allowed CPUs to tell a pinned worker apart")
def test_loader_workers_pin_themselves_to_the_rank_cpus() -> None:
    cpu = min(os.sched_getaffinity(0))
    sampler = StepBatchSampler(start_step=0, steps=2, global_batch=2, dp_rank=0, dp_size=1, grad_accum=1)
    loader = build_loader(_Affinity(), sampler, num_workers=1, cpus=(cpu,))
    rows = [b for b in loader]
    assert all(r.tolist() == [[cpu, 1], [cpu, 1]] for r in rows)
    assert len(os.sched_getaffinity(0)) >= 2  # the parent keeps its own CPUs


def _model_cfg(kind: str):
    return load_job_config_text(f"model:\n  kind: {kind}\n").model


def test_models_learn_their_synthetic_task() -> None:
    for kind, ds in (
        ("mlp", SyntheticVectors(input_dim=32, num_classes=8, num_samples=64, seed=0)),
        ("gpt", SyntheticTokens(vocab_size=256, seq_len=32, num_samples=64, seed=0)),
    ):
        torch.manual_seed(0)
        model = build_model(_model_cfg(kind))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        x = torch.stack([ds[i][0] for i in range(16)])
        y = torch.stack([ds[i][1] for i in range(16)])
        losses = []
        for _ in range(15):
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        assert losses[-1] < 0.8 * losses[0], (kind, losses)


def test_lr_schedules() -> None:
    optim = load_job_config_text("optim:\n  lr: 1.0\n  min_lr: 0.0\n  warmup_steps: 2\n  schedule: cosine\n").optim
    assert lr_at(1, optim, 12) == 0.5 and lr_at(2, optim, 12) == 1.0
    assert lr_at(12, optim, 12) == pytest.approx(0.0) and 0 < lr_at(7, optim, 12) < 1
    const = load_job_config_text("optim:\n  lr: 0.1\n").optim
    assert lr_at(5, const, 10) == lr_at(5, const, 1000) == 0.1


def test_latest_checkpoint_ignores_unfinished_saves(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path / "none") is None
    for step, done in ((4, True), (8, True), (12, False)):
        d = checkpoint.step_dir(tmp_path, step)
        d.mkdir()
        if done:
            (d / "meta.json").write_text("{}")
    (tmp_path / ".step_00000016.tmp").mkdir()
    assert checkpoint.latest(tmp_path) == (8, checkpoint.step_dir(tmp_path, 8))


def test_resaving_a_step_replaces_it_whole(tmp_path: Path) -> None:
    """A step saved twice (a signal at a checkpoint step) ends as the second save, no leftovers."""
    import torch
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        root = tmp_path / "ckpt"
        with torch.no_grad():
            model.weight.fill_(1.0)
        checkpoint.save(root, 4, model, opt, meta={}, rank=0)
        with torch.no_grad():
            model.weight.fill_(2.0)
        checkpoint.save(root, 4, model, opt, meta={}, rank=0)
        assert sorted(p.name for p in root.iterdir()) == ["step_00000004"]
        with torch.no_grad():
            model.weight.zero_()
        assert checkpoint.load(checkpoint.latest(root)[1], model, opt) == 4
        assert torch.equal(model.weight, torch.full((2, 3), 2.0))
    finally:
        dist.destroy_process_group()


def test_stage_checkpoints_merge_and_an_earlier_nested_one_loads(tmp_path: Path) -> None:
    """Two parts on one rank (a rank's pipeline stages) save and load by their own names, each its optimizer; a
    checkpoint of an earlier numarun (nested optimizer state, no "optim_state" in meta.json) still loads."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        # stages name their parameters as the whole model does: disjoint names
        a = torch.nn.ModuleDict({"first": torch.nn.Linear(3, 2)})
        b = torch.nn.ModuleDict({"second": torch.nn.Linear(2, 4)})
        wa, wb = a["first"].weight, b["second"].weight
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (a, b)]
        for m, opt in zip((a, b), opts):
            for p in m.parameters():
                p.grad = torch.ones_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)  # as the trainer leaves it (torch fills a fresh optimizer's state then)
        path = checkpoint.save(tmp_path / "ck", 3, [a, b], opts, meta={}, rank=0)
        saved = [w.detach().clone() for w in (wa, wb)]
        for w, opt in zip((wa, wb), opts):
            with torch.no_grad():
                w.zero_()
            opt.state.clear()
        assert checkpoint.load(path, [a, b], opts) == 3
        assert torch.equal(wa, saved[0]) and torch.equal(wb, saved[1])
        assert torch.equal(opts[1].state[wb]["momentum_buffer"], torch.ones_like(wb))
        with pytest.raises(RuntimeError, match="share parameter names"):
            checkpoint.save(tmp_path / "ck", 4, [a, a], opts[:1] * 2, meta={}, rank=0)

        nested = tmp_path / "old" / "step_00000007"
        model_sd, optim_sd = get_state_dict(a, opts[0])
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(nested))
        (nested / "meta.json").write_text(json.dumps({"step": 7}))
        with torch.no_grad():
            wa.fill_(5.0)
        assert checkpoint.load(nested, a, opts[0]) == 7
        assert torch.equal(wa, saved[0])
    finally:
        dist.destroy_process_group()


def test_checksums_find_a_flipped_byte_and_split_the_reading(tmp_path: Path) -> None:
    """meta.json records every file's checksum; verify_share reads only the files owner() gives a rank."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        root = tmp_path / "ckpt"
        for step in (1, 2):
            checkpoint.save(root, step, model, opt, meta={}, rank=0)
        newest = checkpoint.step_dir(root, 2)
        meta = json.loads((newest / "meta.json").read_text())
        assert meta["hash"] == checkpoint.HASH and set(meta["checksums"]) == set(meta["files"]) == {
            ".metadata",
            "__0_0.distcp",
        }
        shard = newest / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[-100] ^= 1
        shard.write_bytes(bytes(data))
        assert checkpoint.damage(newest) == ""  # same size: the size check cannot see it
        assert checkpoint.verify_share(newest, rank=1, world_size=2) == ""  # rank 1's share: .metadata is rank 0's
        assert "__0_0.distcp does not match its checksum" in checkpoint.verify_share(newest, rank=0, world_size=2)
        lines: list[str] = []
        assert checkpoint.newest_verified(root, rank=0, world_size=1, report=lines.append) == (
            1,
            checkpoint.step_dir(root, 1),
        )
        assert len(lines) == 1 and "step_00000002 is damaged (__0_0.distcp" in lines[0]
    finally:
        dist.destroy_process_group()


def test_owner_gives_each_rank_its_own_shards() -> None:
    assert [
        checkpoint.owner(n, 4) for n in ("__0_0.distcp", "__3_1.distcp", "__5_0.distcp", ".metadata", "__0.metadata")
    ] == [0, 3, 1, 0, 0]
