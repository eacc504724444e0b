"""One job of a sweep in each of its ranks: ``python -m numarun.sweep.job DIR index=N`` runs ``DIR/N.job``
through Hydra's ``run_job``, its task found as multiprocessing's spawn finds one; rank 0 alone runs the job's
Hydra callbacks (one job, one ``on_job_start``) and writes the ``JobReturn`` to ``DIR/N.ret``. ``group=G``: the
jobs of ``DIR/groupG.json``, packed on this node."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any


def load_task(kind: str, where: str, qualname: str, depth: int, main: bool) -> Any:
    if kind == "file":
        spec = importlib.util.spec_from_file_location("__mp_main__", where)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path[0], sys.argv[0] = os.path.dirname(os.path.realpath(where)), where
        sys.modules["__mp_main__"] = sys.modules["__main__"] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
        sys.modules["__main__"] = module if main else sys.modules["__main__"]
    task: Any = module
    for part in qualname.split("."):
        task = getattr(task, part)
    for _ in range(depth):
        task = task.__wrapped__
    return task


def run_one(folder: Path, idx: int) -> int:
    from hydra.core.utils import JobRuntime, JobStatus, setup_globals

    from .. import hydra_internals as internals

    with open(folder / f"{idx}.job", "rb") as f:
        head = pickle.load(f)
        task = load_task(*head["task"])
        cfg = pickle.load(f)
    internals.set_version_base(head["version_base"])
    setup_globals()
    JobRuntime.instance().set("name", cfg.hydra.job.name)
    first = os.environ.get("RANK", "0") == "0"
    ret = internals.run_job(None, cfg, task, internals.callbacks(cfg if first else None), sweep=True)
    if first:
        try:
            data = pickle.dumps(ret)
        except Exception as e:
            message = (
                f"bad return value of job #{idx}: {type(internals.raw_value(ret)).__name__} cannot be handed back to "
                f"the sweeper ({e}); expected a value pickle can write (a number, a dict...)"
            )
            print(f"numarun: error: {message}", file=sys.stderr, flush=True)
            ret.status, ret.return_value = JobStatus.FAILED, RuntimeError(message)
            data = pickle.dumps(ret)
        (folder / f"{idx}.tmp").write_bytes(data)
        os.replace(folder / f"{idx}.tmp", folder / f"{idx}.ret")
    return 0 if ret.status is JobStatus.COMPLETED else 1


def run_group(folder: Path, group: int) -> int:
    from .. import envvars
    from ..options.launch import from_environ
    from ..topology.discover import load_topology
    from ..worker import current_binding
    from .launch import run_local

    # this rank holds the whole node for the jobs: its own plan's variables are not theirs
    binding, user = current_binding(), os.environ.get(envvars.USER_ENV, "").split(",")
    from ..plan.model import DERIVED_ENV

    # (a layout's CUDA_VISIBLE_DEVICES is the user's own GPUs, reordered: kept, or they would be lost)
    for key in set(binding.env if binding is not None else ()) - set(user) - set(DERIVED_ENV):
        os.environ.pop(key, None)
    # each job's head, the first of its file's two pickles
    jobs = [
        pickle.loads((folder / f"{i}.job").read_bytes())["job"]
        for i in json.loads((folder / f"group{group}.json").read_text())
    ]
    topology = load_topology(from_environ(("topology",), os.environ).topology)
    return 1 if any(run_local(jobs, topology, folder).values()) else 0


def main(argv: list[str]) -> int:
    folder = Path(next(a for a in argv if "=" not in a))
    key, _, value = next(a for a in argv if "=" in a).partition("=")
    return run_group(folder, int(value)) if key == "group" else run_one(folder, int(value))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
