"""Who holds the job back: the ranks' recent steps compared (pure).

In a synchronous job every rank's step takes the same wall time: the slow rank sets the pace and the others wait for
it, in a collective (``comm``: Python's collectives, their waits, and DDP's gradient all-reduce inside backward as
the rank's recorder counts it, :mod:`numarun.worker.phases`). So a rank's *own* time in a step is its step less its
``comm``, and the rank the others wait for is the one whose own time is longest: it waits least.

Over a window of the latest steps that every rank recorded (at most :data:`WINDOW`, the first step left out: it holds
the rank's start), per rank the median of its own time; the slowest rank's *lost time* is its median less the median
of the others' medians: how much shorter the job's step would be if that rank kept the others' (median) pace. The
verdict names it only when

* at least :data:`MIN_STEPS` steps are in the window,
* the lost time is at least :data:`NAME_SHARE` of the step (the median step of the ranks), and
* step by step it is behind (its own time above the others' median) so often that chance would do it with a
  probability of at most :data:`CHANCE` (a sign test: the one-sided binomial tail at 1/2, times the ranks, for the
  slowest is picked from all of them).

Medians and the sign test make it robust: a host loaded several times over makes each rank slow now and then by
much, never step after step (tests/launch/test_steps_judge.py judges balanced jobs with ±60 % noise on every step). The
phase the time is lost in is the phase whose median exceeds the others' most.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...worker.steps import PHASES

WINDOW = 64
MIN_STEPS = 12
"""The fewest steps in which the sign test can name a rank (12 of 12 behind: 1/4096)."""
NAME_SHARE = 0.10
CHANCE = 0.001
OWN_PHASES = ("input", "compute", "optim")
"""The phases a rank spends on its own; ``comm`` is where it waits for the others."""


@dataclass(frozen=True)
class Point:
    """One step of one rank, as judged: seconds."""

    step: int
    wall: float
    input: float
    compute: float
    comm: float
    optim: float

    @property
    def own(self) -> float:
        return max(0.0, self.wall - self.comm)

    def phase(self, name: str) -> float:
        return float(getattr(self, name))

    def row(self) -> list[float]:
        """As sent through the store: ``[step, wall, input, compute, comm, optim]``."""
        return [self.step, *(round(self.phase(p), 6) for p in ("wall", *PHASES))]

    @staticmethod
    def of_row(row: Sequence[float]) -> Point:
        return Point(int(row[0]), *(float(x) for x in row[1:6]))


@dataclass(frozen=True)
class Judgement:
    """The verdict on one window of the job's steps."""

    steps: int
    """Steps in the window (every rank recorded each)."""
    ranks: int
    step_s: float
    """The median step: the median over ranks of each rank's median step time; 0 without steps."""
    phases: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per rank, the median seconds of each phase over the window."""
    own: dict[int, float] = field(default_factory=dict)
    """Per rank, the median of its own time (its step less its comm)."""
    slowest: int | None = None
    lost_s: float = 0.0
    """The slowest rank's own time less the others' median: what the job would gain per step."""
    behind: float = 0.0
    """The share of the window's steps in which its own time was above the others' median."""
    chance: float = 1.0
    """How likely a rank no slower than the others is behind as often (the sign test's tail, times the ranks)."""
    culprit: int | None = None
    """The rank named as holding the job back; None: none is."""
    phase: str | None = None
    """The culprit's phase furthest above the others' median (``input``, ``compute`` or ``optim``)."""
    excess: dict[str, float] = field(default_factory=dict)
    """The slowest rank's seconds per step above the others' median, per phase."""
    reason: str = ""
    """Why no rank is named (``too few steps``...), '' when one is."""

    @property
    def share(self) -> float:
        return self.lost_s / self.step_s if self.step_s > 0 else 0.0


def window(points: Mapping[int, Sequence[Point]], size: int = WINDOW) -> dict[int, list[Point]]:
    """Each rank's points of the latest ``size`` steps every rank recorded (step 1 left out)."""
    if not points:
        return {}
    common = set.intersection(*({p.step for p in pts} for pts in points.values()))
    common.discard(1)
    keep = set(sorted(common)[-size:])
    return {r: sorted((p for p in pts if p.step in keep), key=lambda p: p.step) for r, pts in points.items()}


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def judge(
    points: Mapping[int, Sequence[Point]],
    *,
    size: int = WINDOW,
    min_steps: int = MIN_STEPS,
    name_share: float = NAME_SHARE,
) -> Judgement:
    """The verdict on the latest window of ``points`` (rank -> its recent steps; see the module docstring)."""
    win = window(points, size)
    steps = len(next(iter(win.values()), []))
    if steps == 0:
        return Judgement(0, len(points), 0.0, reason="no step recorded by every rank yet")
    phases = {r: {ph: _median([p.phase(ph) for p in pts]) for ph in PHASES} for r, pts in win.items()}
    own = {r: _median([p.own for p in pts]) for r, pts in win.items()}
    step_s = _median([_median([p.wall for p in pts]) for pts in win.values()])
    base = Judgement(steps, len(win), step_s, phases, own)
    if len(win) < 2:
        return _with(base, reason="one rank: nothing to compare")
    slowest = max(own, key=lambda r: own[r])
    others = [r for r in own if r != slowest]
    lost = own[slowest] - _median([own[r] for r in others])
    by_step = list(zip(*(win[r] for r in sorted(win)), strict=True))
    at = sorted(win).index(slowest)
    behind = sum(1 for row in by_step if row[at].own > _median([p.own for i, p in enumerate(row) if i != at]))
    excess = {ph: phases[slowest][ph] - _median([phases[r][ph] for r in others]) for ph in PHASES}
    judged = _with(
        base,
        slowest=slowest,
        lost_s=max(0.0, lost),
        behind=behind / steps,
        chance=min(1.0, _tail(behind, steps) * len(win)),
        excess=excess,
        phase=max(OWN_PHASES, key=lambda ph: excess[ph]),
    )
    if steps < min_steps:
        return _with(judged, phase=None, reason=f"{steps} steps of every rank, fewer than {min_steps}")
    if judged.share < name_share:
        return _with(judged, phase=None, reason=f"the slowest costs {judged.share:.0%} of a step")
    if judged.chance > CHANCE:
        return _with(judged, phase=None, reason=f"the slowest was behind in {judged.behind:.0%} of the steps only")
    return _with(judged, culprit=slowest)


def _tail(k: int, n: int) -> float:
    """P(at least ``k`` of ``n`` fair coins come up heads)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def _with(j: Judgement, **changes: Any) -> Judgement:
    return dataclasses.replace(j, **changes)
