"""Who holds the job back: the ranks' recent steps compared (pure).

In a synchronous job every rank's step takes the same wall time: the slow rank sets the pace and the others wait for
it, in a collective (``comm``: Python's collectives, their waits, and the wait inside DDP's backward, each measured
every step by the rank's recorder, :mod:`numarun.worker.phases`). So a rank's *own* time in a step is its step less
its ``comm`` (on a GPU, the stream's time less its waits, :attr:`Point.gpu_own`), and the rank the others wait for is
the one whose own time is longest: it waits least.

Over a window of the latest steps that every rank recorded (at most :data:`WINDOW`, the first step left out: it holds
the rank's start), each rank's own time is put on the job's clock: times the step's median wall time over the rank's
own wall time, so that a rank whose clock runs fast or slow (another host's) is not taken for a slow one. The slowest
rank is the one with the longest median own time; its *lost time* is the median, step by step, of its own time less
the others' median: how much shorter the job's step would be at their pace. It is named only when

* at least :data:`MIN_STEPS` steps are in the window,
* the lost time is at least :data:`NAME_SHARE` of the step (the median step of the ranks), and
* it is behind (its own time above the others' median) so often that chance would do it with a probability of at
  most :data:`CHANCE` (a sign test: the one-sided binomial tail at 1/2, times the ranks, for the slowest is picked
  from all of them), counting **independent observations only**: a figure repeated exactly from one step to the next
  (a sampled figure held between samples) is one observation however many steps it stands for, and where being
  behind comes in runs (a burst of slow steps, a drift), the steps count as the fewer independent ones they are worth
  (the effective sample size of a series whose lag-1 autocorrelation is ``r``: ``n (1 - r) / (1 + r)``).

Medians and the sign test make it robust to noise, the independence rule to noise that comes in runs
(tests/launch/steps/test_steps_judge.py: balanced jobs with ±60 % noise on every step, bursts of slow steps, a figure
held for 100 steps, a drifting clock). The phase named is the one whose excess over the others' (the mean, step by
step) makes at least half the lost time; where none does, the lost time is spread and no phase is named.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...worker.steps import PHASES

WINDOW = 64
MIN_STEPS = 12
"""The fewest steps in which the sign test can name a rank (12 of 12 behind: 1/4096)."""
NAME_SHARE = 0.10
CHANCE = 0.001
PHASE_SHARE = 0.5
"""A phase is named when its excess is at least this share of the lost time."""
HELD = 3
"""A figure the same to the microsecond in this many steps in a row is held, not measured each step."""
PARTS = 4
"""The window's stretches in each of which the slowest must be behind."""
OWN_PHASES = ("input", "compute", "optim")
"""The phases a rank spends on its own; ``comm`` is where it waits for the others."""


class Unjudged(enum.Enum):
    """Why no rank is named."""

    NO_STEPS = "no step after each rank's first, which holds its start"
    NOT_STEPPING = "a rank took no optimizer step after its first"
    APART = "the ranks' steps do not line up"
    ONE_RANK = "one rank: nothing to compare"
    TOO_FEW = "too few steps"
    SMALL = "the slowest costs less than a tenth of a step"
    UNSTEADY = "the slowest was not behind steadily enough"
    NODES_MISSING = "a node's last view did not come"


@dataclass(frozen=True)
class Point:
    """One step of one rank, as judged: seconds."""

    step: int
    wall: float
    input: float
    compute: float
    comm: float
    optim: float
    gpu_own: float | None = None
    """The step's own time from the GPU's view (its stream's time less the stream's waits); None without a GPU."""

    @property
    def own(self) -> float:
        if self.gpu_own is not None:
            return max(0.0, self.gpu_own)
        return max(0.0, self.wall - self.comm)

    def phase(self, name: str) -> float:
        return float(getattr(self, name))

    def row(self) -> list[float | None]:
        """As sent through the store: ``[step, wall, input, compute, comm, optim, gpu_own]``."""
        return [self.step, *(round(self.phase(p), 6) for p in ("wall", *PHASES)), self.gpu_own]

    @staticmethod
    def of_row(row: Sequence[float | None]) -> Point:
        step, wall, inp, compute, comm, optim = (float(x or 0.0) for x in row[:6])
        gpu = row[6] if len(row) > 6 else None
        return Point(int(step), wall, inp, compute, comm, optim, None if gpu is None else float(gpu))


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
    """Per rank, the median of its own time (its step less its comm), on the job's clock."""
    slowest: int | None = None
    lost_s: float = 0.0
    """The slowest rank's own time less the others' median, the median over the steps: what the job would gain per
    step."""
    behind: float = 0.0
    """The share of the observations in which its own time was above the others' median."""
    independent: float = 0.0
    """How many independent observations the window's steps are worth (held figures and runs counted as fewer)."""
    chance: float = 1.0
    """How likely a rank no slower than the others is behind as often (the sign test's tail, times the ranks)."""
    culprit: int | None = None
    """The rank named as holding the job back; None: none is."""
    phase: str | None = None
    """The culprit's phase that makes most of its lost time (``input``, ``compute`` or ``optim``); None when no rank
    is named or its lost time is spread over its phases."""
    excess: dict[str, float] = field(default_factory=dict)
    """The slowest rank's seconds per step above the others', per phase (the mean over the steps)."""
    unjudged: Unjudged | None = None
    """Why no rank is named; None when one is."""
    missing: tuple[str, ...] = ()
    """The nodes whose last view the judge did not get (``node 1 last reported at step 40``): it names no rank."""
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Where no step is common to every rank: each rank's first and last step judged on (none: (0, 0))."""

    @property
    def share(self) -> float:
        return self.lost_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def reason(self) -> str:
        """Why no rank is named, in words with the figures ('' when one is)."""
        u = self.unjudged
        if u is None:
            return ""
        if u is Unjudged.TOO_FEW:
            return f"{self.steps} steps of every rank, fewer than {MIN_STEPS}"
        if u is Unjudged.SMALL:
            return f"the slowest costs {self.share:.0%} of a step"
        if u is Unjudged.NODES_MISSING:
            return "; ".join(self.missing)
        if u is Unjudged.NOT_STEPPING:
            idle = [r for r, span in sorted(self.spans.items()) if span == (0, 0)]
            return f"{_ranks(idle)} took no optimizer step after {'its' if len(idle) == 1 else 'their'} first"
        if u is Unjudged.APART:
            runs = ", ".join(f"rank {r}'s {a}-{b}" for r, (a, b) in sorted(self.spans.items()))
            return f"the ranks' steps do not line up ({runs}): a rank's records started over"
        if u is Unjudged.UNSTEADY:
            return f"the slowest was behind in {self.behind:.0%} of the steps, {self.unsteady}"
        return u.value

    @property
    def unsteady(self) -> str:
        """Why a slowest rank that costs enough is not named: its lead is what chance would give, or it is not
        behind in each stretch of the window."""
        if self.chance > CHANCE:
            return f"as good as {self.independent:.0f} independent ones: chance would do as much"
        return f"but not in each of {PARTS} stretches of them: slow steps that came together, not a steady cost"


def window(points: Mapping[int, Sequence[Point]], size: int = WINDOW) -> dict[int, list[Point]]:
    """Each rank's points of the latest ``size`` steps every rank recorded (step 1 left out)."""
    if not points:
        return {}
    common = set.intersection(*({p.step for p in pts} for pts in points.values()))
    common.discard(1)
    keep = set(sorted(common)[-size:])
    return {r: sorted((p for p in pts if p.step in keep), key=lambda p: p.step) for r, pts in points.items()}


def median(values: Sequence[float]) -> float:
    """The median, 0 of nothing."""
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
        return _unaligned(points)
    ranks = sorted(win)
    phases = {r: {ph: median([p.phase(ph) for p in pts]) for ph in PHASES} for r, pts in win.items()}
    rows = list(zip(*(win[r] for r in ranks), strict=True))  # step by step, a point per rank
    walls = [median([p.wall for p in row]) for row in rows]
    scale = [[_scale(w, p.wall) for p in row] for w, row in zip(walls, rows, strict=True)]
    own_by_step = [[p.own * k for p, k in zip(row, ks, strict=True)] for row, ks in zip(rows, scale, strict=True)]
    own = {r: median([o[i] for o in own_by_step]) for i, r in enumerate(ranks)}
    step_s = median([median([p.wall for p in pts]) for pts in win.values()])
    base = Judgement(steps, len(win), step_s, phases, own)
    if len(win) < 2:
        return dataclasses.replace(base, unjudged=Unjudged.ONE_RANK)
    at = max(range(len(ranks)), key=lambda i: own[ranks[i]])
    slowest = ranks[at]
    diffs = [o[at] - median([x for i, x in enumerate(o) if i != at]) for o in own_by_step]
    excess = {
        ph: statistics.fmean(
            row[at].phase(ph) * ks[at]
            - statistics.fmean(p.phase(ph) * k for i, (p, k) in enumerate(zip(row, ks)) if i != at)
            for row, ks in zip(rows, scale, strict=True)
        )
        for ph in PHASES
    }
    lost = max(0.0, median(diffs))
    observed = _observations(diffs, _held_runs(rows))
    behind = sum(1 for x in observed if x > 0)
    independent = _effective([x > 0 for x in observed])
    n = max(1, round(independent))
    k = min(n, round(behind / len(observed) * n))
    top = max(OWN_PHASES, key=lambda ph: excess[ph])
    judged = dataclasses.replace(
        base,
        slowest=slowest,
        lost_s=lost,
        behind=behind / len(observed),
        independent=independent,
        chance=min(1.0, _tail(k, n) * len(win)),
        excess=excess,
    )
    if steps < min_steps:
        return dataclasses.replace(judged, unjudged=Unjudged.TOO_FEW)
    if judged.share < name_share:
        return dataclasses.replace(judged, unjudged=Unjudged.SMALL)
    if judged.chance > CHANCE or not _steady(diffs):
        return dataclasses.replace(judged, unjudged=Unjudged.UNSTEADY)
    return dataclasses.replace(judged, culprit=slowest, phase=top if excess[top] >= PHASE_SHARE * lost else None)


def _unaligned(points: Mapping[int, Sequence[Point]]) -> Judgement:
    """No step common to every rank: none recorded yet; a rank that took no optimizer step (after its first, which
    holds its start) while others did; or ranks whose step numbers do not meet (a rank's records started over while
    the others' went on): each said, none judged (steps of different moments would be compared)."""
    spans = {
        r: (min(steps), max(steps)) if (steps := [p.step for p in pts if p.step > 1]) else (0, 0)
        for r, pts in points.items()
    }
    stepping = [r for r, span in spans.items() if span != (0, 0)]
    if not stepping or len(points) < 2:
        return Judgement(0, len(points), 0.0, unjudged=Unjudged.NO_STEPS)
    why = Unjudged.APART if len(stepping) == len(points) else Unjudged.NOT_STEPPING
    return Judgement(0, len(points), 0.0, unjudged=why, spans=spans)


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 1``, ``ranks 1, 3``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _scale(job_wall: float, wall: float) -> float:
    """A rank's seconds on the job's clock: its step's wall time is the job's (a synchronous job's steps are as
    long on every rank), so a clock that runs fast or slow scales all its figures alike."""
    return job_wall / wall if wall > 0 and job_wall > 0 else 1.0


def _held_runs(rows: Sequence[Sequence[Point]]) -> list[int]:
    """The observation each step belongs to: where some rank's ``comm`` figure is the same, to the microsecond, in
    :data:`HELD` or more steps in a row (a figure held between samples: a measured wait varies by more), those steps
    are one observation."""
    ranks = len(rows[0]) if rows else 0
    joins = [False] * len(rows)
    for r in range(ranks):
        values = [round(row[r].comm, 6) for row in rows]
        start = 0
        for i in range(1, len(values) + 1):
            if i == len(values) or values[i] != values[start]:
                if i - start >= HELD and values[start] > 0:
                    for j in range(start + 1, i):
                        joins[j] = True
                start = i
    out: list[int] = []
    for i, joined in enumerate(joins):
        out.append(out[-1] if joined and i > 0 else (out[-1] + 1 if out else 0))
    return out


def _observations(diffs: Sequence[float], groups: Sequence[int]) -> list[float]:
    """One figure per observation: the mean of its steps'."""
    by: dict[int, list[float]] = {}
    for d, g in zip(diffs, groups, strict=True):
        by.setdefault(g, []).append(d)
    return [statistics.fmean(v) for _, v in sorted(by.items())]


def _steady(diffs: Sequence[float]) -> bool:
    """Whether the slowest is behind in each of :data:`PARTS` stretches of the window (the median of each): a burst
    of slow steps, however long, leaves one stretch out."""
    n = len(diffs)
    bounds = [round(i * n / PARTS) for i in range(PARTS + 1)]
    return all(median(diffs[a:b]) > 0 for a, b in zip(bounds, bounds[1:]) if b > a)


def _effective(signs: Sequence[bool]) -> float:
    """How many independent observations ``signs`` are worth: ``n (1 - r) / (1 + r)`` for a lag-1 autocorrelation
    ``r`` that shows runs, ``n`` otherwise. An estimate of ``r`` from ``n`` independent signs is off by about
    ``1 / sqrt(n)``: one within twice that is noise, not runs."""
    n = len(signs)
    if n < 3:
        return float(n)
    xs = [1.0 if s else 0.0 for s in signs]
    mean = statistics.fmean(xs)
    var = sum((x - mean) ** 2 for x in xs)
    if var == 0:
        return float(n)
    r = sum((a - mean) * (b - mean) for a, b in zip(xs, xs[1:])) / var
    return n * (1 - r) / (1 + r) if r > 2 / math.sqrt(n) else float(n)


def _tail(k: int, n: int) -> float:
    """P(at least ``k`` of ``n`` fair coins come up heads)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def without_nodes(j: Judgement, missing: Sequence[str]) -> Judgement:
    """``j`` made on a job some of whose nodes' last views did not come (``missing``): no rank is named."""
    return dataclasses.replace(j, culprit=None, phase=None, unjudged=Unjudged.NODES_MISSING, missing=tuple(missing))
