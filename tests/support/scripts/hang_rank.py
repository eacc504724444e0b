"""Test worker for the hang watchdog: gloo ranks that all-reduce a batch each step.

    hang_rank.py OUT stuck RANK    RANK blocks in load_batch at step 3 (a data source that never answers);
                                   the others then wait in all_reduce
    hang_rank.py OUT healthy STEPS each step sleeps at one line for most of its time, then all-reduces: a
                                   healthy job a stack snapshot alone would take for hung

Each rank writes OUT/pid<RANK> (its pid) and OUT/started.<RANK>; a stuck rank writes OUT/stuck.<RANK>.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

out, mode, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])


def mark(name: str) -> None:
    with open(os.path.join(out, name), "w") as f:
        f.write(str(os.getpid()))


def load_batch(step: int) -> torch.Tensor:
    if mode == "stuck" and dist.get_rank() == arg and step == 3:
        mark(f"stuck.{arg}")
        time.sleep(3600)  # the stuck line
    return torch.ones(8)


def stuck() -> None:
    for step in range(100000):
        batch = load_batch(step)
        dist.all_reduce(batch)  # the collective line


def healthy(steps: int) -> None:
    for _ in range(steps):
        time.sleep(1.0)  # the sleeping line
        dist.all_reduce(torch.ones(8))


dist.init_process_group("gloo")
rank = dist.get_rank()
mark(f"pid{rank}")
mark(f"started.{rank}")
stuck() if mode == "stuck" else healthy(arg)
dist.destroy_process_group()
