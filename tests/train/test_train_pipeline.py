"""Pipeline stages on 2 ranks (gloo), held to the one-rank run (tests/support/trainer_runs.py): each of GPipe, 1F1B and
Interleaved1F1B gives that run's losses and gradient norms step by step; a pipeline checkpoint resumes exactly on
its own layout and is resharded onto another by DCP. Every run has a timeout: a schedule that deadlocks fails.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trainer_runs import STEPS, Reference, assert_matches, metrics, summary, train

pytestmark = pytest.mark.slow

PP2 = ["parallel=fsdp", "parallel.pp=2"]
INTERLEAVED = [*PP2, "parallel.pp_schedule=Interleaved1F1B"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pipeline")


@pytest.fixture(scope="module")
def interleaved(base: Path, trainer_reference: Reference) -> Path:
    """The uninterrupted Interleaved1F1B run (2 stages per rank, 4 in all), saving its last step."""
    return train(
        base / "interleaved",
        nproc=2,
        ref=trainer_reference,
        overrides=[*INTERLEAVED, f"trainer.checkpoint_dir={base / 'ck-whole'}"],
    )


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_single_stage_schedules_match_one_rank(base: Path, trainer_reference: Reference, schedule: str) -> None:
    # 1F1B as the documented command runs it: 4 microbatches of the 8 samples each data-parallel rank holds
    run_dir = train(
        base / schedule,
        nproc=2,
        ref=trainer_reference,
        overrides=[*PP2, f"parallel.pp_schedule={schedule}", "parallel.pp_microbatches=4"],
    )
    assert_matches(trainer_reference, run_dir)
    s = summary(run_dir)
    assert s["layout"] == "pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=1"
    assert s["pipeline"] == f"{schedule}, 2 stages (in+0-1 | 2-3+out), 4 microbatches"
    assert len(s["peak_mem_mb_per_rank"]) == 2 and min(s["peak_mem_mb_per_rank"]) > 0 and s["tokens_per_s_mean"] > 0


def test_interleaved_schedule_matches_one_rank(interleaved: Path, trainer_reference: Reference) -> None:
    assert_matches(trainer_reference, interleaved)
    assert summary(interleaved)["pipeline"] == "Interleaved1F1B, 4 stages (in | 0-1 | 2-3 | out), 4 microbatches"


@pytest.fixture(scope="module")
def stopped(base: Path, trainer_reference: Reference) -> Path:
    """The same run stopped after step 5: its checkpoint dir."""
    ck = base / "ck"
    train(
        base / "first",
        nproc=2,
        ref=trainer_reference,
        overrides=[*INTERLEAVED, f"trainer.checkpoint_dir={ck}", "trainer.steps=5"],
    )
    return ck


def test_pipeline_resumes_where_the_whole_run_ends(
    base: Path, interleaved: Path, stopped: Path, trainer_reference: Reference
) -> None:
    """Resumed after step 5: steps 6-8 are the uninterrupted run's, bit for bit; each rank saved both its stages."""
    meta = json.loads((stopped / "step_00000005" / "meta.json").read_text())
    assert meta["layout"] == "pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=1" and meta["optim_state"] == "flat"
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(meta["files"])
    resumed = train(
        base / "resumed",
        nproc=2,
        ref=trainer_reference,
        overrides=[*INTERLEAVED, f"trainer.checkpoint_dir={stopped}", "trainer.resume=true"],
    )
    got, whole = metrics(resumed), metrics(interleaved)
    assert sorted(got) == list(range(6, STEPS + 1))
    for step in got:
        assert got[step]["loss"] == whole[step]["loss"] and got[step]["grad_norm"] == whole[step]["grad_norm"], step
    assert summary(resumed)["start_step"] == 5


def test_a_pipeline_checkpoint_resumes_on_another_layout(
    base: Path, stopped: Path, trainer_reference: Reference
) -> None:
    """DCP reshards: the step-5 checkpoint of stages on two ranks, resumed by one rank, continues as the one-rank
    run does."""
    ck = base / "ck-one"
    ck.mkdir()
    shutil.copytree(stopped / "step_00000005", ck / "step_00000005")
    run_dir = train(
        base / "one",
        nproc=1,
        ref=trainer_reference,
        overrides=["parallel=ddp", f"trainer.checkpoint_dir={ck}", "trainer.resume=true"],
    )
    assert_matches(trainer_reference, run_dir, steps=range(6, STEPS + 1))
    assert summary(run_dir)["start_step"] == 5
