"""Distributed state inside a worker: ``init()``, hierarchical groups and all-reduce (docs/allreduce.md).

Submodules import torch; this package itself does not."""

from __future__ import annotations

from typing import Any

__all__ = ["init", "hierarchical_all_reduce", "apply_comm", "current_context"]


def __getattr__(name: str) -> Any:
    if name in ("init", "current_context"):
        from . import context

        return getattr(context, name)
    if name in ("hierarchical_all_reduce", "apply_comm"):
        from . import allreduce

        return getattr(allreduce, name)
    raise AttributeError(f"module 'numarun.comm' has no attribute {name!r}")
