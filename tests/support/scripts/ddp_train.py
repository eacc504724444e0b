"""An unmodified torchrun-style DDP script: gloo, init from env, a few SGD steps.

Rank 0 writes the final parameters to the JSON file named by argv[1].
"""

import gc
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(5):
        x = torch.randn(4, 8, generator=data)
        y = torch.randn(4, 1, generator=data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    if rank == 0:
        params = [p.detach().flatten().tolist() for p in model.parameters()]
        with open(out, "w") as f:
            json.dump({"world_size": dist.get_world_size(), "params": params}, f)
    # Free DDP before tearing down: a DDP reducer left to interpreter teardown aborts a few
    # runs in a hundred under plain torchrun (torch 2.13, gloo), which would fail the baseline.
    del ddp, opt
    gc.collect()  # the reducer sits in reference cycles: collect it while the interpreter is whole
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
