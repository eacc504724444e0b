"""numarun's reference trainer: MLP or small GPT, ddp / fsdp / hsdp / tp, Hydra-configured.

Under numarun every rank reads the config numarun composed once (``$NUMARUN_CONFIG``); under plain torchrun
or python, rank 0 composes it and creates the run dir, and the others read the file it saved.
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
        from .entry import run

        return run(list(sys.argv[1:] if argv is None else argv))
    except NumarunError as e:
        # a checkpoint fault is the same on every rank: rank 0 says it once
        if not isinstance(e, CheckpointError) or os.environ.get("RANK", "0") == "0":
            print(e.line(), file=sys.stderr, flush=True)
        return e.exit_code


def exit_now(code: int) -> None:
    """Exit as Python would, without the teardown that can abort a finished rank (:func:`numarun.worker.finish`)."""
    from ..worker import finish

    finish(code)
