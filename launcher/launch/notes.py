"""What numarun's node agent says of its own troubles, each once: a file it cannot write, a use of it that failed.

The agent serves the job and never takes it down (:mod:`numarun.launch.agent`): a full disk, a read-only or vanished
log dir, a quota, a figure its code did not expect are one line on numarun's stderr, said the first time only (the
agent's thread looks at the ranks ten times a second: a failure that stays would otherwise be said as often), and the
agent goes on with what it has.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import first_line
from ..fsutil import write_atomic

log = logging.getLogger(__name__)


def described(e: BaseException) -> str:
    """``Type: its first line`` (:func:`~numarun.errors.first_line`), its type alone where it has no text."""
    text, name = first_line(e), type(e).__name__
    return text if text == name else f"{name}: {text}"


def os_error(e: OSError) -> str:
    """An OSError in the system's words, without the path the caller names anyway (``No space left on device``)."""
    return e.strerror or described(e)


class Notes:
    """The agent's lines about itself (``say`` prints lines on numarun's stderr, each ``numarun: ``-prefixed); safe
    from several threads."""

    def __init__(self, say: Callable[[Iterable[str]], None]) -> None:
        self.say = say
        self._said: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    def once(self, key: tuple[str, ...], line: str) -> bool:
        """Say ``line`` unless a line of ``key`` was said before; whether it was said now."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
        self.say([line])
        return True

    def failed(self, use: str, e: BaseException) -> None:
        """An exception in one of the agent's uses (``the step report``, ``the hang watchdog``): one line per use and
        kind of exception; the job runs on."""
        log.debug("%s: %s", use, e, exc_info=True)
        self.once(
            ("failed", use, type(e).__name__),
            f"WARNING: {use} failed ({described(e)}); the job runs on",
        )

    def cannot_write(self, path: Path, e: OSError, *, what: str) -> None:
        """A write of ``path`` failed: one line per directory (a full disk fails every file there alike)."""
        self.once(("write", str(path.parent)), f"WARNING: cannot write {path}: {os_error(e)} ({what})")

    def write(self, path: Path, text: str, *, what: str) -> bool:
        """``text`` to ``path`` whole or not at all (:func:`~numarun.fsutil.write_atomic`, its directory made);
        False, said once, when it cannot be written."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text)
        except OSError as e:
            self.cannot_write(path, e, what=what)
            return False
        return True
