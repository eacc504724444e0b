"""The bad-input table's machinery: a mistake as a row, numarun run on it in-process, and the refusal checked.

A refusal is exit 2 (1 for output that could not be written), one line on stderr that starts with
``numarun`` and holds the row's words, no traceback, and nothing written in the working directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS

TRAIN = str(REPO / "scripts" / "train.py")
EXIT = str(SCRIPTS / "exit_rank.py")


@dataclass(frozen=True)
class Case:
    """One mistake: argv for ``numarun``, extra env, and words the error line must hold.

    ``stdout``: a file standing for numarun's standard output (``/dev/full``); ``code``: the
    exit code (2 for a mistake, 1 for output that could not be written).
    """

    id: str
    argv: tuple[str, ...]
    words: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    stdout: str | None = None
    code: int = 2


def case(id: str, argv: str | list[str], *words: str, **env: str) -> Case:
    return Case(id, tuple(argv.split() if isinstance(argv, str) else argv), words, env)


def unwritable(id: str, argv: str, *words: str) -> Case:
    """``numarun ARGV > /dev/full``: the write error in one line, exit 1."""
    return replace(case(id, argv, *words), stdout="/dev/full", code=1)


def check_refusal(code: int, err: str, c: Case, workdir: Path) -> None:
    lines = err.splitlines()
    assert code == c.code, (code, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("numarun")
    for w in c.words:
        assert w in lines[0], (w, lines[0])
    # nothing half-written: no run dir, checkpoint or plan file in the working directory
    assert list(workdir.iterdir()) == []


def run_in_process(
    argv: Sequence[str],
    cwd: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: Mapping[str, str] | None = None,
    stdout: str | None = None,
) -> tuple[int, str]:
    """``numarun ARGV`` in this process, from ``cwd``, without the caller's numarun/Slurm variables: (exit code,
    stderr)."""
    from numarun.cli import main

    for k in [k for k in os.environ if k.startswith(("NUMARUN_", "PET_", "SLURM_"))] + ["CUDA_VISIBLE_DEVICES"]:
        monkeypatch.delenv(k, raising=False)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    out = open(stdout, "w") if stdout else None  # noqa: SIM115  (closed below, whatever main does)
    saved = sys.stdout
    if out is not None:
        sys.stdout = out
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own refusals
        code = int(e.code or 0)
    finally:
        if out is not None:
            sys.stdout = saved  # before the file is closed
            try:
                out.close()
            except OSError:
                pass  # what main left buffered: the error it was to report
    return code, capsys.readouterr().err
