"""numarun: a topology-aware launcher for PyTorch distributed training.

``import numarun`` stays light (no torch import): ``init`` and
``hierarchical_all_reduce`` are loaded on first use. Words (node, rank, task, job, slot...) mean one
thing each: docs/glossary.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"
__all__ = ["init", "hierarchical_all_reduce", "current_binding", "report", "__version__"]

_LAZY = {  # each name loaded on first use -> the module that defines it
    "init": ".comm.context",
    "hierarchical_all_reduce": ".comm.allreduce",
    "current_binding": ".worker",
    "report": ".worker",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'numarun' has no attribute {name!r}")
