"""Node 0's comparison of the node reports, and the slow-node verdict. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

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
        # the majority value is taken as intended; the others are named
        ranked = sorted(values.items(), key=lambda kv: (-len(kv[1]), kv[1]))
        common, _ = ranked[0]
        for value, ranks in ranked[1:]:
            out.append((Finding(
                Severity.ERROR if key in ("gpu_count", "gpu_models", "compute_nics") else Severity.WARN,
                "node-mismatch", "nodes " + ",".join(map(str, ranks)),
                f"{key} is {value} on node rank(s) {','.join(map(str, ranks))} but {common} on the others: "
                "a job across them runs at the slowest node's pace or fails to build its groups",
            ), ranks))
    return out


def pairwise_schedule(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair once (circle method), so that in each
    round every node talks to at most one peer and one slow node cannot slow the others'
    measurements."""
    ids = list(range(n)) + ([-1] if n % 2 else [])
    m = len(ids)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = ids[i], ids[m - 1 - i]
            if a >= 0 and b >= 0:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ids = [ids[0]] + [ids[-1]] + ids[1:-1]
    return rounds


def node_link_figures(directed: Mapping[tuple[int, int], float], n: int) -> dict[int, float]:
    """Per node: the best pair bandwidth it reached, a pair counting its slower direction.

    A slow node (or its link) is slow to every peer; a healthy node has at least one fast
    peer, so its best pair stays high even when its pair with the slow node is not.
    """
    best: dict[int, float] = {i: 0.0 for i in range(n)}
    for a in range(n):
        for b in range(a + 1, n):
            ab, ba = directed.get((a, b)), directed.get((b, a))
            if ab is None or ba is None:
                continue
            pair = min(ab, ba)
            best[a] = max(best[a], pair)
            best[b] = max(best[b], pair)
    return best


def slow_nodes(figures: Mapping[int, float], min_fraction: float) -> list[int]:
    """Node ranks whose figure is below ``min_fraction`` of the median figure."""
    if len(figures) < 3:
        return []  # with two nodes a slow link cannot be told from a slow node
    median = statistics.median(figures.values())
    return sorted(r for r, v in figures.items() if v < min_fraction * median)
