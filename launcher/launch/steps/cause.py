"""Why the rank that holds the job back is slow, from what numarun placed, what the kernel says and, on a GPU node,
what its GPU and NIC say (pure).

The causes are tried in order; one is named only when its evidence covers at least :data:`COVERS` of the time the
rank loses per step (:attr:`~numarun.launch.steps.judge.Judgement.lost_s`), else the answer is *cause not found*
with the figures:

1. **a shared core**: its main thread waited on a run queue (schedstat) more than the others' by most of the lost
   time, and a process outside the job ran on its cores (named by pid and command); without such a process, *CPU
   wait* (its own threads, or its loader workers, crowd its cores);
2. **steal**: the VM's host took its cores' time (``/proc/stat``);
3. **input** (the phase it loses the time in): no DataLoader workers (it loads in its main thread), or workers
   busy to the full (they cannot keep up); idle workers point elsewhere (storage, the network): not found;
4. on a GPU node, **its GPU or NIC slowed down** (:mod:`~numarun.launch.steps.device_cause`, measured: the time
   each costs a step): its GPU's clocks held down (power cap, thermal, hardware slowdown...), its PCIe link
   trained below its maximum, its NIC slower than the others'. Before the CPU's compute causes: a rank waiting for
   a slow GPU keeps its main thread busy launching and synchronising, which would read as more work;
5. **compute** or **optim** that its main thread spent running (not waiting): slower cores (cpufreq, throttle
   counters), remote memory (numa_maps: its pages on other NUMA nodes than its own), else more work than the others;
6. on a GPU node, **a fault of its GPU or NIC during the job** (NVLink links down, ECC errors, retired pages or
   remapped rows, a NIC down, its link's errors, ``port_xmit_wait`` congestion, Ethernet drops), its own and not the
   other devices'. A fault has no time of its own to cover the lost time with; it is named where the CPU's figures
   leave that time to the devices: neither the main thread's wait (1) nor its running (5) covers :data:`COVERS` of
   it, so at least that share went to its GPU or its network.

Each cause carries the fix where there is a clear one: more loader workers, ``--binding``, free the cores, raise a
GPU's power limit, check a node's cooling or a link.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...view.steps_text import ms, pct
from .device_cause import device_figures, faults, slowdowns
from .evidence import Evidence
from .judge import Judgement, median

COVERS = 0.5
BUSY_WORKER = 0.8
"""A loader worker busy at least this share of a core cannot keep up."""
SLOW_CORES = 0.9
"""Cores at less than this share of the others' frequency are slower cores."""
REMOTE = 0.25
"""The share of a rank's pages on other NUMA nodes that counts as remote memory (the binding watcher warns at it)."""


@dataclass(frozen=True)
class Cause:
    found: bool
    why: str
    fix: str = ""


def explain(
    j: Judgement,
    evidence: Mapping[int, Evidence],
    *,
    workers: Mapping[int, int] | None = None,
    bound: bool = True,
) -> Cause:
    """The cause of ``j.culprit``'s lost time (see the module docstring). ``workers``: each rank's DataLoader
    workers as its records say (-1 or absent: unknown); ``bound``: whether numarun gave the rank cores of its own."""
    rank = j.culprit if j.culprit is not None else j.slowest
    ev = evidence.get(rank) if rank is not None else None
    if rank is not None and ev is None and j.phase == "input":  # its records tell its loader: enough for a cause
        return _input(j, Evidence(rank, 0.0, ""), rank, (workers or {}).get(rank, -1))
    if rank is None or ev is None:
        return Cause(
            False,
            "cause not found: the kernel's figures of the rank were not read twice while it ran (they are read at its "
            "first steps and at its exit; a rank killed, or ended by os._exit, misses the last)",
        )
    others = [e for r, e in evidence.items() if r != rank]
    lost, step = j.lost_s, j.step_s

    def usual(attr: str) -> float:
        return median([getattr(o, attr) for o in others])

    # A thread on a shared core waits in proportion to the time it runs: the rank's wait per second it ran, above
    # the others', is its core's contention; its running above theirs is more work (and the wait that comes with it).
    # A kernel without schedstat says how long each thread ran, not how long it waited: no contention is told then.
    waits = ev.waits and all(o.waits for o in others)
    run = ev.main_run * step
    ratio = median([o.main_wait / o.main_run for o in others if o.main_run > 0]) if waits else 0.0
    contended = ev.main_wait * step - run * ratio if waits else 0.0
    more_work = (ev.main_run - usual("main_run")) * step * (1 + ratio)
    waited = ev.main_wait * step
    cores = ev.cpus or "?"
    if contended >= COVERS * lost:
        if ev.others:
            named = "; ".join(f"pid {b.pid} ({b.command}) ran {pct(b.share)} of a core on them" for b in ev.others)
            pids = " ".join(str(b.pid) for b in ev.others)
            return Cause(
                True,
                f"a shared core: {named}; the rank's main thread waited {ms(waited)} a step for a CPU (its cpus "
                f"{cores})",
                f"free its cores: stop or move pid {pids} off cpus {cores} (taskset -p)",
            )
        crowd = f"{ev.threads} threads" + (f" and {ev.children} loader workers" if ev.children else "")
        fix = "--binding (cores of its own for each rank)" if not bound else "fewer threads (OMP_NUM_THREADS)"
        why = f"CPU wait: its main thread waited {ms(waited)} a step for a CPU ({crowd} on cpus {cores})"
        if ev.hidden:  # the process on its core may be one numarun cannot see
            why += f"; other users' processes are not seen here ({ev.hidden}): one of them may run on its cores"
            fix += f", or find what else runs on cpus {cores} (ps -eo pid,user,psr,pcpu,comm as root)"
        return Cause(True, why, fix)
    own = j.own.get(rank, step)
    steal = usual("steal")
    if (ev.steal - steal) * own >= COVERS * lost:
        return Cause(
            True, f"steal: the VM's host took {pct(ev.steal)} of its cores' time (the other ranks' {pct(steal)})"
        )
    if j.phase == "input":
        return _input(j, ev, rank, (workers or {}).get(rank, -1))
    devices = [e.device for r, e in evidence.items() if r != rank and e.device is not None]
    if ev.device is not None:
        costly = [f for f in slowdowns(ev.device, devices, own=own, step=step) if (f.seconds or 0) >= COVERS * lost]
        if costly:
            return Cause(True, costly[0].why, costly[0].fix)
    if more_work >= COVERS * lost:
        mhz = median([o.mhz for o in others if o.mhz is not None])
        if ev.mhz is not None and mhz and ev.mhz < SLOW_CORES * mhz:
            throttled = f", throttled {ev.throttled} times" if ev.throttled > 0 else ""
            return Cause(
                True, f"slower cores: its cores ran at {ev.mhz:.0f} MHz, the other ranks' at {mhz:.0f} MHz{throttled}"
            )
        remote_others = median([o.remote or 0.0 for o in others])
        if ev.remote is not None and ev.remote >= REMOTE and ev.remote - remote_others >= REMOTE / 2:
            node = f" (node {ev.numa})" if ev.numa >= 0 else ""
            return Cause(
                True,
                f"remote memory: {pct(ev.remote)} of its pages are on NUMA nodes other than its own{node}, the other "
                f"ranks' {pct(remote_others)}",
                "--mem-policy bind (each rank's memory on its own node)",
            )
        theirs = usual("main_run") * step
        pages = [u for u in ev.unknown if u.startswith("its pages per NUMA node")] if ev.remote is None else []
        return Cause(
            True,
            f"more work: its main thread ran {ms(run)} a step on a CPU, the other ranks' {ms(theirs)}: it computes "
            "more than they do (a larger batch or sequence, code only it runs)"
            + "".join(f"; not known here: {u}" for u in pages),
        )
    found = faults(ev.device, devices) if ev.device is not None else []
    if found:
        return Cause(True, "; ".join(f.why for f in found), found[0].fix)
    return Cause(False, "cause not found: " + figures(j, ev, others))


def _input(j: Judgement, ev: Evidence, rank: int, workers: int) -> Cause:
    spent = j.phases.get(rank, {}).get("input", 0.0)
    rest = median([ph["input"] for r, ph in j.phases.items() if r != rank])
    where = f"{ms(spent)} a step in the DataLoader iterator, the other ranks' {ms(rest)}"
    if workers == 0:
        return Cause(
            True,
            f"it loads its batches in its main thread (DataLoader num_workers=0): {where}",
            "more loader workers (DataLoader num_workers)",
        )
    n = workers if workers > 0 else ev.children
    if n <= 0:
        return Cause(False, f"cause not found: {where}; no loader workers were seen")
    each = ev.children_cpu / n
    on = ev.children_cpus or ev.cpus
    if each >= BUSY_WORKER:
        return Cause(
            True,
            f"its {n} loader workers cannot keep up: {pct(each)} of a core each, on cpus {on}; {where}",
            "more loader workers (DataLoader num_workers), with cores for them",
        )
    return Cause(
        False,
        f"cause not found: {where}; its {n} loader workers use {pct(each)} of a core each (a slow source: storage, "
        "the network?)",
    )


def figures(j: Judgement, ev: Evidence, others: Sequence[Evidence]) -> str:
    """The rank's figures against the others', for *cause not found*."""
    step = j.step_s
    if j.phase is not None:
        parts = [f"{j.phase} {ms(j.excess.get(j.phase, 0.0))} a step above the other ranks'"]
    else:
        parts = [f"its own time {ms(j.lost_s)} a step above the other ranks'"]
    if ev.waits:
        parts.append(
            f"its main thread ran {ms(ev.main_run * step)} and waited {ms(ev.main_wait * step)} for a CPU (the "
            f"others {ms(median([o.main_run for o in others]) * step)} and "
            f"{ms(median([o.main_wait for o in others]) * step)})"
        )
    else:
        theirs = median([o.main_run for o in others]) * step
        parts.append(f"its main thread ran {ms(ev.main_run * step)} (the others {ms(theirs)})")
    parts.append(f"steal {pct(ev.steal)}")
    if ev.remote is not None:
        parts.append(f"pages off its node {pct(ev.remote)}")
    if ev.mhz is not None:
        parts.append(f"cores at {ev.mhz:.0f} MHz")
    if ev.device is not None:
        parts += device_figures(ev.device)
    if ev.nic:
        parts.append(f"its NIC is not the one next to its GPU: {ev.nic}")
    if ev.hidden and not ev.others:
        parts.append(f"other users' processes are not seen here ({ev.hidden})")
    parts += [f"not known here: {u}" for u in ev.unknown]
    return "; ".join(parts)
