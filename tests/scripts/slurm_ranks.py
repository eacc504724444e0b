"""Cluster-test job: every rank reports where it ran and with which CPUs, as JSON in the run dir.

Run under numarun (torchrun env + NUMARUN_PLAN). ``--fail-rank R --exit-code C``: rank R exits
with C after the first barrier, while the others wait to be stopped.
"""

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from numarun.launch.bootstrap import current_binding

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=3)
opts = parser.parse_args()



def cgroup_cpus():
    """The CPUs of this process's cpuset cgroup (v1 or v2): what Slurm's task/cgroup allowed."""
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        for base, name in (("/sys/fs/cgroup/cpuset", "cpuset.cpus"), ("/sys/fs/cgroup", "cpuset.cpus.effective")):
            if ("cpuset" in controllers.split(",") or (controllers == "" and base == "/sys/fs/cgroup")):
                try:
                    text = open(f"{base}{path}/{name}").read().strip()
                except OSError:
                    continue
                cpus = []
                for part in text.split(","):
                    a, _, b = part.partition("-")
                    cpus += range(int(a), int(b or a) + 1)
                return cpus
    return None


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dist.barrier()
if rank == opts.fail_rank:
    sys.exit(opts.exit_code)
if opts.fail_rank >= 0:
    # stay out of collectives with the dead rank: Slurm stops this node's task
    time.sleep(120)
    sys.exit(0)
t = torch.tensor([float(rank)])
dist.all_reduce(t)
binding = current_binding()
report = {
    "rank": rank,
    "world_size": world,
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "group_rank": int(os.environ["GROUP_RANK"]),
    "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
    "job_id": os.environ.get("SLURM_JOB_ID"),
    "slurm_nodeid": int(os.environ.get("SLURM_NODEID", "-1")),
    "nproc_per_node": int(os.environ["LOCAL_WORLD_SIZE"]),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "cgroup_cpus": cgroup_cpus(),
    "affinity": sorted(os.sched_getaffinity(0)),
    "plan_cpus": None if binding is None else list(binding.cpus),
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    "all_reduce_sum": t.item(),
}
run_dir = os.environ["NUMARUN_RUN_DIR"]
with open(os.path.join(run_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(report, f)
dist.barrier()
dist.destroy_process_group()
