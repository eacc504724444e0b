"""Hung jobs whose ranks hang outside their main thread's own frames, end to end (docs/hangs.md, "Workers,
threads and the kernel"): real gloo ranks started by numarun, one role each (tests/support/scripts/hang_elsewhere.py).

* ``--on-hang stop``: a rank whose DataLoader worker blocks (named with where the worker stands), a rank stopped
  by SIGSTOP, a rank asleep in the kernel (state D, with the kernel's wait channel) and a rank that exited 0, while
  one waits in all_reduce; the job ends with exit code 75 and no process is left, the workers included;
* the default ``report``, ``numarun stacks``, then SIGTERM as Slurm's time limit sends it: a rank blocked in a
  checkpoint save (a thread waiting for a spawned writer process) is named with where the thread and the process
  stand; the stopped rank is continued so that the SIGTERM ends it at once (``--shutdown-timeout 600``: were it
  left stopped, torchrun would SIGKILL it only after 600 s, past the test's own limit).

Two jobs, about 20 and 12 s on a quiet 2-core machine. Every wait is bounded by :data:`helpers.TIMEOUT`; none is a
performance bound.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SCRIPTS, TIMEOUT, clean_env, leaked, numarun_cmd, pid_files, wait_until

from numarun.launch.hangs import EXIT_HANG, find_py_spy

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "hang_elsewhere.py"
TEXT = SCRIPT.read_text().splitlines()


def _line(tag: str) -> int:
    return next(i for i, line in enumerate(TEXT, 1) if f"# the {tag}" in line)


WAITS = f"waits at hang_elsewhere.py:{_line('collective line')} in all_reduce (torch.distributed)"
STOPPED = "is stopped (state T: SIGSTOP, job control or a debugger), "


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """The job's ``$TMPDIR``: a short path, as a DataLoader's workers pass tensors through a Unix socket there
    (``AF_UNIX path too long`` under pytest's own temporary directories)."""
    path = Path(tempfile.mkdtemp(prefix="nh", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(tmp: Path, temp: Path, *args: str, roles: tuple[str, ...]) -> subprocess.Popen:  # type: ignore[type-arg]
    (tmp / "out").mkdir(exist_ok=True)
    argv = [*numarun_cmd(), "--log-level", "WARNING", "--binding", "node", "--nproc-per-node", str(len(roles))]
    return subprocess.Popen(
        [*argv, *args, str(SCRIPT), str(tmp / "out"), *roles],
        cwd=SCRIPTS,
        env=clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(temp)),
        stdout=open(tmp / "log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _finish(p: subprocess.Popen) -> int:  # type: ignore[type-arg]
    try:
        return p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def _rollcall(text: str) -> list[str]:
    """The roll-call's lines of the first roll-call in ``text``, their indentation kept past the first level."""
    head = "numarun:   "
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "roll-call of" in line)
    out = []
    for line in lines[start + 1 :]:
        if not line.startswith(head):
            break
        out.append(line[len(head) :])
    return out


def _pids(lines: list[str]) -> list[int]:
    return [int(p) for line in lines for p in re.findall(r"\(pid (\d+)\)", line)]


def test_stop_names_a_loader_worker_a_stopped_rank_a_rank_in_the_kernel_and_one_that_exited(
    tmp_path: Path, short_tmp: Path
) -> None:
    roles = ("wait", "loader", "stop", "kernel", "exit")
    p = _start(tmp_path, short_tmp, "--hang-timeout", "8", "--on-hang", "stop", roles=roles)
    code = _finish(p)
    log = (tmp_path / "log").read_text()
    assert code == EXIT_HANG, (code, log[-4000:])
    lines = _rollcall(log)
    stuck = int((tmp_path / "out" / "helpers.1").read_text())
    spy = find_py_spy() is not None  # then a halted rank's frames are read as it stands, else its last sample's
    assert lines[0] == f"rank 0 {WAITS}", lines
    assert lines[1] == f"rank 1 is at hang_elsewhere.py:{_line('loader line')} in __next__ (torch.utils.data)", lines
    assert re.fullmatch(r"  its DataLoader worker 0 \(pid \d+\) is in _worker_loop \(torch\.utils\.data\)", lines[2])
    assert (
        lines[3] == f"  its DataLoader worker 1 (pid {stuck}) is at hang_elsewhere.py:{_line('worker')} in __getitem__"
    )
    assert lines[4].startswith(f"rank 2 {STOPPED}"), lines
    assert not spy or lines[4].endswith(f"at hang_elsewhere.py:{_line('stop line')} in astray"), lines
    assert lines[5].startswith("rank 3 is in uninterruptible sleep (state D) in the kernel's "), lines
    assert not spy or lines[5].endswith(f"at hang_elsewhere.py:{_line('kernel line')} in astray"), lines
    rest = lines[6:]
    if os.geteuid() == 0:  # /proc/<pid>/stack is root's
        assert rest.pop(0).startswith("  its kernel stack: "), lines
    assert re.fullmatch(r"  its process 'python' \(pid \d+\) is sleeping \(state S\).*", rest[0]), lines  # vfork's
    assert rest[1:] == ["rank 4 has exited (code 0)", "=> ranks 1-4 are not where the others are"], lines
    head = next(line for line in log.splitlines() if "roll-call of" in line)
    assert ("py-spy with native frames" if spy else "py-spy is not installed") in head, head  # no py-spy time-out
    assert "Traceback" not in log and log.count("roll-call of 5 ranks") == 1, log
    stacks = Path(re.search(r"every thread of every rank: (\S+)", log).group(1)).read_text()  # type: ignore[union-attr]
    assert f"--- DataLoader worker 1 (pid {stuck}, parent " in stacks and "__getitem__" in stacks
    pids = pid_files(tmp_path / "out") + _pids(lines)
    assert len(pids) == 5 + 3 and leaked(pids) == []


def test_a_rank_blocked_in_a_checkpoint_save_then_sigterm_ends_a_stopped_rank_at_once(
    tmp_path: Path, short_tmp: Path
) -> None:
    """The roll-call asked with ``numarun stacks`` once the writer (a spawned process: it imports torch first) stands
    where it blocks and rank 2 is stopped; then SIGTERM."""
    p = _start(tmp_path, short_tmp, "--hang-timeout", "5", "--shutdown-timeout", "600", roles=("wait", "save", "stop"))
    out = tmp_path / "out"
    try:
        wait_until("the writer and the stop", lambda: (out / "helpers.1").exists() and _stopped(out / "pid2"), proc=p)
        r = subprocess.run(
            [*numarun_cmd(), "stacks", "--pid", str(p.pid)],
            env=clean_env(TMPDIR=str(short_tmp)),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert r.returncode == 0, r.stderr
        lines = _rollcall(r.stdout)
        writer = int((out / "helpers.1").read_text())
        assert lines[0] == f"rank 0 {WAITS}", lines
        assert lines[1] == f"rank 1 is at hang_elsewhere.py:{_line('save line')} in join (threading)", lines
        writes = f"hang_elsewhere.py:{_line('writer')} in write_shard"
        assert f"  its process 'ckpt-writer' (pid {writer}) is at {writes}" in lines, lines
        joins = f"hang_elsewhere.py:{_line('save thread')} in join (multiprocessing)"
        assert f"  its thread 'ckpt-save' is at {joins}" in lines, lines
        assert lines[-2].startswith(f"rank 2 {STOPPED}") and lines[-1] == "=> ranks 1,2 are not where the others are"
        p.send_signal(signal.SIGTERM)  # as Slurm's time limit reaches numarun
        code = _finish(p)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = (tmp_path / "log").read_text()
    assert code == 128 + signal.SIGTERM, (code, text[-3000:])
    assert "Unable to shutdown process" not in text and "Traceback" not in text, text  # torchrun's SIGKILL, later
    assert leaked([*pid_files(out), writer]) == []


def _stopped(pid_file: Path) -> bool:
    try:
        return Path(f"/proc/{int(pid_file.read_text())}/stat").read_text().rpartition(")")[2].split()[0] == "T"
    except (OSError, ValueError, IndexError):
        return False
