"""Distributed state inside a worker: ``init()``, hierarchical groups and all-reduce (docs/allreduce.md).

Submodules import torch; this package itself does not."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["init", "hierarchical_all_reduce", "apply_comm", "current_context"]


_HOME = {
    "init": "context",
    "current_context": "context",
    "hierarchical_all_reduce": "allreduce",
    "apply_comm": "allreduce",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'numarun.comm' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
