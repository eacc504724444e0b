"""``python -I -S cleaner.py PRIVATE_DIR NUMARUN_PID WATCH_S`` (by path: nothing of the user's or the
package loads but numarun's /proc reader, by its path): once numarun is gone, however, end its job and remove its
private directory.

It waits for EOF on stdin, a pipe only numarun writes to; in subreaper mode it notes numarun's process
tree every WATCH_S meanwhile (once numarun is gone, its orphans are re-parented out of reach).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import select
import shutil
import signal
import sys
from pathlib import Path
from types import ModuleType


def _procfs() -> ModuleType:
    """numarun's one /proc reader (numarun/topology/procfs.py), loaded by its path: standard library only."""
    spec = importlib.util.spec_from_file_location(
        "numarun_cleaner_procfs", Path(__file__).resolve().parent.parent / "topology" / "procfs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


procfs = _procfs()


def _cage(d: str) -> tuple[str, str]:
    with contextlib.suppress(OSError), open(os.path.join(d, "cage")) as f:
        kind, _, where = f.read().strip().partition(" ")
        return kind, where
    return "", ""


def main(d: str, launcher: int, watch_s: float) -> None:
    seen: dict[int, int] = {}
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], watch_s)
        if ready and not os.read(fd, 4096):
            break
        if _cage(d)[0] == "subreaper":
            stats = procfs.read_all()
            seen.update((p, stats[p].start) for p in procfs.tree_of(stats, [launcher]))
    kind, where = _cage(d)
    if kind == "cgroup":
        with contextlib.suppress(OSError), open(os.path.join(where, "cgroup.kill"), "w") as f:
            f.write("1")
    # the recorded workers' process groups, then everything seen in numarun's tree and below it
    for n in [n for n in (os.listdir(d) if os.path.isdir(d) else []) if n.startswith("pid.")]:
        with contextlib.suppress(OSError, ValueError), open(os.path.join(d, n)) as f:
            os.killpg(int(f.read().split()[0]), signal.SIGKILL)
    # a pid with the start time it was seen with: the same process (else gone, or the pid reused)
    alive = [p for p, start in seen.items() if (st := procfs.read_stat(p)) and st.start == start]
    for p in alive + sorted(procfs.tree_of(procfs.read_all(), alive)):
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
