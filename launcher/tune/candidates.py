"""The settings ``numarun tune`` tries: the product of its axes, the first slowest.

Plan axes: ``binding``, ``mem-policy``, ``omp`` (``plan``: the plan's own OMP_NUM_THREADS); Hydra axes: ``key=a,b,c``.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..argtypes import MAX_LOCAL_RANKS, ascii_digits
from ..errors import UsageError
from ..plan.model import BindingMode, MemPolicy

PLAN_AXES = ("binding", "mem-policy", "omp")
OMP_FROM_PLAN = "plan"


@dataclass(frozen=True)
class Axis:
    name: str  # a plan axis, or a Hydra key such as trainer.batch_size
    values: tuple[str, ...]


@dataclass(frozen=True)
class Candidate:
    options: tuple[tuple[str, str], ...]  # (axis name, value) in axis order

    def get(self, name: str) -> str | None:
        return dict(self.options).get(name)

    def as_dict(self) -> dict[str, str]:
        return dict(self.options)

    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.options if k not in PLAN_AXES]

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.options) or "default"


def _split(flag: str, text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(","))
    if not text.strip() or any(not v for v in values):
        raise UsageError(f"bad {flag} {text!r}: expected a comma-separated list such as a,b,c")
    if len(set(values)) != len(values):
        raise UsageError(f"bad {flag} {text!r}: a value is repeated; expected distinct values")
    return values


def _choice_axis(flag: str, choices: type[enum.Enum], text: str) -> Axis:
    values = _split(flag, text)
    allowed = [m.value for m in choices]
    for v in values:
        if v not in allowed:
            raise UsageError(f"bad {flag} value {v!r} in {text!r}: expected a list of {', '.join(allowed)}")
    return Axis(flag.removeprefix("--"), values)


def binding_axis(text: str) -> Axis:
    return _choice_axis("--binding", BindingMode, text)


def mem_policy_axis(text: str) -> Axis:
    return _choice_axis("--mem-policy", MemPolicy, text)


def omp_axis(text: str) -> Axis:
    values = _split("--omp", text)
    for v in values:
        if v != OMP_FROM_PLAN and not (ascii_digits(v) and 1 <= int(v) <= MAX_LOCAL_RANKS):
            raise UsageError(
                f"bad --omp value {v!r} in {text!r}: expected a list of integers from 1 to {MAX_LOCAL_RANKS} or 'plan'"
            )
    return Axis("omp", values)


def override_axes(script_args: Sequence[str]) -> tuple[list[Axis], list[str]]:
    """(axes from ``key=a,b,c`` arguments, the other arguments unchanged, in order)."""
    axes: list[Axis] = []
    rest: list[str] = []
    for a in script_args:
        key, eq, value = a.partition("=")
        # a plain a,b,c list: no brackets, braces, parentheses or quotes that Hydra parses itself
        if eq and key and not a.startswith("-") and "," in value and not any(c in value for c in "[]{}()'\""):
            if any(ax.name == key for ax in axes):
                raise UsageError(f"bad override {a!r}: {key} is swept twice; expected one list per key")
            axes.append(Axis(key, _split(f"override {key}", value)))
        else:
            rest.append(a)
    return axes, rest


def candidates(axes: Sequence[Axis]) -> list[Candidate]:
    """Every combination of the axes' values, the first axis varying slowest."""
    combos = itertools.product(*[[(ax.name, v) for v in ax.values] for ax in axes])
    return [Candidate(tuple(c)) for c in combos]


def default_index(cands: Sequence[Candidate], axes: Sequence[Axis], defaults: dict[str, str]) -> int:
    """The candidate ``numarun run`` would use: each plan axis at ``defaults`` (what the run takes without its
    flag: the environment, else numarun's default; OMP the plan's own), each override at its first value; else
    the first."""
    want = {ax.name: {"omp": OMP_FROM_PLAN, **defaults}.get(ax.name, ax.values[0]) for ax in axes}
    return next((i for i, c in enumerate(cands) if c.as_dict() == want), 0)
