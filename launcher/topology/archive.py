"""Recorded machine trees kept as tarballs (``hwloc-gather-topology`` writes ``.tar.bz2``).

A tarball is extracted once into a cache directory keyed on its content, then read like any
directory standing for a machine's ``/``. Members are extracted with tarfile's ``data``
filter, so nothing lands outside the cache (no absolute paths, no links leaving it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from ..errors import TopologyError

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def safe_extract(tf: tarfile.TarFile, dest: Path) -> None:
    """``extractall`` that lands nothing outside ``dest``.

    tarfile's ``data`` filter where Python has it (3.12, 3.11.4+, 3.10.12+); on older
    patch releases the same refusals are checked here first: absolute or ``..`` paths,
    links pointing out of the tree, devices.
    """
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, filter="data")
        return
    root = os.path.realpath(dest)
    for m in tf.getmembers():
        target = os.path.realpath(os.path.join(root, m.name))
        bad = not (target == root or target.startswith(root + os.sep)) or m.isdev()
        if m.issym() or m.islnk():
            base = os.path.dirname(target) if m.issym() else root
            link = os.path.realpath(os.path.join(base, m.linkname))
            bad = bad or os.path.isabs(m.linkname) or not (link == root or link.startswith(root + os.sep))
        if bad:
            raise tarfile.TarError(f"member {m.name!r} would land outside the tree")
    tf.extractall(dest)


def is_tarball(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(TAR_SUFFIXES)


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/numarun/trees`` (``~/.cache/numarun/trees``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "numarun" / "trees"


def extract_tree(tarball: Path, cache: Path | None = None) -> Path:
    """Extract ``tarball`` once (keyed on its SHA-256) and return the tree's ``/``.

    The root is the directory holding ``sys/``: the top of the archive, or its single top
    directory (hwloc's captures wrap the tree in one, named after the machine).
    """
    cache = cache or default_cache()
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:16]
    dest = cache / f"{tarball.name.split('.tar')[0]}-{digest}"
    if not (dest / ".complete").exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=cache))
        try:
            with tarfile.open(tarball) as tf:
                safe_extract(tf, tmp)
        except (tarfile.TarError, OSError, EOFError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            why = (str(e).splitlines() or [type(e).__name__])[0].rstrip(":")  # tarfile's can span lines
            raise TopologyError(
                f"bad topology archive {str(tarball)!r}: {why}; expected a tarball of a machine's /sys and /proc "
                "(as hwloc-gather-topology writes)"
            ) from None
        (tmp / ".complete").write_text("ok\n")
        try:
            os.rename(tmp, dest)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    if (dest / "sys").is_dir():
        return dest
    dirs = [p for p in dest.iterdir() if p.is_dir()]
    if len(dirs) == 1 and (dirs[0] / "sys").is_dir():
        return dirs[0]
    raise TopologyError(
        f"bad topology archive {str(tarball)!r}: no sys/ directory at its top or in its single top directory; "
        "expected a tarball of a machine's /sys and /proc"
    )
