"""The trainer's layout in one process: degrees and presets to the spec, the world's coordinates, the pipeline's
split and its rules, a stage's module (runs of every layout: test_train_layouts.py, test_train_pipeline.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from helpers import FIXTURES

from numarun.argtypes import NodeRange
from numarun.config.compose import compose
from numarun.config.schema import load_job_config_text
from numarun.errors import TRAINER_LAYOUT, LayoutError, page_url
from numarun.layout import DIMS, Layout
from numarun.train.models import build_model
from numarun.train.parallel import stage_module
from numarun.train.preflight import check_launch_layout, check_layout
from numarun.train.stages import SCHEDULES, accepted_schedules, even_split, plan_pipeline, schedule_name


@pytest.mark.parametrize(
    ("overrides", "spec"),
    [
        ([], "pp=1,dp_replicate=-1,dp_shard=1,cp=1,tp=1"),  # the default preset, ddp
        (["parallel=fsdp"], "pp=1,dp_replicate=1,dp_shard=-1,cp=1,tp=1"),
        (["parallel=hsdp"], "pp=1,dp_replicate=3,dp_shard=-1,cp=1,tp=1"),  # replicas across the 3 nodes
        (["parallel=tp"], "pp=1,dp_replicate=-1,dp_shard=1,cp=1,tp=4"),  # tp over a node's 4 ranks
        (["parallel=fsdp", "parallel.pp=2", "parallel.tp=2"], "pp=2,dp_replicate=1,dp_shard=-1,cp=1,tp=2"),
        (["parallel=tp", "parallel.pp=3", "parallel.tp=2"], "pp=3,dp_replicate=-1,dp_shard=1,cp=1,tp=2"),
    ],
)
def test_presets_are_sets_of_degrees_the_keys_override(overrides: list[str], spec: str) -> None:
    cfg = compose(overrides)
    assert Layout.of_degrees(cfg.parallel, nnodes=3, nproc_per_node=4).text == spec


def test_a_preset_naming_the_job_shape_needs_it() -> None:
    with pytest.raises(LayoutError, match="parallel.dp_replicate 'nnodes': the job's nnodes is not known"):
        Layout.of_degrees(compose(["parallel=hsdp"]).parallel)


def test_the_rest_is_filled_and_the_product_checked() -> None:
    layout = Layout.of_degrees({"pp": 2, "tp": 2})
    assert layout.text == "pp=2,dp_replicate=1,dp_shard=-1,cp=1,tp=2"
    assert layout.resolved(8) == Layout(DIMS, (2, 1, 2, 1, 2))
    with pytest.raises(LayoutError, match="-1 for dp_shard is the job's 6 ranks divided by the other sizes' product 4"):
        layout.resolved(6)
    with pytest.raises(LayoutError, match="its sizes multiply to 4, but the job has 8 ranks"):
        Layout.of_degrees({"pp": 2, "dp_shard": 2}).resolved(8)


def test_one_layout_error_for_the_degrees_the_rules_and_a_mesh() -> None:
    """The trainer's layout is refused as any layout is (the degrees read by layout.py, the rules of the preflight),
    its line naming the trainer's page; a --mesh's names the layouts' page."""
    cfg = load_job_config_text("model:\n  kind: gpt\n  n_layers: 4\nparallel:\n  tp: 3\n")
    refused = []
    for call in (
        lambda: Layout.of_degrees({"tp": "٢"}),  # layout.py
        lambda: check_layout(cfg, world_size=6, nnodes=1, nproc_per_node=6),  # the preflight: tp and the heads
        lambda: Layout.of_degrees({"tp": 3}).resolved(8),
    ):
        with pytest.raises(LayoutError) as e:
            call()
        refused.append(e.value)
    assert [(e.where, e.page) for e in refused] == [(TRAINER_LAYOUT, "trainer.md")] * 3
    with pytest.raises(LayoutError) as e:
        Layout.parse("tp=3").resolved(8)
    assert (e.value.where, e.value.page) == ("--mesh", "layouts.md")


def test_coordinates_are_row_major_with_tp_fastest() -> None:
    # as init_device_mesh lays out arange(world).view(pp, dp_replicate, dp_shard, cp, tp)
    layout = Layout(DIMS, (2, 1, 2, 1, 2))
    assert [layout.coords(r)["tp"] for r in range(8)] == [0, 1] * 4
    assert [layout.coords(r)["dp_shard"] for r in range(8)] == [0, 0, 1, 1] * 2
    assert [layout.coords(r)["pp"] for r in range(8)] == [0] * 4 + [1] * 4
    # the ranks of a tp group and of the pipeline's stages read the same samples
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1] * 2
    hsdp = Layout(DIMS, (1, 2, 2, 1, 1))
    assert [hsdp.dp_rank(r) for r in range(4)] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("n_layers", "stages", "split"),
    [
        (4, 2, (2, 2)),  # 6 layers: in+2 | 2+out
        (4, 4, (0, 2, 2, 0)),  # the 2 extra layers go to the middle stages
        (4, 3, (1, 2, 1)),
        (5, 2, (3, 2)),  # 7 layers: the extra one to the first stage (its embedding is cheap), never the last
        (2, 4, (0, 1, 1, 0)),
    ],
)
def test_even_split_makes_first_and_last_lighter(n_layers: int, stages: int, split: tuple[int, ...]) -> None:
    assert even_split(n_layers, stages) == split
    assert sum(split) == n_layers


def _parallel(**keys: object) -> object:
    text = "".join(f"  {k}: {v}\n" for k, v in keys.items())
    return load_job_config_text(f"parallel:\n{text}" if text else "").parallel


def test_stages_go_round_the_ranks_or_in_a_v() -> None:
    looped = plan_pipeline(_parallel(pp_schedule="interleaved1f1b"), pp=2, n_layers=4, local_batch=8)
    assert looped.schedule == "Interleaved1F1B" and looped.num_stages == 4 and looped.microbatches == 4
    assert [looped.stages_of(r) for r in (0, 1)] == [(0, 2), (1, 3)]
    v = plan_pipeline(_parallel(pp_schedule="ZBVZeroBubble"), pp=2, n_layers=4, local_batch=8)
    assert [v.stages_of(r) for r in (0, 1)] == [(0, 3), (1, 2)]
    single = plan_pipeline(_parallel(pp_schedule="GPipe", pp_split=[3, 1]), pp=2, n_layers=4, local_batch=8)
    assert [single.stages_of(r) for r in (0, 1)] == [(0,), (1,)] and single.microbatches == 2
    assert [list(single.blocks_of(s)) for s in (0, 1)] == [[0, 1, 2], [3]]
    assert single.describe() == "GPipe, 2 stages (in+0-2 | 3+out), 2 microbatches"


def test_schedule_names_are_torchs_in_any_case() -> None:
    assert {"GPipe", "1F1B", "Interleaved1F1B"} <= set(accepted_schedules())
    assert schedule_name("gpipe") == "GPipe" and schedule_name("1f1b") == "1F1B"
    with pytest.raises(
        LayoutError, match=r"bad parallel.pp_schedule 'PipelineScheduleMulti': expected one of GPipe, 1F1B"
    ) as e:
        schedule_name("PipelineScheduleMulti")  # a base class, not a schedule
    assert e.value.line().endswith(f"(see {page_url('trainer.md')})")  # the trainer's layout: its page


@pytest.mark.slow
def test_a_job_without_stages_is_checked_without_torchs_pipelining() -> None:
    """The launcher checks every trainer job before any rank starts: without pipeline stages it must not import
    torch's pipelining, which imports torch's compiler (a second of every trainer launch); a misspelt schedule is
    still named."""
    code = """if True:
        import sys
        from numarun.config.compose import compose
        from numarun.errors import LayoutError
        from numarun.train.preflight import check_layout
        check_layout(compose(["parallel=fsdp"]), world_size=2, nnodes=1, nproc_per_node=2)
        try:
            check_layout(compose(["parallel.pp_schedule=GPipes"]), world_size=2, nnodes=1, nproc_per_node=2)
        except LayoutError as e:
            print(e)
        print(sorted(m for m in sys.modules if m.startswith(("torch.distributed.pipelining", "torch._dynamo"))))
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["bad parallel.pp_schedule 'GPipes': expected one of " + ", ".join(SCHEDULES), "[]"]


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"pp_schedule": "1F1B", "pp_stages_per_rank": 2}, "a single-stage schedule holds 1 stage per rank"),
        ({"pp_schedule": "ZBVZeroBubble", "pp_stages_per_rank": 3}, "exactly 2 stages per rank"),
        ({"pp_schedule": "DualPipeV", "pp_microbatches": 3}, "at least as many microbatches as stages (4)"),
        ({"pp_split": "[4,0,0]"}, "3 stages holding 4 blocks"),
        ({"pp_split": "[4,0]", "pp_schedule": "GPipe"}, None),  # the last stage may hold the head alone
        ({"pp_schedule": "LoopedBFS", "pp_split": "[2,0,0,2]"}, "a middle stage holds no block"),
    ],
)
def test_pipeline_rules(keys: dict[str, object], words: str | None) -> None:
    if words is None:
        assert plan_pipeline(_parallel(**keys), pp=2, n_layers=4, local_batch=8).split == (4, 0)
        return
    with pytest.raises(LayoutError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan_pipeline(_parallel(**keys), pp=2, n_layers=4, local_batch=8)


def test_check_layout_resolves_and_plans() -> None:
    cfg = load_job_config_text(
        "model:\n  kind: gpt\n  n_layers: 4\nparallel:\n  pp: 2\n  tp: 2\ntrainer:\n  batch_size: 16\n  grad_accum: 2\n"
    )
    layout, plan = check_layout(cfg, world_size=8, nnodes=1, nproc_per_node=8)
    assert layout.text == "pp=2,dp_replicate=1,dp_shard=2,cp=1,tp=2"
    assert plan is not None and plan.schedule == "1F1B" and plan.microbatches == 2
    cfg.trainer.batch_size = 10
    with pytest.raises(LayoutError, match=r"trainer.batch_size 10: expected a multiple of .* = 2 x 2"):
        check_layout(cfg, world_size=8, nnodes=1, nproc_per_node=8)
    cfg.trainer.batch_size = 16
    assert check_launch_layout(cfg, nnodes=NodeRange(2, 2, "2:2"), nproc_per_node=4) == layout
    assert check_launch_layout(cfg, nnodes=NodeRange(1, 4), nproc_per_node=8) is None  # elastic: the ranks check it


@pytest.mark.parametrize("kind", ["gpt", "mlp"])
def test_stages_chained_are_the_model(kind: str) -> None:
    """Stage modules keep every parameter's name, share the model's modules and, run one after the other, give
    the model's output."""
    torch.manual_seed(0)
    model = build_model(load_job_config_text(f"model:\n  kind: {kind}\n  n_layers: 3\n  num_layers: 3\n").model)
    x = model.example("input", 2)
    if x.is_floating_point():
        x = torch.randn_like(x)
    else:
        x = torch.randint(0, 256, x.shape)
    whole = model(x)
    split = (0, 2, 1)
    parts = [
        stage_module(model, range(sum(split[:s]), sum(split[: s + 1])), first=s == 0, last=s == 2) for s in range(3)
    ]
    names = [n for p in parts for n, _ in p.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert dict(model.named_parameters())[names[0]] is dict(parts[0].named_parameters())[names[0]]
    h = x
    for p in parts:
        h = p(h)
    assert torch.equal(h, whole)


def test_a_trainer_job_is_placed_for_its_layout(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher hands the trainer's layout to its placement as the job's mesh: --dry-run shows its groups,
    on a recorded 8-GPU machine; nothing is created."""
    from helpers import REPO

    from numarun.cli import main

    for k in [k for k in os.environ if k.startswith(("NUMARUN_", "PET_", "SLURM_"))]:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.chdir(tmp_path)
    p4d = FIXTURES / "nvidia-smi" / "aws-p4d.24xlarge.txt"
    capsys.readouterr()
    code = main(
        [
            "--dry-run",
            "--topology",
            str(p4d),
            "--nproc-per-node",
            "4",
            str(REPO / "scripts" / "train.py"),
            "model=gpt",
            "parallel=fsdp",
            "parallel.pp=2",
            "parallel.tp=2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "# layout of the ranks (parallel.*): pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=2" in out
    assert "layout pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=2 on 1 node" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("  pp ", "  tp "))}
    assert "0,1→" in rows["tp"] and "0,2→" in rows["pp"], out  # tp innermost: ranks 0,1 share a group
    assert "job config (parallel.* (the trainer's layout))" in out
    assert list(tmp_path.iterdir()) == []
