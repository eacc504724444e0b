"""A thread that re-pins itself after the bootstrap bound it, as NCCL/UCX/OpenMP threads can.

Prints ``bound <cpus>`` (the main thread's affinity), ``moved <cpus>`` and, after the
watcher had time to look, ``final <cpus>`` (the thread's affinity then).
"""

import ctypes
import os
import threading
import time

bound = sorted(os.sched_getaffinity(0))
target = {bound[0]} if len(bound) > 1 else set(range(os.cpu_count() or 1))
moved = threading.Event()
done = threading.Event()


def repinner() -> None:
    # name it for the kernel too, as native library threads are named
    ctypes.CDLL(None).prctl(15, b"repinner", 0, 0, 0)  # PR_SET_NAME
    os.sched_setaffinity(0, target)
    print("moved", ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
    moved.set()
    done.wait()


t = threading.Thread(target=repinner, name="repinner")
t.start()
moved.wait()
print("bound", ",".join(map(str, bound)), flush=True)
time.sleep(float(os.environ.get("REPIN_WAIT", "2")))
print("final", ",".join(map(str, sorted(os.sched_getaffinity(t.native_id)))), flush=True)
done.set()
t.join()
