"""The soak's short version: the reference trainer under ``--max-restarts``, two workers SIGKILLed.

``scripts/soak.py`` runs the trainer untouched and then with faults, and checks that the final
loss (and every logged step's) equals the untouched run's, that no process of the job and no
``.tmp`` checkpoint is left, and that every restart is named in the log. The long version
(200 steps, 5 faults) and its figures are in docs/measured.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow


def test_soak_short(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "soak.py"),
            "--steps",
            "30",
            "--interval",
            "5",
            "--faults",
            "2",
            "--seed",
            "1",
            "--json-file",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["failed_checks"] == []
    assert figures["faults"] == 2 and figures["restarts"] == 2
    assert figures["final_loss"] == figures["reference_final_loss"] is not None
    assert figures["processes_left"] == 0 and figures["tmp_left"] == 0
    assert figures["steps_redone"] >= 0 and r.stdout.splitlines()[-1].startswith("SOAK faults=2 restarts=2 ")
