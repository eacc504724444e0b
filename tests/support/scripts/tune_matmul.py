"""A real CPU job for ``numarun tune``: matrix products for a fixed time, reported with numarun.report.

With ``--binding none`` two ranks each run OMP_NUM_THREADS threads over all cores; bound,
each has its own cores. ``numarun tune --binding exclusive,none --nproc-per-node 2 THIS``.
"""

import sys
import time

import torch

import numarun

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
a = torch.randn(256, 256)
for _ in range(3):  # warm-up, not counted
    a @ a
done, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    a @ a
    done += 1
numarun.report(samples=done, seconds=time.perf_counter() - start)
