"""Recorded machine trees kept as tarballs, extracted once, safely and bounded (why: docs/design-notes.md)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from .. import envvars
from ..argtypes import ascii_digits
from ..errors import TopologyError

MAX_BYTES = 1 << 30
MAX_MEMBERS = 200_000

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def safe_extract(tf: tarfile.TarFile, dest: Path) -> None:
    """``extractall`` that lands nothing outside ``dest`` (tarfile's ``data`` filter, or its refusals)."""
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


def _cap(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    if not text:
        return default
    if not ascii_digits(text) or int(text) < 1:
        raise TopologyError(f"bad {name} {text!r}: expected a positive whole number")
    return int(text)


def check_size(tf: tarfile.TarFile, *, max_bytes: int, max_members: int) -> None:
    """Count the members of ``tf`` and their bytes from its headers alone; TarError at the first member past either
    cap."""
    count = total = 0
    for m in tf:
        count += 1
        total += max(m.size, 0)
        if count > max_members:
            raise tarfile.TarError(f"more than {max_members} members (set {envvars.TAR_MAX_MEMBERS} to allow more)")
        if total > max_bytes:
            raise tarfile.TarError(
                f"members exceed {max_bytes} bytes extracted (set {envvars.TAR_MAX_BYTES} to allow more)"
            )


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_tarball(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(TAR_SUFFIXES)


def extract_tree(tarball: Path, cache: Path | None = None) -> Path:
    """Extract ``tarball`` once (keyed on its SHA-256) and return the tree's ``/``: the directory holding ``sys/``."""
    from ..fsutil import cache_dir

    cache = cache or cache_dir() / "trees"
    max_bytes = _cap(envvars.TAR_MAX_BYTES, MAX_BYTES)
    max_members = _cap(envvars.TAR_MAX_MEMBERS, MAX_MEMBERS)
    try:
        digest = file_digest(tarball)[:16]
    except OSError as e:
        raise TopologyError(
            f"bad topology archive {str(tarball)!r}: {e.strerror}; expected a readable tarball"
        ) from None
    dest = cache / f"{tarball.name.split('.tar')[0]}-{digest}"
    if not (dest / ".complete").exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=cache))
        try:
            with tarfile.open(tarball) as tf:
                check_size(tf, max_bytes=max_bytes, max_members=max_members)
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
