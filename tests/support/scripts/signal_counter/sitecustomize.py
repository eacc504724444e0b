"""Test hook, on PYTHONPATH: from the interpreter's start, each rank counts every SIGUSR1 and SIGUSR2 it
receives, one by one, in SIGNAL_COUNT_DIR/count.<RANK> (``<usr1> <usr2>``), and SIGTERM ends it cleanly.

Counted from the C-level wake-up byte of each delivery (``signal.set_wakeup_fd``): Python runs a handler
once for deliveries that come before it runs, so a handler could not count them. Only in a rank (not in
numarun itself): the rank's environment has LOCAL_RANK. ``storm_rank.py`` waits on :data:`STOP`.
"""

import os
import signal
import threading

STOP = threading.Event()

if "LOCAL_RANK" in os.environ and "SIGNAL_COUNT_DIR" in os.environ:
    _path = os.path.join(os.environ["SIGNAL_COUNT_DIR"], f"count.{os.environ['RANK']}")
    _counts = {int(signal.SIGUSR1): 0, int(signal.SIGUSR2): 0}
    _r, _w = os.pipe()
    os.set_blocking(_w, False)
    signal.set_wakeup_fd(_w)
    for _s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(_s, lambda signum, frame: None)

    def _write() -> None:
        with open(_path + ".tmp", "w") as f:
            f.write(f"{_counts[signal.SIGUSR1]} {_counts[signal.SIGUSR2]}\n")
        os.replace(_path + ".tmp", _path)

    def _read() -> None:
        while True:
            for signum in os.read(_r, 256):
                if signum == signal.SIGTERM:
                    STOP.set()
                elif signum in _counts:
                    _counts[signum] += 1
            _write()

    _write()
    threading.Thread(target=_read, daemon=True).start()
