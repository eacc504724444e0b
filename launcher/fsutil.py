"""Writing files so that no reader ever sees half of one (results, summaries, reports)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .errors import OutputError, UsageError


def cache_dir() -> Path:
    """numarun's cache: ``$XDG_CACHE_HOME/numarun``, else ``~/.cache/numarun``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numarun"


def write_atomic(path: Path, text: str, mode: int = 0o666) -> None:
    """Write ``text`` to a fresh temp file beside ``path`` and rename it over ``path``.

    The temp file is created with O_EXCL|O_NOFOLLOW and ``mode`` (0666), so the result follows
    the user's umask like any ``open()``; a rename replaces a symlink at ``path`` rather
    than writing through it. Raises ``OSError``; nothing is left behind on failure.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_output(path: str, text: str, *, flag: str) -> Path:
    """:func:`write_atomic` for a file the user named with ``flag`` (``--svg``...).

    A missing directory, a directory, a device or a pipe given as the file is a one-line
    :class:`UsageError` (exit 2); a write that fails (a full disk, no permission) is a one-line
    :class:`OutputError` (exit 1). Both name the flag and the value; nothing is written then.
    A device or a pipe is refused because the file is replaced whole by a rename: run as root,
    ``--svg /dev/null`` would otherwise put a regular file where the device was.
    """
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
        raise OutputError(f"cannot write {flag} {path!r}: {e.strerror}; expected a writable file path with room") from None
    return target
