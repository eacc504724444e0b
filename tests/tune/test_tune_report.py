"""numarun.report(samples=N): one JSON line per call into NUMARUN_REPORT, nothing outside a tune."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import numarun
from numarun import envvars, worker


def test_report_appends_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r.jsonl"
    monkeypatch.setenv(envvars.REPORT, str(out))
    monkeypatch.setenv("RANK", "3")
    numarun.report(samples=5, seconds=2)
    numarun.report(samples=7)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0] == {"rank": "3", "samples": 5.0, "seconds": 2.0}
    assert rows[1]["samples"] == 7.0 and rows[1]["seconds"] >= 0


def test_report_outside_a_tune_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(envvars.REPORT, raising=False)
    monkeypatch.chdir(tmp_path)
    worker.report(samples=1)
    assert list(tmp_path.iterdir()) == []
