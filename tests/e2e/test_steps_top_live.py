"""``numarun top --once`` during a real 4-rank job prints a row for every rank with its step time: numarun's agent
writes the step report's live view (``steps.live.json``) on its own, nothing in the script asks for it.

One job of four gloo ranks training a small DDP model from a DataLoader (tests/support/scripts/steps_train.py); the test
polls ``numarun top --once`` for the live view for up to 60 s after every rank started, then stops the job (exit 0).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import SCRIPTS, TIMEOUT, clean_env, numarun_cmd, wait_until

pytestmark = pytest.mark.slow

FIRST_REPORT_S = 60
"""How long after its ranks started a job may take to write its first live view (the test fails after it)."""


def test_numarun_top_once_during_a_real_four_rank_job_prints_every_ranks_step_time(tmp_path: Path) -> None:
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    env = clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp), COLUMNS="200")
    job = subprocess.Popen(
        [*numarun_cmd(), "--nproc-per-node", "4", "--binding", "node", str(SCRIPTS / "steps_train.py"), str(out)],
        env=env,
        stdout=open(tmp_path / "log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until("all four ranks", lambda: len(list(out.glob("started.*"))) == 4, TIMEOUT, proc=job)
        deadline = time.monotonic() + FIRST_REPORT_S
        answers: list[str] = []
        while True:
            r = subprocess.run(
                [*numarun_cmd(), "top", "--once", "--pid", str(job.pid)],
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
            )
            rows = _rows(r.stdout)
            if r.returncode == 0 and sorted(rows) == [0, 1, 2, 3] and all(_timed(c) for c in rows.values()):
                break
            answers.append(f"exit {r.returncode}: {r.stdout}{r.stderr}")
            if job.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"no live view with every rank's step time within {FIRST_REPORT_S} s of the ranks' start "
                    f"(numarun writes steps.live.json in its private directory); numarun top said, last:\n"
                    + "\n".join(answers[-3:])
                )
            time.sleep(1.0)
        assert any(line.startswith("=> ") for line in r.stdout.splitlines()), r.stdout  # the verdict line
        (out / "stop").touch()
        assert job.wait(timeout=TIMEOUT) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)


def _rows(text: str) -> dict[int, list[str]]:
    """The table's rows by rank: lines whose first cell is a number and that have the table's width."""
    return {int(c[0]): c for line in text.splitlines() if (c := line.split()) and c[0].isdigit() and len(c) > 10}


def _timed(cells: list[str]) -> bool:
    """The row has a step time (``0.0213 s``, ``21.3 ms``), not ``-``."""
    return any(unit in ("s", "ms") and _number(value) for value, unit in zip(cells, cells[1:]))


def _number(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False
