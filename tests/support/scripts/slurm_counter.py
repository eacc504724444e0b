"""Cluster-test job: a distributed counter that checkpoints on SIGTERM/SIGUSR1 and resumes.

Each step all-reduces a stop flag so that every rank stops after the same step. The state
(steps done, with the restart count each ran in) is written by rank 0 only when stopping
and at the end, so a requeued job continues exactly where it stopped only if the signal
path worked.  Usage: slurm_counter.py STEPS STEP_SECONDS [SAVE_SECONDS]
SAVE_SECONDS: a save after a signal takes that long (a large checkpoint); progress.txt
records 'save start' and 'save done' around it.
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

steps, step_seconds = int(sys.argv[1]), float(sys.argv[2])
save_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
stop = False


def on_signal(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGUSR1, on_signal)

dist.init_process_group("gloo")
rank = dist.get_rank()
run_dir = os.environ["NUMARUN_RUN_DIR"]
state_path = os.path.join(run_dir, "counter.json")
progress_path = os.path.join(run_dir, "progress.txt")
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
history = []
if os.path.exists(state_path):
    with open(state_path) as f:
        history = json.load(f)["history"]


def save():
    tmp = state_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"history": history}, f)
    os.replace(tmp, state_path)


step = len(history)
while step < steps:
    time.sleep(step_seconds)
    flag = torch.tensor([1.0 if stop else 0.0])
    dist.all_reduce(flag)
    history.append([step, restart])
    step += 1
    if rank == 0:
        with open(progress_path, "a") as f:
            f.write(f"{step} {restart}\n")
    if flag.item() > 0:
        break
if rank == 0:
    if stop and save_seconds:
        with open(progress_path, "a") as f:
            f.write(f"save start {step}\n")
        time.sleep(save_seconds)
    save()
    if stop and save_seconds:
        with open(progress_path, "a") as f:
            f.write(f"save done {step}\n")
dist.barrier()
dist.destroy_process_group()
