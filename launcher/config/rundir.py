"""Run-dir safety: never create or write through a symbolic link planted at a run dir's name.

Hydra's ``mkdir -p`` follows links, so the path is checked when the job is composed, before Hydra makes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from ..fsutil import write_atomic


def check_run_dir(path: Path, *, root: Path | None = None) -> None:
    """Refuse ``path`` when it, or a directory between ``root`` (default: the cwd) and it, is a symlink
    (a link above ``root``, such as ``/scratch -> /lus/scratch``, is the user's own choice)."""
    path = Path(os.path.abspath(path))
    base = Path(os.path.abspath(root or os.getcwd()))
    below = [p for p in (path, *path.parents) if base in p.parents] if base in path.parents else [path]
    for p in below:
        if p.is_symlink():
            raise ConfigError(
                f"bad run dir {str(path)!r}: {str(p)!r} is a symbolic link; expected real directories "
                "(or hydra.run.dir=DIR naming one)"
            )
        if p.exists() and not p.is_dir():
            raise ConfigError(
                f"bad run dir {str(path)!r}: {str(p)!r} exists and is not a directory; expected a writable directory "
                "path"
            )
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(
            f"bad run dir {str(path)!r}: {str(existing)!r} is not a directory; expected a writable directory path"
        )
    if existing != path and not os.access(existing, os.W_OK):
        raise ConfigError(
            f"bad run dir {str(path)!r}: {str(existing)!r} is not writable; expected a writable directory path"
        )


def write_text_nofollow(path: Path, text: str) -> None:
    """Write a file atomically (every node writes the same config into a shared run dir), refusing a planted symlink."""
    if path.is_symlink():
        raise ConfigError(f"bad run dir file {str(path)!r}: it is a symbolic link; expected a regular file")
    try:
        write_atomic(path, text)
    except OSError as e:
        raise ConfigError(f"bad run dir file {str(path)!r}: {e.strerror}; expected a writable path") from None
