"""The soak's short versions: the reference trainer under ``--max-restarts``, workers SIGKILLed, on the default
layout and on two pipeline stages with tensor parallelism.

``scripts/soak.py`` runs the trainer untouched and then with faults, and checks that the final
loss (and every logged step's) equals the untouched run's, that no process of the job and no
``.tmp`` checkpoint is left, that every restart is named in the log and resumed from the newest
checkpoint. The long version (200 steps, 5 faults) and its figures are in docs/measured.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow


def _soak(tmp_path: Path, *args: str) -> tuple[list[str], dict[str, Any]]:
    """``scripts/soak.py ARGS``, which must pass: its output lines and its figures."""
    out = tmp_path / "soak.json"
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "soak.py"), *args, "--json-file", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["failed_checks"] == []
    return r.stdout.splitlines(), figures


def test_soak_short(tmp_path: Path) -> None:
    lines, figures = _soak(tmp_path, "--steps", "30", "--interval", "5", "--faults", "2", "--seed", "1")
    f = figures["layouts"]["ddp"]
    assert f["faults"] == 2 and f["restarts"] == 2
    assert f["final_loss"] == f["reference_final_loss"] is not None
    assert f["processes_left"] == 0 and f["tmp_left"] == 0
    assert f["steps_redone"] >= 0 and lines[-1].startswith("SOAK layout=ddp faults=2 restarts=2 ")


def test_soak_pipeline_stages_with_tensor_parallelism(tmp_path: Path) -> None:
    """4 ranks, pp=2 x tp=2: a worker SIGKILLed after step 5 (seed 0), the restart resumes from the checkpoint of
    step 3 and retraces the untouched run's losses, bit for bit."""
    _, figures = _soak(
        tmp_path,
        *("--layout", "pp-tp", "--binding", "none"),  # 4 ranks on any machine
        *("--steps", "12", "--interval", "3", "--faults", "1", "--seed", "0"),
    )
    f = figures["layouts"]["pp-tp"]
    assert f["layout_spec"] == "pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=2"
    assert f["faults"] == f["restarts"] == 1 and f["fault_steps"][0] >= 5
    assert f["resumed_from"][0] >= 3  # a checkpoint, not the start
    assert f["final_loss"] == f["reference_final_loss"] is not None
    assert f["processes_left"] == 0 and f["tmp_left"] == 0
