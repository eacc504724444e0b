"""The first code each worker runs: apply this rank's binding, then run the user's program.

torchrun starts every worker as::

    python -u <numarun>/worker/entry.py [--module | --no-python] TARGET [args...]

(:mod:`numarun.worker.entry` loads this package by its own path, then calls :func:`main`)
with ``NUMARUN_PLAN`` naming the plan file and ``LOCAL_RANK`` set by torchrun. Before
the user's code is imported, the rank's environment variables, CPU affinity (every
thread) and memory policy are applied and read back; one INFO line per rank says what
was bound. Then the script runs in a fresh ``__main__`` module (``runpy.run_module`` for
``--module``) with ``sys.argv``, ``__file__`` and ``sys.path[0]`` as ``python script.py``
/ ``python -m`` would set them, so a torchrun script behaves
identically (``--no-python`` execs the program instead; affinity and memory policy
survive ``execve``).

A binding that cannot be applied (EPERM in a container, an offline CPU: EINVAL) warns
once and the rank continues unbound or partly bound, unless ``NUMARUN_STRICT_BINDING=1``:
then the worker prints one line and exits with code 2.

This module must not import torch: the user's script does, after the binding.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import logging
import os
import runpy
import sys
import types
from collections.abc import Mapping, MutableMapping, Sequence

from .. import envvars, ledger
from ..cpuset import format_list
from ..errors import BindingError, NumarunError
from ..plan.model import DERIVED_ENV, LaunchPlan, MemPolicy, RankBinding
from . import affinity, finish, hydra_pin, load_plan, rank_binding

# Not __name__: run with -m this module is "__main__", and so is the user's script.
log = logging.getLogger("numarun.worker.bootstrap")

_MPOL = {MemPolicy.BIND: affinity.Mpol.BIND, MemPolicy.PREFERRED: affinity.Mpol.PREFERRED}


def apply_env(
    binding: RankBinding, environ: MutableMapping[str, str]
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Set the rank's variables in ``environ``; returns (set, kept at the user's value)."""
    if envvars.USER_ENV in environ:
        keep = {k for k in environ[envvars.USER_ENV].split(",") if k}
    else:
        keep = {k for k in binding.env if k in environ}
    keep -= set(DERIVED_ENV)
    applied, kept = [], []
    for key, value in binding.env.items():
        if key in keep:
            kept.append(key)
            continue
        environ[key] = value
        applied.append((key, value))
    return tuple(applied), tuple(kept)


def apply_binding(
    binding: RankBinding, environ: MutableMapping[str, str] | None = None
) -> tuple[affinity.Readback, tuple[str, ...]]:
    """Apply env, CPU affinity and memory policy: (what the kernel says the process got, the binding steps that
    failed: () when everything was applied); never raises for a bind failure."""
    env = os.environ if environ is None else environ
    errors: list[str] = []
    apply_env(binding, env)

    wanted = set(binding.cpus)
    try:
        affinity.set_cpu_affinity(wanted)
    except OSError as e:
        errors.append(f"sched_setaffinity to cpus {format_list(wanted)} failed: {e.strerror}")
        # EPERM or no usable CPU at all (EINVAL): the rank keeps the launcher's CPUs.
    else:
        # The kernel silently drops offline/disallowed CPUs as long as one is left.
        missing = wanted - set(affinity.get_cpu_affinity())
        if missing:
            errors.append(
                f"sched_setaffinity: cpus {format_list(missing)} of {format_list(wanted)} are not usable here"
            )

    mode = _MPOL.get(binding.mem_policy)
    if mode is not None and binding.mems:
        try:
            affinity.set_mempolicy(mode, binding.mems)
        except OSError as e:
            errors.append(
                f"set_mempolicy {binding.mem_policy.value} to nodes {format_list(binding.mems)} failed: {e.strerror}"
            )

    return affinity.read_back(), tuple(errors)


def describe(binding: RankBinding, applied: affinity.Readback, environ: Mapping[str, str]) -> str:
    """``rank 0: gpu 0 (0000:18:00.0) cpus 0-13 mems 0 (bind) nic mlx5_0 OMP 14``."""
    rank = environ.get("RANK", str(binding.local_rank))
    who = f"rank {rank}" if rank == str(binding.local_rank) else f"rank {rank} (local {binding.local_rank})"
    gpu = f"gpu {binding.gpu.index} ({binding.gpu.pci_bus_id})" if binding.gpu else "gpu -"
    mode = "not bound" if binding.mem_policy is MemPolicy.NONE and applied.mem_policy == "?" else applied.mem_policy
    mems = f"{format_list(applied.mems) or '-'} ({mode})"
    omp = environ.get("OMP_NUM_THREADS", "-")
    return f"{who}: {gpu} cpus {format_list(applied.cpus)} mems {mems} nic {binding.nic or '-'} OMP {omp}"


def _setup_logging(environ: Mapping[str, str]) -> None:
    # Our own handler on our own logger: the user's logging.basicConfig() must still work.
    level = getattr(logging, environ.get(envvars.LOG_LEVEL, "INFO").upper(), logging.INFO)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("numarun: %(levelname)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def bind_from_env(environ: MutableMapping[str, str] | None = None) -> affinity.Readback | None:
    """Apply this worker's binding from the environment; None when no plan is given.

    Raises :class:`BindingError` on a failure when ``NUMARUN_STRICT_BINDING=1``.
    """
    env = os.environ if environ is None else environ
    plan = load_plan(env)
    if plan is None:
        log.debug("%s is not set: running unbound", envvars.PLAN)
        return None
    binding = rank_binding(plan, env)
    apply_mesh(plan, env)
    applied, errors = apply_binding(binding, env)
    if errors:
        what = "; ".join(errors)
        if env.get(envvars.STRICT_BINDING) == "1":
            raise BindingError(
                f"local rank {binding.local_rank}: {what} (binding asked for by {envvars.STRICT_BINDING}=1)"
            )
        log.warning("local rank %d: %s; continuing with cpus %s", binding.local_rank, what, format_list(applied.cpus))
    log.info(describe(binding, applied, env))
    return applied


def apply_mesh(plan: LaunchPlan, environ: MutableMapping[str, str]) -> None:
    """Name the plan's layout in the environment, each size known (``-1`` resolved with ``WORLD_SIZE``)."""
    if plan.mesh is None:
        return
    world, layout = environ.get("WORLD_SIZE", ""), plan.mesh.layout
    if layout.rest is not None and not world.isdigit():
        raise BindingError(
            f"bad WORLD_SIZE {world!r}: expected the job's rank count to size {layout.rest} of {layout.text}"
        )
    environ.update((layout.resolved(int(world)) if layout.rest is not None else layout).env())


def run_target(kind: str, target: str, args: Sequence[str]) -> None:
    """Run the user's program as ``python TARGET``, ``python -m TARGET`` or an executable."""
    sys.argv = [target, *args]  # for a module, run_module(alter_sys=True) puts its file in argv[0]
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "exec":
        os.execvp(target, sys.argv)
    else:
        # As 'python script.py': the script's directory, symlinks resolved, first on the path.
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        if os.path.isfile(target):
            _run_file(target)
        else:  # a directory or zip file with __main__.py
            runpy.run_path(target, run_name="__main__")


def _run_file(target: str) -> None:
    """Run a script file as ``python FILE`` does, in a fresh ``__main__`` module.

    Not ``runpy.run_path``: it sets ``sys.argv[0]`` to the path it is given, while Python
    keeps ``argv[0]`` as typed and makes ``__main__.__file__`` absolute (3.9+).
    """
    path = os.path.abspath(target)
    with io.open_code(path) as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __spec__=None,
    )
    # Kept registered afterwards, as Python keeps its __main__ (pickling, multiprocessing spawn).
    sys.modules["__main__"] = main_module
    exec(code, main_module.__dict__)


_KINDS = {"--module": "module", "-m": "module", "--no-python": "exec"}


def parse_argv(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """``[--module|--no-python] TARGET ARGS...`` -> (kind, target, args)."""
    kind = _KINDS.get(argv[0], "script") if argv else "script"
    argv = list(argv if kind == "script" else argv[1:])
    if not argv:
        raise BindingError(f"bad bootstrap arguments {argv!r}: expected [--module|--no-python] TARGET [ARGS...]")
    return kind, argv[0], argv[1:]


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def guard_launcher(environ: Mapping[str, str]) -> None:
    """Die with the launcher: a parent-death signal, then a check that it is still there.

    ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill this worker when its parent
    (numarun, which runs torchrun's agent in its main thread) exits, however it exits; the
    signal survives ``execve`` (``--no-python``). The launcher may have died before the call:
    then the parent is already someone else (init or a subreaper) and the worker ends now.
    """
    pid = environ.get(envvars.LAUNCHER_PID, "")
    if not pid.isdigit():
        return  # started by plain torchrun or by hand
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as e:  # not Linux
        log.warning("no parent-death signal: %s", e)
    if os.getppid() != int(pid):
        print(f"numarun: error: the launcher (pid {pid}) is gone; this worker ends", file=sys.stderr, flush=True)
        os._exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    _setup_logging(os.environ)
    guard_launcher(os.environ)
    # known to numarun from here on; a signal it forwarded before now is delivered here
    ledger.register(os.environ)
    announce_restart(os.environ)
    try:
        kind, target, args = parse_argv(sys.argv[1:] if argv is None else argv)
        applied = bind_from_env()
        if applied is not None:
            from . import binding_watch

            binding_watch.start_from_env(
                applied.cpus, applied.mems if applied.mem_policy in ("bind", "preferred") else (), os.environ
            )
        hydra_pin.install(os.environ)  # a user's Hydra app: one run dir for every rank
        if kind != "exec":  # an exec'd program keeps no handler: the dump signal would end it
            from . import phases, progress

            progress.install(os.environ)  # the hang watchdog's counters and sampler, before torch is imported
            phases.install(os.environ)  # the step report's recorder, beside them
    except NumarunError as e:
        print(f"numarun: error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    try:
        run_target(kind, target, args)
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:  # Ctrl-C: numarun's one line says it; the rank ends quietly, as interrupted
        finish(None, signum=2)  # SIGINT
    except BaseException as e:  # as an uncaught exception in 'python script.py'
        report_failure(e, os.environ)
        code = 1
    else:
        code = 0
    finish(code)


def announce_restart(environ: Mapping[str, str]) -> None:
    """One line per restart of the worker group (``--max-restarts``), from local rank 0 of each node.

    torchrun names the failed worker (its local rank, exit code and pid) at ERROR level but
    says that it restarts the group only at INFO, which numarun's default level hides.
    """
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restart.isdigit() and int(restart) > 0 and environ.get("LOCAL_RANK", "0") == "0":
        limit = environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
        node = environ.get("GROUP_RANK")
        where = f" of node {node}" if node and environ.get("WORLD_SIZE") != environ.get("LOCAL_WORLD_SIZE") else ""
        log.warning(
            "restart %s of %s (--max-restarts): the workers%s were started again after a failure", restart, limit, where
        )


_BOOTSTRAP = os.path.abspath(__file__)
_LOADERS = (
    "<frozen runpy>",
    "<frozen importlib._bootstrap>",
    "<frozen importlib._bootstrap_external>",
    os.path.abspath(runpy.__file__),
)


def _from_user_code(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` from the first frame after the bootstrap's last and after runpy's and importlib's that
    follow it (the CLI's too, in per-rank mode); ``tb`` itself when no user frame is left."""
    start, t = tb, tb
    while t is not None:
        if os.path.abspath(t.tb_frame.f_code.co_filename) == _BOOTSTRAP:
            start = t.tb_next
        t = t.tb_next
    while start is not None and start.tb_frame.f_code.co_filename in _LOADERS:
        start = start.tb_next
    return start or tb


def report_failure(e: BaseException, environ: Mapping[str, str]) -> None:
    """Print the traceback from the user's first frame through ``sys.excepthook``, as Python would
    (every exception of the chain), and name the exception in torchelastic's error file so the
    launcher's last line can say what failed."""
    import traceback

    x: BaseException | None = e
    seen: set[int] = set()
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        x.__traceback__ = _from_user_code(x.__traceback__)
        x = x.__cause__ or x.__context__
    text = "".join(traceback.format_exception(e))
    sys.excepthook(type(e), e, e.__traceback__)
    sys.stderr.flush()
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        from ..torch_private import record_error

        record_error(path, e, text)
