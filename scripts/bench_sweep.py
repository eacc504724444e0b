#!/usr/bin/env python3
"""A Hydra sweep of CPU jobs under Hydra's basic launcher and under ``hydra/launcher=numarun``, side by side.

Each job of the sweep is one rank doing a fixed amount of busy work (pure Python arithmetic),
calibrated here to take --seconds on one core. The same app runs the same sweep of --jobs jobs
twice per round, once with Hydra's basic launcher (one job after another, in one process) and
once packed by numarun (a job per core at a time, each started as its own bound process: the
launch of every job is part of what is timed). Rounds alternate which launcher goes first.

    .venv/bin/python scripts/bench_sweep.py [--jobs 4] [--seconds 10] [--rounds 1]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

APP = """
import hydra


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def job(cfg):
    total = 0
    for i in range(cfg.work):
        total += i * i % 7
    return total


if __name__ == "__main__":
    job()
"""


def busy(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def calibrate(seconds: float) -> int:
    """Iterations of the job's loop that take ``seconds`` on one core of this machine."""
    n = 1_000_000
    while True:
        t0 = time.perf_counter()
        busy(n)
        took = time.perf_counter() - t0
        if took > 0.5:
            return int(n * seconds / took)
        n *= 2


def sweep(app: Path, jobs: int, work: int, launcher: str) -> float:
    cmd = [
        sys.executable,
        str(app),
        "-m",
        f"hydra/launcher={launcher}",
        f"+x=range(0,{jobs})",
        f"+work={work}",
        f"hydra.sweep.dir={app.parent / launcher}",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=app.parent, capture_output=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="busy work of each job, on one core")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    work = calibrate(args.seconds)
    times: dict[str, list[float]] = {"basic": [], "numarun": []}
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "app.py"
        app.write_text(APP)
        for r in range(args.rounds):
            for launcher in ("basic", "numarun") if r % 2 == 0 else ("numarun", "basic"):
                times[launcher].append(sweep(app, args.jobs, work, launcher))
    basic, ours = statistics.median(times["basic"]), statistics.median(times["numarun"])
    print(f"sweep of {args.jobs} jobs of {args.seconds:g} s busy work each (1 rank), {args.rounds} round(s), median:")
    print(f"  hydra/launcher=basic    {basic:7.2f} s   ({', '.join(f'{t:.2f}' for t in times['basic'])})")
    print(f"  hydra/launcher=numarun  {ours:7.2f} s   ({', '.join(f'{t:.2f}' for t in times['numarun'])})")
    print(f"  numarun / basic         {ours / basic:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
