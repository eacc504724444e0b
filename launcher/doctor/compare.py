"""Node 0's comparison of the node reports, and the verdict on slow nodes and slow links. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .model import Finding, NodeReport, Severity

COMPARED_FACTS = ("gpu_count", "gpu_models", "compute_nics", "driver", "cuda", "nccl", "torch")


def compare_nodes(reports: Sequence[NodeReport]) -> list[Finding]:
    """A finding per fact on which the nodes disagree, naming the odd nodes out."""
    return [f for f, _ in _mismatches(reports)]


def odd_nodes(reports: Sequence[NodeReport]) -> set[int]:
    """Node ranks outside the majority on a fact that breaks a job (GPU count/model, NICs)."""
    return {r for f, ranks in _mismatches(reports) if f.severity is Severity.ERROR for r in ranks}


def _mismatches(reports: Sequence[NodeReport]) -> list[tuple[Finding, list[int]]]:
    out = []
    for key in COMPARED_FACTS:
        values: dict[str, list[int]] = {}
        for r in reports:
            if key in r.facts:
                values.setdefault(repr(r.facts[key]), []).append(r.node_rank)
        if len(values) <= 1:
            continue
        # the majority value is taken as intended
        ranked = sorted(values.items(), key=lambda kv: (-len(kv[1]), kv[1]))
        common, _ = ranked[0]
        for value, ranks in ranked[1:]:
            out.append(
                (
                    Finding(
                        Severity.ERROR if key in ("gpu_count", "gpu_models", "compute_nics") else Severity.WARN,
                        "node-mismatch",
                        "nodes " + ",".join(map(str, ranks)),
                        f"{key} is {value} on node rank(s) {','.join(map(str, ranks))} but {common} on the others: "
                        "a job across them runs at the slowest node's pace or fails to build its groups",
                    ),
                    ranks,
                )
            )
    return out


def pair_figures(directed: Mapping[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """Per pair measured both ways (low rank first): its slower direction."""
    return {(a, b): min(ab, directed[(b, a)]) for (a, b), ab in directed.items() if a < b and (b, a) in directed}


def node_link_figures(directed: Mapping[tuple[int, int], float], n: int) -> dict[int, float]:
    """Per node: the best pair bandwidth it reached (a slow node is slow to every peer, a healthy one fast to some)."""
    best: dict[int, float] = {i: 0.0 for i in range(n)}
    for (a, b), gbs in pair_figures(directed).items():
        best[a] = max(best[a], gbs)
        best[b] = max(best[b], gbs)
    return best


def slow_nodes(figures: Mapping[int, float], min_fraction: float) -> list[int]:
    """Node ranks whose figure is below ``min_fraction`` of the median figure."""
    if len(figures) < 3:
        return []  # with two nodes a slow link cannot be told from a slow node
    median = statistics.median(figures.values())
    return sorted(r for r, v in figures.items() if v < min_fraction * median)


@dataclass(frozen=True)
class LinkVerdict:
    """What the measured pairs say about the nodes and the links between them."""

    pairs: dict[tuple[int, int], float]  # low rank first -> GB/s of the slower direction
    node_gbs: dict[int, float]  # per node, its best pair
    peers: dict[int, int]  # per node, distinct peers measured
    median_gbs: float  # of the nodes' best pairs
    slow_nodes: tuple[int, ...]
    slow_links: tuple[tuple[int, int, float], ...]  # (a, b, GB/s), neither end a slow node


def link_verdict(directed: Mapping[tuple[int, int], float], n: int, min_fraction: float) -> LinkVerdict:
    """The slow nodes and slow links from directed figures ``{(sender, receiver): GB/s}`` (rules: docs/scale.md);
    nothing is judged below three nodes, where links alone cannot tell a slow node from a slow link."""
    pairs = pair_figures(directed)
    best = node_link_figures(directed, n)
    peers = {i: 0 for i in range(n)}
    for a, b in pairs:
        peers[a] += 1
        peers[b] += 1
    median = statistics.median(best.values()) if best else 0.0
    slow = tuple(slow_nodes(best, min_fraction))
    links: tuple[tuple[int, int, float], ...] = ()
    if n >= 3:
        slow_set = set(slow)
        links = tuple(
            (a, b, gbs)
            for (a, b), gbs in sorted(pairs.items())
            if gbs < min_fraction * median and a not in slow_set and b not in slow_set
        )
    return LinkVerdict(pairs, best, peers, median, slow, links)
