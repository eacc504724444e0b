"""Worker entry: find the job config (``NUMARUN_CONFIG`` or compose it on rank 0), train."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .. import envvars
from ..config.schema import load_job_config
from ..errors import ConfigError

log = logging.getLogger(__name__)


def _config_without_numarun(overrides: list[str], rank: int) -> Path:
    """Rank 0 composes and saves; the others receive the saved file's path (one run dir, no drift)."""
    path = [""]
    if rank == 0:
        from ..config.compose import prepare_launch
        from .preflight import check_prepared

        path = [str(prepare_launch(overrides, check_prepared).config_file)]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(path, src=0)
    return Path(path[0])


def hydra_task(cfg: Any) -> int:
    """The trainer as the task of the Hydra job each rank runs (``hydra/launcher=numarun``): rank 0 saves
    the resolved ``config.yaml`` in the run dir Hydra made, every rank trains on the same config."""
    from ..config.files import running_job, save_job

    job = running_job(cfg)
    if os.environ.get("RANK", "0") == "0":
        save_job(job)
    return run([], job.config, job.run_dir)


def run(argv: list[str], job_cfg: Any = None, job_dir: Path | None = None) -> int:
    from ..launch.signals import Requests
    from .loop import STOP_SIGNALS, Trainer, init_context

    stops = Requests(STOP_SIGNALS)  # recorded from here on; the training loop reads them after each step
    env_config = None if job_cfg is not None else os.environ.get(envvars.CONFIG)
    if env_config and argv:
        log.warning("%s is set: ignoring command-line overrides %s", envvars.CONFIG, argv)
    cfg = load_job_config(env_config) if env_config else job_cfg  # checked before any process group is made
    ctx = init_context()
    try:
        if env_config:
            job_dir = Path(os.environ.get(envvars.RUN_DIR) or Path(env_config).parent)
        elif cfg is None:
            config_file = _config_without_numarun(argv, ctx.rank)
            cfg, job_dir = load_job_config(config_file), Path(os.environ.get(envvars.RUN_DIR) or config_file.parent)
        if job_dir is None or not job_dir.is_dir():
            raise ConfigError(f"bad {envvars.RUN_DIR} {str(job_dir)!r}: expected an existing run directory")
        code = Trainer(cfg, job_dir, ctx, stops).run()
        if dist.is_initialized() and dist.get_world_size() > 1:
            # Every rank past its last collective before any rank tears its sockets down:
            # a peer that closes while another still waits on it aborts that one (SIGABRT).
            dist.barrier()
        return code
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
