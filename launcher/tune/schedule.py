"""The order of runs: every round runs every candidate once, rotated by one each round, so
that a slow drift of the machine (another job starting, a warming page cache) falls on
every candidate alike and no candidate always runs first."""

from __future__ import annotations


def alternate(num_candidates: int, rounds: int) -> list[tuple[int, int]]:
    """(round, candidate index) pairs in run order."""
    order = []
    for r in range(rounds):
        for i in range(num_candidates):
            order.append((r, (i + r) % num_candidates))
    return order
