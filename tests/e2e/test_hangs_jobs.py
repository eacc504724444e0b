"""Hung jobs of real gloo ranks, end to end (docs/hangs.md): the roll-call names the rank that went
elsewhere and the ones waiting in the collective; ``--on-hang stop`` ends the job with exit code 75 and
nothing left running; the default keeps it running (and a SIGTERM, as Slurm's time limit sends numarun,
writes where each rank stood); a healthy job whose ranks sleep at one line is never reported and
``numarun stacks`` names each of its ranks while it runs; two nodes (two agents on this host, c10d on
loopback) get one roll-call, printed on one node, naming the stuck rank on the second.

Each test starts one small job (two agents for the two-node one); about 20-40 s each on a quiet
2-core machine. Every wait is bounded by :data:`helpers.TIMEOUT`; none is a performance bound.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import SCRIPTS, TIMEOUT, clean_env, free_port, leaked, numarun_cmd, pid_files, wait_until

from numarun.launch.hangs import EXIT_HANG, find_py_spy

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "hang_rank.py"
TEXT = SCRIPT.read_text().splitlines()
STUCK_LINE = next(i for i, line in enumerate(TEXT, 1) if "# the stuck line" in line)
COLLECTIVE_LINE = next(i for i, line in enumerate(TEXT, 1) if "# the collective line" in line)
WAITING = f"wait at hang_rank.py:{COLLECTIVE_LINE} in all_reduce (torch.distributed)"
STUCK = f"is at hang_rank.py:{STUCK_LINE} in load_batch"


def _env(tmp: Path) -> dict[str, str]:
    (tmp / "tmp").mkdir(exist_ok=True)
    return clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp / "tmp"))


def _out(tmp: Path) -> Path:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    return out


def _start(tmp: Path, *args: str, ranks: tuple[str, str], log: str = "log") -> subprocess.Popen:  # type: ignore[type-arg]
    """``numarun ARGS hang_rank.py OUT MODE N`` (``ranks``: MODE, N) in a session of its own, output in ``tmp/log``."""
    argv = [*numarun_cmd(), "--log-level", "WARNING", "--binding", "node", *args, str(SCRIPT), str(_out(tmp)), *ranks]
    return subprocess.Popen(
        argv, cwd=SCRIPTS, env=_env(tmp), stdout=open(tmp / log, "w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _finish(p: subprocess.Popen) -> int:  # type: ignore[type-arg]
    try:
        return p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def _rollcall(text: str) -> list[str]:
    return [line[len("numarun:   ") :] for line in text.splitlines() if line.startswith("numarun:   ")]


def _ranks_named(lines: list[str]) -> set[int]:
    """Every rank a roll-call's group lines name (``ranks 0-2,5 ...``, ``rank 3 ...``)."""
    named: set[int] = set()
    for line in lines:
        m = re.match(r"ranks? ([\d,-]+) ", line)
        for part in m.group(1).split(",") if m else []:
            lo, _, hi = part.partition("-")
            named.update(range(int(lo), int(hi or lo) + 1))
    return named


def _source_says(text: str) -> None:
    """Which stacks were used is said: py-spy's native frames where it runs here, else the in-process ones."""
    head = next(line for line in text.splitlines() if "roll-call of" in line)
    assert ("py-spy with native frames" if find_py_spy() else "py-spy is not installed") in head, head


def test_four_ranks_one_stuck_in_its_batch_loading_stop_with_exit_75_naming_it(tmp_path: Path) -> None:
    """The issue's job: rank 2 blocks in load_batch, ranks 0, 1, 3 wait in all_reduce. With --hang-timeout 15
    --on-hang stop it ends (the test's timeout bounds how soon), naming both, and leaves no process."""
    p = _start(tmp_path, "--nproc-per-node", "4", "--hang-timeout", "15", "--on-hang", "stop", ranks=("stuck", "2"))
    code = _finish(p)
    log = (tmp_path / "log").read_text()
    assert code == EXIT_HANG, (code, log[-4000:])
    assert _rollcall(log) == [f"ranks 0,1,3 {WAITING}", f"rank 2 {STUCK}", "=> rank 2 is not where the others are"], log
    assert log.count("roll-call of 4 ranks") == 1 and "Traceback" not in log, log
    assert f"stopped it (--on-hang stop, exit code {EXIT_HANG})" in log.splitlines()[-1], log
    _source_says(log)
    kept = Path(re.search(r"this roll-call: (\S+)", log).group(1))  # type: ignore[union-attr]
    assert f"rank 2 {STUCK}" in kept.read_text() and kept.is_relative_to(tmp_path / "tmp")
    stacks = Path(re.search(r"every thread of every rank: (\S+)", log).group(1)).read_text()  # type: ignore[union-attr]
    assert stacks.count("=== rank ") == 4 and '"MainThread"' in stacks and "load_batch" in stacks
    pids = pid_files(_out(tmp_path))
    assert len(pids) == 4 and leaked(pids) == []
    assert not list((tmp_path / "tmp").glob("numarun-*/"))  # numarun's private directory went with it


def test_by_default_the_job_keeps_running_after_the_roll_call_and_a_sigterm_writes_where_ranks_stood(
    tmp_path: Path,
) -> None:
    p = _start(tmp_path, "--nproc-per-node", "2", "--hang-timeout", "5", ranks=("stuck", "1"))
    log = tmp_path / "log"
    try:
        wait_until("the roll-call", lambda: "=> rank 1 is not where the others are" in log.read_text(), TIMEOUT, proc=p)
        beat = next((tmp_path / "tmp").glob("numarun-*/progress.0"))
        seen = _samples(beat)
        wait_until("five more samples", lambda: _samples(beat) >= seen + 5, TIMEOUT, proc=p)
        text = log.read_text()
        assert _rollcall(text) == [
            f"rank 0 {WAITING.replace('wait ', 'waits ')}",
            f"rank 1 {STUCK}",
            "=> rank 1 is not where the others are",
        ], text
        assert text.count("roll-call of") == 1 and "the job keeps running (--on-hang report)" in text, text
        pids = pid_files(_out(tmp_path))
        assert p.poll() is None and len(pids) == 2 and all(_alive(pid) for pid in pids)
        p.send_signal(signal.SIGTERM)  # as Slurm's time limit reaches numarun
        code = _finish(p)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 128 + signal.SIGTERM, (code, text[-3000:])
    stood = Path(re.search(r"where each rank stood at SIGTERM: (\S+)", text).group(1)).read_text()  # type: ignore[union-attr]
    assert f"rank 1 {STUCK}" in stood and "rank 0 waits at" in stood, stood
    assert leaked(pids) == []


def _samples(beat: Path) -> int:
    import json

    try:
        return int(json.loads(beat.read_text())["samples"])
    except (OSError, ValueError, KeyError):
        return 0


def _alive(pid: int) -> bool:
    from helpers import alive

    return alive(pid)


def test_a_healthy_job_sleeping_at_one_line_is_never_reported_and_numarun_stacks_names_its_ranks(
    tmp_path: Path,
) -> None:
    """Each step sleeps 1 s at one line, then all-reduces: with --hang-timeout 3 every sample sees the same stack,
    the counters move. ``numarun stacks --pid`` (this job, chosen explicitly) names both ranks; the job ends 0."""
    p = _start(tmp_path, "--nproc-per-node", "2", "--hang-timeout", "3", ranks=("healthy", "14"))
    try:
        wait_until("both ranks", lambda: len(list(_out(tmp_path).glob("started.*"))) == 2, TIMEOUT, proc=p)
        r = subprocess.run(
            [*numarun_cmd(), "stacks", "--pid", str(p.pid)],
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert r.returncode == 0, r.stderr
        assert "roll-call of 2 ranks" in r.stdout and _ranks_named(_rollcall(r.stdout)) == {0, 1}, r.stdout
        _source_says(r.stdout)
        listed = subprocess.run(
            [*numarun_cmd(), "stacks", "--list"], env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT
        )
        assert f"pid {p.pid}," in listed.stdout, listed
        code = _finish(p)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    assert "hang:" not in log and "roll-call" not in log, log


def test_two_nodes_one_roll_call_names_the_stuck_rank_on_the_second_node(tmp_path: Path) -> None:
    """Two agents on this host, c10d rendezvous on loopback, two ranks each: rank 3 (on the node of group rank 1)
    blocks. One roll-call for the whole job, printed on one node; both end with 75, nothing left."""
    port = free_port()
    args = (
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "hangs",
        "--hang-timeout",
        "10",
        "--on-hang",
        "stop",
    )
    nodes = [_start(tmp_path, *args, ranks=("stuck", "3"), log=f"log{i}") for i in range(2)]
    codes = [_finish(p) for p in nodes]
    logs = [(tmp_path / f"log{i}").read_text() for i in range(2)]
    assert codes == [EXIT_HANG, EXIT_HANG], (codes, logs)
    printed = [text for text in logs if "roll-call of" in text]
    assert len(printed) == 1 and printed[0].count("roll-call of 4 ranks on 2 nodes") == 1, logs
    lines = _rollcall(printed[0])
    assert lines[0] == f"ranks 0-2 {WAITING}", lines
    assert re.fullmatch(rf"rank 3 on node 1 \(.*\) {re.escape(STUCK)}", lines[1]) and lines[2].startswith(
        "=> rank 3 "
    ), lines
    other = next(text for text in logs if text is not printed[0])
    assert "found the job hung" in other and "Traceback" not in "".join(logs), logs
    pids = pid_files(_out(tmp_path))
    assert len(pids) == 4 and leaked(pids) == []
