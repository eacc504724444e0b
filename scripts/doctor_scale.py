#!/usr/bin/env python3
"""The doctor's link schedule and verdict at any node count, on synthetic link figures.

Drives the product's own code in the order a real run takes it (``numarun.doctor.multinode``):
:func:`~numarun.doctor.schedule.first_rounds`, then node 0's
:func:`~numarun.doctor.schedule.next_round` one round at a time while it returns one, then
:func:`~numarun.doctor.multinode.judge` over one report per node. Only the streams are
synthetic: a healthy pair measures the fabric's figure less up to ``--noise`` (each direction,
each measurement drawn anew), a pair with a slow node or on a slow link ``--slow-fraction`` of
it; a receiver keeps its best figure per sender, as the stream server does.

    python scripts/doctor_scale.py --nodes 1024 --slow-nodes 2 --slow-links 1 --seed 7 --json
    python scripts/doctor_scale.py --grid            # N in 2..4096, 0-3 slow nodes, 0-2 slow links, 100 seeds

A draw is *decidable* when link figures can tell its faults apart at all: fewer than half the
nodes slow (else the median is a slow figure and "slow" means nothing), and every healthy
node has a healthy peer over a good link (else even all pairs cannot tell it from a slow
node). Undecidable draws are counted apart in the grid, with what the verdict did on them.

``est_seconds`` = rounds x (2 x ``--link-seconds`` + ``--round-overhead``) + nodes x
``--store-per-node``: the defaults are this machine's figures (docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from numarun.doctor.model import NodeReport
from numarun.doctor.multinode import judge
from numarun.doctor.schedule import LinkSchedule, doubts, first_rounds, next_round, pair, resolve

GRID_NODES = (2, 3, 5, 8, 64, 1024, 4096)
GRID_SLOW_NODES = (0, 1, 2, 3)
GRID_SLOW_LINKS = (0, 1, 2)
LINK_SECONDS = 0.5
"""Each direction of a pair streams this long (``numarun doctor``'s default)."""
ROUND_OVERHEAD_S = 0.3
"""Per round beyond the streams: two connections, the ready/sent keys, a throttled receiver's
drain (six namespace nodes here: 7.5-8.2 s from the store to the verdict for 6 rounds)."""
STORE_PER_NODE_S = 0.004
"""Store time per node for the whole exchange: scripts/bench_store_gather.py, 256 nodes as
threads of one process on two cores, 0.97 s (client CPU included, so an upper bound)."""


class BadInput(ValueError):
    pass


def draw_faults(
    nodes: int, slow_nodes: int, slow_links: int, rng: random.Random
) -> tuple[list[int], set[tuple[int, int]]]:
    """``slow_nodes`` random nodes, and ``slow_links`` random pairs of healthy nodes."""
    if nodes < 2:
        raise BadInput(f"bad --nodes {nodes}: expected at least 2")
    if not 0 <= slow_nodes <= nodes:
        raise BadInput(f"bad --slow-nodes {slow_nodes}: expected 0..{nodes}")
    slow = sorted(rng.sample(range(nodes), slow_nodes))
    healthy = sorted(set(range(nodes)) - set(slow))
    most = len(healthy) * (len(healthy) - 1) // 2
    if not 0 <= slow_links <= most:
        raise BadInput(
            f"bad --slow-links {slow_links}: expected 0..{most} (pairs of healthy nodes at "
            f"--nodes {nodes} --slow-nodes {slow_nodes})"
        )
    links: set[tuple[int, int]] = set()
    while len(links) < slow_links:
        a, b = rng.sample(healthy, 2)
        links.add(pair(a, b))
    return slow, links


def decidable(nodes: int, slow: Sequence[int], links: Iterable[tuple[int, int]]) -> bool:
    """Whether link figures can tell these faults apart under any schedule (module docstring)."""
    if 2 * len(slow) >= nodes:
        return False
    healthy = nodes - len(slow)
    degree: dict[int, int] = {}
    for a, b in links:
        degree[a] = degree.get(a, 0) + 1
        degree[b] = degree.get(b, 0) + 1
    return all(healthy - 1 - degree.get(i, 0) >= 1 for i in range(nodes) if i not in set(slow))


def simulate(
    *,
    nodes: int,
    slow_nodes: int,
    slow_links: int,
    seed: int,
    schedule: str = "auto",
    slow_fraction: float = 0.25,
    noise: float = 0.1,
    min_fraction: float = 0.5,
    link_seconds: float = LINK_SECONDS,
    round_overhead: float = ROUND_OVERHEAD_S,
    store_per_node: float = STORE_PER_NODE_S,
) -> dict[str, Any]:
    rng = random.Random(seed)
    slow, links = draw_faults(nodes, slow_nodes, slow_links, rng)
    slow_set = set(slow)
    received: list[dict[int, float]] = [{} for _ in range(nodes)]
    measured: set[tuple[int, int]] = set()

    def run(rounds: Iterable[Iterable[tuple[int, int]]]) -> None:
        for rnd in rounds:
            ends = [x for p in rnd for x in p]
            assert len(ends) == len(set(ends)), "a node in two pairs of one round"
            for a, b in rnd:
                measured.add(pair(a, b))
                factor = slow_fraction if a in slow_set or b in slow_set or pair(a, b) in links else 1.0
                for src, dst in ((a, b), (b, a)):
                    gbs = factor * rng.uniform(1.0 - noise, 1.0)
                    received[dst][src] = max(gbs, received[dst].get(src, 0.0))

    def directed() -> dict[tuple[int, int], float]:
        return {(s, r): g for r, got in enumerate(received) for s, g in got.items()}

    kind = resolve(LinkSchedule(schedule), nodes)
    schedule_seed = rng.randrange(1 << 31)  # node 0 draws it in a real run
    done = first_rounds(nodes, kind, seed=schedule_seed)
    run(done)
    first_doubts = doubts(nodes, directed(), done, min_fraction=min_fraction)
    while kind is LinkSchedule.BOUNDED:
        nxt = next_round(nodes, directed(), done, min_fraction=min_fraction, seed=schedule_seed)
        if not nxt:
            break
        run([nxt])
        done.append(nxt)
    rounds = len(done)
    reports = [
        NodeReport(i, f"node{i}", (), {}, {"recv_gbs": {str(s): g for s, g in got.items()}})
        for i, got in enumerate(received)
    ]
    verdict = judge(
        reports, min_link_fraction=min_fraction, schedule={"name": kind.value, "seed": schedule_seed, "rounds": rounds}
    )
    flagged = set(verdict["slow_nodes"])
    flagged_links = {pair(a, b) for a, b, _ in verdict["slow_links"]}
    return {
        "nodes": nodes,
        "rounds": rounds,
        "est_seconds": round(rounds * (2 * link_seconds + round_overhead) + nodes * store_per_node, 2),
        "slow_true": slow,
        "flagged": sorted(flagged),
        "missed": len(slow_set - flagged),
        "false_positives": len(flagged - slow_set),
        "slow_links_measured": len(links & measured),
        "slow_links_flagged": len(links & flagged_links),
        # beyond the required keys
        "slow_links_true": sorted(links),
        "false_links": len(flagged_links - links),
        "decidable": decidable(nodes, slow, links),
        "schedule": kind.value,
        "suspects_after_first_rounds": list(first_doubts.suspects),
        "min_peers": min(n["figures"]["link_peers"] for n in verdict["nodes"]),
        "pairs_measured": len(measured),
    }


def grid(
    *,
    nodes: Sequence[int] = GRID_NODES,
    slow_nodes: Sequence[int] = GRID_SLOW_NODES,
    slow_links: Sequence[int] = GRID_SLOW_LINKS,
    seeds: int = 100,
    **options: Any,
) -> list[dict[str, Any]]:
    """One row per node count: totals over every (slow nodes, slow links, seed) that can be drawn."""
    return list(grid_rows(nodes=nodes, slow_nodes=slow_nodes, slow_links=slow_links, seeds=seeds, **options))


def grid_rows(
    *, nodes: Sequence[int], slow_nodes: Sequence[int], slow_links: Sequence[int], seeds: int, **options: Any
) -> Iterator[dict[str, Any]]:
    for n in nodes:
        row: dict[str, Any] = {
            "nodes": n,
            "draws": 0,
            "undecidable": 0,
            "missed": 0,
            "false_positives": 0,
            "false_links": 0,
            "slow_links_measured": 0,
            "slow_links_flagged": 0,
            "max_rounds": 0,
            "max_est_seconds": 0.0,
            "min_peers": None,
            "undecidable_wrong": 0,
            "failures": [],
        }
        for k in slow_nodes:
            for m in slow_links:
                for seed in range(seeds):
                    try:
                        r = simulate(nodes=n, slow_nodes=k, slow_links=m, seed=seed, **options)
                    except BadInput:
                        break  # no such draw at this size (too few healthy pairs for the links)
                    row["max_rounds"] = max(row["max_rounds"], r["rounds"])
                    row["max_est_seconds"] = max(row["max_est_seconds"], r["est_seconds"])
                    if not r["decidable"]:
                        row["undecidable"] += 1
                        row["undecidable_wrong"] += bool(r["missed"] or r["false_positives"] or r["false_links"])
                        continue
                    row["draws"] += 1
                    for key in (
                        "missed",
                        "false_positives",
                        "false_links",
                        "slow_links_measured",
                        "slow_links_flagged",
                    ):
                        row[key] += r[key]
                    row["min_peers"] = (
                        r["min_peers"] if row["min_peers"] is None else min(row["min_peers"], r["min_peers"])
                    )
                    if (
                        r["missed"]
                        or r["false_positives"]
                        or r["false_links"]
                        or r["slow_links_flagged"] != r["slow_links_measured"]
                    ):
                        row["failures"].append({"slow_nodes": k, "slow_links": m, "seed": seed})
        yield row


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad list {text!r}: expected integers separated by commas such as '8,64'"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--slow-nodes", type=int, default=0)
    ap.add_argument("--slow-links", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--schedule", choices=[s.value for s in LinkSchedule], default="auto")
    ap.add_argument("--slow-fraction", type=float, default=0.25, help="a slow pair's share of the fabric's figure")
    ap.add_argument(
        "--noise", type=float, default=0.1, help="a healthy pair measures up to this share below the figure"
    )
    ap.add_argument("--min-link-fraction", type=float, default=0.5)
    ap.add_argument("--link-seconds", type=float, default=LINK_SECONDS)
    ap.add_argument("--round-overhead", type=float, default=ROUND_OVERHEAD_S, metavar="SECONDS")
    ap.add_argument("--store-per-node", type=float, default=STORE_PER_NODE_S, metavar="SECONDS")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--grid", action="store_true", help="run the whole grid and print a row per node count")
    ap.add_argument("--grid-nodes", type=_ints, default=list(GRID_NODES))
    ap.add_argument("--grid-seeds", type=int, default=100)
    args = ap.parse_args(argv)
    options = dict(
        schedule=args.schedule,
        slow_fraction=args.slow_fraction,
        noise=args.noise,
        min_fraction=args.min_link_fraction,
        link_seconds=args.link_seconds,
        round_overhead=args.round_overhead,
        store_per_node=args.store_per_node,
    )
    if args.grid:
        cols = (
            "nodes",
            "draws",
            "missed",
            "false_positives",
            "false_links",
            "slow_links_measured",
            "slow_links_flagged",
            "max_rounds",
            "max_est_seconds",
            "min_peers",
            "undecidable",
            "undecidable_wrong",
        )
        if not args.json:
            print(" ".join(f"{c:>12}" for c in cols), flush=True)
        rows = []
        for row in grid_rows(
            nodes=args.grid_nodes,
            slow_nodes=GRID_SLOW_NODES,
            slow_links=GRID_SLOW_LINKS,
            seeds=args.grid_seeds,
            **options,
        ):
            rows.append(row)
            if not args.json:
                print(" ".join(f"{row[c]!s:>12}" for c in cols), flush=True)
                for f in row["failures"][:5]:
                    print(f"  failure: {f}", flush=True)
        if args.json:
            print(json.dumps(rows))
        return 1 if any(r["failures"] for r in rows) else 0
    try:
        result = simulate(
            nodes=args.nodes, slow_nodes=args.slow_nodes, slow_links=args.slow_links, seed=args.seed, **options
        )
    except BadInput as e:
        print(f"doctor_scale.py: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
