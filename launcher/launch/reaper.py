"""Every process a job starts is found and ended: the workers, and what they start in other
sessions or process groups (``setsid``, ``start_new_session=True``, a tool's daemon).

Process groups do not reach a daemon that called ``setsid``; a cgroup and a subreaper do:

* **cgroup** (where numarun may create one): numarun moves itself into a cgroup v2 of its own,
  ``numarun-<pid>`` below its current one (on hosts that mount the v1 controllers, the unified
  hierarchy beside them), before it starts any worker. Every descendant is born in it, whatever
  its session, and ``cgroup.kill`` (Linux 5.14+) ends all of them at once. Used when this process
  can create the directory (root, or a delegated subtree) and is not in a Slurm job (Slurm's own
  cgroup tree is left alone: its proctrack ends the step's processes at step end).
* **init** (its parent is numarun as PID 1, :func:`numarun.launch.signals.init_main`): orphans go to
  that init, which reaps them at once; they are ended from its process tree, and all of them with it.
* **subreaper** (everywhere else): numarun sets ``PR_SET_CHILD_SUBREAPER``, so an orphaned
  descendant is re-parented to numarun instead of init and stays in its process tree; the
  cleaner process watches that tree (``/proc``, every :data:`WATCH_S`) and, when numarun dies
  however it died, ends every process it last saw there and their descendants.

At a normal exit numarun ends what is left the same way (:meth:`Cage.end_others`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from ..envvars import INIT
from ..topology.procfs import cgroup2_mount, own_cgroup2_path

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
WATCH_S = 0.25
"""How often the cleaner re-reads the tree in subreaper mode."""
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

    def end_others(self, *, spare: frozenset[int] = frozenset()) -> int:
        """End every process of the job but this one (and ``spare``, e.g. the cleaner); returns how
        many were signalled."""
        if self.kind == "cgroup":
            return _end_cgroup(Path(self.path), keep=os.getpid())
        orphans = _end_descendants(1, spare=spare | {os.getpid()}) if self.kind == "init" else 0
        return orphans + _end_descendants(os.getpid(), spare=spare)


def enter(environ: dict[str, str] | None = None) -> Cage:
    """Put this process (and so everything it starts from now on) where it can be found again."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
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
    if env.get(INIT) == "1" and os.getppid() == 1:
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


def _end_cgroup(path: Path, *, keep: int | None) -> int:
    try:
        pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return 0
    others = [p for p in pids if p != keep]
    if keep is None and others:
        try:
            (path / "cgroup.kill").write_text("1\n")
            return len(others)
        except OSError:
            pass
    for pid in others:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(others)


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _end_descendants(pid: int, *, spare: frozenset[int] = frozenset()) -> int:
    kids = _children_map()
    found, todo = [], [k for k in kids.get(pid, ()) if k not in spare]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(kids.get(p, ()))
    for p in found:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(found)


# The cleaner's own code (run with python -I -S: nothing of the user's loads). It blocks on a pipe
# whose only writer is numarun: EOF means numarun exited, however. In subreaper mode it re-reads
# numarun's process tree every WATCH_S meanwhile, since once numarun is gone its orphans are
# re-parented out of reach.
CLEANER = r"""
import os, select, shutil, signal, sys
d, launcher, watch_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def stat(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(b")") + 2:].split()
    return int(rest[1]), rest[19]  # ppid, start time

def tree(roots):
    kids = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            st = stat(int(e))
            if st:
                kids.setdefault(st[0], []).append(int(e))
    out, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        for c in kids.get(p, ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out

def cage():
    try:
        kind, _, where = open(os.path.join(d, "cage")).read().strip().partition(" ")
        return kind, where
    except OSError:
        return "", ""

seen = {}
fd = sys.stdin.fileno()
while True:
    ready, _, _ = select.select([fd], [], [], watch_s)
    if ready and not os.read(fd, 4096):
        break
    if cage()[0] == "subreaper":
        for p in tree([launcher]):
            st = stat(p)
            if st:
                seen[p] = st[1]

kind, where = cage()
if kind == "cgroup":
    try:
        open(os.path.join(where, "cgroup.kill"), "w").write("1")
    except OSError:
        pass
# the recorded workers' process groups, then everything seen in numarun's tree and below it
try:
    names = os.listdir(d)
except OSError:
    names = []
for n in names:
    if n.startswith("pid."):
        try:
            os.killpg(int(open(os.path.join(d, n)).read().split()[0]), signal.SIGKILL)
        except (OSError, ValueError):
            pass
alive = [p for p, start in seen.items() if (stat(p) or (0, None))[1] == start]
for p in alive + sorted(tree(alive)):
    try:
        os.kill(p, signal.SIGKILL)
    except OSError:
        pass
if kind == "cgroup":
    for _ in range(50):
        try:
            os.rmdir(where)
            break
        except OSError:
            select.select([], [], [], 0.1)
shutil.rmtree(d, ignore_errors=True)
"""
