"""A watcher that proves a rank's binding holds while the job runs.

The bootstrap binds every thread once, before the user's code starts. Libraries change it
later: threads that NCCL, UCX or OpenMP create and re-pin, ``torch.set_num_threads``,
code that calls ``sched_setaffinity`` itself. Every ``NUMARUN_WATCH_INTERVAL`` seconds
(default :data:`DEFAULT_INTERVAL`; 0 turns it off) a daemon thread

- re-reads the affinity of every thread of the process (``/proc/self/task``) and compares
  it with the CPUs the bootstrap bound;
- on the first check and every :data:`MEMORY_EVERY`-th after it, reads
  ``/proc/self/numa_maps`` for the share of resident pages on NUMA nodes other than the
  rank's memory nodes;

warns once per kind of drift (``affinity``, ``remote-memory``) naming the thread, and under
``--strict-binding`` (``NUMARUN_STRICT_BINDING=1``) puts a drifted thread back on the bound
CPUs. Pages on a remote node are reported, never moved: migrating them costs more than
the watcher may. :func:`figures` gives the trainer what it writes to ``metrics.jsonl``
and ``summary.json``.

Parsing is pure (:func:`parse_numa_maps`, :func:`remote_share`);
the I/O is in :func:`drifted_threads` and :class:`Watcher`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from .. import envvars
from ..cpuset import format_list
from ..topology import procfs
from . import affinity
from .progress import env_seconds, every

# Under the bootstrap's logger: its handler prints in the worker, where nothing else is configured.
log = logging.getLogger("numarun.worker.bootstrap.watch")

DEFAULT_INTERVAL = 30.0
"""Seconds between checks: coarse, so the cost stays out of sight (scripts/bench_watch.py)."""
MEMORY_EVERY = 10
"""Read numa_maps on every tenth check only: the kernel walks every resident page to answer
(about 30 ms per GiB resident, measured by scripts/bench_watch.py), the affinity check
costs microseconds."""
REMOTE_WARN_SHARE = 0.25
"""Warn when more than this share of the rank's resident pages sit on other NUMA nodes."""

_NODE_PAGES = re.compile(r"\bN(\d+)=(\d+)")
_PAGE_KB = re.compile(r"\bkernelpagesize_kB=(\d+)")


def parse_numa_maps(text: str) -> dict[int, int]:
    """``/proc/<pid>/numa_maps`` text -> resident bytes per NUMA node.

    Each line is one mapping: ``<addr> <policy> [file=...] [anon=N] N0=<pages> N1=<pages>
    kernelpagesize_kB=<kB>``; a huge-page mapping counts its pages at its own page size
    (``Documentation/filesystems/proc.rst``).
    """
    out: dict[int, int] = {}
    for line in text.splitlines():
        m = _PAGE_KB.search(line)
        page = int(m.group(1)) * 1024 if m else 4096
        for node, pages in _NODE_PAGES.findall(line):
            out[int(node)] = out.get(int(node), 0) + int(pages) * page
    return out


def remote_share(per_node: Mapping[int, int], local: Iterable[int]) -> float:
    """Share of the resident bytes on nodes outside ``local``; 0.0 when nothing is resident."""
    total = sum(per_node.values())
    if total == 0:
        return 0.0
    here = set(local)
    return sum(v for n, v in per_node.items() if n not in here) / total


def drifted_threads(bound: frozenset[int]) -> list[tuple[int, str, tuple[int, ...]]]:
    """The threads of this process whose affinity is no longer the bound set: (tid, name (Python's, else the kernel's
    ``comm``), its CPUs)."""
    py = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    return [
        (
            tid,
            py[tid]
            if tid in py
            else (procfs.read_text(procfs.proc(procfs.ROOT, os.getpid(), tid) / "comm") or "?").strip(),
            cpus,
        )
        for tid, cpus in affinity.thread_affinities().items()
        if frozenset(cpus) != bound
    ]


class Watcher:
    """Checks the binding of this process every ``interval`` seconds on a daemon thread."""

    def __init__(
        self,
        cpus: Iterable[int],
        mems: Iterable[int],
        *,
        interval: float,
        strict: bool,
        numa_maps: str = "/proc/self/numa_maps",
    ) -> None:
        self.bound = frozenset(cpus)
        self.mems = tuple(mems)
        self.interval = interval
        self.strict = strict
        self.numa_maps = numa_maps
        self.warned: set[str] = set()
        self.repaired: set[int] = set()
        self.drifts = 0
        self.checks = 0
        self.remote_share: float | None = None
        self._stop = threading.Event()

    def check_once(self, *, memory: bool = True) -> None:
        self.checks += 1
        drifted = drifted_threads(self.bound)
        if drifted:
            self.drifts += len(drifted)
            if self.strict:
                for tid, _, _ in drifted:
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(tid, self.bound)
                        self.repaired.add(tid)
            self._warn_once(
                "affinity",
                "thread(s) left the bound CPUs "
                + format_list(sorted(self.bound))
                + ": "
                + ", ".join(f"{name!r} (tid {tid}) on {format_list(cpus)}" for tid, name, cpus in drifted[:4])
                + ("; put back (--strict-binding)" if self.strict else "; --strict-binding puts them back"),
            )
        if self.mems and memory:
            try:
                with open(self.numa_maps) as f:
                    per_node = parse_numa_maps(f.read())
            except OSError:
                return
            self.remote_share = round(remote_share(per_node, self.mems), 4)
            if self.remote_share > REMOTE_WARN_SHARE:
                self._warn_once(
                    "remote-memory",
                    f"{self.remote_share:.0%} of resident memory is on NUMA nodes other than "
                    f"{format_list(self.mems)}: memory allocated before binding or by another thread's policy",
                )

    def _warn_once(self, kind: str, text: str) -> None:
        if kind in self.warned:
            return
        self.warned.add(kind)
        log.warning("binding drift (%s): %s", kind, text)

    def start(self) -> Watcher:
        every(
            self.interval,
            lambda: self.check_once(memory=self.checks % MEMORY_EVERY == 0),
            name="numarun-watch",
            what="binding watcher check failed",
            logger=log,
            stop=self._stop,
        )
        return self

    def stop(self) -> None:
        self._stop.set()

    def figures(self) -> dict[str, Any]:
        return {
            "remote_memory_share": self.remote_share,
            "threads_repaired": len(self.repaired),
            "binding_drifts": self.drifts,
        }


_current: Watcher | None = None


def interval_from_env(environ: Mapping[str, str]) -> float:
    value = env_seconds(environ, envvars.WATCH_INTERVAL, DEFAULT_INTERVAL)
    if value is None:
        log.warning(
            "%s=%r is not a number of seconds; watching every %g s",
            envvars.WATCH_INTERVAL,
            environ[envvars.WATCH_INTERVAL],
            DEFAULT_INTERVAL,
        )
        return DEFAULT_INTERVAL
    return value


def start_from_env(cpus: Iterable[int], mems: Iterable[int], environ: Mapping[str, str]) -> Watcher | None:
    """Start this process's watcher (the bootstrap calls it after binding); None when off."""
    global _current
    interval = interval_from_env(environ)
    if interval <= 0:
        return None
    _current = Watcher(cpus, mems, interval=interval, strict=environ.get(envvars.STRICT_BINDING) == "1").start()
    return _current


def figures() -> dict[str, Any]:
    """The running watcher's figures for metrics ({} when no watcher runs in this process)."""
    return _current.figures() if _current is not None else {}
