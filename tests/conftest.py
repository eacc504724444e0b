"""Shared test helpers: recorded machine trees, extracted once into a cache outside the repo.

The sysfs/procfs captures stay in the repository as tarballs (their symlinks and odd file
names survive that way); tests extract them on first use into ``$TMPDIR/numarun-fixture-trees``.
Never inside the checkout: the trees hold symlink cycles, and setuptools walks the whole
project directory following links when it builds (``pip install -e .`` would never end).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest

from numarun.topology import archive

FIXTURES = Path(__file__).parent / "fixtures"
EXTRACTED = Path(tempfile.gettempdir()) / "numarun-fixture-trees"
SYSFS_DIR = FIXTURES / "hwloc-linux-sysfs"
HWLOC_XML_DIR = FIXTURES / "hwloc"
H200_TARBALL = FIXTURES / "live-h200-vm" / "sysfs.tar.gz"

# Extracted trees hold sysfs symlink cycles (cpuN/node0 -> node0/cpuN): never walk them.
collect_ignore = ["fixtures", "golden"]


def extract_tree(tarball: Path) -> Path:
    """Extract ``tarball`` once (into :data:`EXTRACTED`) and return the tree's ``/``."""
    return archive.extract_tree(tarball, EXTRACTED)


def sysfs_tarballs() -> list[Path]:
    return sorted(SYSFS_DIR.glob("*.tar.bz2"))


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _spawn_guard(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _spawn_guard(item):
        yield


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
