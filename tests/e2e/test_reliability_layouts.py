"""Checkpoints across layouts: one layout's checkpoint resumed by another, and one that no layout can resume.

A checkpoint of FSDP over 2 ranks (AdamW) or of two pipeline stages on 2 ranks (SGD with momentum), saved after
step 4, resumed by 4 ranks as two pipeline stages with tensor parallelism or as HSDP (replicas of shards),
continues as the uninterrupted run that wrote it: steps 5 to 8, loss and gradient norm, within
tests/trainer_runs.py's tolerances. The optimizer's state comes along: AdamW's moments and step count, SGD's
momentum (AdamW's state lost at the resume moves the loss by 9e-2 within 4 steps, 4 orders of magnitude past the
tolerance).

Why the tolerances hold for AdamW too: measured, the AdamW job's layouts (FSDP, pp=2, tp=2, HSDP and pp=2 x tp=2)
agree with its one-rank run within 9.5e-7 of the loss and 1e-8 (relative) of the gradient norm over 8 steps, and
the same resumed across layouts within 4.8e-7 and 7.3e-9: float32 sums in other orders, as for SGD.

A checkpoint that cannot be resumed (a model of another shape, another optimizer's state, a checkpoint whose
meta.json does not record its model) is one line, exit 2, before any rank starts, with the checkpoint dir byte for
byte as it was; every rank checks again what it loads (runs started by plain torchrun).

Restarts under ``--max-restarts`` on these layouts: the soak (tests/e2e/test_reliability_soak.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from refusals import TRAIN, case, check_refusal, run_in_process
from trainer_runs import STEPS, Reference, assert_matches, metrics, summary, train, write_tokens

SOURCES = {
    "adamw": (["parallel=fsdp"], "pp=1,dp_replicate=1,dp_shard=2,cp=1,tp=1"),
    "sgd": (["parallel=fsdp", "parallel.pp=2"], "pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=1"),
}
"""The optimizer -> the layout on 2 ranks that writes its checkpoint, and that layout's spec."""
TARGETS = {
    "pp2-tp2": (["parallel=fsdp", "parallel.pp=2", "parallel.tp=2"], "pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=2"),
    "hsdp": (["parallel.dp_replicate=2", "parallel.dp_shard=2"], "pp=1,dp_replicate=2,dp_shard=2,cp=1,tp=1"),
}
"""Layouts of 4 ranks that resume it."""
STOP = 4


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resharded")


@pytest.fixture(scope="module")
def whole(base: Path) -> Callable[[str], tuple[Reference, Path]]:
    """Each optimizer's job run uninterrupted on its :data:`SOURCES` layout, 8 steps, saving after step 4 and 8:
    the run the resumes are held to, and its checkpoint dir."""
    tokens = write_tokens(base / "tokens.bin")
    made: dict[str, tuple[Reference, Path]] = {}

    def get(optim: str) -> tuple[Reference, Path]:
        if optim not in made:
            overrides, spec = SOURCES[optim]
            ck, ref = base / f"ck-{optim}", Reference(tokens, {}, optim)
            run_dir = train(
                base / f"whole-{optim}",
                nproc=2,
                ref=ref,
                overrides=[*overrides, f"trainer.checkpoint_interval={STOP}", f"trainer.checkpoint_dir={ck}"],
            )
            assert json.loads((ck / f"step_{STOP:08d}" / "meta.json").read_text())["layout"] == spec
            made[optim] = replace(ref, rows=metrics(run_dir)), ck
        return made[optim]

    return get


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry under ``root``: its mode and, for a file, its bytes."""
    return {
        str(p.relative_to(root)): (p.lstat().st_mode, p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.slow
@pytest.mark.parametrize(("optim", "target"), [("adamw", "pp2-tp2"), ("sgd", "hsdp")])
def test_a_checkpoint_resumes_on_another_layout_as_the_whole_run(
    base: Path, whole: Callable[[str], tuple[Reference, Path]], optim: str, target: str
) -> None:
    """FSDP's AdamW checkpoint onto stages x TP (the fused AdamW's flags once came along and failed its first step
    under TP's DTensors); the pipeline's SGD checkpoint onto HSDP: 2 ranks to 4, steps 5-8 as the whole run's."""
    overrides, spec = TARGETS[target]
    ref, saved = whole(optim)
    ck = base / f"ck-{optim}-{target}"
    shutil.copytree(saved / f"step_{STOP:08d}", ck / f"step_{STOP:08d}")
    run_dir = train(
        base / f"{optim}-{target}",
        nproc=4,
        ref=ref,
        overrides=[*overrides, f"trainer.checkpoint_dir={ck}", "trainer.resume=true"],
    )
    assert_matches(ref, run_dir, steps=range(STOP + 1, STEPS + 1))
    s = summary(run_dir)
    assert s["layout"] == spec and s["start_step"] == STOP
    assert s["resumed_from"] == str(ck / f"step_{STOP:08d}")
    # and what it saved is this layout's, loadable again
    assert json.loads((ck / f"step_{STEPS:08d}" / "meta.json").read_text())["layout"] == spec


@pytest.mark.slow
def test_a_checkpoint_no_layout_can_resume_is_one_line_and_left_as_it_was(
    whole: Callable[[str], tuple[Reference, Path]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AdamW's FSDP checkpoint, resumed by stages x TP on 4 ranks with a deeper model, with SGD, and (its meta.json
    without the model's record, as an earlier numarun wrote it) with a wider vocabulary."""
    ref, saved = whole("adamw")
    ck = tmp_path.parent / f"{tmp_path.name}-ck"
    shutil.copytree(saved, ck)
    unrecorded = tmp_path.parent / f"{tmp_path.name}-unrecorded"
    shutil.copytree(ck, unrecorded)
    meta_path = unrecorded / f"step_{STEPS:08d}" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["model"]
    meta_path.write_text(json.dumps(meta))
    before = {d: _tree(d) for d in (ck, unrecorded)}
    launch = ["--nproc-per-node", "4", "--binding", "none", TRAIN, *ref.job()]
    layout = TARGETS["pp2-tp2"][0]
    step = f"step_{STEPS:08d}"  # the newest

    def resume(d: Path, *more: str) -> list[str]:
        return [*launch, *layout, *more, f"trainer.checkpoint_dir={d}", "trainer.resume=true"]

    cases = [
        case("deeper", resume(ck, "model.n_layers=6"), step, "model.n_layers=4 in the checkpoint but 6 now"),
        case(
            "sgd",
            resume(ck, "optim=sgd"),
            step,
            "the optimizer state is exp_avg, exp_avg_sq, step per parameter in the checkpoint but optim.kind=sgd "
            "needs momentum_buffer",
            "expected a checkpoint of this model and optimizer",
        ),
        case(
            "unrecorded-wider",
            resume(unrecorded, "model.vocab_size=256"),
            step,
            "tok.weight is [128, 64] in the checkpoint but [256, 64] now; head.weight is [128, 64]",
            "expected a checkpoint of this model and optimizer",
        ),
    ]
    for c in cases:
        code, err = run_in_process(c.argv, tmp_path, capsys, monkeypatch)
        check_refusal(code, err, c, tmp_path)  # exit 2, one line, no run dir
        assert {d: _tree(d) for d in (ck, unrecorded)} == before, c.id


# ------------------------------------------------------------------ in one process


@pytest.fixture
def one_rank(tmp_path: Path):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _adamw_checkpoint(root: Path, **path: bool):  # type: ignore[no-untyped-def]
    """A 2-layer model and its AdamW (``fused=True`` or ``foreach=False``) after a step, saved as step 1."""
    import torch

    from numarun.train import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, **path)
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    return model, opt, checkpoint.save(root, 1, model, opt, meta={}, rank=0)


@pytest.mark.parametrize(("saved", "running"), [({"fused": True}, {"foreach": False}), ({"foreach": False}, {})])
def test_a_resume_keeps_the_running_optimizers_implementation(
    one_rank: None, tmp_path: Path, saved: dict[str, bool], running: dict[str, bool]
) -> None:
    """How the optimizer runs its step (fused, foreach) is the running layout's; what it learnt is the checkpoint's.
    Tensor parallelism needs AdamW's per-tensor path; elsewhere the trainer runs the fused one."""
    import torch

    from numarun.train import checkpoint

    model, opt, path = _adamw_checkpoint(tmp_path / "ck", **saved)
    again = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    mine = torch.optim.AdamW(again.parameters(), lr=0.1, **running)
    flags = {k: mine.param_groups[0][k] for k in ("foreach", "fused")}
    assert checkpoint.load(path, again, mine) == 1
    assert {k: mine.param_groups[0][k] for k in ("foreach", "fused")} == flags
    for p, q in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["exp_avg_sq"], mine.state[q]["exp_avg_sq"])
        assert float(opt.state[p]["step"]) == float(mine.state[q]["step"]) == 1.0


def test_every_rank_checks_what_it_loads(one_rank: None, tmp_path: Path) -> None:
    """Under plain torchrun nothing checked the checkpoint before the ranks: each refuses before DCP reads a
    tensor, naming what differs, and leaves the checkpoint as it was."""
    import torch

    from numarun.errors import CheckpointError
    from numarun.train import checkpoint

    _, _, path = _adamw_checkpoint(tmp_path / "ck", fused=True)
    before = _tree(tmp_path / "ck")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError, match="exp_avg, exp_avg_sq, step per parameter in the checkpoint but "):
        checkpoint.load(path, model, sgd)
    wider = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    with pytest.raises(CheckpointError, match=r"0.weight is \[4, 4\] in the checkpoint but \[8, 4\] now"):
        checkpoint.load(path, wider, torch.optim.AdamW(wider.parameters()))
    assert _tree(tmp_path / "ck") == before
