"""A rank's records file, read as it grows (the rank appends a JSON line a step: :mod:`numarun.worker.phases`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ...worker.steps import RECORDS, StepRecord, read_records


class Tail:
    """A rank's records file, read as it grows; a new file (a restarted rank, a rotation) starts over."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode = -1
        self.partial = ""

    def read(self) -> tuple[list[StepRecord], bool]:
        """(the records written since the last read, whether the file was started anew: a restarted rank's)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return [], False
        out: list[StepRecord] = []
        anew = False
        if st.st_ino != self.inode:
            rotated = Path(f"{self.path}.1")
            with contextlib.suppress(OSError):
                if self.inode >= 0 and os.stat(rotated).st_ino == self.inode:  # moved aside: its end first
                    out += self._lines(rotated, os.stat(rotated).st_size)
            anew = self.inode >= 0 and not out and not rotated.exists()
            self.offset, self.inode, self.partial = 0, st.st_ino, ""
        elif st.st_size < self.offset:
            self.offset, self.partial, anew = 0, "", True
        out += self._lines(self.path, st.st_size)
        return out, anew

    def _lines(self, path: Path, size: int) -> list[StepRecord]:
        if size <= self.offset:
            return []
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        text = self.partial + data.decode("utf-8", "replace")
        *lines, self.partial = text.split("\n")
        return list(read_records(lines))


def all_records(state: Path, local_rank: int) -> list[StepRecord]:
    """Every record a rank's files hold (the rotated one first)."""
    out: list[StepRecord] = []
    base = state / RECORDS.format(local_rank=local_rank)
    for path in (Path(f"{base}.1"), base):
        with contextlib.suppress(OSError):
            out += read_records(path.read_text().splitlines())
    return out


def has_records(state: Path, local_rank: int) -> bool:
    try:
        return (state / RECORDS.format(local_rank=local_rank)).stat().st_size > 0
    except OSError:
        return False
