#!/usr/bin/env python3
"""Expanding a 10,000-node Slurm host list with ``numarun.jobenv.hostlist.expand_hostlist``
(what every node of a job does with ``SLURM_JOB_NODELIST`` to find the node order).

Four spellings of 10,000 hosts: one range, a range with a hole every 50 nodes (as Slurm
compresses an allocation with drained nodes), racks x nodes (two bracket groups), and every
name spelt out (no compression at all). Prints the median of repeated expansions of each.

Usage: .venv/bin/python scripts/bench_hostlist.py [--nodes 10000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

from numarun.jobenv.hostlist import expand_hostlist


def spellings(nodes: int) -> dict[str, str]:
    width = len(str(nodes * 2))
    ranges, start, got, i = [], 1, 0, 1
    while got < nodes:  # runs of 49 hosts, one left out after each
        run = min(49, nodes - got)
        ranges.append(f"{start:0{width}d}-{start + run - 1:0{width}d}")
        got += run
        start += run + 1
        i += 1
    racks = max(1, nodes // 250)
    return {
        "one range": f"gpu[{1:0{width}d}-{nodes:0{width}d}]",
        "range with holes": f"gpu[{','.join(ranges)}]",
        "racks x nodes": f"r[{1:02d}-{racks:02d}]n[001-{nodes // racks:03d}]",
        "every name spelt out": ",".join(f"gpu{i:0{width}d}" for i in range(1, nodes + 1)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    for name, text in spellings(args.nodes).items():
        hosts = expand_hostlist(text)  # warm-up, and the count is checked
        assert len(hosts) == args.nodes and len(set(hosts)) == args.nodes, (name, len(hosts))
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            expand_hostlist(text)
            times.append(time.perf_counter() - t0)
        print(
            f"expand_hostlist {name:<21} {len(text):6d} chars -> {len(hosts)} hosts: median "
            f"{statistics.median(times) * 1e3:7.2f} ms (min {min(times) * 1e3:.2f} ms, {args.repeat} runs)"
        )


if __name__ == "__main__":
    main()
