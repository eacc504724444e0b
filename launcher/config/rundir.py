"""Run-dir safety: never create or write through a symbolic link planted at a run dir's name.

Hydra creates the run dir (``mkdir -p``, which follows links); numarun checks the path
first (:func:`check_run_dir`, when it composes the job, before Hydra's job runner makes the
dir) and writes its own files with :func:`write_text_nofollow`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from ..fsutil import write_atomic


def check_run_dir(path: Path, *, root: Path | None = None) -> None:
    """Refuse ``path`` when it, or a directory between ``root`` (default: the cwd) and it, is a symlink.

    Only the part below ``root`` is checked: a path the user spelled through a link of
    their own above it (``/scratch -> /lus/scratch``) is theirs to choose.
    """
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
                f"bad run dir {str(path)!r}: {str(p)!r} exists and is not a directory; expected a writable directory path"
            )
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"bad run dir {str(path)!r}: {str(existing)!r} is not a directory; expected a writable directory path")
    if existing != path and not os.access(existing, os.W_OK):
        raise ConfigError(f"bad run dir {str(path)!r}: {str(existing)!r} is not writable; expected a writable directory path")


def write_text_nofollow(path: Path, text: str) -> None:
    """Write a file atomically, refusing a symlink planted at its name.

    The text goes to a fresh temp file beside it (O_EXCL) and is renamed over the name:
    on a multi-node job every node's numarun writes the same config into the shared run
    dir, and a rank must never read a half-written one. A rename replaces a link rather
    than writing through it, and a planted link is refused outright.
    """
    if path.is_symlink():
        raise ConfigError(f"bad run dir file {str(path)!r}: it is a symbolic link; expected a regular file")
    try:
        write_atomic(path, text)
    except OSError as e:
        raise ConfigError(f"bad run dir file {str(path)!r}: {e.strerror}; expected a writable path") from None
