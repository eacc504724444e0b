"""Which pairs of nodes measure their link, and in which round (pure; the schedules and why: docs/scale.md).

In a round every node streams with at most one peer, so that a slow node slows only its own pair.
"""

from __future__ import annotations

import collections
import enum
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .compare import pair_figures

Pair = tuple[int, int]
Round = list[Pair]

FIRST_ROUNDS = 3
RETEST_ROUNDS = 3
MAX_ROUNDS = FIRST_ROUNDS + RETEST_ROUNDS
ALWAYS_FULL_BELOW = 16  # below it the retests always run: 3 slow nodes of 7 can hide in every first pair
_MATCH_BUDGET = 2_000_000  # pair visits per round; reached only when about half the nodes are suspects


class LinkSchedule(str, enum.Enum):
    """Which node pairs ``numarun doctor --nnodes`` measures (``--link-schedule``)."""

    AUTO = "auto"
    """``all-pairs`` up to 6 nodes, else ``bounded``."""
    BOUNDED = "bounded"
    """At most 6 rounds at any node count: 3 rounds of seeded random pairs, then re-tests of the suspects."""
    ALL_PAIRS = "all-pairs"
    """Every pair of nodes, n-1 rounds: finds every slow link."""


def pair(a: int, b: int) -> Pair:
    return (a, b) if a < b else (b, a)


def _circle(ids: Sequence[int], rounds: int | None = None) -> list[Round]:
    """Rounds of the circle method over ``ids`` (no pair twice); all of them by default."""
    ring = list(ids) + ([-1] if len(ids) % 2 else [])
    m = len(ring)
    out = []
    for _ in range(m - 1 if rounds is None else min(rounds, m - 1)):
        pairs = [pair(ring[i], ring[m - 1 - i]) for i in range(m // 2) if ring[i] >= 0 and ring[m - 1 - i] >= 0]
        out.append(sorted(pairs))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return out


def pairwise_schedule(n: int) -> list[Round]:
    """Rounds of disjoint pairs covering every pair once (circle method)."""
    return _circle(range(n))


def matching_rounds(n: int, *, rounds: int, seed: int) -> list[Round]:
    """``rounds`` rounds of disjoint pairs, no pair twice: the circle method over a shuffle of the ranks by ``seed``."""
    ids = list(range(n))
    random.Random(seed).shuffle(ids)
    return _circle(ids, rounds)


def resolve(schedule: LinkSchedule, n: int) -> LinkSchedule:
    """``auto`` -> the schedule it takes at ``n`` nodes."""
    if schedule is not LinkSchedule.AUTO:
        return schedule
    return LinkSchedule.ALL_PAIRS if all_pairs_rounds(n) <= MAX_ROUNDS else LinkSchedule.BOUNDED


def all_pairs_rounds(n: int) -> int:
    """Rounds of :func:`pairwise_schedule` at ``n`` nodes."""
    return 0 if n < 2 else n - 1 if n % 2 == 0 else n


def first_rounds(n: int, schedule: LinkSchedule, *, seed: int) -> list[Round]:
    if resolve(schedule, n) is LinkSchedule.ALL_PAIRS:
        return pairwise_schedule(n)
    return matching_rounds(n, rounds=FIRST_ROUNDS, seed=seed)


@dataclass(frozen=True)
class Doubts:
    """What the rounds so far leave in doubt (node 0's view, before the next round)."""

    known_good: frozenset[int]  # ends of a pair within min_fraction of the fastest
    suspects: tuple[int, ...]  # without a fast pair yet
    suspect_links: tuple[Pair, ...]  # slow pairs between known-good nodes, measured once so far


def doubts(
    n: int, directed: Mapping[tuple[int, int], float], rounds: Sequence[Sequence[Pair]], *, min_fraction: float
) -> Doubts:
    """Known-good nodes, suspects and suspect links after ``rounds``, judged against the fastest pair
    (docs/scale.md)."""
    pairs = pair_figures(directed)
    if not pairs:
        return Doubts(frozenset(), (), ())
    top = max(pairs.values())
    fast = {p for p, g in pairs.items() if g >= min_fraction * top}
    good = frozenset(x for p in fast for x in p)
    times = collections.Counter(pair(a, b) for rnd in rounds for a, b in rnd)
    links = tuple(
        sorted(
            (p for p in pairs if p not in fast and p[0] in good and p[1] in good and times[p] < 2),
            key=lambda p: (pairs[p], p),
        )
    )
    return Doubts(good, tuple(i for i in range(n) if i not in good), links)


def next_round(
    n: int,
    directed: Mapping[tuple[int, int], float],
    rounds: Sequence[Sequence[Pair]],
    *,
    min_fraction: float,
    seed: int,
) -> Round:
    """Node 0's next round of a ``bounded`` schedule after ``rounds`` (who meets whom: docs/scale.md); [] when nothing
    is in doubt or the bound is reached."""
    if len(rounds) >= MAX_ROUNDS or len(rounds) < FIRST_ROUNDS:
        return []
    d = doubts(n, directed, rounds, min_fraction=min_fraction)
    met = {pair(a, b) for rnd in rounds for a, b in rnd}
    peers = collections.Counter(x for p in met for x in p)
    # nodes that sat out a first round (odd n) and so met fewer peers than the others
    thin = [x for x in range(n) if peers[x] < min(FIRST_ROUNDS, n - 1) and x not in set(d.suspects)]
    if not d.suspects and not d.suspect_links and not thin and n >= ALWAYS_FULL_BELOW:
        return []
    rng = random.Random(seed * 1_000_003 + len(rounds))
    busy: set[int] = set()
    out: list[Pair] = []
    for a, b in d.suspect_links:
        if a not in busy and b not in busy:
            out.append((a, b))
            busy.update((a, b))
    free_good = [g for g in sorted(d.known_good) if g not in busy]
    # known-good partners go first to the suspects that have met the fewest known-good nodes
    good_met = collections.Counter(x for a, b in met for x, y in ((a, b), (b, a)) if y in d.known_good)
    order = sorted(d.suspects, key=lambda x: (good_met[x], rng.random()))
    for s, g in _match(order, free_good, met, rng).items():
        out.append(pair(s, g))
        busy.update((s, g))
    # suspects left over meet each other (two healthy ones clear both), then the thin nodes, then everyone else
    out += _pair_up([s for s in d.suspects if s not in busy], met, rng, busy)
    thin = [x for x in thin if x not in busy]
    thin_set = set(thin)
    for x, g in _match(thin, [g for g in free_good if g not in busy and g not in thin_set], met, rng).items():
        out.append(pair(x, g))
        busy.update((x, g))
    out += _pair_up([i for i in range(n) if i not in busy], met, rng, busy)
    return sorted(out)


def _pair_up(nodes: list[int], met: Collection[Pair], rng: random.Random, busy: set[int]) -> list[Pair]:
    """Pairs among ``nodes`` not in ``met`` (greedy, random order); adds their ends to ``busy``."""
    rest = list(nodes)
    rng.shuffle(rest)
    out: list[Pair] = []
    waiting: list[int] = []
    for x in rest:
        for i, y in enumerate(waiting):
            if pair(x, y) not in met:
                out.append(pair(x, y))
                busy.update((x, y))
                del waiting[i]
                break
        else:
            waiting.append(x)
            if len(waiting) > 8:  # enough choice: the oldest waits out this round
                waiting.pop(0)
    return out


def _match(
    left: Sequence[int], right: Sequence[int], forbidden: Collection[Pair], rng: random.Random
) -> dict[int, int]:
    """A maximum matching of ``left`` to ``right`` avoiding ``forbidden``, within a budget: greedy, then augmenting
    paths."""
    if not left or not right:
        return {}
    order = list(right)
    rng.shuffle(order)
    start = {s: rng.randrange(len(order)) for s in left}

    def candidates(s: int) -> Iterable[int]:
        k = start[s]
        for g in (*order[k:], *order[:k]):
            if pair(s, g) not in forbidden:
                yield g

    owner: dict[int, int] = {}
    mate: dict[int, int] = {}
    for s in left:
        g = next((g for g in candidates(s) if g not in owner), None)
        if g is not None:
            owner[g], mate[s] = s, g
    budget = _MATCH_BUDGET
    for s in left:
        if s in mate or budget <= 0:
            continue
        # breadth-first search of an alternating path from s to a free right node
        parent: dict[int, tuple[int, int | None]] = {}  # right node -> (left node, that left node's right node)
        frontier: list[tuple[int, int | None]] = [(s, None)]
        found: int | None = None
        while frontier and found is None and budget > 0:
            nxt: list[tuple[int, int | None]] = []
            for u, via in frontier:
                for g in candidates(u):
                    budget -= 1
                    if g in parent:
                        continue
                    parent[g] = (u, via)
                    if g not in owner:
                        found = g
                        break
                    nxt.append((owner[g], g))
                if found is not None:
                    break
            frontier = nxt
        while found is not None:  # flip the path's pairs
            u, via = parent[found]
            owner[found], mate[u] = u, found
            found = via
    return mate
