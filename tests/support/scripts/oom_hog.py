"""Rank 1 allocates until the kernel kills it (or 12.8 GB); rank 0 waits to be stopped by torchrun.
With --self-kill, rank 1 sends itself SIGKILL instead: not out of memory."""

import os
import signal
import sys
import time

if os.environ["RANK"] == "1":
    if "--self-kill" in sys.argv:
        os.kill(os.getpid(), signal.SIGKILL)
    chunks = [bytearray(64 << 20) for _ in range(200)]
else:
    deadline = time.monotonic() + 120  # torchrun ends this rank once rank 1 is gone
    while time.monotonic() < deadline:
        time.sleep(0.2)
