"""What the binding watcher costs a rank: the time of one check, and a workload side by side.

    python scripts/bench_watch.py [--mib 1024] [--rounds 3] [--seconds 3]

1. One check (every thread's affinity + /proc/self/numa_maps) timed in a process that holds
   ``--mib`` MiB of touched memory and torch's threads: the watcher's cost per interval,
   and that as a share of the default interval.
2. A CPU workload (numpy matmuls for a fixed count) with the watcher off, at the default
   interval, and at 0.05 s, alternated ``--rounds`` times; prints the ratios to "off".
   A workload shorter than the default interval sees at most the first check, so its
   ratio shows the noise of the host; the 0.05 s row shows what the check costs when it
   runs 600 times more often than by default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=100, help="matmuls per workload run")
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        torch.ones(1) + 1
    except ImportError:
        pass
    from numarun.worker import binding_watch as watch

    hold = np.ones((args.mib << 20) // 8)  # touched: every page resident
    cpus = os.sched_getaffinity(0)
    w = watch.Watcher(cpus, [0], interval=watch.DEFAULT_INTERVAL, strict=False)
    w.check_once()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        w.check_once()
        times.append(time.perf_counter() - t0)
    full = statistics.median(times)
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        w.check_once(memory=False)
        times.append(time.perf_counter() - t0)
    light = statistics.median(times)
    n = watch.MEMORY_EVERY
    per_interval = (light * (n - 1) + full) / n
    print(
        f"one check with numa_maps: {full * 1e3:.2f} ms; affinity only: {light * 1e3:.3f} ms "
        f"({len(watch.affinity.thread_affinities())} threads, {args.mib} MiB resident)"
    )
    print(
        f"at the default interval ({watch.DEFAULT_INTERVAL:g} s, numa_maps every {n}th check): "
        f"{per_interval / watch.DEFAULT_INTERVAL:.1e} of one core"
    )

    a = np.random.default_rng(0).random((384, 384))

    def workload() -> float:
        t0 = time.perf_counter()
        x = a
        for _ in range(args.iters):
            x = a @ x
            x /= np.abs(x).max()
        return time.perf_counter() - t0

    results: dict[str, list[float]] = {"off": [], f"{watch.DEFAULT_INTERVAL:g} s": [], "0.05 s": []}
    for _ in range(args.rounds):
        for label in results:
            watcher = None
            if label != "off":
                interval = 0.05 if label == "0.05 s" else watch.DEFAULT_INTERVAL
                watcher = watch.Watcher(cpus, [0], interval=interval, strict=False).start()
            results[label].append(workload())
            if watcher is not None:
                watcher.stop()
    base = statistics.median(results["off"])
    for label, vals in results.items():
        m = statistics.median(vals)
        print(f"workload, watcher {label:>6}: {m:.3f} s  ratio to off {m / base:.3f}")
    del hold
    return 0


if __name__ == "__main__":
    sys.exit(main())
