"""Where a DDP step's time goes: forward, backward (with the gradient reduction), optimizer.

Run under numarun (or torchrun) on every node, e.g. by ``PHASES=1 sudo scripts/netns-train.sh``.
Builds the reference trainer's GPT (``--d-model 256 --layers 4`` by default, seq 32, vocab
256), wraps it in DDP with the chosen reduction, and times each step's phases after a barrier;
prints rank 0's medians over the steps after the first, one line starting ``PHASES`` (and
one starting ``CPUS``: every rank's CPU affinity, ``rank:cpu,cpu``):

* F: forward and loss; B: ``loss.backward()``, which returns when every bucket is reduced;
  O: gradient clipping (1.0), AdamW step (the trainer's implementation) and the mean-loss
  all-reduce, as the trainer does;
* for the hierarchical hook, from numarun's chunk pipeline: ``first_cross`` (seconds from the
  start of backward until the first chunk is sent across nodes) and ``link`` (first chunk sent
  to last chunk back: the time the inter-node link is in use), with ``bytes`` crossing per
  rank, so that ``link`` can be set against the link's rate.

    numarun --nproc-per-node 2 --standalone scripts/ddp_phases.py --comm hierarchical --compression bf16
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import numarun
from numarun.comm.allreduce import apply_comm, ddp_bucket_mb
from numarun.comm.pipeline import Steps
from numarun.train.models import Gpt
from numarun.train.optim import adamw_path


def _record_stream(events: list[tuple[str, float, int]]) -> None:
    """Note when each chunk is sent across nodes and when it is gathered back."""
    cross, gather = Steps.cross, Steps.gather

    def timed_cross(self: Any, c: Any) -> Any:
        wire_bytes = c.shard.numel() * (
            torch.finfo(self.inter_dtype).bits // 8 if self.inter_dtype else c.shard.element_size()
        )
        events.append(("cross", time.perf_counter(), wire_bytes))
        return cross(self, c)

    def timed_gather(self: Any, c: Any) -> Any:
        events.append(("gather", time.perf_counter(), 0))
        return gather(self, c)

    Steps.cross = timed_cross  # type: ignore[method-assign]
    Steps.gather = timed_gather  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--comm", choices=["flat", "hierarchical"], default="hierarchical")
    p.add_argument("--compression", choices=["none", "bf16", "fp16"], default="none")
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="DDP's bucket_cap_mb (default: the trainer's, DDP's 25 for flat, 2 for hierarchical)",
    )
    p.add_argument(
        "--bucket-list",
        default=None,
        metavar="MB,MB,...",
        help="DDP's bucket_cap_mb_list: a size per bucket, the first bucket first (torch >= 2.13)",
    )
    p.add_argument("--bucket-view", action="store_true", help="DDP's gradient_as_bucket_view")
    p.add_argument("--chunk-mb", type=float, default=None, help="pipelining chunk (default: numarun's)")
    p.add_argument("--batch-per-rank", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()

    ctx = numarun.init()
    torch.manual_seed(0)
    model = Gpt(vocab_size=256, seq_len=32, d_model=args.d_model, n_heads=4, n_layers=args.layers, dropout=0.0)
    if not args.bucket_list:
        args.bucket_mb = ddp_bucket_mb(args.bucket_mb, args.comm)  # as the trainer
    buckets: dict[str, Any] = {} if args.bucket_mb is None else {"bucket_cap_mb": args.bucket_mb}
    if args.bucket_list:
        buckets["bucket_cap_mb_list"] = [float(v) for v in args.bucket_list.split(",")]
    ddp = DDP(model, gradient_as_bucket_view=args.bucket_view, **buckets)
    compression = None if args.compression == "none" else args.compression
    if args.comm != "flat" or compression:
        chunk = None if args.chunk_mb is None else int(args.chunk_mb * 2**20)
        apply_comm(ddp, args.comm, compression, ctx, chunk_bytes=chunk)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, **adamw_path(tp=1, device_type="cpu"))  # as the trainer
    events: list[tuple[str, float, int]] = []
    _record_stream(events)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randint(0, 256, (args.batch_per_rank, 32), generator=g)
    y = torch.randint(0, 256, (args.batch_per_rank, 32), generator=g)
    rows = []
    for _ in range(args.steps):
        dist.barrier()
        events.clear()
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(x).view(-1, 256), y.view(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        mean = loss.detach().clone()
        work = dist.all_reduce(mean, async_op=True)
        torch.nn.utils.clip_grad_norm_(list(ddp.parameters()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        work.wait()
        t3 = time.perf_counter()
        crosses = [e for e in events if e[0] == "cross"]
        gathers = [e for e in events if e[0] == "gather"]
        link = gathers[-1][1] - crosses[0][1] if crosses and gathers else float("nan")
        first = crosses[0][1] - t1 if crosses else float("nan")
        rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0, first, link, sum(e[2] for e in crosses)))
    cpus: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(cpus, sorted(os.sched_getaffinity(0)))
    if ctx.rank == 0:
        print("CPUS " + " ".join(f"{r}:{','.join(map(str, c))}" for r, c in enumerate(cpus)), flush=True)
        med = [statistics.median(r[i] for r in rows[1:]) for i in range(7)]
        label = (
            f"{args.comm}{'-' + compression if compression else ''} bucket_mb={args.bucket_mb}"
            f"{' bucket_list=' + args.bucket_list if args.bucket_list else ''} chunk_mb={args.chunk_mb}"
        )
        print(
            f"PHASES {label}: F {med[0]:.3f} B {med[1]:.3f} O {med[2]:.3f} step {med[3]:.3f} s"
            f" | first_cross {med[4]:.3f} s link {med[5]:.3f} s bytes {med[6] / 1e6:.2f} MB per rank",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
