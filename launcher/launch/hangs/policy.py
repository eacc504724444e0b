"""The watchdog's settings: ``--hang-timeout``, ``--on-hang`` and what follows from them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ... import envvars
from ...argtypes import seconds

DEFAULT_TIMEOUT_S = 300.0
"""``--hang-timeout``'s default (docs/hangs.md, "Options"): half of NCCL's own collective timeout (10 min), so
the roll-call comes while every rank still stands where it hangs, before NCCL's watchdog tears the ranks down; far
longer than a healthy job goes without a collective or an optimizer step; minutes, not a queue's time limit."""
EXIT_HANG = 75
"""The exit code of a job ended by ``--on-hang stop``: sysexits.h's EX_TEMPFAIL (a temporary failure, worth a
retry), apart from a failed rank's code, 2 (a usage mistake) and 128+N (a signal)."""


class OnHang(str, enum.Enum):
    """What numarun does once it has printed the roll-call of a hung job."""

    REPORT = "report"
    """Nothing more: the job keeps running (a debugger can still attach; a long step may still finish)."""
    STOP = "stop"
    """End the job on every node, nothing left running, with exit code :data:`EXIT_HANG`."""


parse_hang_timeout = seconds("--hang-timeout", above=False)
"""``--hang-timeout``'s reader (its declaration, with ``--on-hang``'s: :data:`numarun.launch.options.DECLARED`)."""


@dataclass(frozen=True)
class HangPolicy:
    timeout_s: float = DEFAULT_TIMEOUT_S
    action: OnHang = OnHang.REPORT
    source: str = "--hang-timeout"
    """Where the timeout came from, for the roll-call's first line."""

    @property
    def on(self) -> bool:
        return self.timeout_s > 0

    @property
    def sample_s(self) -> float:
        """A tenth of the timeout, from 0.5 to 5 s: the verdict is at most a tenth late, and a sample costs
        tens of microseconds (scripts/bench_launch.py --watchdog)."""
        return min(5.0, max(0.5, self.timeout_s / 10)) if self.on else 0.0

    @property
    def tick_s(self) -> float:
        return self.sample_s or 5.0

    def worker_env(self) -> dict[str, str]:
        return {envvars.HANG_SAMPLE: f"{self.sample_s:g}"}


def policy_from(options: Any) -> HangPolicy:
    """The policy of resolved launch options (:class:`numarun.launch.options.Options`)."""
    timeout = options.setting("hang_timeout")
    action = options.on_hang
    return HangPolicy(float(timeout.value), OnHang(action), timeout.where)
