"""Every process a job starts is found and ended, in whatever session it runs (docs/reliability.md,
"Signals to numarun"). The cage, by kind:

* ``cgroup``: a cgroup v2 of numarun's own, ended by ``cgroup.kill`` (root or a delegated subtree, not in
  a Slurm job, whose own cgroups end the step's processes);
* ``init``: numarun's parent is numarun as PID 1, which reaps the job's orphans: they are ended from its tree;
* ``subreaper`` (elsewhere): ``PR_SET_CHILD_SUBREAPER`` keeps orphans in numarun's tree, and the cleaner
  (:mod:`numarun.launch.cleaner`) ends what it saw there once numarun is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from ..envvars import INIT
from ..topology.procfs import cgroup2_mount, own_cgroup2_path, read_all, tree_of
from .signals import send

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
WATCH_S = 0.25
"""How often the cleaner re-reads the tree in subreaper mode."""
CLEANER = str(Path(__file__).with_name("cleaner.py"))
CAGE_FILE = "cage"
"""In numarun's private directory: ``<kind> <cgroup path or pid>``, read by the cleaner."""


@dataclass(frozen=True)
class Cage:
    """How this numarun finds its descendants: ``kind`` ``cgroup`` (``path`` the cgroup's directory),
    ``init`` or ``subreaper``."""

    kind: str
    path: str = ""

    def record(self) -> str:
        return f"{self.kind} {self.path or os.getpid()}\n"

    def end_others(self, *, spare: frozenset[int] = frozenset()) -> None:
        """End every process of the job but this one (and ``spare``, e.g. the cleaner)."""
        if self.kind == "cgroup":
            return _end_cgroup(Path(self.path), keep=os.getpid())
        # under a numarun init, the job's orphans are that init's children
        stats = read_all()
        doomed = (
            tree_of(stats, [1 if self.kind == "init" else os.getpid()]) - tree_of(stats, spare) - spare - {os.getpid()}
        )
        send(doomed, signal.SIGKILL)


def enter() -> Cage:
    """Put this process (and so everything it starts from now on) where it can be found again."""
    if not os.environ.get("SLURM_JOB_ID"):
        try:
            root = cgroup2_mount(Path("/proc/self/mounts").read_text())
            rel = own_cgroup2_path(Path("/proc/self/cgroup").read_text())
            if root is not None and rel is not None:
                cage = Path(root) / rel.lstrip("/") / f"numarun-{os.getpid()}"
                cage.mkdir(mode=0o755)
                if (cage / "cgroup.kill").exists():
                    (cage / "cgroup.procs").write_text(f"{os.getpid()}\n")
                    return Cage("cgroup", str(cage))
                cage.rmdir()
        except OSError as e:
            log.debug("no cgroup of numarun's own (%s): watching its process tree instead", e)
    if os.environ.get(INIT) == "1" and os.getppid() == 1:
        return Cage("init")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as e:
        log.warning("no child subreaper: %s", e)
    return Cage("subreaper")


def leave(cage: Cage) -> None:
    """Move this process back out of its cgroup and remove it (what is still inside is ended first)."""
    if cage.kind != "cgroup":
        return
    path = Path(cage.path)
    try:
        (path.parent / "cgroup.procs").write_text(f"{os.getpid()}\n")
        _end_cgroup(path, keep=None)
        path.rmdir()
    except OSError as e:
        log.debug("could not remove numarun's cgroup %s: %s", path, e)


def _end_cgroup(path: Path, *, keep: int | None) -> None:
    try:
        pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return
    others = [p for p in pids if p != keep]
    if keep is None and others:
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1\n")
            return
    send(others, signal.SIGKILL)
