"""``python -I -S cleaner.py PRIVATE_DIR NUMARUN_PID WATCH_S`` (by path: nothing of the user's or the
package loads): once numarun is gone, however, end its job and remove its private directory.

It waits for EOF on stdin, a pipe only numarun writes to; in subreaper mode it notes numarun's process
tree every WATCH_S meanwhile (once numarun is gone, its orphans are re-parented out of reach).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
from collections.abc import Iterable


def stat(pid: int) -> tuple[int, bytes] | None:
    """(ppid, start time) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(b")") + 2 :].split()
    return int(rest[1]), rest[19]


def tree(roots: Iterable[int]) -> set[int]:
    """Every descendant of the pids ``roots`` (not the roots)."""
    kids: dict[int, list[int]] = {}
    for e in os.listdir("/proc"):
        st = stat(int(e)) if e.isdigit() else None
        if st:
            kids.setdefault(st[0], []).append(int(e))
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _cage(d: str) -> tuple[str, str]:
    with contextlib.suppress(OSError), open(os.path.join(d, "cage")) as f:
        kind, _, where = f.read().strip().partition(" ")
        return kind, where
    return "", ""


def main(d: str, launcher: int, watch_s: float) -> None:
    seen: dict[int, bytes] = {}
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], watch_s)
        if ready and not os.read(fd, 4096):
            break
        if _cage(d)[0] == "subreaper":
            seen.update((p, st[1]) for p in tree([launcher]) if (st := stat(p)))
    kind, where = _cage(d)
    if kind == "cgroup":
        with contextlib.suppress(OSError), open(os.path.join(where, "cgroup.kill"), "w") as f:
            f.write("1")
    # the recorded workers' process groups, then everything seen in numarun's tree and below it
    for n in [n for n in (os.listdir(d) if os.path.isdir(d) else []) if n.startswith("pid.")]:
        with contextlib.suppress(OSError, ValueError), open(os.path.join(d, n)) as f:
            os.killpg(int(f.read().split()[0]), signal.SIGKILL)
    alive = [p for p, start in seen.items() if (stat(p) or (0, None))[1] == start]
    for p in alive + sorted(tree(alive)):
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    for _ in range(50 if kind == "cgroup" else 0):
        try:
            os.rmdir(where)
            break
        except OSError:
            select.select([], [], [], 0.1)
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
