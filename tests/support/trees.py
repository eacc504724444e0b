"""Recorded machine trees, extracted once into a cache outside the repo.

The sysfs/procfs captures stay in the repository as tarballs (their symlinks and odd file
names survive that way); tests extract them on first use into ``$TMPDIR/numarun-fixture-trees``.
Never inside the checkout: the trees hold symlink cycles, and setuptools walks the whole
project directory following links when it builds (``pip install -e .`` would never end).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from helpers import FIXTURES

from numarun.topology import archive

EXTRACTED = Path(tempfile.gettempdir()) / "numarun-fixture-trees"
SYSFS_DIR = FIXTURES / "hwloc-linux-sysfs"
HWLOC_XML_DIR = FIXTURES / "hwloc"
H200_TARBALL = FIXTURES / "live-h200-vm" / "sysfs.tar.gz"


def extract_tree(tarball: Path) -> Path:
    """Extract ``tarball`` once (into :data:`EXTRACTED`) and return the tree's ``/``."""
    return archive.extract_tree(tarball, EXTRACTED)


def sysfs_tarballs() -> list[Path]:
    return sorted(SYSFS_DIR.glob("*.tar.bz2"))
