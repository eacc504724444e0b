"""Per-rank mode: this process is one rank the scheduler started; it binds itself and runs the script.

There is no torchrun agent: the scheduler (``srun --ntasks-per-node=G``, ``mpirun``) started every
rank, restarts nothing and forwards signals itself. numarun gives the process the environment
torchrun gives its workers (:func:`numarun.jobenv.settle.rank_env`), then becomes the worker:
the same bootstrap applies the binding (affinity on every thread, memory policy, environment),
starts the watcher and runs the script in this interpreter, as ``python script.py`` would, so
no second interpreter starts and torch is imported once, by the script, after the binding.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import NoReturn

from .torchrun import Target


def become_rank(target: Target, env: Mapping[str, str]) -> NoReturn:
    """Set ``env``, hand logging and standard output back as Python starts them, and run the bootstrap
    on ``target``."""
    import sys

    os.environ.update(env)
    sys.stdout = sys.__stdout__  # not the CLI's checked stream: the script's writes are its own
    # The CLI configured the root logger for numarun's own lines; a script's logging.basicConfig()
    # must work as under plain python.
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    from ..worker.bootstrap import main

    main(target.bootstrap_args())
    raise SystemExit(0)  # main() ends the process through worker.finish; not reached
