"""Shared test helpers: recorded machine trees, extracted once into a cache outside the repo.

The sysfs/procfs captures stay in the repository as tarballs (their symlinks and odd file
names survive that way); tests extract them on first use into ``$TMPDIR/numarun-fixture-trees``.
Never inside the checkout: the trees hold symlink cycles, and setuptools walks the whole
project directory following links when it builds (``pip install -e .`` would never end).
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
EXTRACTED = Path(tempfile.gettempdir()) / "numarun-fixture-trees"
SYSFS_DIR = FIXTURES / "hwloc-linux-sysfs"
HWLOC_XML_DIR = FIXTURES / "hwloc"
H200_TARBALL = FIXTURES / "live-h200-vm" / "sysfs.tar.gz"

# Extracted trees hold sysfs symlink cycles (cpuN/node0 -> node0/cpuN): never walk them.
collect_ignore = ["fixtures", "golden"]


def _tar_name(tarball: Path) -> str:
    name = tarball.name
    for suffix in (".tar.bz2", ".tar.gz", ".tgz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def extract_tree(tarball: Path) -> Path:
    """Extract ``tarball`` once and return the directory standing for the machine's ``/``.

    hwloc's tarballs hold one top directory (its name can differ from the file name); our
    own captures hold ``sys/`` and ``proc/`` at the top.
    """
    key = tarball.parent.name + "__" + _tar_name(tarball)
    dest = EXTRACTED / key
    if not (dest / ".complete").exists():
        EXTRACTED.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=key + ".", dir=EXTRACTED))
        with tarfile.open(tarball) as tf:
            # The "data" filter refuses members and links that would land outside tmp.
            tf.extractall(tmp, filter="data")
        (tmp / ".complete").write_text("ok\n")
        try:
            os.rename(tmp, dest)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    entries = [p for p in dest.iterdir() if p.name != ".complete"]
    if (dest / "sys").is_dir():
        return dest
    dirs = [p for p in entries if p.is_dir()]
    if len(dirs) == 1:
        return dirs[0]
    raise AssertionError(f"cannot find the root of the tree in {tarball}")


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
