"""Fault worker: counts steps, checkpointing the count atomically after each one.

``fault_counter.py OUT STEPS CRASH_RANK CRASH_STEP``: every rank resumes from
``OUT/ckpt<RANK>`` (written to a temporary file, fsynced, then renamed), logs the step it resumed
from (``resume N``) and each step it runs to ``OUT/steps<RANK>.<attempt>`` and its pid to ``OUT/pid<RANK>.<attempt>``.
On the
first attempt only, rank CRASH_RANK exits with code 3 when it reaches CRASH_STEP.
"""

import os
import sys
import time

out, steps, crash_rank, crash_step = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rank = os.environ["RANK"]
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
ckpt = os.path.join(out, f"ckpt{rank}")


def put(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


put(os.path.join(out, f"pid{rank}.{attempt}"), str(os.getpid()))
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
with open(os.path.join(out, f"steps{rank}.{attempt}"), "a") as log:
    log.write(f"resume {start}\n")
    for step in range(start + 1, steps + 1):
        if attempt == "0" and rank == crash_rank and step == crash_step:
            sys.exit(3)
        time.sleep(0.05)  # the "work" of a step
        log.write(f"{step}\n")
        log.flush()
        put(ckpt, str(step))
