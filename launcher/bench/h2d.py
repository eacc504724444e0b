"""Host<->device copy bandwidth: pinned memory on the rank's NUMA node vs pageable vs raw torch.

See docs/gpu.md. The launcher side never imports torch; the bound worker and the raw one run one after the other.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import argtypes, envvars, tables
from ..fsutil import write_atomic
from ..jsonable import from_jsonable
from .allreduce import human_size, parse_size

log = logging.getLogger(__name__)

DISTRIBUTED = False  # starts its own workers, one bound, one raw

NO_CUDA_EXIT = 2
DIRECTIONS = ("h2d", "d2h")
_MOVE_PAGES = {"x86_64": 279, "amd64": 279, "aarch64": 239, "arm64": 239}


@dataclass(frozen=True)
class WorkerResult:
    """What one worker measured (GB/s = 1e9 bytes/s), plus where it ran."""

    label: str  # numarun (bound by the bootstrap) or raw
    cuda: bool
    size_bytes: int = 0
    iters: int = 0
    gbps: dict[str, float] = field(default_factory=dict)  # {h2d,d2h}_{pinned,pageable}
    device: str = ""
    torch_version: str = ""
    cpus: tuple[int, ...] = ()
    mem_policy: str = ""
    mems: tuple[int, ...] = ()
    pinned_page_nodes: tuple[int, ...] = ()  # sampled by move_pages(2); () when the driver's mapping hides them
    pageable_page_nodes: tuple[int, ...] = ()
    error: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="1GiB", help="bytes per copy, binary units (default 1GiB)")
    parser.add_argument(
        "--iters",
        type=argtypes.int_in("--iters", low=1, high=argtypes.MAX_COUNT),
        default=10,
        help="timed copies per direction and kind (default 10)",
    )
    argtypes.add_json_options(parser, what="the figures")


def page_nodes(address: int, length: int, *, samples: int = 16) -> tuple[int, ...]:
    """NUMA nodes of ``samples`` pages over [address, address+length) (``move_pages(2)``, NULL nodes: query); ()
    unknown."""
    number = _MOVE_PAGES.get(platform.machine().lower())
    if number is None or length <= 0:
        return ()
    page = os.sysconf("SC_PAGE_SIZE")
    first = address - address % page
    count = max(1, min(samples, length // page))
    step = max(page, (length // count) // page * page)
    pages = (ctypes.c_void_p * count)(*[first + i * step for i in range(count)])
    status = (ctypes.c_int * count)()
    libc = ctypes.CDLL(None, use_errno=True)
    ret = libc.syscall(ctypes.c_long(number), 0, ctypes.c_ulong(count), pages, None, status, 0)
    if ret != 0:
        return ()
    return tuple(sorted({s for s in status if s >= 0}))


def measure(*, size_bytes: int, iters: int, label: str) -> WorkerResult:
    """In a worker: time the four copies on the rank's CUDA device."""
    import torch

    from ..worker import affinity, current_binding

    got = affinity.read_back()
    result = WorkerResult(
        label, cuda=True, torch_version=torch.__version__, cpus=got.cpus, mem_policy=got.mem_policy, mems=got.mems
    )
    if not torch.cuda.is_available():
        return replace(result, cuda=False, error="no CUDA device (torch.cuda.is_available() is False)")

    binding = current_binding()
    index = binding.gpu.cuda_index if binding is not None and binding.gpu is not None else 0
    dev = torch.device("cuda", index)
    device_buf = torch.empty(size_bytes, dtype=torch.uint8, device=dev)
    pinned = torch.ones(size_bytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.ones(size_bytes, dtype=torch.uint8)
    nodes = page_nodes(pinned.data_ptr(), size_bytes)
    pageable_nodes = page_nodes(pageable.data_ptr(), size_bytes)

    def timed(copy: Any) -> float:
        copy()  # warm-up: first use of a buffer pays for mappings
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            copy()
        end.record()
        end.synchronize()
        return size_bytes * iters / (start.elapsed_time(end) / 1e3) / 1e9

    gbps = {
        "h2d_pinned": timed(lambda: device_buf.copy_(pinned, non_blocking=True)),
        "d2h_pinned": timed(lambda: pinned.copy_(device_buf, non_blocking=True)),
        "h2d_pageable": timed(lambda: device_buf.copy_(pageable)),
        "d2h_pageable": timed(lambda: pageable.copy_(device_buf)),
    }
    return replace(
        result,
        size_bytes=size_bytes,
        iters=iters,
        gbps={k: round(v, 2) for k, v in gbps.items()},
        device=torch.cuda.get_device_name(dev),
        pinned_page_nodes=nodes,
        pageable_page_nodes=pageable_nodes,
    )


def worker_main(spec: str) -> int:
    """A worker: ``spec`` is :func:`worker_argv`'s JSON; writes a :class:`WorkerResult` to its ``out``."""
    job = json.loads(spec)
    out = Path(job.pop("out"))
    try:
        result = measure(**job)
    except Exception as e:  # reported by the parent as one line, with the worker's reason
        result = WorkerResult(label=job["label"], cuda=True, error=f"{type(e).__name__}: {e}")
    write_atomic(out, json.dumps(asdict(result)) + "\n")
    return 0


def worker_argv(*, label: str, out: str, size_bytes: int, iters: int) -> list[str]:
    """The worker's command: under ``numarun run`` (bound) for ``numarun``, plain python for ``raw``."""
    tail = ["--worker", json.dumps({"label": label, "out": out, "size_bytes": size_bytes, "iters": iters})]
    if label == "raw":
        return [sys.executable, "-m", "numarun.bench.h2d", *tail]
    from ..launch.child import numarun_command

    return numarun_command("run", "--nproc-per-node=1", "--standalone", "-m", "numarun.bench.h2d", *tail)


def ratios(bound: Mapping[str, float], raw: Mapping[str, float]) -> dict[str, float]:
    """pinned/pageable per direction (numarun worker) and numarun/raw per figure."""
    pinned = {
        f"{d}_pinned_over_pageable": round(bound[f"{d}_pinned"] / bound[f"{d}_pageable"], 3)
        for d in DIRECTIONS
        if bound.get(f"{d}_pageable")
    }
    return pinned | {
        f"{key}_numarun_over_raw": round(value / raw[key], 3) for key, value in bound.items() if raw.get(key)
    }


def format_table(bound: WorkerResult, raw: WorkerResult, *, color: bool = False) -> str:
    """The printed report: GB/s per direction, worker and memory kind, then the ratios."""
    columns = [(worker, kind) for worker in (bound, raw) for kind in ("pinned", "pageable")]
    out = tables.table([("GB/s", "left"), *((f"{w.label} {kind}", "right") for w, kind in columns)])
    for d in DIRECTIONS:
        cells = [w.gbps.get(f"{d}_{kind}") for w, kind in columns]
        out.add_row(d, *(f"{v:.2f}" if v is not None else "-" for v in cells))
    r = ratios(bound.gbps, raw.gbps)
    nodes = ",".join(map(str, bound.pinned_page_nodes)) or "?"
    pageable = ",".join(map(str, bound.pageable_page_nodes)) or "?"
    return tables.render(
        f"host<->device copies of {human_size(bound.size_bytes)} x {bound.iters} on {bound.device}",
        out,
        "ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()),
        f"numarun worker: memory policy {bound.mem_policy} nodes {list(bound.mems)}, "
        f"pinned pages on node(s) {nodes}, pageable pages on node(s) {pageable}",
        color=color,
    )


def _run_worker(label: str, *, size_bytes: int, iters: int, tmp: Path) -> WorkerResult:
    out = tmp / f"{label}.json"
    cmd = worker_argv(label=label, out=str(out), size_bytes=size_bytes, iters=iters)
    log.info("running: %s", " ".join(cmd))
    env = {envvars.LOG_LEVEL: "WARNING", **os.environ}  # the bootstrap's INFO line would repeat the report
    rc = subprocess.call(cmd, env=env)
    if not out.exists():
        return WorkerResult(label=label, cuda=True, error=f"worker exited with code {rc} without a result")
    return from_jsonable(WorkerResult, json.loads(out.read_text()))


def run_and_report(args: argparse.Namespace) -> int:
    size_bytes = parse_size(args.size)
    with tempfile.TemporaryDirectory(prefix="numarun-h2d.") as d:
        bound = _run_worker("numarun", size_bytes=size_bytes, iters=args.iters, tmp=Path(d))
        if not bound.cuda:
            print(f"numarun: bench h2d: {bound.error}: nothing measured", file=sys.stderr)
            return NO_CUDA_EXIT
        raw = _run_worker("raw", size_bytes=size_bytes, iters=args.iters, tmp=Path(d))
    for r in (bound, raw):
        if r.error:
            print(f"numarun: bench h2d: {r.label} worker failed: {r.error}", file=sys.stderr)
            return 1
    doc = {"numarun": asdict(bound), "raw": asdict(raw), "ratios": ratios(bound.gbps, raw.gbps)}
    text = json.dumps(doc, indent=1) + "\n"
    sys.stdout.write(text if args.json else format_table(bound, raw, color=sys.stdout.isatty()))
    sys.stdout.flush()
    if args.json_file:
        write_atomic(Path(args.json_file), text)
    return 0


if __name__ == "__main__":
    if "--worker" not in sys.argv[1:]:
        print("usage: numarun bench h2d [--size 1GiB] [--iters N] [--json] [--json-file FILE]", file=sys.stderr)
        sys.exit(2)
    sys.exit(worker_main(sys.argv[-1]))
