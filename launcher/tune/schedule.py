"""The order of runs: every round runs every candidate once, rotated by one, so that drift falls on all alike."""

from __future__ import annotations


def alternate(num_candidates: int, rounds: int) -> list[tuple[int, int]]:
    """(round, candidate index) pairs in run order."""
    return [(r, (i + r) % num_candidates) for r in range(rounds) for i in range(num_candidates)]
