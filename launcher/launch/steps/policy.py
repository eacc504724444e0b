"""The step report's settings: ``--step-report`` and the report interval (``NUMARUN_STEP_INTERVAL``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ... import envvars
from ...argtypes import seconds
from ...errors import UsageError
from ...options.choices import StepReport
from ...options.launch import LaunchOptions

DEFAULT_INTERVAL_S = 5.0
"""Seconds between two looks at the ranks (their records, the kernel's figures) and between two exchanges through
the store: the live table is at most this old, and the kernel's figures are sampled this often."""
MIN_INTERVAL_S = 0.1
"""The shortest interval: the agent looks at the ranks every tenth of a second (``agent.POLL_S``), no more often."""


_interval = seconds(envvars.STEP_INTERVAL, low=MIN_INTERVAL_S, above=False)


@dataclass(frozen=True)
class StepPolicy:
    on: bool = True
    interval_s: float = DEFAULT_INTERVAL_S

    def worker_env(self) -> dict[str, str]:
        return {envvars.STEPS: "1" if self.on else "0", envvars.STEP_INTERVAL: f"{self.interval_s:g}"}


def interval_from(environ: Mapping[str, str]) -> float:
    """``NUMARUN_STEP_INTERVAL`` (seconds, at least :data:`MIN_INTERVAL_S`), else the default; a bad value is a
    one-line error."""
    text = environ.get(envvars.STEP_INTERVAL, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        return _interval(text)
    except Exception as e:  # argparse's ArgumentTypeError: its text says what was expected
        raise UsageError(str(e)) from None


def steps_from(options: LaunchOptions, environ: Mapping[str, str]) -> StepPolicy:
    """The policy of resolved launch options and numarun's environment."""
    return StepPolicy(options.step_report is StepReport.ON, interval_from(environ))
