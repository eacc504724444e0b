"""The suite's fixtures and hooks: recorded machine trees (tests/support/trees.py), the fast tier's rule that a test
starting a process is marked slow, and plain torchrun's reference run.

Where a test goes, and the support modules every test can import (tests/support/ is on sys.path): docs/testing.md.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from skips import pytest_terminal_summary  # noqa: F401  (a hook: the run's end names the tests skipped for want of root)
from trees import H200_TARBALL, SYSFS_DIR, extract_tree

# Extracted trees hold sysfs symlink cycles (cpuN/node0 -> node0/cpuN): never walk them.
collect_ignore = ["fixtures", "golden"]


@pytest.fixture(scope="session")
def h200_tree() -> Path:
    """The live H200 VM capture (1 NUMA node, 16 vCPUs, one H200 at 0000:00:06.0)."""
    return extract_tree(H200_TARBALL)


@pytest.fixture(scope="session")
def sysfs_tree():
    """``sysfs_tree("offline-cpu0-node0")`` -> the extracted root of that hwloc tarball."""

    def get(name: str) -> Path:
        return extract_tree(SYSFS_DIR / f"{name}.tar.bz2")

    return get


# -- the fast tier: `pytest -m "not slow"` ---------------------------------------------------------
# A test that starts a process must be marked slow (decorator or module pytestmark), so that
# the fast tier never spawns. Enforced: in a test without the mark (its fixtures' setup
# included), every way the standard library starts a process raises.


def _spawn_targets() -> list[tuple[object, str]]:
    import _posixsubprocess
    import os
    import subprocess

    targets = [(subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec")]
    targets += [(os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")]
    return [(obj, name) for obj, name in targets if getattr(obj, name, None) is not None]


def _forbid_spawn(item: pytest.Item):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{item.nodeid} starts a process: mark it @pytest.mark.slow (or the module's pytestmark)")

    saved = [(obj, name, getattr(obj, name)) for obj, name in _spawn_targets()]
    for obj, name, _ in saved:
        setattr(obj, name, refuse)
    return saved


@contextlib.contextmanager
def _spawn_guard(item: pytest.Item):
    saved = [] if item.get_closest_marker("slow") else _forbid_spawn(item)
    try:
        yield
    finally:
        for obj, name, original in saved:
            setattr(obj, name, original)


def pytest_sessionstart(session: pytest.Session) -> None:
    """torchrun's options are read once per torch version by a child interpreter and cached
    (numarun.options.torchrun.torchrun_record), as a user's first 'numarun run' does: read here, before any
    test, so that the fast tier's tests that build the run parser find them on a fresh machine too."""
    from numarun.options.torchrun import torchrun_record

    torchrun_record()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _spawn_guard(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _spawn_guard(item):
        yield


@pytest.fixture(scope="session")
def torchrun_ddp(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What plain torchrun's two ranks end with on tests/support/scripts/ddp_train.py: the reference that
    numarun's launcher and per-rank modes are held to. Run once for the whole session, also across
    pytest-xdist's workers (they share the parent of their temporary roots; a lock orders them)."""
    import fcntl
    import json
    import os
    import subprocess
    import sys

    from helpers import REPO, SCRIPTS, TIMEOUT, clean_env

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common root, this run's
    out = shared / "torchrun-ddp.json"
    with open(shared / "torchrun-ddp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            t = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nproc-per-node",
                    "2",
                    "--standalone",
                    str(SCRIPTS / "ddp_train.py"),
                    str(out),
                ],
                cwd=REPO,
                env=clean_env(),
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
            )
            assert t.returncode == 0, t.stderr
        return json.loads(out.read_text())


@pytest.fixture(scope="session")
def trainer_reference(tmp_path_factory: pytest.TempPathFactory):
    """The one-rank run of tests/support/trainer_runs.py's job that every layout is held to: made once for the whole
    session, also across pytest-xdist's workers (as ``torchrun_ddp``)."""
    import fcntl
    import os

    import trainer_runs

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "trainer-reference"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tokens, run_dir = shared / "tokens.bin", shared / "one-rank"
        if not (run_dir / "summary.json").exists():
            trainer_runs.write_tokens(tokens)
            ref = trainer_runs.Reference(tokens, {})
            trainer_runs.train(run_dir, nproc=1, overrides=["parallel=ddp"], ref=ref)
        return trainer_runs.Reference(tokens, trainer_runs.metrics(run_dir))


@pytest.fixture
def procs():
    """Popen objects to kill (with their process groups) however the test ends."""
    import os
    import signal

    started: list = []
    yield started
    for p in started:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(timeout=120)


# -- parallel runs (pytest-xdist; scripts/test.sh runs `-n 3`) -----------------------------------------
# A file's tests stay on one worker (module fixtures, such as the wheel's venv, are built once), and
# files that share a machine-wide resource form one unit, run on one worker one after another: the
# Slurm test cluster, and the network namespaces (a test there checks `ip netns list` is left as it
# found it). The longest units start first so that neither worker is left alone with one at the end.
SHARED = {
    "test_slurm_cluster.py": "slurm-cluster",
    "test_slurm_patterns.py": "slurm-cluster",
    "test_doctor_multinode.py": "netns",
    "test_launch_net.py": "netns",
    "test_bench_scripts.py": "netns",
    "test_comm_multinode.py": "netns",
}
LONGEST_FIRST = (
    "slurm-cluster",
    "netns",
    "test_train_layouts.py",
    "test_train_dist.py",
    "test_train_pipeline.py",
    "test_train_checkpoint_faults.py",
    "test_reliability_layouts.py",
    "test_reliability_soak.py",
    "test_reliability_faults.py",
    "test_hydra_apps.py",
    "test_launch_patterns.py",
    "test_tune_e2e.py",
    "test_wheel.py",
    "test_containers.py",
    "test_reliability_signals.py",
)


def _unit(nodeid: str) -> str:
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return SHARED.get(name, name)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_unit(item.nodeid), len(rank)))  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 (xdist's types)
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # keep LONGEST_FIRST's order
    return ByUnit(config, log)
