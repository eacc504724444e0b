"""Mesh test job: every rank builds numarun.init()'s DeviceMesh, all-reduces its rank over each dimension's
group, and writes what it saw as JSON to ``--out DIR`` (rank-<RANK>.json): the mesh's names and groups (torch's
own rank lists), the sums, its binding's GPU and the visible-device order it ran with (default DIR: the run dir)."""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import numarun
from numarun.worker import current_binding

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=os.environ.get("NUMARUN_RUN_DIR"))
opts = parser.parse_args()

ctx = numarun.init()
mesh = ctx.mesh
rank = dist.get_rank()
groups, sums = {}, {}
for name in mesh.mesh_dim_names:
    sub = mesh[name]
    groups[name] = dist.get_process_group_ranks(sub.get_group())
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=sub.get_group())
    sums[name] = t.item()
binding = current_binding()
report = {
    "rank": rank,
    "local_rank": ctx.local_rank,
    "world_size": ctx.world_size,
    "node_rank": ctx.node_rank,
    "node_key": os.environ.get("NUMARUN_NODE_KEY"),
    "host": os.environ.get("SLURMD_NODENAME"),
    "names": list(mesh.mesh_dim_names),
    "shape": list(mesh.shape),
    "mesh": mesh.mesh.tolist(),
    "groups": groups,
    "sums": sums,
    "gpu_index": binding.gpu.index if binding is not None and binding.gpu is not None else None,
    "cuda_index": binding.gpu.cuda_index if binding is not None and binding.gpu is not None else None,
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "env": {k: v for k, v in os.environ.items() if k.startswith("NUMARUN_MESH")},
}
Path(opts.out, f"rank-{rank}.json").write_text(json.dumps(report))
dist.barrier()
numarun.comm.context.destroy()
