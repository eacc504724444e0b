"""What a rank tells numarun's hang watchdog: whether it moves, and where it stands (docs/hangs.md).

Installed by the bootstrap before the user's code is imported (:func:`install`), in three parts:

* **counters**: torch.distributed's collectives are wrapped as ``torch.distributed.distributed_c10d`` finishes
  loading (a post-import hook: ``torch.distributed`` then copies the wrapped functions with its ``import *``), so
  every collective a rank enters or leaves, through any name, counts; so does every optimizer step (torch's global
  post-step hook). torch 2.13 keeps the process groups' sequence numbers out of Python; these counts stand in for
  them. The collective the main thread is inside is kept too: the roll-call says a rank *waits* in it;
* **a sampler thread** (``numarun-hangs``) every ``NUMARUN_HANG_SAMPLE`` seconds reads the counters and the main
  thread's stack (``sys._current_frames``) and rewrites ``progress.<local rank>`` in numarun's private directory:
  when the counters last moved, when the stack last changed, and the stack itself. A stack alone cannot tell a
  blocked rank from a healthy loop that spends most of its time at one line (a sleep, a long all-reduce); the
  counters can. No torch import here: the counters are wrapped when the user's code imports torch;
* **a dump handler**: ``faulthandler`` writes every thread's Python stack to ``stacks.<local rank>`` when numarun
  sends :data:`DUMP_SIGNAL`, from a C-level handler: it answers while the main thread is blocked in C code or a
  thread holds the GIL, and needs no ptrace (containers rarely allow it);
* **helpers' dump handlers**: every ``multiprocessing`` child a rank starts (a DataLoader worker, a checkpoint
  writer, a process pool's worker), whatever its start method (fork, spawn, forkserver), runs its target through
  :func:`run_helper`, which registers the same handler writing to ``helper.<local rank>.<pid>`` (the target is
  wrapped as the parent starts the process: a spawned child unpickles the wrapper and so imports this module). The
  roll-call then shows where a rank's workers stand, not only that its main thread waits for them.

The heartbeat format (:data:`FORMAT`) is read by :mod:`numarun.launch.hangs`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import importlib.abc
import importlib.machinery
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import envvars
from ..fsutil import write_atomic

log = logging.getLogger("numarun.worker.bootstrap.progress")

FORMAT = 1
"""Of the heartbeat file; bumped when a field changes meaning."""
DUMP_SIGNAL = signal.SIGRTMIN + 6
"""A real-time signal nothing else in a training process uses; sent only to ranks whose heartbeat says the handler is
in."""
HEARTBEAT = "progress.{local_rank}"
STACKS = "stacks.{local_rank}"
HELPER = "helper.{local_rank}.{pid}"
"""A helper process's dump file; its first line is :data:`HELPER_HEAD` and JSON saying what it is."""
HELPER_HEAD = "# numarun helper "
MAX_FRAMES = 80
"""Frames of the main thread kept in a heartbeat: the innermost 60 and the outermost 20 (a recursion is cut in the
middle)."""

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_coalesced",
    "all_reduce_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "send_object_list",
    "recv_object_list",
    "_all_gather_base",
    "_reduce_scatter_base",
)
"""torch.distributed's functions that talk to other ranks (``distributed_c10d.__all__`` of torch 2.13, and the two
deprecated base forms still called by older libraries); those a torch version lacks are skipped."""
C10D = "torch.distributed.distributed_c10d"
OPTIMIZER = "torch.optim.optimizer"


class Counters:
    """Events of this process (collectives entered and left, optimizer steps) and the collective each thread is in.

    Plain integers under the GIL: a wrapped collective costs two additions and two dict writes."""

    def __init__(self) -> None:
        self.events = 0
        self.collectives = 0
        self.steps = 0
        self.inside: dict[int, str] = {}  # thread ident -> the outermost collective it is in
        self.comm_s = 0.0
        """Seconds the main thread spent inside collectives (the outermost call), for the step report."""
        self.timed: Callable[[str, bool], None] | None = None
        """Told ``(name, entering)`` around each outermost collective of the main thread, when set (the step
        report's GPU events)."""
        self.clock: Callable[[], float] = time.perf_counter

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` counting its calls; under torch.compile the original is called (dynamo remaps the wrapped name)."""
        inside = self.inside
        get_ident = threading.get_ident
        clock = self.clock
        main = threading.main_thread().ident
        compiling = [_is_compiling]  # torch's own check once torch is whole: a call, not a module lookup, each time

        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            check = compiling[0]
            if check is _is_compiling:
                compiler = getattr(sys.modules.get("torch"), "compiler", None)
                check = compiling[0] = getattr(compiler, "is_compiling", None) or _is_compiling
            if check():
                return fn(*args, **kwargs)
            me = get_ident()
            outer = me not in inside
            timed = outer and me == main
            if outer:
                inside[me] = name
            self.events += 1
            self.collectives += 1
            if timed and self.timed is not None:
                self.timed(name, True)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.events += 1
                if outer:
                    inside.pop(me, None)
                if timed:
                    self.comm_s += clock() - t0
                    if self.timed is not None:
                        self.timed(name, False)

        return collective

    def step(self, *args: Any) -> None:
        """torch's global optimizer post-step hook."""
        self.events += 1
        self.steps += 1


COUNTERS = Counters()


def _is_compiling() -> bool:
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return bool(check()) if check is not None else False


def wrap_once(owner: Any, name: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """``owner.name`` replaced by ``wrapper(it)``, marked (``__numarun_wrapped__``: the original) so that it is
    wrapped once; False when there is none or it is wrapped already."""
    fn = getattr(owner, name, None)
    if not callable(fn) or hasattr(fn, "__numarun_wrapped__"):
        return False
    wrapped = wrapper(fn)
    wrapped.__numarun_wrapped__ = fn  # type: ignore[attr-defined]
    setattr(owner, name, wrapped)
    return True


def patch_c10d(module: ModuleType, counters: Counters = COUNTERS) -> list[str]:
    """Wrap the collectives of ``distributed_c10d`` (and ``torch.distributed``'s copies, if already made); returns
    the names wrapped. Idempotent."""
    done = []
    package = sys.modules.get("torch.distributed")
    for name in COLLECTIVES:
        fn = getattr(module, name, None)
        if wrap_once(module, name, functools.partial(counters.wrap, name)):
            if package is not None and getattr(package, name, None) is fn:
                setattr(package, name, getattr(module, name))
            done.append(name)
    return done


def patch_optimizer(module: ModuleType, counters: Counters = COUNTERS) -> bool:
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is None or getattr(module, "__numarun_counted__", False):
        return False
    register(counters.step)
    module.__numarun_counted__ = True  # type: ignore[attr-defined]
    return True


MULTIPROCESSING = "multiprocessing.process"


class _After(importlib.abc.Loader):
    """A module's own loader, then each of ``then`` on the module once it has run (before whoever imported it goes
    on)."""

    def __init__(self, loader: Any, then: Sequence[Callable[[ModuleType], object]]) -> None:
        self._loader, self._then = loader, tuple(then)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader  # linecache, inspect and pickle see the real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        for then in self._then:
            _patch(then, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _patch(then: Callable[[ModuleType], object], module: ModuleType) -> None:
    try:
        then(module)
    except Exception as e:  # never break the user's import for a count
        log.debug("%s not patched after its import: %s", module.__name__, e)


class _PostImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands the modules it waits for to :class:`_After`; leaves the path when none is left."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[ModuleType], object]]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        then = self.pending.pop(fullname, None)
        if then is None:
            return None
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _After(spec.loader, then)
        return spec


_post_import = _PostImport()


def after_import(name: str, then: Callable[[ModuleType], object]) -> None:
    """``then(module)`` once the module ``name`` has loaded: now if it has, else as soon as someone imports it
    (one finder for every module waited for, so that two features may wait for the same one)."""
    module = sys.modules.get(name)
    if module is not None:
        _patch(then, module)
        return
    _post_import.pending.setdefault(name, []).append(then)
    if _post_import not in sys.meta_path:
        sys.meta_path.insert(0, _post_import)


def install_counters() -> None:
    """Count collectives and optimizer steps from now on: at once for modules already imported, else as they are.
    Idempotent, as the patches are (the hang watchdog and the step report both ask)."""
    after_import(C10D, patch_c10d)
    after_import(OPTIMIZER, patch_optimizer)


# ----------------------------------------------------------------------------- helper processes

_helper_dump: Any = None  # the helper's dump file, kept open for faulthandler


def helper_label(target: Any, args: Sequence[Any], kwargs: Mapping[str, Any], name: str) -> str:
    """What a multiprocessing child is, for the roll-call: ``DataLoader worker 1``, ``process 'ckpt-writer'``."""
    if getattr(target, "__name__", "") == "_worker_loop" and str(getattr(target, "__module__", "")).startswith(
        "torch.utils.data"
    ):
        import inspect

        try:
            worker = inspect.signature(target).bind(*args, **kwargs).arguments.get("worker_id")
        except (TypeError, ValueError):
            worker = None
        return f"DataLoader worker {worker}" if isinstance(worker, int) else "DataLoader worker"
    return f"process {name!r}"


def arm_helper(label: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """In a rank's multiprocessing child: the dump handler, writing to :data:`HELPER` after a head line saying what
    this process is and which thread is its main one. None outside a job numarun started."""
    global _helper_dump
    state = environ.get(envvars.STATE_DIR)
    if not state or not os.path.isdir(state):
        return None
    head = {"label": label, "pid": os.getpid(), "main": threading.get_ident()}
    path = Path(state) / HELPER.format(local_rank=identity(environ)["local_rank"], pid=os.getpid())
    try:
        dump = open(path, "w")  # noqa: SIM115  (faulthandler keeps it)
        print(HELPER_HEAD + json.dumps(head), file=dump, flush=True)
        faulthandler.register(DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError) as e:
        log.debug("no stack dump handler in %s: %s", label, e)
        return None
    _helper_dump = dump
    return path


def run_helper(label: str, target: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """A multiprocessing child's target, run with its own dump handler (:func:`arm_helper`); its file goes with
    it."""
    path = arm_helper(label)
    try:
        return target(*args, **kwargs)
    finally:
        if path is not None:
            with contextlib.suppress(OSError, RuntimeError):
                faulthandler.unregister(DUMP_SIGNAL)
                path.unlink()


def patch_multiprocessing(module: ModuleType) -> bool:
    """``BaseProcess.start`` wraps the process's target in :func:`run_helper` (its label made here, where the
    target's arguments are known). Idempotent."""

    def wrapper(start: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(start)
        def start_with_dump_handler(self: Any) -> Any:
            target = getattr(self, "_target", None)
            if target is not None and getattr(target, "func", None) is not run_helper:
                args, kwargs = tuple(getattr(self, "_args", ())), dict(getattr(self, "_kwargs", {}))
                self._target = functools.partial(run_helper, helper_label(target, args, kwargs, self.name), target)
            return start(self)

        return start_with_dump_handler

    return wrap_once(getattr(module, "BaseProcess", None), "start", wrapper)


# ----------------------------------------------------------------------------- the sampler


def main_frames(stack: Sequence[tuple[Any, int]]) -> list[list[Any]]:
    """``[[file, line, function], ...]`` of a stack's ``(code, line)`` pairs, innermost first, at most
    :data:`MAX_FRAMES` (the middle cut)."""
    out: list[list[Any]] = [[code.co_filename, line, code.co_name] for code, line in stack]
    if len(out) > MAX_FRAMES:
        out = [*out[:60], ["...", 0, f"{len(out) - MAX_FRAMES} frames"], *out[-20:]]
    return out


class HeartbeatWriter:
    """Rewrites the heartbeat every ``interval`` seconds on a daemon thread (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        identity: Mapping[str, Any],
        *,
        interval: float,
        counters: Counters = COUNTERS,
        main: int | None = None,
    ) -> None:
        self.path = path
        self.identity = dict(identity)
        self.interval = interval
        self.counters = counters
        self.main = threading.main_thread().ident if main is None else main
        now = time.monotonic()
        self.moved = self.changed = now
        self.samples = 0
        self.cpu_s = 0.0
        self._events = -1
        self._signature: tuple[Any, ...] | None = None
        self._frames: list[list[Any]] = []

    def sample(self) -> dict[str, Any]:
        """One look: the counters, the main thread's stack; the heartbeat rewritten."""
        cpu0 = time.thread_time()
        now = time.monotonic()
        events = self.counters.events
        if events != self._events:
            self._events, self.moved = events, now
        frame = sys._current_frames().get(self.main) if self.main is not None else None
        sig = tuple((f.f_code, line) for f, line in traceback.walk_stack(frame)) if frame is not None else ()
        del frame
        if sig != self._signature:
            self._signature, self.changed = sig, now
            self._frames = main_frames(sig)
        inside = self.counters.inside.get(self.main) if self.main is not None else None
        self.samples += 1
        beat = {
            **self.identity,
            "t": now,
            "moved": self.moved,
            "changed": self.changed,
            "events": events,
            "collectives": self.counters.collectives,
            "steps": self.counters.steps,
            "inside": inside,
            "frames": self._frames,
            **thread_names(),
            "samples": self.samples,
            "sampler_cpu_s": round(self.cpu_s, 6),
            "interval": self.interval,
        }
        write_heartbeat(self.path, beat)
        self.cpu_s += time.thread_time() - cpu0
        return beat

    def start(self) -> HeartbeatWriter:
        self.sample()
        every(self.interval, self.sample, name="numarun-hangs", what="hang sampler", logger=log)
        return self


def every(
    interval: float,
    call: Callable[[], object],
    *,
    name: str,
    what: str,
    logger: logging.Logger,
    stop: threading.Event | None = None,
) -> None:
    """``call()`` every ``interval`` seconds on a daemon thread ``name`` until ``stop`` is set (None: for the process's
    life); a failure is ``what: error`` at debug level on ``logger``: a report never takes the job down."""
    until = stop or threading.Event()

    def loop() -> None:
        while not until.wait(interval):
            try:
                call()
            except Exception as e:
                logger.debug("%s: %s", what, e)

    threading.Thread(target=loop, name=name, daemon=True).start()


def thread_names() -> dict[str, dict[str, Any]]:
    """The heartbeat's ``threads`` (ident -> name, for the dumps' ``Thread 0x...`` headers) and ``tids`` (ident ->
    the kernel's thread id, for ``/proc/<pid>/task/<tid>``: a thread asleep in the kernel)."""
    threads = threading.enumerate()
    return {
        "threads": {str(t.ident): t.name for t in threads},
        "tids": {str(t.ident): t.native_id for t in threads if t.native_id is not None},
    }


def write_heartbeat(path: Path, beat: Mapping[str, Any]) -> None:
    """The heartbeat rewritten; one that cannot be (a full disk) is left as it was: the rank never fails for it."""
    try:
        write_atomic(path, json.dumps(beat, separators=(",", ":")))
    except OSError as e:
        log.debug("heartbeat: %s", e)


_current: HeartbeatWriter | None = None


def identity(environ: Mapping[str, str]) -> dict[str, Any]:
    """Who this rank is, as torchrun told it."""

    def num(name: str, default: int = 0) -> int:
        text = environ.get(name, "")
        return int(text) if text.isdigit() else default

    return {
        "v": FORMAT,
        "pid": os.getpid(),
        "rank": num("RANK"),
        "local_rank": num("LOCAL_RANK"),
        "world": num("WORLD_SIZE", 1),
        "local_world": num("LOCAL_WORLD_SIZE", 1),
        "node_rank": num("GROUP_RANK"),
        "nodes": num("GROUP_WORLD_SIZE", 1),
        "group": num("TORCHELASTIC_RESTART_COUNT"),
        "main": threading.main_thread().ident,
        "cwd": os.getcwd(),
        "dump_signal": int(DUMP_SIGNAL),
    }


def env_seconds(environ: Mapping[str, str], name: str, default: float) -> float | None:
    """The variable ``name`` as seconds (below 0: 0), ``default`` when unset; None when it is not a number."""
    text = environ.get(name, "")
    if not text:
        return default
    try:
        return max(float(text), 0.0)
    except ValueError:
        return None


def install(environ: Mapping[str, str]) -> HeartbeatWriter | None:
    """In a rank numarun started (``NUMARUN_STATE_DIR`` set): the dump handler always (``numarun stacks`` works
    with the watchdog off); the counters and the sampler when ``NUMARUN_HANG_SAMPLE`` > 0. Returns the sampler."""
    global _current
    state = environ.get(envvars.STATE_DIR)
    if not state or not os.path.isdir(state):
        return None
    who = identity(environ)
    local = who["local_rank"]
    try:
        dump = open(Path(state) / STACKS.format(local_rank=local), "a")  # noqa: SIM115  (faulthandler keeps it)
        faulthandler.register(DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError) as e:
        log.debug("no stack dump handler: %s", e)
        return None
    after_import(MULTIPROCESSING, patch_multiprocessing)
    interval = env_seconds(environ, envvars.HANG_SAMPLE, 0.0) or 0.0  # 0: no sampler
    path = Path(state) / HEARTBEAT.format(local_rank=local)
    if interval <= 0:  # the dump handler only: one heartbeat says it is in place
        write_heartbeat(
            path,
            {
                **who,
                "t": time.monotonic(),
                "sampling": False,
                **thread_names(),
            },
        )
        return None
    install_counters()
    _current = HeartbeatWriter(path, {**who, "sampling": True}, interval=interval).start()
    return _current


def figures() -> dict[str, Any]:
    """What the sampler cost this process so far (``scripts/bench_launch.py --watchdog`` reads it)."""
    s = _current
    if s is None:
        return {}
    return {
        "samples": s.samples,
        "sampler_cpu_s": s.cpu_s,
        "interval_s": s.interval,
        "collectives": s.counters.collectives,
        "steps": s.counters.steps,
    }
