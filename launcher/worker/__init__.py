"""The worker-side API: what a rank started by numarun can ask about itself.

``numarun.current_binding()`` is this rank's :class:`~numarun.plan.model.RankBinding`
(None outside numarun); :func:`report` tells ``numarun tune`` how much work a run did;
:func:`finish` leaves the process as Python would, without the
module teardown that can abort a finished gloo rank. No torch import.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from .. import envvars
from ..errors import BindingError
from ..plan.model import LaunchPlan, RankBinding


def load_plan(environ: Mapping[str, str] | None = None) -> LaunchPlan | None:
    """The plan named by ``NUMARUN_PLAN`` (a file), else held by ``NUMARUN_PLAN_JSON`` (a rank the
    scheduler started, per-rank mode); None when neither is set."""
    env = os.environ if environ is None else environ
    path = env.get(envvars.PLAN)
    if not path:
        inline = env.get(envvars.PLAN_JSON)
        return LaunchPlan.from_json(inline, origin=envvars.PLAN_JSON) if inline else None
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise BindingError(
            f"bad {envvars.PLAN} {path!r}: {e.strerror}; expected a plan file written by numarun"
        ) from None
    return LaunchPlan.from_json(text, origin=path)


def current_binding(environ: Mapping[str, str] | None = None) -> RankBinding | None:
    """This worker's RankBinding (``NUMARUN_PLAN`` + ``LOCAL_RANK``); None outside numarun."""
    env = os.environ if environ is None else environ
    plan = load_plan(env)
    return None if plan is None else rank_binding(plan, env)


def rank_binding(plan: LaunchPlan, environ: Mapping[str, str]) -> RankBinding:
    """The row of ``plan`` for this worker's ``LOCAL_RANK``."""
    local_rank = environ.get("LOCAL_RANK", "")
    if not local_rank.isdigit():
        raise BindingError(f"bad LOCAL_RANK {local_rank!r}: expected a non-negative integer set by torchrun")
    return plan.rank(int(local_rank))


_last_report = time.monotonic()  # the bootstrap imports this module before the user's script


def report(*, samples: float, seconds: float | None = None) -> None:
    """Record that this rank processed ``samples`` samples in ``seconds`` (default: since the
    previous call, or since the worker started). ``numarun tune`` ranks candidates by the job's
    samples/s (each rank's samples over its seconds, summed over ranks); outside a tune this
    does nothing. One ``O_APPEND`` write per call, so ranks never interleave a line."""
    global _last_report
    now = time.monotonic()
    elapsed = now - _last_report if seconds is None else float(seconds)
    _last_report = now
    path = os.environ.get(envvars.REPORT)
    if not path:
        return
    line = json.dumps({"rank": os.environ.get("RANK", "0"), "samples": float(samples), "seconds": elapsed}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def finish(code: object, *, signum: int = 0) -> NoReturn:
    """Leave as Python would after the script ends, minus module teardown (``signum``: then die of
    that signal, as Python does after an uncaught KeyboardInterrupt, less its traceback).

    In the interpreter's order, while it is whole: non-daemon threads joined, atexit handlers run, the
    script's objects dropped and collected. The module teardown is skipped (``os._exit``): a DDP reducer
    or gloo work destroyed there can abort a rank that finished fine (SIGABRT, a few runs in a hundred
    with torch 2.13's gloo). ``NUMARUN_FULL_EXIT=1`` keeps the plain exit.
    """
    import atexit
    import gc
    import threading

    if signum:
        status = 128 + signum
    elif code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        status = 1
    # Read by numarun after a SIGTERM: every rank ending with 0 on its own is a clean stop.
    from ..ledger import record_exit

    record_exit(os.environ, status)
    if os.environ.get(envvars.FULL_EXIT) == "1" and not signum:
        sys.exit(status)
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    from ..ledger import SIDECAR_WAIT_S, await_sidecar

    await_sidecar(os.environ, SIDECAR_WAIT_S)  # per-rank mode's first task: its node's agent ends first
    main_module = sys.modules.get("__main__")
    if main_module is not None and main_module.__dict__ is not globals():
        main_module.__dict__.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(OSError, ValueError):
            if stream is not None:
                stream.flush()
    if signum:
        import signal

        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(status & 0xFF)
