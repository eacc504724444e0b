"""`numarun submit` against fake Slurm clients on PATH: every external command bounded in time,
`--wait` after slurmctld forgot the job (sacct, else the last known state), every job of a
sweep checked before anything is submitted, `--launch-opt` checked like `numarun run`, no
empty output dir left by a failed submit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from numarun.slurm.submit import parse_gres_gpus, parse_sacct

pytestmark = pytest.mark.slow

NUMARUN = [sys.executable, "-m", "numarun"]
TRAIN = str(REPO / "scripts" / "train.py")


def _fake(tmp: Path, **tools: str) -> dict[str, str]:
    b = tmp / "bin"
    b.mkdir(exist_ok=True)
    for name, body in tools.items():
        (b / name).write_text("#!/bin/bash\n" + body + "\n")
        (b / name).chmod(0o755)
    return dict(os.environ, PATH=f"{b}:{os.environ['PATH']}")


def _submit(env, tmp, *args):
    return subprocess.run([*NUMARUN, "submit", *args], env=env, cwd=tmp, capture_output=True, text=True, timeout=300)


def _script(tmp: Path) -> str:
    s = tmp / "job.py"
    s.write_text("print('hi')\n")
    return str(s)


def test_an_sbatch_that_never_answers_fails_naming_the_timeout(tmp_path):
    env = _fake(tmp_path, sbatch="sleep 600", sinfo="exit 1")
    env["NUMARUN_SLURM_TIMEOUT"] = "2"
    out = tmp_path / "deep" / "out"
    proc = _submit(env, tmp_path, "--output-dir", str(out), _script(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "'sbatch --parsable' did not answer within 2 s" in proc.stderr and "NUMARUN_SLURM_TIMEOUT" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # a failed submit leaves no empty output dir behind (nor the parents it made)
    assert not (tmp_path / "deep").exists()


def test_a_refused_submit_leaves_no_output_dir(tmp_path):
    env = _fake(
        tmp_path,
        sbatch="echo 'sbatch: error: Batch job submission failed: Invalid partition' >&2; exit 1",
        sinfo="exit 1",
    )
    proc = _submit(env, tmp_path, "--output-dir", str(tmp_path / "out"), _script(tmp_path))
    assert proc.returncode == 2 and "sbatch refused the job: sbatch: error: Batch job submission failed" in proc.stderr
    assert not (tmp_path / "out").exists()


FORGOTTEN = dict(
    sbatch="echo 41",
    sinfo="exit 1",
    squeue='echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1',
    scontrol='echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1',
)


def test_wait_falls_back_to_sacct_when_slurmctld_forgot_the_job(tmp_path):
    env = _fake(tmp_path, **FORGOTTEN, sacct='echo "41|FAILED|3:0"')
    proc = _submit(
        env, tmp_path, "--wait", "--poll-seconds", "0.1", "--output-dir", str(tmp_path / "out"), _script(tmp_path)
    )
    assert proc.returncode == 3, proc.stderr
    assert "job 41: FAILED exit code 3:0" in proc.stdout


def test_wait_without_accounting_reports_the_last_known_state_and_why(tmp_path):
    env = _fake(tmp_path, **FORGOTTEN, sacct='echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1')
    proc = _submit(
        env, tmp_path, "--wait", "--poll-seconds", "0.1", "--output-dir", str(tmp_path / "out"), _script(tmp_path)
    )
    assert proc.returncode == 1
    assert "final state unknown" in proc.stdout
    assert "slurmctld forgot it" in proc.stderr and "accounting storage is disabled" in proc.stderr


def test_every_job_of_a_sweep_is_checked_before_submitting(tmp_path):
    env = _fake(tmp_path, sbatch=f"touch {tmp_path}/submitted; echo 1", sinfo="exit 1")
    for bad, shown in ((["trainer.steps=1,-5"], "-5"), (["trainer.steps=1", "model=mlp,nope"], "nope")):
        proc = _submit(env, tmp_path, "--output-dir", str(tmp_path / "out"), TRAIN, "-m", *bad)
        assert proc.returncode == 2 and shown in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "submitted").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "opt, shown",
    [
        ("--binding=bogus", "bad --binding 'bogus'"),
        ("--max-restarts=x", "bad --max-restarts 'x': expected an integer"),
        ("--no-such-option", "unrecognized arguments: --no-such-option"),
        ("--rdzv-endpoint=h:1", "the job does not set itself"),
        ("--nnodes=2", "the job does not set itself"),
    ],
)
def test_launch_opts_are_checked_like_numarun_run(tmp_path, opt, shown):
    env = _fake(tmp_path, sbatch=f"touch {tmp_path}/submitted; echo 1", sinfo="exit 1")
    proc = _submit(env, tmp_path, "--dry-run", f"--launch-opt={opt}", _script(tmp_path))
    assert proc.returncode == 2 and shown in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_whole_node_job_asks_for_every_gpu_sinfo_reports(tmp_path):
    env = _fake(
        tmp_path, sinfo='echo "cpu|(null)"; echo "big*|gpu:h100:8(S:0-1)"; echo "big*|gpu:4,nic:1"; echo "small|gpu:1"'
    )
    proc = _submit(env, tmp_path, "--dry-run", "--nnodes", "2", _script(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --exclusive" in proc.stdout and "#SBATCH --gpus-per-node=4" in proc.stdout
    assert "# Requested: 2 whole nodes (--exclusive): every CPU, 4 GPUs" in proc.stdout
    # a named partition: its own nodes
    small = _submit(env, tmp_path, "--dry-run", "--partition", "small", _script(tmp_path))
    assert "#SBATCH --gpus-per-node=1" in small.stdout
    cpu = _submit(env, tmp_path, "--dry-run", "--partition", "cpu", _script(tmp_path))
    assert "#SBATCH --exclusive" in cpu.stdout and "gpus-per-node" not in cpu.stdout
    part = _submit(env, tmp_path, "--dry-run", "--cpus-per-task", "4", _script(tmp_path))
    assert "#SBATCH --exclusive" not in part.stdout and "gpus-per-node" not in part.stdout


def test_parsers_of_slurm_answers():
    assert parse_gres_gpus("gpu:8\n(null)\n") == 0
    assert parse_gres_gpus("gpu:a100:4(S:0),gpu:v100:2\ngpu:8\n") == 6
    assert parse_gres_gpus("") == 0
    recs = parse_sacct("41_0|COMPLETED|0:0\n41_0.batch|COMPLETED|0:0\n41_1|CANCELLED by 0|0:15\n")
    assert [(r.job_id, r.state, r.exit_code, r.signal) for r in recs] == [
        ("41_0", "COMPLETED", 0, 0),
        ("41_1", "CANCELLED", 0, 15),
    ]
