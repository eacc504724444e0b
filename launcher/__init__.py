"""numarun: a topology-aware launcher for PyTorch distributed training.

``import launcher`` stays light (no torch import): ``init`` and
``hierarchical_all_reduce`` are loaded on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["init", "hierarchical_all_reduce", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "init":
        from .dist.context import init

        return init
    if name == "hierarchical_all_reduce":
        from .dist.allreduce import hierarchical_all_reduce

        return hierarchical_all_reduce
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
