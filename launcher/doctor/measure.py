"""Bounded bandwidth measurements of one node, in a child process (the launcher must not initialise CUDA or rebind).

Prints ``mem_bw_gbs`` ``{"<numa node>": GB/s}`` (a numpy copy bound to the node, best within :data:`MEM_SECONDS`;
memory-only nodes read from the first CPU node) and ``h2d_gbs`` / ``d2h_gbs`` ``{"<pci bus id>": GB/s}`` (pinned, per
GPU).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

MEM_BYTES = 64 << 20
MEM_SECONDS = 0.25
H2D_BYTES = 256 << 20
H2D_SECONDS = 0.5


def _best(seconds: float, nbytes: int, copy: Callable[[], object], wait: Callable[[], object] = lambda: None) -> float:
    """GB/s of the fastest of ``copy()`` of ``nbytes`` (done once ``wait()`` returns), repeated for ``seconds``."""
    best, end = 0.0, time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        copy()
        wait()
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
        if time.perf_counter() > end:
            return best


def mem_bandwidth(node: int, cpus: set[int] | None) -> float:
    import numpy as np

    from ..worker import affinity

    old_cpus = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    with contextlib.suppress(OSError):  # no NUMA syscalls here (container): the figure is for wherever the pages land
        affinity.set_mempolicy(affinity.Mpol.BIND, [node])
    try:
        src = np.ones(MEM_BYTES // 8, dtype=np.float64)
        dst = np.zeros_like(src)  # written here: its pages are placed before the timing
        return _best(MEM_SECONDS, 2 * src.nbytes, functools.partial(np.copyto, dst, src))  # read and written once
    finally:
        with contextlib.suppress(OSError):
            affinity.set_mempolicy(affinity.Mpol.DEFAULT)
        os.sched_setaffinity(0, old_cpus)


def h2d_bandwidth() -> tuple[dict[str, float], dict[str, float]]:
    import torch

    if not torch.cuda.is_available():
        return {}, {}
    h2d: dict[str, float] = {}
    d2h: dict[str, float] = {}
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        # the properties carry the PCI location from torch 2.x on; -1 when they do not
        dom, bus_no, dev_no = (getattr(p, k, -1) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        bus = f"{dom:04x}:{bus_no:02x}:{dev_no:02x}.0" if bus_no >= 0 else f"cuda:{i}"
        host = torch.empty(H2D_BYTES, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(H2D_BYTES, dtype=torch.uint8, device=f"cuda:{i}")
        sync = functools.partial(torch.cuda.synchronize, i)
        for dst, src, out in ((dev, host, h2d), (host, dev, d2h)):
            sync()
            out[bus] = round(
                _best(H2D_SECONDS, H2D_BYTES, functools.partial(dst.copy_, src, non_blocking=True), sync), 2
            )
        del host, dev
    return h2d, d2h


def measure(nodes: dict[int, set[int]]) -> dict[str, Any]:
    first = next((c for c in nodes.values() if c), set())  # a memory-only node is read from the first CPU node
    allowed = os.sched_getaffinity(0)
    mem = {str(n): round(mem_bandwidth(n, (cpus or first) & allowed or None), 2) for n, cpus in sorted(nodes.items())}
    h2d, d2h = h2d_bandwidth()
    return {"mem_bw_gbs": mem, "h2d_gbs": h2d, "d2h_gbs": d2h}


def main(argv: list[str]) -> int:
    """``argv[0]``: JSON ``{"<node>": [cpus]}``; prints one JSON object of figures."""
    spec = json.loads(argv[0]) if argv else {}
    nodes = {int(k): set(v) for k, v in spec.items()}
    print(json.dumps(measure(nodes)))
    return 0
