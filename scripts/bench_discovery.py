#!/usr/bin/env python3
"""Time topology discovery: the largest recorded sysfs trees, the largest hwloc XML, and this
machine (sysfs + NVML when present). Prints the median and minimum of N runs per source.

    .venv/bin/python scripts/bench_discovery.py [--runs 20]

The recorded trees are extracted once into ``$TMPDIR/numarun-fixture-trees`` (outside the
checkout: their symlink cycles would trap setuptools' walk of the project).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from numarun.topology.archive import extract_tree  # noqa: E402
from numarun.topology.discover import load_topology  # noqa: E402
from numarun.topology.model import Topology  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
CACHE = Path(tempfile.gettempdir()) / "numarun-fixture-trees"


def _members(tarball: Path) -> int:
    with tarfile.open(tarball) as tf:
        return sum(1 for _ in tf)


def _extract(tarball: Path) -> Path:
    """Extract once into the cache and return the tree's root."""
    return extract_tree(tarball, CACHE)


def _time(fn: Callable[[], Topology], runs: int) -> tuple[list[float], Topology]:
    topo = fn()  # warm the page cache and imports
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        topo = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times, topo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="timed runs per source (default 20)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"bad --runs {args.runs!r}: expected a positive integer")

    tarballs = sorted(FIXTURES.glob("hwloc-linux-sysfs/*.tar.bz2")) + [FIXTURES / "live-h200-vm" / "sysfs.tar.gz"]
    largest_tree = max(tarballs, key=_members)
    xmls = sorted(FIXTURES.glob("hwloc/*.xml"))
    largest_xml = max(xmls, key=lambda p: p.stat().st_size)
    most_cpus = max(tarballs, key=lambda t: len(load_topology(str(_extract(t))).cpus))
    sources: list[tuple[str, str | None]] = [
        (f"tree {largest_tree.name} ({_members(largest_tree)} files)", str(_extract(largest_tree))),
        (f"tree {most_cpus.name} (most CPUs)", str(_extract(most_cpus))),
        (f"hwloc {largest_xml.name} ({largest_xml.stat().st_size // 1024} KiB)", str(largest_xml)),
        ("live machine", None),
    ]
    rows = []
    for label, src in sources:
        times, topo = _time(lambda src=src: load_topology(src), args.runs)
        rows.append(
            (
                label,
                len(topo.numa_nodes),
                len(topo.cpus),
                len(topo.gpus),
                topo.gpu_source,
                statistics.median(times),
                min(times),
            )
        )
    head = ("source", "nodes", "cpus", "gpus", "gpu src", "median ms", "min ms")
    w0 = max(len(head[0]), *(len(r[0]) for r in rows))
    print(f"{head[0]:<{w0}}  {head[1]:>5}  {head[2]:>5}  {head[3]:>4}  {head[4]:<7}  {head[5]:>9}  {head[6]:>7}")
    for r in rows:
        print(f"{r[0]:<{w0}}  {r[1]:>5}  {r[2]:>5}  {r[3]:>4}  {r[4]:<7}  {r[5]:>9.2f}  {r[6]:>7.2f}")
    print(f"({args.runs} runs each, after one warm-up run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
