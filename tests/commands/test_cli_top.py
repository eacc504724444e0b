"""``numarun top`` (docs/steps.md): the live table of a running job's ranks.

The table's drawing is checked on known live views (fast). End to end, one real job (two ranks that sleep): the test
stands in for numarun's agent and writes the live view into the job's private directory (where ``job.json`` is),
then checks each answer of ``numarun top``: before the view exists (exit 3), ``--once`` (a row a rank, plain text),
``--json`` (round-trips), ``--pid`` of no job (exit 2), the live view redrawn until the job ends (exit 0), and no
job at all (exit 1). About 15-20 s on a quiet 2-core machine; every wait is bounded by :data:`helpers.TIMEOUT`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import REPO, SLEEPER, TIMEOUT, clean_env, error_lines, numarun_cmd, wait_until

from numarun import cli
from numarun.fsutil import write_atomic
from numarun.launch.hangs.stacks import JOB_FILE, RunningJob, choose_job, running_jobs
from numarun.view.top import render_top, summary_line
from numarun.worker.steps import LIVE, PHASES, LiveTable, RankPlace, RankRow

VERDICT = "=> rank 1 holds the job back: its cores are shared with another process"


def _table(pids: dict[int, int], *, updated: float = 1_000.0) -> LiveTable:
    rows = tuple(
        RankRow(
            place=RankPlace(rank=r, local_rank=r, node_rank=0, host="host-a", cpus=f"{2 * r}-{2 * r + 1}", numa=r),
            pid=pid,
            steps=40 + r,
            step_s=0.25 if r == 1 else 0.125,
            phases={"input": 0.0125, "compute": 0.1 if r == 1 else 0.05, "comm": 0.0125, "optim": 0.0125},
            peak_bytes=3 * 2**30,
        )
        for r, pid in sorted(pids.items(), reverse=True)  # the agent's order is not the table's
    )
    return LiveTable(updated=updated, rows=rows, steps_per_s=4.0, verdict=VERDICT)


def _row_cells(text: str) -> dict[int, list[str]]:
    """The table's rows by rank (its first cell)."""
    return {int(c[0]): c for line in text.splitlines() if (c := line.split()) and c[0].isdigit() and len(c) > 10}


def test_the_table_has_a_row_a_rank_in_rank_order_with_its_shares_and_the_verdict_under_it() -> None:
    text = render_top(_table({0: 101, 1: 102, 2: 103}), title="pid 7, started now: numarun train.py", now=1_003.0)
    assert "\x1b" not in text
    rows = _row_cells(text)
    assert list(rows) == [0, 1, 2]
    # rank node host cpus numa nic pid steps step(2 cells) input compute comm optim peak(2) state
    assert rows[1] == ["1", "0", "host-a", "2-3", "1", "-", "102", "41", "0.25", "s", "5%", "40%", "5%", "5%"] + [
        "3.0",
        "GiB",
        "running",
    ]
    assert rows[0][8:14] == ["0.125", "s", "10%", "40%", "10%", "10%"]
    lines = text.rstrip().splitlines()
    assert lines[0] == "pid 7, started now: numarun train.py"
    assert lines[-2:] == ["job: 4 steps/s; 3 ranks on 1 node; updated 3 s ago", VERDICT]
    header = next(line for line in lines if line.split()[:2] == ["rank", "node"]).split()
    assert header[-len(PHASES) - 2 : -2] == list(PHASES)


def test_before_any_pace_and_a_part_of_a_multi_node_job() -> None:
    place = RankPlace(rank=5, local_rank=1, node_rank=2, host="h", cpus="", gpu="0")
    live = LiveTable(updated=10.0, rows=(RankRow(place, pid=9, steps=1, step_s=None),), nodes=1, job_nodes=4)
    text = render_top(live, now=10.0)
    assert summary_line(live, now=10.0) == "job: no pace yet; 1 rank on 1 node of the job's 4; updated 0 s ago"
    assert text.rstrip().endswith("=> no verdict yet")
    (row,) = _row_cells(text).values()
    assert row[:9] == ["5", "2", "h", "unbound", "-", "-", "0", "9", "1"] and row[9:14] == ["-"] * 5


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--interval", "0"], "--interval"),
        (["--interval", "soon"], "'soon'"),
        (["--pid", "0"], "--pid"),
        (["--every", "2"], "--every"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:  # argparse's exit, as the command line gets it
        cli.main(["top", *argv])
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err and "Traceback" not in err, err


def test_top_and_stacks_take_the_one_declaration_of_pid() -> None:
    """``--pid`` means the same job in both commands: one declaration (numarun.argtypes.add_job_pid)."""

    def pid(command: str) -> Any:
        parser = cli.build_parser(only=command)
        p = next(a for a in parser._actions if a.dest == "command").choices[command]
        return next(a for a in p._actions if "--pid" in a.option_strings)

    pids = [pid("top"), pid("stacks")]
    assert pids[0].help == pids[1].help and pids[0].metavar == pids[1].metavar == "PID"
    source = "\n".join(p.read_text() for p in (REPO / "launcher").rglob("*.py"))
    assert source.count('add_argument(\n        "--pid"') == 1


def test_the_latest_job_is_chosen_and_said_so_when_several_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two job records of live processes (this test's and its parent): the later started is shown, with a note."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name, pid, started in (("a", os.getppid(), 10.0), ("b", os.getpid(), 20.0)):
        (tmp_path / f"numarun-{name}").mkdir()
        (tmp_path / f"numarun-{name}" / JOB_FILE).write_text(
            json.dumps({"pid": pid, "started": started, "argv": [name]})
        )
    job, note = choose_job(None)
    assert job.pid == os.getpid() and job.state == tmp_path / "numarun-b"
    assert note.startswith(f"numarun: 2 jobs run here; showing the latest, pid {os.getpid()}, started ")
    assert choose_job(os.getppid()) == (_job_of(tmp_path / "numarun-a"), "")


def _job_of(state: Path) -> RunningJob:
    return next(j for j in running_jobs() if j.state == state)


def _env(tmp: Path) -> dict[str, str]:
    (tmp / "tmp").mkdir(exist_ok=True)
    return clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp / "tmp"), COLUMNS="100")


def _top(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*numarun_cmd(), "top", *args], env=_env(tmp), capture_output=True, text=True, timeout=TIMEOUT
    )


def _ranks(numarun: int) -> dict[int, int]:
    """The job's ranks' pids, by rank (from their environment)."""
    out = {}
    for p in psutil.Process(numarun).children(recursive=True):
        try:
            rank = p.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None:
            out[int(rank)] = p.pid
    return out


class _Terminal:
    """A command whose output is a terminal (a pseudo-terminal), read as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        main, side = os.openpty()
        self.proc = subprocess.Popen(argv, env=env, stdin=side, stdout=side, stderr=side, close_fds=True)
        os.close(side)
        self._chunks: list[bytes] = []
        threading.Thread(target=self._read, args=(main,), daemon=True).start()

    def _read(self, fd: int) -> None:
        with contextlib.suppress(OSError):  # EIO once the command has ended
            while chunk := os.read(fd, 65536):
                self._chunks.append(chunk)
        os.close(fd)

    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")


@pytest.mark.slow
def test_numarun_top_on_a_real_job(tmp_path: Path) -> None:
    nothing = _top(tmp_path, "--once")
    assert nothing.returncode == 1 and error_lines(nothing.stderr) == [nothing.stderr.strip()], nothing
    assert "no numarun job of yours runs on this node" in nothing.stderr and not nothing.stdout

    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    (tmp_path / "out").mkdir()
    job = subprocess.Popen(
        [*numarun_cmd(), "--nproc-per-node", "2", "--binding", "node", str(script), str(tmp_path / "out")],
        env=_env(tmp_path),
        stdout=open(tmp_path / "log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    watcher = screen = dumb = None
    try:
        wait_until("both ranks", lambda: len(list((tmp_path / "out").glob("started.*"))) == 2, TIMEOUT, proc=job)
        (record,) = (tmp_path / "tmp").glob(f"numarun-*/{JOB_FILE}")  # where the agent keeps its live view
        pids = _ranks(job.pid)
        assert sorted(pids) == [0, 1], pids

        early = _top(tmp_path, "--once")
        assert early.returncode == 3 and error_lines(early.stderr) == [early.stderr.strip()], early
        assert f"numarun {job.pid} has no step report yet" in early.stderr and not early.stdout

        # the job's own agent writes its view ("no verdict yet": the ranks never step) every few seconds: the test's
        # view is written again before each look, so that a slow start of `numarun top` cannot see the agent's
        live = _table(pids, updated=time.time())

        def planted(ready: Callable[[], bool]) -> Callable[[], bool]:
            def look() -> bool:
                write_atomic(record.parent / LIVE, live.text())
                return ready()

            return look

        planted(lambda: True)()
        once = _top(tmp_path, "--once")
        assert once.returncode == 0 and once.stderr == "", once
        rows = _row_cells(once.stdout)
        assert sorted(rows) == [0, 1] and "\x1b" not in once.stdout, once.stdout
        assert [rows[r][6] for r in (0, 1)] == [str(pids[0]), str(pids[1])]
        assert rows[0][8:10] == ["0.125", "s"] and rows[1][8:10] == ["0.25", "s"]
        assert VERDICT in once.stdout.splitlines() and f"pid {job.pid}, started " in once.stdout

        planted(lambda: True)()
        as_json = _top(tmp_path, "--json", "--pid", str(pids[1]))  # a rank's pid names its job
        assert as_json.returncode == 0 and LiveTable.parse(as_json.stdout) == live, as_json

        stranger = _top(tmp_path, "--once", "--pid", str(os.getpid()))
        assert stranger.returncode == 2 and error_lines(stranger.stderr) == [stranger.stderr.strip()], stranger
        assert f"bad --pid {os.getpid()}: no numarun job" in stranger.stderr

        # the live view until the job ends, then exit 0: piped, one table after another; on a terminal, redrawn
        watcher = subprocess.Popen(
            [*numarun_cmd(), "top", "--interval", "0.2"],
            env=_env(tmp_path),
            stdout=open(tmp_path / "top.out", "w"),
            stderr=subprocess.PIPE,
            text=True,
        )
        screen = _Terminal([*numarun_cmd(), "top", "--interval", "0.2"], {**_env(tmp_path), "TERM": "xterm"})
        dumb = _Terminal([*numarun_cmd(), "top", "--interval", "0.2"], {**_env(tmp_path), "TERM": "dumb"})
        wait_until(
            "two tables", planted(lambda: (tmp_path / "top.out").read_text().count(VERDICT) >= 2), TIMEOUT, proc=watcher
        )
        wait_until("two redraws", planted(lambda: screen.text().count(VERDICT) >= 2), TIMEOUT, proc=screen.proc)
        # a terminal that cannot redraw in place gets one table after another, as a pipe does
        wait_until("two tables on TERM=dumb", planted(lambda: dumb.text().count(VERDICT) >= 2), TIMEOUT, proc=dumb.proc)
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=TIMEOUT)
        assert watcher.wait(timeout=TIMEOUT) == 0 and screen.proc.wait(timeout=TIMEOUT) == 0
        assert dumb.proc.wait(timeout=TIMEOUT) == 0
        assert watcher.stderr is not None and watcher.stderr.read().strip() == f"numarun: job {job.pid} ended"
        assert "\x1b" not in (tmp_path / "top.out").read_text()
        assert "\x1b[" in screen.text() and f"numarun: job {job.pid} ended" in screen.text()
    finally:
        for p in (watcher, screen.proc if screen else None, dumb.proc if dumb else None):
            if p is not None and p.poll() is None:
                p.kill()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
