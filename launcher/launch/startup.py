"""Start-up work the launcher process need not pay for: two costs torchrun pays on every launch.

* **Garbage collection while torch is imported.** ``import torch`` creates a few hundred
  thousand objects, and CPython's cyclic collector walks all of them again and again as
  they pile up (about a fifth of the import on a small host). :func:`import_torchrun`
  imports ``torch.distributed.run`` with the collector paused, then moves what it created
  into the permanent generation (``gc.freeze``), so later collections in this long-lived
  process skip torch's modules too. Only the launcher does this: workers run the user's
  program with the interpreter's defaults.
* **``inspect.stack()`` in the rendezvous.** torchrun's dynamic rendezvous names each
  recorded event after the calling method with ``inspect.stack()``, which reads every
  frame's source file and searches ``sys.modules`` for its module, twice per event.
  :func:`install` swaps in the same lookup by frame depth (``sys._getframe``); the events,
  their names and where they are logged stay torchrun's.

``scripts/bench_launch.py`` measures the launch against plain torchrun.
"""

from __future__ import annotations

import gc
import sys
import types
from typing import Any


def import_torchrun() -> types.ModuleType:
    """``torch.distributed.run``, imported with the cyclic collector paused, then frozen."""
    if "torch.distributed.run" in sys.modules:
        return sys.modules["torch.distributed.run"]
    enabled = gc.isenabled()
    gc.disable()
    try:
        import torch.distributed.run as run
    finally:
        if enabled:
            gc.freeze()
            gc.enable()
    return run


def method_name(depth: int = 2) -> str:
    """The name of the function ``depth`` frames up from this one, as
    ``inspect.stack()[depth].function`` gives it (``no_method_name`` past the outermost)."""
    frame: types.FrameType | None = sys._getframe(0)
    for _ in range(depth):
        frame = frame.f_back if frame is not None else None
    return frame.f_code.co_name if frame is not None else "no_method_name"


def install(module: Any | None = None) -> bool:
    """Replace ``get_method_name`` in torchrun's dynamic rendezvous module (or ``module``);
    False when that torch has no such function (nothing is changed then)."""
    target: Any = module
    if target is None:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as target
    if getattr(target, "get_method_name", None) is None:
        return False
    target.get_method_name = method_name
    return True
