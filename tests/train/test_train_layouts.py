"""Layouts of 4 ranks (gloo), held to the one-rank run step by step (tests/support/trainer_runs.py): pipeline stages
with FSDP2 shards and with tensor parallelism, shards with tensor parallelism, replicas of shards; and the presets hsdp
and tp on two "nodes" (two numarun processes on this host), whose degrees name the job's shape.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_runs import Reference, assert_matches, metrics, summary, train, train_two_nodes

pytestmark = pytest.mark.slow

LAYOUTS = {
    "pp2-dp_shard2": (["parallel=fsdp", "parallel.pp=2"], "pp=2,dp_replicate=1,dp_shard=2,cp=1,tp=1"),
    "pp2-tp2": (["parallel=fsdp", "parallel.pp=2", "parallel.tp=2"], "pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=2"),
    "dp_shard2-tp2": (["parallel=fsdp", "parallel.tp=2"], "pp=1,dp_replicate=1,dp_shard=2,cp=1,tp=2"),
    "dp_replicate2-dp_shard2": (
        ["parallel.dp_replicate=2", "parallel.dp_shard=2"],
        "pp=1,dp_replicate=2,dp_shard=2,cp=1,tp=1",
    ),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("layouts")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_four_rank_layout_matches_one_rank(base: Path, trainer_reference: Reference, name: str) -> None:
    overrides, spec = LAYOUTS[name]
    run_dir = train(base / name, nproc=4, overrides=overrides, ref=trainer_reference)
    assert_matches(trainer_reference, run_dir)
    s = summary(run_dir)
    assert s["layout"] == spec and s["world_size"] == 4 and len(s["peak_mem_mb_per_rank"]) == 4


@pytest.mark.parametrize("preset", ["hsdp", "tp"])
def test_preset_on_two_nodes_matches_one_rank(base: Path, trainer_reference: Reference, preset: str) -> None:
    # tp also reads its tokens through a loader worker pinned to the rank's CPUs
    extra = ["data.num_workers=1"] if preset == "tp" else []
    run_dir = train_two_nodes(base / preset, overrides=[f"parallel={preset}", *extra], ref=trainer_reference)
    assert_matches(trainer_reference, run_dir)
    s = summary(run_dir)
    assert s["num_nodes"] == 2 and s["parallel"] == preset
    # hsdp: replicas across the nodes, shards inside; tp: tensor parallel inside, replicas across
    assert (
        s["layout"]
        == {"hsdp": "pp=1,dp_replicate=2,dp_shard=2,cp=1,tp=1", "tp": "pp=1,dp_replicate=2,dp_shard=1,cp=1,tp=2"}[
            preset
        ]
    )
    assert "tokens_per_s" in metrics(run_dir)[1]
