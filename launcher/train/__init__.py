"""numarun's reference trainer: MLP or small GPT, ddp / fsdp / hsdp / tp, Hydra-configured.

Run it under numarun (``numarun scripts/train.py parallel=fsdp model=gpt ...``): numarun
composes the config once and every rank reads ``$NUMARUN_CONFIG``. Without numarun
(``python scripts/train.py key=value ...`` or torchrun), rank 0 composes the config and
creates the run dir, and the other ranks read the file it saved.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main", "exit_now"]


def main(argv: Sequence[str] | None = None) -> int:
    """Train; returns the exit code (2 and one line on stderr for a configuration mistake)."""
    import os

    from ..errors import CheckpointError, NumarunError

    try:
        from .run import run

        return run(list(sys.argv[1:] if argv is None else argv))
    except NumarunError as e:
        # a checkpoint fault is the same on every rank: rank 0 says it once
        if not isinstance(e, CheckpointError) or os.environ.get("RANK", "0") == "0":
            print(f"numarun: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code


def exit_now(code: int) -> None:
    """Exit as Python would, without the module teardown that can abort a finished rank.

    See :func:`numarun.worker.bootstrap.finish`; used by the trainer's entry points so
    that the trainer run under plain torchrun or python exits the same way.
    """
    from ..worker import finish

    finish(code)
