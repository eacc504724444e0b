"""Worker side of a user's Hydra app under numarun: one run dir for every rank, Hydra's files once.

A ``@hydra.main`` app runs in every rank exactly as Hydra runs it: the script is imported
as its author wrote it and Hydra composes, picks the run dir and configures logging (each
job of a sweep runs Hydra's job runner in its ranks the same way: :mod:`numarun.sweep.job`).
Under plain torchrun the ranks disagree on one input only, the clock behind ``${now:}``: two
ranks started a second apart get two timestamped run dirs. numarun fixes the clock once, in
the launcher (``NUMARUN_HYDRA_NOW``), so every rank's Hydra computes the same dirs from the
same config; on several nodes, whose launchers start apart, the ranks take the first rank's
value through the job's store (:func:`agreed_now`); in per-rank mode, rank 0's through the ranks'
exchange (:func:`numarun.launch.rank.agree`). Rank 0 alone writes ``.hydra/``; the
other ranks' Hydra skips those writes, so a file is never written by two processes at once.
Hydra's job log (``<job>.log``) keeps every rank's lines, as under torchrun.

The hook (:func:`numarun.hydra_internals.worker_hook`, with every other use of Hydra's
private parts) is installed when Hydra's module is first imported, so a script that never
imports Hydra pays nothing, and one that imports it indirectly is covered too.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Mapping

from .. import envvars, hydra_internals
from .progress import after_import

# under the bootstrap's logger, which has the worker's "numarun: LEVEL:" handler
log = logging.getLogger("numarun.worker.bootstrap.hydra_pin")


AGREE_TIMEOUT_S = 60.0
"""How long a rank waits for the job's store to agree on the clock before keeping its own."""


def agreed_now(value: str, environ: Mapping[str, str]) -> str:
    """The clock every rank of the job uses: the first rank's ``value`` through the job's store.

    Each node's launcher fixes the clock when it starts, and nodes start seconds apart unless
    something hands them one value (``numarun submit`` does). On a job of several nodes the
    ranks agree through torchrun's store instead (the rendezvous store on MASTER_ADDR:PORT):
    the first rank to get there sets the key, every other rank reads it. One node, or no
    store reachable within :data:`AGREE_TIMEOUT_S`: ``value`` (with a warning for the latter).
    """
    try:
        nodes = int(environ.get("GROUP_WORLD_SIZE", "1"))
    except ValueError:
        nodes = 1
    host, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if nodes <= 1 or not host or not port or environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False":
        # no agent's store to agree through (a rank the scheduler started): the value is the job's own
        return value
    try:
        import torch.distributed as dist

        store = dist.TCPStore(host, int(port), is_master=False, timeout=_dt.timedelta(seconds=AGREE_TIMEOUT_S))
        # one key for the whole launch: the store outlives worker restarts, so a restarted job
        # keeps the run dir it started in
        key = f"numarun/hydra_now/{environ.get('TORCHELASTIC_RUN_ID', '')}"
        got = store.compare_set(key, "", value)
        return got.decode() if isinstance(got, bytes) else str(got)
    except Exception as e:  # the job still runs; nodes may then pick different run dirs
        log.warning(
            "could not agree on Hydra's clock with the other nodes through %s:%s (%s); using this node's", host, port, e
        )
        return value


def install(environ: Mapping[str, str]) -> bool:
    """Pin Hydra's clock (and, off rank 0, its file writes) when the launcher asked for it."""
    value = environ.get(envvars.HYDRA_NOW)
    if not value:
        return False
    value = agreed_now(value, environ)
    try:
        when = _dt.datetime.fromisoformat(value)
    except ValueError:
        return False
    # patched in place if already imported (a sitecustomize, say), else right after its import
    after_import(
        hydra_internals.WORKER_MODULE, hydra_internals.worker_hook(when, writer=environ.get("RANK", "0") == "0")
    )
    return True
