"""Runs of the reference trainer on a layout, held to the one-rank run of the same job (tests/conftest.py's
``trainer_reference``, made once per session).

Every run trains the same job: the GPT with 4 blocks on a token file, SGD with momentum, no clipping (AdamW
would normalise a wrong gradient scale away, clipping would hide it), a global batch of 16, 8 steps. A layout
is right when each step's loss and gradient norm (before the update: over every stage, shard and replica) are
the one-rank run's within :data:`LOSS_ATOL` and :data:`NORM_RTOL`.

Why those tolerances: the layouts add the same float32 numbers in other orders (microbatches, reduce-scatters,
tensor-parallel partial sums); measured, the losses differ by at most 2 ulps (1e-6 at 5.7) over 8 steps and the
norms by 5e-9 relative. A wrong gradient scale (a factor 2: an average left out or done twice) moves the norm by
100 % at step 1 and the loss at step 2 by about 1e-2: far outside both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, clean_env, free_port

TRAIN = str(REPO / "scripts" / "train.py")
TIMEOUT = 600
"""Never hang CI (a schedule that deadlocks on gloo must fail, not wait); not a performance bound."""
STEPS = 8
LOSS_ATOL = 1e-5
NORM_RTOL = 1e-5


def job(tokens: Path, optim: str = "sgd") -> list[str]:
    """The overrides every run shares (its layout comes after them); ``optim``: the optimizer (SGD with momentum,
    or AdamW), no clipping either way."""
    return [
        "model=gpt",
        "model.n_layers=4",
        "model.vocab_size=128",
        "data=tokens",
        f"data.path={tokens}",
        f"optim={optim}",
        "optim.grad_clip=0",
        "trainer.batch_size=16",
        f"trainer.steps={STEPS}",
        "trainer.progress=false",
    ]


def write_tokens(path: Path) -> Path:
    (np.arange(20000) % 97).astype(np.uint16).tofile(path)
    return path


@dataclass(frozen=True)
class Reference:
    tokens: Path
    rows: dict[int, dict]
    """step -> its metrics.jsonl row."""
    optim: str = "sgd"

    def job(self) -> list[str]:
        return job(self.tokens, self.optim)


def metrics(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def numarun(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "numarun", *args],
        cwd=cwd,
        env=clean_env(PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def train(run_dir: Path, *, nproc: int, overrides: list[str], ref: Reference, launch: tuple[str, ...] = ()) -> Path:
    """One numarun on this host with ``nproc`` ranks (``--binding none``: 4 ranks may share 2 cores)."""
    numarun(
        [
            "--nproc-per-node",
            str(nproc),
            "--binding",
            "none",
            *launch,
            TRAIN,
            *ref.job(),
            *overrides,
            f"hydra.run.dir={run_dir}",
        ],
        run_dir.parent,
    )
    return run_dir


def train_two_nodes(run_dir: Path, *, overrides: list[str], ref: Reference) -> Path:
    """Two numarun processes on this host as two nodes of 2 ranks each."""
    port = free_port()
    procs = []
    for node_rank in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "numarun",
            "--nnodes",
            "2",
            "--node-rank",
            str(node_rank),
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            TRAIN,
            *ref.job(),
            *overrides,
            f"hydra.run.dir={run_dir}",
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=run_dir.parent,
                env=clean_env(PYTHONUNBUFFERED="1"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=TIMEOUT))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return run_dir


def assert_matches(ref: Reference, run_dir: Path, steps: range | None = None) -> None:
    """Each step's loss and gradient norm are the one-rank run's (steps: those ``run_dir`` logged, by default)."""
    got = metrics(run_dir)
    wanted = list(steps) if steps is not None else list(range(1, STEPS + 1))
    assert sorted(got) == wanted
    for step in wanted:
        assert got[step]["loss"] == pytest.approx(ref.rows[step]["loss"], abs=LOSS_ATOL), step
        assert got[step]["grad_norm"] == pytest.approx(ref.rows[step]["grad_norm"], rel=NORM_RTOL), step
    assert got[wanted[-1]]["loss"] < ref.rows[1]["loss"]  # and it learns
