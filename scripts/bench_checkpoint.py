"""What checkpoint checksums cost, set against the save and the resume they guard.

Run under numarun (or torchrun); every rank runs it:

    numarun --nproc-per-node 2 scripts/bench_checkpoint.py --model gpt --d-model 512 --layers 8

Builds the reference trainer (``numarun.train.loop.Trainer``: its model, optimizer and
parallel wrapping) from the given model config, trains one step so that the optimizer has
state, then, for each round, side by side on the same files:

* save: ``checkpoint.save`` as the trainer calls it (DCP write, fsync, each rank hashing the
  files it wrote, meta.json, rename), and the checksum part alone (``hash_share`` on every
  rank at once, then the slowest rank), read back from the page cache as the save does;
* resume: the verification (``newest_verified``: every rank checks its share) and
  ``checkpoint.load`` (torch reads and applies the state).

Each time is rank 0's, between two barriers (so the slowest rank counts). Prints the medians,
one line each, and the ratios; the last line is ``CHECKSUM save=<%> resume=<%>``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from numarun.config.schema import load_job_config_text
from numarun.train import checkpoint
from numarun.train.loop import Trainer, init_context


def _timed(fn: Any) -> tuple[float, Any]:
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    dist.barrier()
    return time.perf_counter() - t0, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", choices=["mlp", "gpt"], default="mlp", help="the reference model (default mlp, the trainer's)"
    )
    p.add_argument("--d-model", type=int, default=64, help="gpt width (default 64, the trainer's)")
    p.add_argument("--layers", type=int, default=2, help="gpt layers (default 2, the trainer's)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", default=None, help="where checkpoints are written (default: a fresh temporary directory)")
    args = p.parse_args()

    ctx = init_context()
    rank, world = ctx.rank, ctx.world_size
    where = [args.dir or (tempfile.mkdtemp(prefix="numarun-bench-ckpt-") if rank == 0 else None)]
    dist.broadcast_object_list(where, src=0)
    base = Path(where[0])
    root, run_dir = base / "ck", base / "run"
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    model_yaml = f"  kind: {args.model}\n"
    if args.model == "gpt":
        model_yaml += f"  d_model: {args.d_model}\n  n_layers: {args.layers}\n"
    ddp = "parallel:\n  kind: ddp\n  dp_replicate: -1\n  dp_shard: 1\n"  # configs/parallel/ddp.yaml
    cfg = load_job_config_text(
        f"model:\n{model_yaml}{ddp}trainer:\n  steps: 1\n  progress: false\n  checkpoint_dir: {root}\n"
    )
    trainer = Trainer(cfg, run_dir, ctx)
    trainer.run()  # one step, so that the optimizer has state, and its final save
    meta = {"world_size": world, "parallel": cfg.parallel.kind, "model": checkpoint.model_config(cfg.model)}

    rows: dict[str, list[float]] = {"save": [], "hash": [], "verify": [], "load": []}
    size = 0
    for i in range(args.rounds):
        step = 100 + i
        t, path = _timed(
            lambda s=step: checkpoint.save(root, s, trainer.par.parts, trainer.optimizers, meta=meta, rank=rank)
        )
        rows["save"].append(t)
        size = sum(f.stat().st_size for f in path.iterdir())
        rows["hash"].append(_timed(lambda p=path: checkpoint.hash_share(p, rank=rank, world_size=world))[0])
        t, found = _timed(lambda: checkpoint.newest_verified(root, rank=rank, world_size=world, device=ctx.device))
        assert found == (step, path), found
        rows["verify"].append(t)
        rows["load"].append(_timed(lambda p=path: checkpoint.load(p, trainer.par.parts, trainer.optimizers))[0])
        if rank == 0:
            for old in root.glob("step_*"):
                if old != path:
                    shutil.rmtree(old)
        dist.barrier()
    if rank == 0:
        med = {k: statistics.median(v) for k, v in rows.items()}
        save_pct, resume_pct = 100 * med["hash"] / med["save"], 100 * med["verify"] / med["load"]
        label = f"{args.model}" + (f" d_model={args.d_model} layers={args.layers}" if args.model == "gpt" else "")
        print(f"model {label}, {world} ranks, checkpoint {size / 2**20:.1f} MiB, {args.rounds} rounds (medians)")
        print(
            f"save   {med['save'] * 1e3:8.1f} ms   of which checksums {med['hash'] * 1e3:7.1f} ms   ({save_pct:.1f} %)"
        )
        print(
            f"resume {med['load'] * 1e3:8.1f} ms load   verification {med['verify'] * 1e3:7.1f} ms before it"
            f"   ({resume_pct:.1f} %)"
        )
        print(json.dumps({k: [round(x, 5) for x in v] for k, v in rows.items()}))
        print(f"CHECKSUM save={save_pct:.1f}% resume={resume_pct:.1f}%")
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
