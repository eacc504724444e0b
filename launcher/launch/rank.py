"""Per-rank mode: no torchrun agent (the scheduler started every rank, and signals them); this process,
given the environment torchrun gives its workers (:func:`numarun.jobenv.settle.rank_env`), becomes the
worker in this interpreter: torch is imported once, by the script, after the bootstrap's binding.
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
