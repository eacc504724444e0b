"""Fault worker: gloo all-reduce in a loop until a peer disappears.

``fault_allreduce.py OUT``: writes its pid to ``OUT/pid<RANK>`` once the process group is
up, then all-reduces a small tensor every 50 ms for at most 10 minutes.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
path = os.path.join(sys.argv[1], f"pid{rank}")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)
t = torch.ones(4)
end = time.monotonic() + 600
while time.monotonic() < end:
    dist.all_reduce(t)
    time.sleep(0.05)
