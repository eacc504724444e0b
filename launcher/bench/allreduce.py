"""All-reduce benchmark: flat ``all_reduce`` vs :func:`hierarchical_all_reduce`.

Run by every rank of a job; what it measures and prints: docs/allreduce.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import argtypes
from ..errors import UsageError, expected
from ..fsutil import write_atomic

log = logging.getLogger(__name__)

DISTRIBUTED = True  # every rank of a job runs this benchmark

DEFAULT_SIZES = "1M,4M,16M,64M,256M"
_UNITS = {
    "": 1,
    "B": 1,
    "K": 2**10,
    "KB": 2**10,
    "KIB": 2**10,
    "M": 2**20,
    "MB": 2**20,
    "MIB": 2**20,
    "G": 2**30,
    "GB": 2**30,
    "GIB": 2**30,
}
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


MAX_SIZE = 2**40  # one buffer: 1 TiB, past any host's or GPU's memory


def parse_size(text: str) -> int:
    """``16M`` / ``1MiB`` / ``4096`` -> bytes (binary units), at most :data:`MAX_SIZE`."""
    m = re.fullmatch(r"\s*(\d{1,30})\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS or not 0 < int(m.group(1)) * _UNITS[m.group(2).upper()] <= MAX_SIZE:
        raise UsageError(
            expected(text, "a positive size up to 1T such as 4096, 512K, 16M or 1G (binary units)", "size")
        )
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(text: str) -> tuple[int, ...]:
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise UsageError(expected(text, "a comma-separated list of sizes such as 1M,16M,256M", "--sizes"))
    return tuple(parse_size(p) for p in parts)


def parse_rate(text: str) -> float:
    """``200mbit`` (tc's spelling, decimal units) -> bits per second."""
    m = re.fullmatch(r"\s*(\d{1,15}(?:\.\d{1,15})?)\s*([A-Za-z]+)\s*", text)
    if not m or m.group(2).lower() not in _RATE_UNITS or float(m.group(1)) <= 0:
        raise UsageError(expected(text, "a link rate such as 200mbit or 10gbit", "--link-rate"))
    return float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]


def human_size(n: int) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n-1)/n."""
    return 2.0 * (world_size - 1) / world_size if world_size > 1 else 0.0


def node_bytes(*, size_bytes: int, num_nodes: int, local_world_size: int, hierarchical: bool) -> float:
    """Bytes each node sends to other nodes for one all-reduce of ``size_bytes``: the ring's 2(n-1)/n of it over the
    nodes (hierarchical) or over every rank (flat)."""
    peers = num_nodes if hierarchical else num_nodes * local_world_size
    return bus_factor(peers) * size_bytes if num_nodes > 1 else 0.0


def bound_ratio(*, num_nodes: int, local_world_size: int) -> float | None:
    """hierarchical/flat ratio of inter-node bytes: (N-1)/N / ((NG-1)/(NG)); None on one node (no inter-node bytes)."""
    n = num_nodes * local_world_size
    return ((num_nodes - 1) / num_nodes) / ((n - 1) / n) if num_nodes >= 2 else None


ONE_NODE_NOTE = (
    "note: one node: hierarchical all-reduce only helps across nodes (it cuts the bytes each node "
    "sends to the others); inside one node it adds steps and is expected to be slower than flat"
)


@dataclass(frozen=True)
class SizeResult:
    """Timings of one size in one mode."""

    size_bytes: int
    mode: str
    times_s: tuple[float, ...]
    median_s: float
    algbw_gbps: float  # 1e9 bytes/s of payload: size / median time
    busbw_gbps: float


def summarize(*, size_bytes: int, mode: str, times: Sequence[float], world_size: int) -> SizeResult:
    med = statistics.median(times)
    alg = size_bytes / med / 1e9 if med > 0 else float("inf")
    return SizeResult(size_bytes, mode, tuple(times), med, alg, alg * bus_factor(world_size))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"comma-separated message sizes, binary units (default {DEFAULT_SIZES})"
    )
    parser.add_argument(
        "--iters",
        type=argtypes.int_in("--iters", low=1, high=argtypes.MAX_COUNT),
        default=5,
        help="timed iterations per size and mode (default 5)",
    )
    parser.add_argument(
        "--warmup",
        type=argtypes.int_in("--warmup", low=0, high=argtypes.MAX_COUNT),
        default=1,
        help="untimed iterations per size and mode (default 1)",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="element type (default float32)"
    )
    parser.add_argument(
        "--modes",
        default="flat,hierarchical",
        help="which all-reduces to time, comma-separated: flat, hierarchical (default both)",
    )
    parser.add_argument(
        "--chunk",
        default="auto",
        help="hierarchical pipelining chunk (e.g. 1M; 0 = one shot, no pipelining; default auto)",
    )
    parser.add_argument(
        "--backend", default=None, help="torch.distributed backend (default: nccl with GPUs, else gloo)"
    )
    parser.add_argument(
        "--link-rate",
        default=None,
        help="inter-node link rate (e.g. 200mbit): adds each mode's time at that rate to the report",
    )
    argtypes.add_json_options(parser, what="the results (rank 0)")


def check_options(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[str, ...], float | None]:
    """Every option of the benchmark, checked (by ``numarun bench`` before it starts any rank)."""
    sizes = parse_sizes(args.sizes)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or any(m not in ("flat", "hierarchical") for m in modes):
        raise UsageError(expected(args.modes, "flat, hierarchical or flat,hierarchical", "--modes"))
    rate = parse_rate(args.link_rate) if args.link_rate else None
    chunk = str(args.chunk).strip().lower()
    args.chunk_bytes = None if chunk == "auto" else 0 if chunk == "0" else parse_size(chunk)
    return sizes, modes, rate


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark on this rank (collective). Returns the report (same on every rank)."""
    import torch
    import torch.distributed as dist

    from ..comm.allreduce import hierarchical_all_reduce
    from ..comm.context import init

    sizes, modes, rate = check_options(args)
    ctx = init(args.backend)
    if "hierarchical" in modes:
        ctx.require_hierarchical()
    dtype = getattr(torch, args.dtype)
    elem = torch.tensor([], dtype=dtype).element_size()
    world = ctx.world_size

    fns = {
        "flat": dist.all_reduce,
        "hierarchical": lambda t: hierarchical_all_reduce(t, context=ctx, chunk_bytes=args.chunk_bytes),
    }
    results: list[SizeResult] = []
    checks: dict[str, bool] = {}
    for size in sizes:
        numel = max(1, size // elem)
        # small integers: the sum is exact in every dtype here, so the modes must agree bit for bit
        pos = torch.arange(numel, dtype=torch.int64) % 7
        base = ((pos + ctx.rank) % 7).to(dtype).to(ctx.device)
        table = torch.tensor([sum((k + r) % 7 for r in range(world)) for k in range(7)], dtype=torch.int64)
        want = table[pos].to(dtype).to(ctx.device)
        del pos
        times: dict[str, list[float]] = {m: [] for m in modes}
        ok = True
        for it in range(args.warmup + args.iters):
            for m in modes if it % 2 == 0 else modes[::-1]:
                t = base.clone()
                dist.barrier()
                t0 = time.perf_counter()
                fns[m](t)
                if t.is_cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                if it == 0:
                    ok = ok and bool(torch.equal(t, want))
                if it >= args.warmup:
                    times[m].append(dt)
        # one collective per size: every rank learns the slowest rank's times and the check
        flat_times = torch.tensor(
            [x for m in modes for x in times[m]] + [0.0 if ok else 1.0], dtype=torch.float64, device=ctx.device
        )
        dist.all_reduce(flat_times, op=dist.ReduceOp.MAX)
        vals = flat_times.cpu().tolist()
        checks[str(size)] = vals[-1] == 0.0
        results += [
            summarize(size_bytes=size, mode=m, times=vals[k * args.iters : (k + 1) * args.iters], world_size=world)
            for k, m in enumerate(modes)
        ]
        if ctx.rank == 0:
            log.info("size %s done", human_size(size))

    return {
        "benchmark": "allreduce",
        "world_size": world,
        "num_nodes": ctx.num_nodes,
        "local_world_size": ctx.local_world_size,
        "backend": ctx.backend,
        "dtype": args.dtype,
        "iters": args.iters,
        "warmup": args.warmup,
        "link_rate_bps": rate,
        "chunk_bytes": args.chunk_bytes,
        "rank0_cpus": list(ctx.binding.cpus) if ctx.binding is not None else None,
        "bound_ratio": bound_ratio(num_nodes=ctx.num_nodes, local_world_size=ctx.local_world_size)
        if ctx.hierarchical_ok
        else None,
        "results": [asdict(r) for r in results],
        "correct": checks,
        "comparisons": _comparisons(results, ctx.num_nodes, ctx.local_world_size if ctx.hierarchical_ok else 0, rate),
    }


def _comparisons(results: Sequence[SizeResult], num_nodes: int, g: int, rate: float | None) -> list[dict[str, Any]]:
    by = {(r.size_bytes, r.mode): r for r in results}
    out = []
    for size in sorted({r.size_bytes for r in results}):
        row: dict[str, Any] = {"size_bytes": size}
        f, h = by.get((size, "flat")), by.get((size, "hierarchical"))
        if f and h:
            row["ratio"] = h.median_s / f.median_s
        if rate and g and num_nodes > 1:
            for mode, r in (("flat", f), ("hierarchical", h)):
                if r is None:
                    continue
                link_s = (
                    node_bytes(
                        size_bytes=size, num_nodes=num_nodes, local_world_size=g, hierarchical=mode == "hierarchical"
                    )
                    * 8
                    / rate
                )
                row[f"{mode}_link_bound_s"] = link_s
                row[f"{mode}_over_bound"] = r.median_s / link_s - 1.0
        out.append(row)
    return out


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"all-reduce, {report['num_nodes']} node(s) x {report['local_world_size']} rank(s), "
        f"{report['backend']}, {report['dtype']}, median of {report['iters']}"
    )
    table = Table(title=title)
    for col in ("size", "mode", "time (ms)", "algbw (GB/s)", "busbw (GB/s)", "hier/flat", "vs link bound"):
        table.add_column(col, justify="right")
    comps = {c["size_bytes"]: c for c in report["comparisons"]}
    for r in report["results"]:
        c = comps.get(r["size_bytes"], {})
        ratio = f"{c['ratio']:.3f}" if r["mode"] == "hierarchical" and "ratio" in c else ""
        over = c.get(f"{r['mode']}_over_bound")
        table.add_row(
            human_size(r["size_bytes"]),
            r["mode"],
            f"{r['median_s'] * 1e3:.2f}",
            f"{r['algbw_gbps']:.3f}",
            f"{r['busbw_gbps']:.3f}",
            ratio,
            f"{over * 100:+.1f}%" if over is not None else "",
        )
    console = Console(width=120)
    console.print(table)
    if report.get("bound_ratio"):
        console.print(f"byte-count bound for hier/flat: {report['bound_ratio']:.3f}")
    if report["num_nodes"] < 2 and any(r["mode"] == "hierarchical" for r in report["results"]):
        console.print(ONE_NODE_NOTE)
    bad = [k for k, v in report["correct"].items() if not v]
    console.print("results: flat == hierarchical" if not bad else f"results DIFFER for sizes {bad}")


def run_and_report(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from ..comm.context import destroy

    report = run(args)
    if dist.get_rank() == 0:
        text = json.dumps(report, indent=1, allow_nan=False) + "\n"  # allow_nan=False: NaN is not JSON
        if args.json:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            render(report)
        if args.json_file:
            write_atomic(Path(args.json_file), text)
    destroy()
    return 0 if all(report["correct"].values()) else 1


if __name__ == "__main__":
    from ..errors import NumarunError

    parser = argparse.ArgumentParser(prog="python -m numarun.bench.allreduce", description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        sys.exit(run_and_report(parser.parse_args()))
    except NumarunError as e:
        print(f"numarun: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
