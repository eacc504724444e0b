"""Checkpoints with ``torch.distributed.checkpoint`` (sharded: works for DDP, FSDP2, HSDP, TP).

Layout: ``<dir>/step_00000010/`` holds the DCP files and ``meta.json`` (step, world size,
parallel mode). A save goes to ``<dir>/.step_00000010.tmp`` first; rank 0 renames it when
every rank has written, so a killed job never leaves a half-written ``step_*`` behind.
The directory must be shared by all nodes. RNG and data position need no saving: batches
and dropout seeds are functions of the step (see ``numarun.train.data``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def latest(root: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root`` (one with meta.json), or None."""
    best: tuple[int, Path] | None = None
    if not root.is_dir():
        return None
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / "meta.json").is_file():
            step = int(m.group(1))
            if best is None or step > best[0]:
                best = (step, child)
    return best


def save(root: Path, step: int, model: Any, optimizer: Any, *, meta: dict[str, Any], rank: int) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint dir."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    dist.barrier()
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps({"step": step, **meta}, indent=1) + "\n")
        # Re-saving a step (a signal at a checkpoint step): move the old copy aside with a
        # rename first, so a kill never leaves a half-deleted step_* that latest() would pick.
        old = root / f".{final.name}.old"
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint saved: %s", final)
    dist.barrier()
    return final


def load(path: Path, model: Any, optimizer: Any) -> int:
    """Collective: load model and optimizer state in place; returns the saved step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = json.loads((path / "meta.json").read_text())
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(meta["step"])
