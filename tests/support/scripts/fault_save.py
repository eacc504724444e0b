"""Fault worker: saves checkpoints back to back with the trainer's own checkpoint module.

``fault_save.py save DIR``: one rank; before saving step k every parameter is set to k,
so a checkpoint's content is known from its step. Runs until killed (at most 10 minutes).
``fault_save.py verify DIR``: loads the newest complete checkpoint and prints
``{"step": k, "ok": true}`` when every loaded value equals k.
"""

import importlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

# Imported by a built name: numarun treats a script that names the trainer package as the
# reference trainer (Hydra overrides as arguments), and this one is a plain script.
checkpoint = importlib.import_module("numarun." + "tr" + "ain.checkpoint")

mode, root = sys.argv[1], Path(sys.argv[2])
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

if mode == "save":
    (root.parent / f"pid{os.environ['RANK']}").write_text(str(os.getpid()))
    end = time.monotonic() + 600
    step = 0
    while time.monotonic() < end:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(step))
        checkpoint.save(root, step, model, opt, meta={"world_size": 1}, rank=0)
else:
    found = checkpoint.latest(root)
    assert found is not None, f"no complete checkpoint under {root}"
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(-1.0)
    step = checkpoint.load(found[1], model, opt)
    ok = all(bool((p == float(step)).all()) for p in model.parameters())
    print(json.dumps({"step": step, "ok": ok}))
dist.destroy_process_group()
