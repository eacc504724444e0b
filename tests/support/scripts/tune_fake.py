"""A job whose "speed" is a function of its binding, so that tuning it is deterministic.

Each rank reports samples/s = 1 / (CPUs it may run on), doubled under the preferred memory
policy: a job that gains from a narrow CPU set (cache locality) and from preferred memory.
The binding is read back from the kernel (sched_getaffinity) and from numarun's plan; no clock.
"""

import os

import numarun

binding = numarun.current_binding()
speed = 1.0 / len(os.sched_getaffinity(0))
if binding is not None and binding.mem_policy.value == "preferred":
    speed *= 2
numarun.report(samples=speed, seconds=1.0)
