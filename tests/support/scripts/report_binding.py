"""Test worker: writes what this rank really got to OUT_DIR/rank<RANK>.json.

Records, before importing anything heavy, whether torch was already loaded (the
bootstrap must not import it), then the kernel's view of every thread's affinity,
the memory policy, Mems_allowed_list, argv, sys.path[0] and the environment.
"""

import sys

TORCH_LOADED_BEFORE_SCRIPT = "torch" in sys.modules

import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402

from numarun.worker import affinity, current_binding  # noqa: E402


def main() -> None:
    out_dir = sys.argv[1]
    # a thread started by the user's code inherits the binding
    seen: dict[str, list[int]] = {}
    t = threading.Thread(target=lambda: seen.setdefault("thread", sorted(os.sched_getaffinity(0))))
    t.start()
    t.join()
    got = affinity.read_back(threads=True)
    binding = current_binding()
    report = {
        "torch_loaded_before_script": TORCH_LOADED_BEFORE_SCRIPT,
        "name": __name__,
        "file": __file__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "cpus": list(got.cpus),
        "task_cpus": {str(tid): list(cpus) for tid, cpus in got.thread_cpus.items()},
        "new_thread_cpus": seen["thread"],
        "mems_allowed": list(affinity.mems_allowed()),
        "mempolicy": [got.mem_policy, list(got.mems)],
        "env": dict(os.environ),
        "binding_local_rank": None if binding is None else binding.local_rank,
    }
    path = os.path.join(out_dir, f"rank{os.environ['RANK']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
