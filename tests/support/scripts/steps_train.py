"""Test worker for the step report: a small DDP job on gloo, its batches from a DataLoader, until told to stop.

    steps_train.py OUT    each rank writes OUT/started.<RANK>, then trains (one optimizer step about every 20 ms)
                          until OUT/stop exists (or 3,000 steps), and exits 0

Nothing in it knows numarun: the step report must find its steps, batches and collectives on its own.
"""

import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
open(os.path.join(out, f"started.{rank}"), "w").close()
step = 0
while step < 3000 and not os.path.exists(os.path.join(out, "stop")):
    for x, y in DataLoader(data, batch_size=16):
        time.sleep(0.01)  # a step's worth of work, without loading the machine
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
del model, opt
gc.collect()  # free DDP's reducer while the interpreter is whole (tests/scripts/ddp_train.py)
dist.destroy_process_group()
