"""What the kernel says about each rank while it runs: the readers (each taking ``root``, so tests read recorded
trees) and the sampler that turns their counters into rates over a span of steps.

Read on every report tick, for every local rank, while the ranks still run (at the end they may be gone):

* its threads' time on a CPU and waiting on a run queue (``/proc/<pid>/task/<tid>/schedstat``: ns on a CPU, ns
  waiting, timeslices; Documentation/scheduler/sched-stats.rst): a rank whose core another process takes waits. A
  kernel without CONFIG_SCHEDSTATS has no such file: the time on a CPU is then read from ``task/<tid>/stat``, and the
  wait is not known (:attr:`Evidence.waits`);
* every process's CPU time and the CPU it last ran on (``/proc/<pid>/stat``: utime, stime, field 39): a process
  outside the job whose time moved while it ran on one of a rank's cores took that much of it (sampled at each
  tick: a pinned process is counted in full, one that moves about in part);
* the rank's children (its DataLoader workers): their CPU time and where they may run;
* steal time of its cores (``/proc/stat``, a VM whose host took the CPU), their frequency
  (``cpufreq/scaling_cur_freq`` against ``cpuinfo_max_freq``) and throttle counters
  (``thermal_throttle/{core,package}_throttle_count``) where sysfs has them;
* its pages per NUMA node (``/proc/<pid>/numa_maps``, as the binding watcher reads them), for the ranks the report
  suspects only: the kernel walks every resident page to answer (a file it may not read, EACCES, is said in
  :attr:`Evidence.unknown`);
* whether other users' processes are hidden from this ``/proc`` (``hidepid``): a process on a rank's core that
  numarun cannot see is no "process outside the job" it can name (:attr:`Evidence.hidden`);
* once, its NIC variables (``/proc/<pid>/environ``) against the plan's, which chose the NIC next to its GPU;
* on a GPU node, its GPU's and NIC's figures (:mod:`~numarun.launch.steps.device`, sampled beside these).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...cpuset import format_list, parse_list
from ...errors import CpuListError
from ...plan.nic import NIC_VARIABLES
from ...topology import procfs
from ...worker.binding_watch import parse_numa_maps, remote_share
from .device import DeviceEvidence, DeviceSampler, RankDevice

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
HISTORY = 240
"""Samples kept per rank (20 minutes at the default 5 s)."""
MHZ_CPUS = 64
"""At most this many of a rank's cores have their frequency read."""
BUSY_SHARE = 0.05
"""A process outside the job is named when it took at least this share of one of a rank's cores."""


# ----------------------------------------------------------------------------- readers


def read_cpu_ticks(root: Path) -> dict[int, tuple[int, int]]:
    """CPU -> (all its time, its steal time), clock ticks, from ``/proc/stat``."""
    out: dict[int, tuple[int, int]] = {}
    for line in (procfs.read_text(root / "proc" / "stat") or "").splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(values) >= 8:
            nums = [int(v) for v in values[:8] if v.isdigit()]
            if len(nums) == 8:
                out[int(name[3:])] = (sum(nums), nums[7])
    return out


def read_mhz(root: Path, cpu: int) -> tuple[float | None, float | None]:
    """(current, maximum) MHz of ``cpu`` from cpufreq; None where sysfs has no answer (many VMs)."""
    base = root / "sys" / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cpufreq"

    def khz(name: str) -> float | None:
        text = (procfs.read_text(base / name) or "").strip()
        return int(text) / 1000 if text.isdigit() else None

    return khz("scaling_cur_freq"), khz("cpuinfo_max_freq")


def read_throttle(root: Path, cpu: int) -> int | None:
    """Thermal throttle events of ``cpu``'s core and package so far; None where sysfs does not count them."""
    base = root / "sys" / "devices" / "system" / "cpu" / f"cpu{cpu}" / "thermal_throttle"
    counts = [(procfs.read_text(base / f"{k}_throttle_count") or "").strip() for k in ("core", "package")]
    known = [int(c) for c in counts if c.isdigit()]
    return sum(known) if known else None


def nic_note(planned: Mapping[str, str], environ: Mapping[str, str]) -> str:
    """Where the rank's NIC variables differ from the plan's for it (a user's value kept over the NIC the plan
    chose next to its GPU): ``NCCL_IB_HCA=mlx5_3, the plan's =mlx5_0``; '' when they agree or the plan set none."""
    differ = [
        f"{k}={environ.get(k, '(unset)')}, the plan's {v}"
        for k, v in sorted(planned.items())
        if k in NIC_VARIABLES and environ.get(k) != v
    ]
    return "; ".join(differ)


# ----------------------------------------------------------------------------- the sampler


@dataclass(frozen=True)
class RankProc:
    """A local rank as the sampler watches it."""

    rank: int
    pid: int
    cpus: frozenset[int]
    """Its cores (the plan's; all the node's CPUs when unbound)."""
    numa: int = -1
    """Its NUMA node (-1: unknown, no remote-memory figure)."""
    nic: str = ""
    """Where its NIC variables differ from the plan's (:func:`nic_note`)."""
    device: RankDevice | None = None
    """The GPU and NIC the plan gave it (:func:`~numarun.launch.steps.device.rank_device`)."""


@dataclass(frozen=True)
class Busy:
    """A process outside the job that took time on a rank's cores."""

    pid: int
    command: str
    share: float
    """Of one core, over the span."""
    cpus: str
    """Where it may run (its ``Cpus_allowed_list``)."""


@dataclass(frozen=True)
class Evidence:
    """One rank over a span of its steps (JSON through the store): rates are per second of the span."""

    rank: int
    span_s: float
    cpus: str
    numa: int = -1
    threads: int = 0
    run: float = 0.0
    """Its threads' time on a CPU (cores' worth)."""
    wait: float = 0.0
    """Its threads' time waiting on a run queue."""
    main_run: float = 0.0
    main_wait: float = 0.0
    """The main thread's wait: the direct measure of a shared core for the thread that runs the step."""
    others: tuple[Busy, ...] = ()
    children: int = 0
    children_cpu: float = 0.0
    """Its children's (DataLoader workers') CPU, cores' worth."""
    children_cpus: str = ""
    steal: float = 0.0
    """The share of its cores' time a VM's host took."""
    mhz: float | None = None
    max_mhz: float | None = None
    throttled: int = 0
    remote: float | None = None
    """The share of its resident pages on NUMA nodes other than its own (read for suspects only)."""
    nic: str = ""
    """Where its NIC variables differ from the plan's, which chose the NIC next to its GPU; '' when they agree."""
    device: DeviceEvidence | None = None
    """Its GPU's and NIC's figures over the span; None off a GPU node, or where neither was read."""
    waits: bool = True
    """Its threads' waits for a CPU were read (schedstat); False on a kernel without it: ``wait`` and ``main_wait``
    are then 0 and mean nothing, ``run`` and ``main_run`` come from the threads' ``stat``."""
    unknown: tuple[str, ...] = ()
    """The figures that could not be read, each with why (``its pages per NUMA node (/proc/7/numa_maps: Permission
    denied)``)."""
    hidden: str = ""
    """Why other users' processes are not seen here (``/proc is mounted with hidepid=2``); '' when they are."""


NO_SCHEDSTAT = "its wait for a CPU (no /proc/<pid>/task/*/schedstat: a kernel without CONFIG_SCHEDSTATS)"


@dataclass
class _Totals:
    """One rank's counters, cumulative since the sampler began watching it."""

    t: float
    run_ns: int = 0
    wait_ns: int = 0
    main_run_ns: int = 0
    main_wait_ns: int = 0
    threads: int = 0
    children_ticks: int = 0
    children: int = 0
    children_cpus: str = ""
    cpu_ticks: int = 0
    steal_ticks: int = 0
    throttle: int | None = None
    mhz: float | None = None
    max_mhz: float | None = None
    others: dict[int, int] = field(default_factory=dict)
    """pid -> clock ticks it took on the rank's cores."""
    waits: bool = True
    """The threads' figures came from schedstat (False: from their stat, without the wait)."""


class Sampler:
    """Samples the node's ranks on each report tick (:meth:`sample`) and gives each one's :class:`Evidence` over
    a span (:meth:`evidence`)."""

    def __init__(self, root: Path = Path("/"), *, exclude: Iterable[int] = ()) -> None:
        self.root = root
        self.exclude = set(exclude)
        """Pids of the job that are no rank (numarun itself): never "another process"."""
        self.history: dict[int, deque[_Totals]] = {}
        self.remote: dict[int, float] = {}
        self._procs: dict[int, procfs.ProcStat] = {}
        self._ticks: dict[int, tuple[int, int]] = {}
        self._threads: dict[int, dict[int, tuple[int, int]]] = {}
        self._names: dict[int, tuple[str, str]] = {}
        self.pages_unread: dict[int, str] = {}
        """Rank -> why its numa_maps could not be read (``/proc/7/numa_maps: Permission denied``)."""
        self.hidden: str | None = None
        """Why other users' processes are not in this /proc ('' when they are); read at the first sample."""
        self.devices = DeviceSampler(live=root == Path("/"))  # GPUs (NVML) and NICs: device.py

    def sample(self, ranks: Sequence[RankProc], t: float, *, suspects: Iterable[int] = ()) -> None:
        """One look at every rank of ``ranks`` at time ``t`` (monotonic seconds); numa_maps of ``suspects`` only."""
        procs = procfs.read_all(self.root)
        ticks = read_cpu_ticks(self.root)
        if self.hidden is None:
            self.hidden = procfs.hidden_processes(self.root)
        job = {*(r.pid for r in ranks), *self.exclude}
        job |= procfs.tree_of(procs, job)  # the ranks, everything they started, and numarun's own processes
        before = self._procs
        moved = {
            pid: p.ticks - before[pid].ticks
            for pid, p in procs.items()
            if pid not in job and pid in before and p.ticks > before[pid].ticks
        }
        for r in ranks:
            hist = self.history.setdefault(r.rank, deque(maxlen=HISTORY))
            last = hist[-1] if hist else None
            now = _Totals(t) if last is None else dataclasses.replace(last, t=t, others=dict(last.others))
            self._threads_of(r, now)
            kids = [p for p in procs.values() if p.ppid == r.pid]
            if last is not None:  # the first look only sets where the counters start
                now.children_ticks += sum(p.ticks - before[p.pid].ticks for p in kids if p.pid in before)
                common = [c for c in r.cpus if c in ticks and c in self._ticks]
                now.cpu_ticks += sum(ticks[c][0] - self._ticks[c][0] for c in common)
                now.steal_ticks += sum(ticks[c][1] - self._ticks[c][1] for c in common)
                for pid, d in moved.items():
                    if procs[pid].cpu in r.cpus:
                        now.others[pid] = now.others.get(pid, 0) + d
                        if pid not in self._names:  # named now, while it runs
                            self._names[pid] = (
                                procfs.read_cmdline(pid, self.root, fallback=procs[pid].comm),
                                procfs.read_status(pid, "Cpus_allowed_list", self.root),
                            )
            now.children = len(kids)
            now.children_cpus = procfs.read_status(kids[0].pid, "Cpus_allowed_list", self.root) if kids else ""
            counted = [x for c in sorted(r.cpus) if (x := read_throttle(self.root, c)) is not None]
            now.throttle = sum(counted) if counted else None
            mhz = [read_mhz(self.root, c) for c in sorted(r.cpus)[:MHZ_CPUS]]
            current = [m[0] for m in mhz if m[0] is not None]
            top = [m[1] for m in mhz if m[1] is not None]
            now.mhz = statistics.mean(current) if current else None
            now.max_mhz = max(top) if top else None
            hist.append(now)
            if r.rank in set(suspects) and r.numa >= 0:
                text, why = procfs.read_numa_maps_or_why(r.pid, self.root)
                pages = parse_numa_maps(text)
                if pages:
                    self.remote[r.rank] = remote_share(pages, [r.numa])
                    self.pages_unread.pop(r.rank, None)
                elif why and procfs.alive(r.pid, self.root):  # one that has just ended has nothing to say
                    self.pages_unread[r.rank] = f"/proc/{r.pid}/numa_maps: {why}"
        self._ticks, self._procs = ticks, procs
        self.devices.sample(self.root, [r.device for r in ranks], t)

    def _threads_of(self, r: RankProc, totals: _Totals) -> None:
        now = procfs.read_schedstat(r.pid, self.root)
        if not now:  # a kernel without schedstat: the time on a CPU from each thread's stat, no wait
            ns = 1e9 / CLK_TCK
            now = {tid: (int(t * ns), 0) for tid, t in procfs.read_thread_ticks(r.pid, self.root).items()}
            totals.waits = not now
        before = self._threads.get(r.pid, {})
        for tid, (run, wait) in now.items():
            run0, wait0 = before.get(tid, (0, 0)) if before else (run, wait)
            d_run, d_wait = max(0, run - run0), max(0, wait - wait0)
            totals.run_ns += d_run
            totals.wait_ns += d_wait
            if tid == r.pid:
                totals.main_run_ns += d_run
                totals.main_wait_ns += d_wait
        totals.threads = len(now)
        self._threads[r.pid] = now

    def evidence(self, rank: RankProc, start: float, end: float) -> Evidence | None:
        """The rank's figures between the samples that bracket [start, end] (monotonic seconds) most closely: the
        last sample at or before ``start`` (else the first) and the first at or after ``end`` (else the latest)."""
        hist = list(self.history.get(rank.rank, ()))
        if len(hist) < 2:
            return None
        a = next((s for s in reversed(hist) if s.t <= start), hist[0])
        b = next((s for s in hist if s.t >= end), hist[-1])
        if b.t <= a.t:
            a, b = hist[-2], hist[-1]
        span = b.t - a.t
        if span <= 0:
            return None
        ticks = max(b.cpu_ticks - a.cpu_ticks, 1)
        others = []
        for pid in b.others:
            share = (b.others[pid] - a.others.get(pid, 0)) / CLK_TCK / span
            if share >= BUSY_SHARE:
                command, cpus = self._names.get(pid, ("?", ""))
                others.append(Busy(pid, command, round(share, 3), cpus))
        others.sort(key=lambda o: -o.share)
        return Evidence(
            rank=rank.rank,
            span_s=round(span, 3),
            cpus=format_list(rank.cpus),
            numa=rank.numa,
            threads=b.threads,
            run=(b.run_ns - a.run_ns) / 1e9 / span,
            wait=(b.wait_ns - a.wait_ns) / 1e9 / span,
            main_run=(b.main_run_ns - a.main_run_ns) / 1e9 / span,
            main_wait=(b.main_wait_ns - a.main_wait_ns) / 1e9 / span,
            others=tuple(others[:3]),
            children=b.children,
            children_cpu=(b.children_ticks - a.children_ticks) / CLK_TCK / span,
            children_cpus=b.children_cpus,
            steal=(b.steal_ticks - a.steal_ticks) / ticks if b.cpu_ticks > a.cpu_ticks else 0.0,
            mhz=b.mhz,
            max_mhz=b.max_mhz,
            throttled=(b.throttle or 0) - (a.throttle or 0),
            remote=self.remote.get(rank.rank),
            nic=rank.nic,
            device=self.devices.evidence(rank.device, a.t, b.t),
            waits=a.waits and b.waits,
            unknown=tuple(
                [NO_SCHEDSTAT] * (not (a.waits and b.waits))
                + [f"its pages per NUMA node ({why})" for why in [self.pages_unread.get(rank.rank)] if why]
            ),
            hidden=self.hidden or "",
        )


def cpus_of(text: str, fallback: Iterable[int]) -> frozenset[int]:
    """A cpu list's CPUs, else ``fallback`` (an unbound rank: every CPU of the node)."""
    try:
        got = frozenset(parse_list(text)) if text else frozenset()
    except CpuListError:
        got = frozenset()
    return got or frozenset(fallback)
