"""The end of a test run says how many tests were skipped for want of root, and where: a non-root run
skips the namespace, mount, cgroup and container tests, and a green line must not hide it."""

from __future__ import annotations

import os
import re
from typing import Any

NEEDS_ROOT = re.compile(r"\bneeds? root\b|\bneeds? [^;:()]* as root\b")
"""How a test's skip says it needs root ("bind mounts need root", "fake nodes need unshare --uts as root")."""


def _reason(report: Any) -> str:
    longrepr = getattr(report, "longrepr", None)
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")


LISTED = "not run here:"
"""How the docs-examples test lists an example it never runs, root or not: not a skip for want of root."""


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    skipped = [
        r
        for r in terminalreporter.stats.get("skipped", [])
        if NEEDS_ROOT.search(_reason(r)) and LISTED not in _reason(r)
    ]
    if not skipped:
        return
    files = sorted({r.nodeid.split("::")[0].rsplit("/", 1)[-1] for r in skipped})
    n = len(skipped)
    terminalreporter.write_sep(
        "=", f"{n} test{'s' * (n != 1)} skipped for want of root (this run's uid is {os.geteuid()})", yellow=True
    )
    terminalreporter.write_line(f"in {', '.join(files)}: run the suite as root to run them, as the CI does")
