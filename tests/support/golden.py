"""The one golden-file helper: compare a generated artefact with its file under ``tests/golden/``.

Regenerate every golden file with ``NUMARUN_REGEN_GOLDEN=1 bash scripts/test.sh -k golden``
(or the one test module), then review ``git diff tests/golden/`` before committing. A
regenerating run writes the file and skips the comparison (reported as skipped), so it
can never pass by comparing a file with itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import GOLDEN

GOLDEN_DIR = GOLDEN
REGEN = os.environ.get("NUMARUN_REGEN_GOLDEN") == "1"


def check_golden(path: Path, text: str) -> None:
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.skip(f"regenerated {path}")
    assert path.exists(), f"missing golden {path}: run with NUMARUN_REGEN_GOLDEN=1 to create it"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{path.name} differs from its golden; regenerate with NUMARUN_REGEN_GOLDEN=1 if intended"
