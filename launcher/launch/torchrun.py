"""A LaunchPlan handed to torchrun: the option parser, the argv as data, and the run.

``numarun [run] [torchrun options] SCRIPT|-m MODULE [args...]`` parses torchrun's own
options with torchrun's own parser (``torch.distributed.run.get_args_parser``, so every
spelling torchrun accepts is accepted), adds numarun's, and calls
``torch.distributed.run.main(argv)`` with an argv whose entrypoint is this package's
worker bootstrap::

    torchrun --nproc-per-node=2 ... <numarun>/launch/entry.py [--module] SCRIPT ARGS...

Rendezvous, restarts, log redirection and signal forwarding stay torchrun's. The argv is
built first as a value (:func:`build_torchrun_argv`) so ``--dry-run`` prints exactly
what would run.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shlex
import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import NumarunError, UsageError
from ..plan.model import LaunchPlan
from ..envvars import PLAN as PLAN_ENV
from ..envvars import STRICT_BINDING as STRICT_ENV
from ..envvars import USER_ENV

ENTRY_FILE = str(Path(__file__).resolve().with_name("entry.py"))
"""The worker entry point, run by path so that nothing on ``sys.path`` can shadow it."""

# torchrun options numarun replaces or cannot honour.
_REPLACED = {"nproc_per_node", "numa_binding", "module", "no_python", "training_script", "training_script_args", "help"}


def torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's own parser (imports torch)."""
    from torch.distributed.run import get_args_parser

    return get_args_parser()


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """numarun's own ``run`` options, next to torchrun's and the planning ones."""
    group = parser.add_argument_group("numarun")
    group.add_argument("--dry-run", action="store_true", help="print the plan and the equivalent torchrun command; run nothing")
    group.add_argument(
        "--strict-binding", action="store_true",
        help=f"a rank whose binding cannot be applied fails instead of running unbound (sets {STRICT_ENV}=1)",
    )
    group.add_argument("--plan-file", metavar="PATH", default=None, help="use this saved plan ('numarun plan --json' output) instead of planning")


@dataclass(frozen=True)
class Target:
    """What each worker runs after the bootstrap."""

    kind: str
    """``script`` (python SCRIPT), ``module`` (python -m MODULE) or ``exec`` (--no-python)."""
    name: str
    args: tuple[str, ...] = ()

    def bootstrap_args(self) -> list[str]:
        flag = {"module": ["--module"], "exec": ["--no-python"]}.get(self.kind, [])
        return [*flag, self.name, *self.args]


def target_from_args(args: argparse.Namespace) -> Target:
    """The user's program from torchrun's positional/flag options; checks it exists."""
    if getattr(args, "run_path", False):
        raise UsageError("bad option '--run-path': numarun runs each worker in its own process to bind it; expected it left out")
    if getattr(args, "virtual_local_rank", False):
        raise UsageError("bad option '--virtual-local-rank': every rank would read local rank 0's binding; expected it left out")
    name = args.training_script
    script_args = tuple(args.training_script_args)
    if args.module and args.no_python:
        raise UsageError("bad options '--module' with '--no-python': expected at most one of them")
    if args.module:
        return Target("module", name, script_args)
    if args.no_python:
        if shutil.which(name) is None:
            raise UsageError(f"bad program {name!r}: not found or not executable; expected a program on PATH or a path to one")
        return Target("exec", name, script_args)
    if not os.path.isfile(name):
        raise UsageError(f"bad script {name!r}: no such file; expected a path to a Python script (or -m MODULE)")
    return Target("script", name, script_args)


# torch's registered rendezvous backends (torch.distributed.elastic.rendezvous.registry).
RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")


def check_torchrun_options(options: Mapping[str, Any]) -> None:
    """Refuse values torchrun would only reject later with a traceback (``--nnodes 0``...)."""
    nnodes = str(options.get("nnodes", "1"))
    parts = nnodes.split(":")
    form = "N or MIN:MAX with 1 <= MIN <= MAX, e.g. 2 or 1:4"
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"bad --nnodes {nnodes!r}: expected {form}")
    low, high = int(parts[0]), int(parts[-1])
    if not 1 <= low <= high:
        raise UsageError(f"bad --nnodes {nnodes!r}: expected {form}")
    backend = options.get("rdzv_backend", "static")
    if backend not in RDZV_BACKENDS:
        raise UsageError(f"bad --rdzv-backend {backend!r}: expected one of {', '.join(RDZV_BACKENDS)}")


def _option_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        # torchrun's comma_separated_list reads ",," as a literal comma
        return ",".join(str(v).replace(",", ",,") for v in value)
    return str(value)


def build_torchrun_argv(
    options: Mapping[str, Any], *, nproc_per_node: int, target: Target, parser: argparse.ArgumentParser | None = None
) -> list[str]:
    """torchrun's argv (without the program name) for ``options`` (torchrun dests -> values).

    An option is written, in its first long spelling, only when it differs from
    torchrun's default; ``--nproc-per-node`` is always the plan's rank count. The
    entrypoint is the worker entry file (:mod:`numarun.launch.entry`) with the user's
    target behind it.
    """
    parser = parser or torchrun_parser()
    check_torchrun_options(options)
    argv = [f"--nproc-per-node={nproc_per_node}"]
    for action in parser._actions:  # noqa: SLF001  (torchrun exposes no other listing)
        if not action.option_strings or action.dest in _REPLACED or action.dest not in options:
            continue
        value = options[action.dest]
        if value == action.default or value is None:
            continue
        spelling = next(s for s in action.option_strings if s.startswith("--"))
        if action.nargs == 0:
            if value:
                argv.append(spelling)
        else:
            argv.append(f"{spelling}={_option_text(value)}")
    argv += [ENTRY_FILE, *target.bootstrap_args()]
    return argv


def worker_env(plan: LaunchPlan, environ: Mapping[str, str], *, plan_path: str, strict: bool) -> dict[str, str]:
    """Variables numarun adds to its own environment for torchrun to pass to every worker."""
    planned = {k for r in plan.ranks for k in r.env}
    user_set = sorted(k for k in planned if k in environ)
    env = {PLAN_ENV: plan_path, USER_ENV: ",".join(user_set)}
    if strict:
        env[STRICT_ENV] = "1"
    # torchrun forces OMP_NUM_THREADS=1 (with a warning) when unset; the bootstrap sets each
    # rank's own value anyway, so pass rank 0's to keep torchrun from overriding it.
    if "OMP_NUM_THREADS" not in environ and plan.ranks and "OMP_NUM_THREADS" in plan.ranks[0].env:
        env["OMP_NUM_THREADS"] = plan.ranks[0].env["OMP_NUM_THREADS"]
    return env


def command_line(env: Mapping[str, str], argv: Sequence[str]) -> str:
    """The equivalent shell command: ``NUMARUN_PLAN=... torchrun ...``."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return " ".join([*prefix, shlex.join(["torchrun", *argv])])


def write_plan_file(plan: LaunchPlan, run_dir: "os.PathLike[str] | str | None" = None) -> Path:
    """The plan as a file (mode 0600) for the workers.

    In ``run_dir`` when the job has one (kept there as the record of how it ran), else in
    a fresh private directory (0700) removed when numarun exits.
    """
    if run_dir is not None:
        path = Path(run_dir) / "numarun_plan.json"
        path.unlink(missing_ok=True)  # a restarted job: write it afresh with our mode
    else:
        directory = tempfile.mkdtemp(prefix="numarun-")
        atexit.register(shutil.rmtree, directory, True)
        path = Path(directory) / "plan.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(plan.to_json())
    return path


def options_endpoint(argv: Sequence[str]) -> str:
    """The ``--rdzv-endpoint`` value in a torchrun argv ('' when absent)."""
    for a in argv:
        if a.startswith("--rdzv-endpoint="):
            return a.split("=", 1)[1]
    return ""


def failure_cause(failure: Any) -> str:
    """``ValueError: boom`` from a failed worker's torchelastic error file ('' when it wrote none)."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    if not isinstance(message, str) or not message or message.startswith(("To enable traceback", "Signal ")):
        return ""  # torchelastic's own placeholder: the worker wrote no error file
    return message.splitlines()[0]


class RunFailed(NumarunError):
    """A worker failed (its exit code is the run's) or numarun was stopped by a signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run_torchrun(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """``torch.distributed.run.main(argv)`` with ``env`` added; failures become :class:`RunFailed`.

    A failed run exits with the exit code of the lowest global rank that exited non-zero
    (1 when every failed rank died from a signal); SIGTERM/SIGINT/... to numarun stops every worker
    (torchrun's own handling) and exits 128 + the signal number.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun_main

    # Restored afterwards: a sweep runs several jobs from one numarun, and a variable left
    # by one job (torchrun's OMP_NUM_THREADS too) must not look user-set to the next.
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        torchrun_main(list(argv))
    except ChildFailedError as e:
        parts = []
        for rank in sorted(e.failures):
            f = e.failures[rank]
            how = f"exited with code {f.exitcode}" if f.exitcode >= 0 else f"was killed by {f.signal_name()}"
            cause = failure_cause(f)
            who = f"rank {rank} (local rank {f.local_rank}, pid {f.pid})"
            parts.append(f"{who} failed: {cause} ({how})" if cause else f"{who} {how}")
        # Ranks torchrun itself stopped after the first failure show up killed by a signal:
        # the run's code is that of the lowest rank that exited on its own.
        codes = [e.failures[r].exitcode for r in sorted(e.failures) if e.failures[r].exitcode > 0]
        raise RunFailed("; ".join(parts), codes[0] if codes else 1) from None
    except RendezvousError as e:
        # A node (or the one hosting the c10d store) went away, or the endpoint is unreachable.
        first = str(e).splitlines()[0] if str(e) else ""
        raise RunFailed(
            f"rendezvous failed: {type(e).__name__}: {first} (a node was lost or the rendezvous endpoint "
            f"{options_endpoint(argv)!r} is unreachable); expected every node to stay up and reach it",
            1,
        ) from None
    except SignalException as e:
        sig = signal.Signals(e.sigval)
        raise RunFailed(f"stopped by {sig.name}; all workers were ended", 128 + int(sig)) from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
