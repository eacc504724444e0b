"""Cluster-test job: every rank reports where it ran and with which CPUs, as JSON in the run dir
(``--out DIR``, default ``$NUMARUN_RUN_DIR``).

Run under numarun, however it was started (numarun submit, srun numarun, mpirun numarun).
``--fail-rank R --exit-code C``: rank R exits with C after the first barrier, while the others
wait to be stopped.
"""

import sys

TORCH_LOADED_BEFORE_SCRIPT = "torch" in sys.modules

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from numarun.worker import current_binding  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=3)
parser.add_argument("--out", default=os.environ.get("NUMARUN_RUN_DIR"))
opts = parser.parse_args()


def cgroup_cpus():
    """The CPUs of this process's cpuset cgroup (v1 or v2): what Slurm's task/cgroup allowed."""
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        for base, name in (("/sys/fs/cgroup/cpuset", "cpuset.cpus"), ("/sys/fs/cgroup", "cpuset.cpus.effective")):
            if "cpuset" in controllers.split(",") or (controllers == "" and base == "/sys/fs/cgroup"):
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


def openable_gpu_minors():
    """Minor numbers of the GPU device files under $NUMARUN_TOPOLOGY/dev this process may open (the
    device cgroup refuses the others with EPERM); None without such a tree."""
    tree = os.environ.get("NUMARUN_TOPOLOGY")
    if not tree or not os.path.isdir(os.path.join(tree, "dev")):
        return None
    mine = []
    for name in sorted(os.listdir(os.path.join(tree, "dev"))):
        try:
            os.close(os.open(os.path.join(tree, "dev", name), os.O_RDONLY | os.O_NONBLOCK))
        except PermissionError:
            continue
        except OSError:
            pass  # ENXIO: allowed, no driver behind the fake device
        mine.append(int(name.removeprefix("nvidia")))
    return mine


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
    "slurm_procid": int(os.environ.get("SLURM_PROCID", "-1")),
    "slurm_nodelist": os.environ.get("SLURM_STEP_NODELIST", os.environ.get("SLURM_JOB_NODELIST")),
    "slurm_localid": int(os.environ.get("SLURM_LOCALID", "-1")),
    "mpi_rank": int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "-1"))),
    "gpu_bus_id": None if binding is None or binding.gpu is None else binding.gpu.pci_bus_id,
    "gpu_cuda_index": None if binding is None or binding.gpu is None else binding.gpu.cuda_index,
    "openable_gpu_minors": openable_gpu_minors(),
    "torch_loaded_before_script": TORCH_LOADED_BEFORE_SCRIPT,
    "pid": os.getpid(),
}
with open(os.path.join(opts.out, f"rank-{rank}.json"), "w") as f:
    json.dump(report, f)
dist.barrier()
dist.destroy_process_group()
