"""``numarun run --preflight`` / ``numarun submit --preflight``: the doctor on every node, with the job's own flags.

Node 0's store listens one port above the job's rendezvous port, closed before torchrun's own starts.
"""

from __future__ import annotations

import logging
import os
import sys

from ..errors import PreflightFailed
from ..options.launch import LaunchOptions
from .diagnose import Settings, diagnose

log = logging.getLogger(__name__)

PORT_OFFSET = 1


def preflight(options: LaunchOptions, settings: Settings) -> None:
    """The doctor on every node with the job's launch options, settled, and the doctor's ``settings``; returns when
    no node has an error (the job may start), else prints why and raises :class:`PreflightFailed`."""
    from .render import render

    # a static rendezvous: --master-addr/--master-port name node 0
    result = diagnose(options, settings, port_offset=PORT_OFFSET, endpoint=str(options.rdzv_backend) != "static")
    node0 = result.get("node_rank", 0) == 0
    # node 0's verdict counts every node's findings; the others receive it without the per-node detail
    counts = result.get("counts") or {
        s: sum(1 for f in result["findings"] if f["severity"] == s) for s in ("error", "warn")
    }
    if result["ok"]:
        print(
            f"numarun: preflight: no errors, {counts['warn']} warnings ('numarun doctor' shows them)",
            file=sys.stderr,
            flush=True,
        )
        return
    if node0:
        sys.stderr.write(render(result))
    exclude = result.get("exclude") or ""
    if os.environ.get("SLURM_JOB_ID") and exclude:
        print(
            f"numarun: preflight: leave out node(s) {exclude}: resubmit with "
            f"'numarun submit --sbatch-option=--exclude={exclude} ...'",
            file=sys.stderr,
            flush=True,
        )
    raise PreflightFailed(f"preflight found {counts['error'] or 'node'} error(s): the job was not started")
