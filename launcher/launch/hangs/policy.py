"""The watchdog's settings: ``--hang-timeout``, ``--on-hang`` and what follows from them."""

from __future__ import annotations

from dataclasses import dataclass

from ... import envvars
from ...options.choices import DEFAULT_TIMEOUT_S, EXIT_HANG, OnHang, parse_hang_timeout
from ...options.launch import LaunchOptions

__all__ = ["DEFAULT_TIMEOUT_S", "EXIT_HANG", "HangPolicy", "OnHang", "parse_hang_timeout", "policy_from"]


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


def policy_from(options: LaunchOptions) -> HangPolicy:
    """The policy of resolved launch options."""
    return HangPolicy(options.hang_timeout, options.on_hang, options.setting("hang_timeout").where)
