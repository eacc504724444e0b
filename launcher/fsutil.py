"""Writing files so that no reader ever sees half of one (results, summaries, reports)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from .errors import OutputError, UsageError


def cache_dir() -> Path:
    """numarun's cache: ``$XDG_CACHE_HOME/numarun``, else ``~/.cache/numarun``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numarun"


def write_atomic(path: Path, text: str, mode: int = 0o666) -> None:
    """Write ``text`` to a fresh temp file beside ``path`` (O_EXCL|O_NOFOLLOW, ``mode`` under the umask) and rename it
    over ``path``, replacing a symlink there rather than writing through it; OSError leaves nothing behind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_output(path: str, text: str, *, flag: str) -> Path:
    """:func:`write_atomic` for a file the user named with ``flag``: UsageError for a missing directory, a directory,
    a device or a pipe (a rename would replace ``/dev/null`` itself), OutputError for a failed write."""
    target = Path(path)
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(
            f"bad {flag} {path!r}: directory {str(parent)!r} does not exist; expected a file in an existing directory"
        )
    if target.is_dir():
        raise UsageError(f"bad {flag} {path!r}: it is a directory; expected a file name")
    if target.exists() and not target.is_file():
        raise UsageError(f"bad {flag} {path!r}: it is not a regular file (a device or a pipe); expected a file path")
    try:
        write_atomic(target, text)
    except OSError as e:
        raise OutputError(
            f"cannot write {flag} {path!r}: {e.strerror}; expected a writable file path with room"
        ) from None
    return target
