"""The one command line that starts numarun in a child process: the Slurm node task, ``numarun tune``'s
runs, ``numarun bench``'s jobs, the sbatch script of ``numarun submit``."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def numarun_command(*args: str) -> list[str]:
    """This installation's ``numarun ARGS...``: its console script beside the interpreter (the nodes of a
    shared filesystem run the same version), else ``python -m numarun``."""
    exe = Path(sys.executable).parent / "numarun"
    head = [str(exe)] if exe.is_file() and os.access(exe, os.X_OK) else [sys.executable, "-m", "numarun"]
    return [*head, *args]
