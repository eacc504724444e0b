"""numarun: a topology-aware launcher for PyTorch distributed training.

``import numarun`` stays light (no torch import): ``init`` and
``hierarchical_all_reduce`` are loaded on first use. Words (node, rank, task, job, slot...) mean one
thing each: docs/glossary.md.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"
__all__ = ["init", "hierarchical_all_reduce", "current_binding", "report", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "init":
        from .comm.context import init

        return init
    if name == "hierarchical_all_reduce":
        from .comm.allreduce import hierarchical_all_reduce

        return hierarchical_all_reduce
    if name == "current_binding":
        from .worker import current_binding

        return current_binding
    if name == "report":
        from .worker import report

        return report
    raise AttributeError(f"module 'numarun' has no attribute {name!r}")
