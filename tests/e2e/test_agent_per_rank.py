"""The node agent in per-rank mode, where a scheduler starts every rank (no torchrun agent): the sidecar the node's
first task starts gives those jobs the step report, the hang watchdog and ``numarun top`` (docs/slurm.md, "The
node agent in per-rank mode"). Under real ``mpirun`` (Open MPI) on this host, and ``srun --ntasks-per-node=2`` in a
batch script over two nodes of the real Slurm test cluster: an input-bound rank named, a balanced job names none, a
stuck rank named by the roll-call and the job stopped, ``numarun top --once`` shows every rank, and nothing of
numarun's is left running after any of them. Every wait is bounded by :data:`helpers.TIMEOUT`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS, TIMEOUT, clean_env, cluster_env, numarun_cmd, slurm, wait_until

from numarun.launch.sidecar import START_WAIT_S, STATE_PREFIX
from numarun.launch.steps.judge import MIN_STEPS

pytestmark = pytest.mark.slow

STEP_RANK = SCRIPTS / "step_rank.py"
HANG_RANK = SCRIPTS / "hang_rank.py"
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


def _mpirun() -> str:
    exe = shutil.which("mpirun.openmpi")
    if exe is None:
        if os.environ.get("NUMARUN_TEST_MPI") == "1":
            pytest.fail("mpirun.openmpi is missing: scripts/test.sh installs Debian's openmpi-bin as root")
        pytest.skip("no mpirun.openmpi (Debian's openmpi-bin; scripts/test.sh installs it as root)")
    return exe


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    (tmp / "tmp").mkdir(exist_ok=True)
    return clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp / "tmp"), **MPI_ENV, **extra)


def _start(tmp: Path, *args: str, np: int = 2, log: str = "log") -> subprocess.Popen:  # type: ignore[type-arg]
    (tmp / "out").mkdir(exist_ok=True)
    return subprocess.Popen(
        [_mpirun(), "-np", str(np), *numarun_cmd(), "--log-level", "WARNING", *args],
        cwd=REPO,
        env=_env(tmp),
        stdout=open(tmp / log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _finish(p: subprocess.Popen) -> int:  # type: ignore[type-arg]
    try:
        return p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)


def _lines(text: str) -> list[str]:
    return [line[len("numarun: ") :] for line in text.splitlines() if line.startswith("numarun: ")]


def _verdict(text: str) -> str:
    return next((line for line in _lines(text) if line.startswith("=> ")), "(no verdict)")


def _left(tmp: Path) -> list[str]:
    """What of numarun's is still there after the job: its sidecars' directories, and processes that name them."""
    dirs = sorted(str(d) for d in (tmp / "tmp").glob(f"{STATE_PREFIX}*"))
    procs = subprocess.run(["pgrep", "-af", f"{tmp}/tmp/{STATE_PREFIX}"], capture_output=True, text=True).stdout
    return dirs + [line for line in procs.splitlines() if "pgrep" not in line]


def test_mpirun_an_input_bound_rank_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    code = _finish(_start(tmp_path, str(STEP_RANK), str(tmp_path / "out"), "input", "1", "40", "ddp"))
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    lines = _lines(log)
    assert sum(line.startswith("step report: 40 steps of 2 ranks") for line in lines) == 1, log[-3000:]
    assert _verdict(log).startswith("=> rank 1 holds the job back: input, "), lines
    assert "   why: it loads its batches in its main thread (DataLoader num_workers=0)" in "\n".join(lines)
    assert wait_until("nothing left", lambda: not _left(tmp_path) or None, TIMEOUT) is not None


def test_mpirun_a_balanced_job_names_no_rank_and_numarun_top_shows_every_rank(tmp_path: Path) -> None:
    p = _start(tmp_path, str(STEP_RANK), str(tmp_path / "out"), "none", "0", "0", "ddp")
    env = _env(tmp_path, COLUMNS="200")
    seen: list[str] = []

    def every_rank() -> bool:
        r = subprocess.run([*numarun_cmd(), "top", "--once"], env=env, capture_output=True, text=True, timeout=TIMEOUT)
        seen[:] = [r.stdout + r.stderr]
        cells = [c for line in r.stdout.splitlines() if (c := line.split())]
        at = next((c.index("steps") for c in cells if c[0] == "rank" and "steps" in c), None)
        rows = {c[0]: c[at] for c in cells if at is not None and c[0].isdigit() and len(c) > 10}
        # a loaded host may show the first step before the next: the job stops once the judge has steps to judge
        enough = all(steps.isdigit() and int(steps) >= 2 * MIN_STEPS for steps in rows.values())
        return r.returncode == 0 and set(rows) == {"0", "1"} and "=> " in r.stdout and enough

    try:
        wait_until("numarun top with both ranks", every_rank, TIMEOUT, proc=p)
    finally:
        (tmp_path / "out" / "stop").touch()
        code = _finish(p)
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:] + "\n".join(seen)
    assert _verdict(log).startswith("=> no rank holds the job back"), _lines(log)
    assert wait_until("nothing left", lambda: not _left(tmp_path) or None, TIMEOUT) is not None


def test_mpirun_a_stuck_rank_is_named_by_the_roll_call_and_the_job_stopped(tmp_path: Path) -> None:
    """Rank 1 blocks in its batch loading, rank 0 waits in all_reduce: after --hang-timeout the roll-call names rank
    1 in load_batch and --on-hang stop ends every task; mpirun reports them ended."""
    args = ("--hang-timeout", "6", "--on-hang", "stop", str(HANG_RANK), str(tmp_path / "out"), "stuck", "1")
    code = _finish(_start(tmp_path, *args))
    log = (tmp_path / "log").read_text()
    lines = _lines(log)
    assert code != 0, log[-3000:]
    assert any(re.match(r"  rank 1 is at .*hang_rank\.py:\d+ in load_batch", line) for line in lines), lines
    assert "  => rank 1 is not where the others are" in lines, lines
    assert any(line.startswith("error: the job made no progress for ") and "every task ended" in line for line in lines)
    assert wait_until("nothing left", lambda: not _left(tmp_path) or None, TIMEOUT) is not None


# ----------------------------------------------------------------------------- the Slurm test cluster


@pytest.fixture(scope="module")
def cluster() -> dict[str, str]:
    return cluster_env()


def _batch(cluster: dict[str, str], tmp: Path, body: str, *sbatch: str) -> tuple[str, str]:
    """Run a batch script to its end; (its state, its output)."""
    script = tmp / "job.sh"
    script.write_text(f"#!/bin/bash\ncd {shlex.quote(str(REPO))}\nexport TMPDIR={tmp}/tmp\n{body}")
    (tmp / "tmp").mkdir(exist_ok=True)
    log = tmp / "job.out"
    job = slurm(cluster, "sbatch", "--parsable", "--time", "5", "-o", str(log), *sbatch, str(script)).stdout.strip()

    def ended() -> str | None:
        text = slurm(cluster, "scontrol", "show", "job", job, check=False).stdout
        state = dict(re.findall(r"(\w+)=(\S*)", text)).get("JobState", "")
        return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None

    state = wait_until(f"job {job} to end", ended, TIMEOUT, 0.5)
    return state, log.read_text() if log.exists() else ""


@pytest.mark.cluster
def test_srun_one_task_per_rank_over_two_nodes_names_the_slow_rank_once(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """srun --ntasks-per-node=2 over two nodes: rank 3, on node 1, loads slowly. The sidecars meet in node 0's store;
    one summary, on node 0, names rank 3 and its node; the job succeeds and nothing is left."""
    (tmp_path / "out").mkdir()
    exe = str(Path(sys.executable).parent / "numarun")
    body = f"srun --ntasks-per-node=2 {exe} --log-level WARNING {STEP_RANK} {tmp_path}/out input 3 40 ddp\n"
    state, log = _batch(cluster, tmp_path, body, "-N2", "--ntasks-per-node=2")
    assert state == "COMPLETED", log[-3000:]
    assert sum(line.startswith("step report: 40 steps of 4 ranks on 2 nodes") for line in _lines(log)) == 1, log
    assert re.match(r"=> rank 3 \(node 1, \S+\) holds the job back: input, ", _verdict(log)), _lines(log)
    assert "frame #" not in log and "TCPStore" not in log, log
    assert not list((tmp_path / "tmp").glob(f"{STATE_PREFIX}*"))


@pytest.mark.cluster
def test_srun_one_task_per_rank_a_stuck_rank_stops_every_task_on_every_node(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    exe = str(Path(sys.executable).parent / "numarun")
    body = (
        f"srun --ntasks-per-node=2 {exe} --log-level WARNING --hang-timeout 8 --on-hang stop {HANG_RANK} "
        f"{tmp_path}/out stuck 3\n"
    )
    state, log = _batch(cluster, tmp_path, body, "-N2", "--ntasks-per-node=2")
    assert state == "FAILED", log[-3000:]
    lines = _lines(log)
    assert any(
        re.match(r"  rank 3 on node 1 \(\S+\) is at .*hang_rank\.py:\d+ in load_batch", line) for line in lines
    ), log
    assert sum(line.startswith("error: the job made no progress") for line in lines) == 1, log  # node 0, the judge
    assert any(line.startswith("error: node 0 found the job hung") for line in lines), log  # node 1, told by it
    assert not list((tmp_path / "tmp").glob(f"{STATE_PREFIX}*"))


@pytest.mark.parametrize("value", ["abc", "70000"])
def test_a_bad_agent_port_is_one_line_before_any_rank_starts(tmp_path: Path, value: str) -> None:
    (tmp_path / "out").mkdir()
    p = subprocess.run(
        [_mpirun(), "-np", "1", *numarun_cmd(), str(SCRIPTS / "slurm_ranks.py"), "--out", str(tmp_path / "out")],
        cwd=REPO,
        env={**_env(tmp_path), "NUMARUN_AGENT_PORT": value},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    lines = [line for line in p.stderr.splitlines() if line.startswith("numarun: error: ")]
    assert len(lines) == 1 and f"NUMARUN_AGENT_PORT {value!r}" in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not list((tmp_path / "out").iterdir())  # no rank ran
    assert not list((tmp_path / "tmp").glob(f"{STATE_PREFIX}*"))


def test_mpirun_a_script_that_fails_as_it_starts_leaves_nothing_behind(tmp_path: Path) -> None:
    """Every rank's script fails at once (before any heartbeat could say much): the sidecar does not wait for ranks
    that will never come (its first task is gone), and mpirun ends with the script's failure."""
    assert TIMEOUT < START_WAIT_S
    script = tmp_path / "broken.py"
    script.write_text("import sys\nsys.exit(3)\n")
    code = _finish(_start(tmp_path, str(script)))
    assert code != 0
    # within the test's bound, shorter than the sidecar's wait for ranks that start late (START_WAIT_S)
    assert wait_until("nothing left", lambda: not _left(tmp_path) or None, TIMEOUT) is not None
