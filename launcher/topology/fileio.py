"""The one bounded read of machine data: a regular file, at most a cap (docs/design-notes.md)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import TopologyError

MAX_BYTES = 64 << 20  # an hwloc XML of a 384-PU machine is a few MB

_KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


def read_bounded(path: Path | str, *, shown: str | None = None, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path``; OSError as ``open`` raises it, a TopologyError naming
    ``shown`` for anything not a regular file or larger than ``limit``."""
    name = shown or str(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise TopologyError(f"bad topology file {name!r}: it is {kind}; expected a regular file")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise TopologyError(
                    f"bad topology file {name!r}: larger than {limit} bytes; expected a topology file of at most that "
                    "size"
                )
        return b"".join(chunks)
    finally:
        os.close(fd)
