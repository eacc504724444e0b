"""What tests share for running numarun as users do: the command, a clean environment, bounded waits.

The environment starts from the test's own, minus everything a launcher or scheduler sets
(``NUMARUN_*``, torchrun's, Slurm's and MPI's variables): a test run inside a Slurm job or under
``mpirun`` must not see its own job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
FIXTURES = TESTS / "fixtures"
"""Recorded machines, scheduler outputs and apps (their sources: fixtures/SOURCES.md)."""
GOLDEN = TESTS / "golden"
SCRIPTS = TESTS / "support" / "scripts"
"""Programs the tests run as ranks, jobs and fakes."""
TIMEOUT = 240
"""Never hang CI; not a performance bound."""

_LAUNCH_PREFIXES = ("NUMARUN_", "PET_", "TORCHELASTIC_", "SLURM_", "SLURMD_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL")
_LAUNCH_NAMES = (
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
)

T = TypeVar("T")


def numarun_cmd() -> list[str]:
    """The installed ``numarun`` next to this Python, else ``python -m numarun``."""
    exe = Path(sys.executable).parent / "numarun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "numarun"]


def clean_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (default: this process's environment) without any launcher's or scheduler's variables, plus
    ``extra``."""
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith(_LAUNCH_PREFIXES) and k not in _LAUNCH_NAMES
    }
    env.update(extra)
    return env


def run_numarun(
    *args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT, **extra: str
) -> subprocess.CompletedProcess[str]:
    """``numarun ARGS`` to the end, output captured."""
    return subprocess.run(
        [*numarun_cmd(), *args], cwd=cwd, env=clean_env(env, **extra), capture_output=True, text=True, timeout=timeout
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("numarun: error:")]


def wait_until(
    what: str,
    predicate: Callable[[], T | None],
    limit_s: float = 120.0,
    every_s: float = 0.3,
    proc: subprocess.Popen | None = None,
) -> T:  # type: ignore[type-arg]
    """Poll ``predicate`` until it returns something true; fail the test naming ``what`` after
    ``limit_s``, or as soon as ``proc`` (the numarun under test) has exited without it."""
    import pytest

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"numarun exited ({proc.returncode}) before {what}")
        time.sleep(every_s)
    pytest.fail(f"timed out waiting for {what}")


# ----------------------------------------------------------------------------- the Slurm test cluster


def cluster_env() -> dict[str, str]:
    """The environment for the Slurm test cluster's clients (``scripts/test-cluster.sh up`` wrote it).

    Skips when ``NUMARUN_TEST_CLUSTER`` is unset; fails when it names a file that is not there
    (the cluster was asked for and did not come up: that must not pass as green).
    """
    import shlex  # noqa: F401  (re-exported for callers building commands)

    import pytest

    path = os.environ.get("NUMARUN_TEST_CLUSTER")
    if not path:
        pytest.skip("NUMARUN_TEST_CLUSTER is unset: no Slurm test cluster (run 'sudo bash scripts/test-cluster.sh up')")
    if not os.path.isfile(path):
        pytest.fail(f"NUMARUN_TEST_CLUSTER={path} does not exist: 'scripts/test-cluster.sh up' failed")
    out = subprocess.run(
        ["bash", "-c", 'set -a; source "$1"; env -0', "_", path], capture_output=True, check=True, timeout=30
    ).stdout
    env = clean_env()
    env.update(kv.split("=", 1) for kv in out.decode().split("\0") if "=" in kv)
    return env


def slurm(
    cluster: Mapping[str, str], *argv: str, timeout: float = 60, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """A Slurm client command (sbatch, scontrol...) run where the cluster's clients run."""
    import shlex

    cmd = shlex.split(cluster["NUMARUN_CLUSTER_EXEC"]) + list(argv)
    return subprocess.run(cmd, env=dict(cluster), capture_output=True, text=True, timeout=timeout, check=check)


# ----------------------------------------------------------------------------- processes of a run


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler in place for ``signum`` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(caught >> (signum - 1) & 1)


def alive(pid: int) -> bool:
    """Running (a zombie counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def leaked(pids: list[int], *, within_s: float = 30) -> list[int]:
    """The pids still running ``within_s`` after numarun exited (waits out the last reaps)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def pid_files(out: Path) -> list[int]:
    """The pids test workers wrote as ``OUT/pid<RANK>`` (tests/support/scripts/fault_allreduce.py and others)."""
    return [int(p.read_text()) for p in out.glob("pid*") if not p.name.endswith(".tmp")]


RECORDING_SAMPLER = '''
import json, os

from optuna.samplers import TPESampler


class RecordingSampler(TPESampler):
    """Optuna's TPE sampler, writing down every trial Optuna is told about."""

    def after_trial(self, study, trial, state, values):
        with open(os.environ["TRIALS"], "a") as f:
            f.write(json.dumps({"params": trial.params, "state": state.name, "values": values}) + "\\n")
        super().after_trial(study, trial, state, values)
'''
"""An Optuna sampler (a module for a sweep's config to name) that appends every trial Optuna is told about to
$TRIALS."""

SLEEPER = (
    "import os, sys, time\n"
    "open(os.path.join(sys.argv[1], 'started.' + os.environ['RANK']), 'w').close()\n"
    "time.sleep(600)\n"
)
"""A rank's script: writes ``started.RANK`` into the folder named by its argument, then sleeps (no signal handler)."""
