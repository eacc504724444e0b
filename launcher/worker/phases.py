"""The step report's recorder in a rank: where each of its steps' time goes (docs/steps.md).

Installed by the bootstrap (:func:`install`) beside the hang watchdog's counters, before the user's code is imported,
when numarun asks for it (``NUMARUN_STEPS=1``), so that any script is measured without a change: the user's own
DDP or FSDP2 loop, Lightning, accelerate, numarun's trainer.

**A step** ends when an optimizer step returns (torch's global post-step hook, which the hang watchdog counts too).
Several optimizers stepped one after the other make one step: a step is closed when an optimizer steps a second
time (its record is written then, one step late) or when the rank exits. Within a step, on the main thread, at the
outermost call:

* ``input``: inside a DataLoader iterator's ``__next__`` (``_BaseDataLoaderIter``, wrapped as its module loads);
* ``comm``: inside torch.distributed's collectives (timed by the hang watchdog's wrappers,
  :class:`~numarun.worker.progress.Counters`) and in ``Work.wait()`` (an asynchronous collective's wait: FSDP2's
  all-gathers and reduce-scatters). DDP's gradient all-reduce never passes through Python: its C++ reducer runs it
  inside ``loss.backward()``, and the waiting for a late rank lands there. It is measured every step, exactly
  (:class:`DdpWait`): a gradient hook on a few of the module's parameters queues a callback of the autograd engine,
  which runs once every gradient of the rank is computed, before DDP's own end-of-backward callback (its gradient
  sync); that callback queues a second one, which runs after it. Their difference is the wait for the other ranks
  plus the last bucket's transfer: ``comm``. DDP's own figures (``_get_ddp_logging_data()``, sampled on a few
  iterations) decide nothing;
* ``optim``: inside the optimizer's step (global pre- and post-step hooks);
* ``compute``: the rest of the step.

Time inside a collective called from one of the others counts as ``comm`` only. On a GPU (once torch.cuda is
initialised) CUDA events are recorded at each step's end and around each collective and wait of the main thread, and
read later with ``query()``, never synchronising: ``gpu_s`` is the stream's time from one step's end to the next, and
the waits' GPU time counts as ``comm`` where it is larger than the host's (an NCCL collective returns to the host at
once; the stream waits). A record then waits until its events are done. Peak memory: the CUDA allocator's, else the
process's resident high-water mark, read at most once a second.

Each record is a JSON line (:class:`~numarun.worker.steps.StepRecord`) in ``steps.<local rank>.jsonl`` of numarun's
private directory, buffered and flushed at least twice per report interval. The files are bounded whatever the job's
length (:data:`NODE_BYTES` for a node's ranks together: a rank's file moves aside when it reaches its share, the one
before is dropped); the agent reads every record as it comes, so the summary still counts the whole job. A write that
fails (a full disk) stops the rank's records, in one line on its stderr, and never its training. Cost:
scripts/bench_steps.py.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import io
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from .. import envvars
from . import progress
from .steps import END, FORMAT, PHASES, RECORDS

log = logging.getLogger("numarun.worker.bootstrap.phases")

DEFAULT_INTERVAL_S = 5.0
"""The agent's report interval when ``NUMARUN_STEP_INTERVAL`` is unset."""
READ_EVERY_S = 1.0
"""Figures that cost more than a clock read (peak memory) are read at most this often."""
DDP_HOOKED = 3
"""Parameters of a DDP module that get the gradient hook: the first, the last and one between (one that receives a
gradient in a backward is enough; three, in case some are unused in a step). Each costs a Python call a backward."""
END_WAIT_S = 1.0
"""At its exit a rank waits at most this long for the agent's last look at it (:func:`ask_last_look`)."""
NODE_BYTES = 64 << 20
"""The most a node's ranks' records files hold together: each rank's file is moved to ``<name>.1`` (the one before is
dropped) when it grows past its share, ``NODE_BYTES / (2 x its node's ranks)`` (:func:`rotate_bytes`)."""
GPU_PENDING = 64
"""Records waiting for their CUDA events; beyond this the oldest is written without its GPU figures."""
RECENT = 512
"""Records kept in memory for :func:`shares` (the trainer's log line)."""
LOADER = "torch.utils.data.dataloader"
DDP = "torch.nn.parallel.distributed"


@dataclass(frozen=True)
class Mark:
    """The recorder's running totals at a moment (the end of an optimizer step, or when counting began)."""

    t: float
    input: float
    comm: float
    optim: float
    ddp: float = 0.0
    """The waits inside DDP's backward so far (:class:`DdpWait`)."""
    gpu: Any = None
    """The CUDA event recorded then; None without a GPU."""
    waits: int = 0
    """How many GPU wait pairs had been recorded by then."""


class Recorder:
    """One rank's step records (see the module docstring); its hooks are called on the main thread only."""

    def __init__(
        self,
        out: IO[str],
        *,
        rank: int,
        counters: progress.Counters,
        flush_s: float,
        path: Path | None = None,
        end: Path | None = None,
        main: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        rotate: int = NODE_BYTES // 2,
    ) -> None:
        self.out: IO[str] = out
        self.path = path
        self.rotate = rotate
        """Bytes after which the file moves aside (:data:`NODE_BYTES`)."""
        self.end = end
        """Where the rank says, at its exit, that its last record is out (:data:`END`); None: no agent looks."""
        self.rank = rank
        self.counters = counters
        self.flush_s = flush_s
        self.main = threading.main_thread().ident if main is None else main
        self.clock = clock
        """Every time the recorder takes: ``time.monotonic`` (which the ranks of a host share)."""
        self.input_s = self.optim_s = 0.0
        self.depth = 0  # inside input on the main thread: what is nested counts once
        self.steps = 0
        self.gpu: GpuEvents | None = None
        self.ddp = DdpWait(self)
        self.start = self._mark(clock())
        self.last: Mark | None = None  # the end of the latest optimizer step of the open step
        self.stepped: set[int] = set()  # optimizers stepped in the open step
        self.active: int | None = None  # the outermost optimizer stepping now
        self._opt_t0 = self._opt_o0 = 0.0
        self.closure_s = 0.0
        """Time inside optimizer steps' closures, less the other phases in them: compute, not the optimizer's."""
        self.loader_workers = -1
        self.peak: int | None = None
        self._peak_read = -1e9
        self.written = 0
        self._flushed = clock()
        self.recent: collections.deque[tuple[float, ...]] = collections.deque(maxlen=RECENT)

    def _mark(self, t: float) -> Mark:
        gpu = self.gpu
        return Mark(
            t,
            self.input_s,
            self.counters.comm_s,
            self.optim_s,
            self.ddp.wait_s,
            gpu.event() if gpu is not None else None,
            gpu.dropped + len(gpu.waits) if gpu is not None else 0,
        )

    # -- hooks
    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` adding its time on the main thread, less the collectives inside it, to ``input_s``; nested calls
        count once."""
        get_ident = threading.get_ident
        clock = self.clock
        counters = self.counters

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.depth or get_ident() != self.main:
                return fn(*args, **kwargs)
            self.depth = 1
            c0, t0 = counters.comm_s, clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.input_s += clock() - t0 - (counters.comm_s - c0)
                if args:
                    self.loader_workers = getattr(args[0], "_num_workers", -1)
                self.depth = 0

        return call

    def waited(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``Work.wait`` adding its time on the main thread to ``comm`` (outside a collective, which counts its own)."""
        get_ident = threading.get_ident
        clock = self.clock
        counters = self.counters

        @functools.wraps(fn)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            me = get_ident()
            if me != self.main or me in counters.inside or progress._is_compiling():
                return fn(work, *args, **kwargs)
            self.around(True)
            t0 = clock()
            try:
                return fn(work, *args, **kwargs)
            finally:
                counters.comm_s += clock() - t0
                self.around(False)

        return wait

    def around(self, entering: bool) -> None:
        """A CUDA event at the start or the end of a wait, once the GPU path is on."""
        if self.gpu is not None:
            self.gpu.around(entering)

    def before_step(self, opt: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """torch's global optimizer pre-step hook. A closure passed to the step (Lightning's: forward and backward
        run inside the optimizer's step) is timed as the rest of the step is, not as the optimizer's."""
        if threading.get_ident() != self.main:
            return None
        key = id(opt)
        if self.active is not None and self.active != key:
            return None  # an optimizer stepped inside another's step: the outer one counts
        if key in self.stepped:
            self.close()  # a second step of the same optimizer: the step before ended with the last one
        self.active = key
        self.stepped.add(key)
        self._opt_t0, self._opt_o0 = self.clock(), self._elsewhere()
        if kwargs and callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._closure(kwargs["closure"])}
        if args and callable(args[0]):
            return (self._closure(args[0]), *args[1:]), kwargs
        return None

    def after_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        """torch's global optimizer post-step hook: the open step may end here."""
        if threading.get_ident() != self.main or self.active != id(opt):
            return
        self.active = None
        now = self.clock()
        if not self.depth:  # an optimizer stepped while loading a batch is part of the loading
            self.optim_s += now - self._opt_t0 - (self._elsewhere() - self._opt_o0)
        self.last = self._mark(now)

    def _elsewhere(self) -> float:
        """The time counted so far in the other phases (and in closures): what an optimizer step holds that is not
        its own."""
        return self.input_s + self.counters.comm_s + self.ddp.wait_s + self.closure_s

    def _closure(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        def timed() -> Any:
            t0, o0 = self.clock(), self._elsewhere()
            try:
                return closure()
            finally:
                self.closure_s += self.clock() - t0 - (self._elsewhere() - o0)

        return timed

    # -- records
    def close(self) -> None:
        """End the open step at its last optimizer step and write its record (or queue it for its GPU events)."""
        end, start = self.last, self.start
        if end is None:
            return
        self.steps += 1
        self.start, self.last, self.stepped = end, None, set()
        comm = end.comm - start.comm
        extra: dict[str, float] = {}
        ddp = end.ddp - start.ddp
        if ddp > 0:
            extra["ddp_wait_s"] = ddp
        if self.loader_workers >= 0:
            extra["loader_workers"] = self.loader_workers
        fields = {
            "rank": self.rank,
            "step": self.steps,
            "start": start.t,
            "end": end.t,
            "input_s": end.input - start.input,
            "comm_s": comm,
            "optim_s": end.optim - start.optim,
            "peak_bytes": self._peak(end.t),
        }
        gpu = self.gpu
        if gpu is not None and end.gpu is not None and start.gpu is not None:
            gpu.pending.append((fields, extra, start, end))
            self.write_ready()
        else:
            self.write(fields, extra)
        if end.t - self._flushed >= self.flush_s:
            self._gpu_check()  # as seldom as the flush: CUDA starts once
            self.flush()

    def write_ready(self, *, wait_s: float = 0.0) -> None:
        """Write the queued records whose CUDA events are done (all of them within ``wait_s``, at exit)."""
        gpu = self.gpu
        if gpu is None:
            return
        deadline = time.monotonic() + wait_s
        while gpu.pending:
            fields, extra, start, end = gpu.pending[0]
            if not gpu.done(end) and len(gpu.pending) <= GPU_PENDING:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.001)
                continue
            gpu.pending.popleft()
            if gpu.done(end):
                gpu_s, waits = gpu.span(start, end)
                extra = {**extra, "gpu_comm_s": waits}
                fields = {**fields, "gpu_s": gpu_s, "comm_s": max(fields["comm_s"], waits)}
            self.write(fields, extra)

    def write(self, fields: dict[str, Any], extra: Mapping[str, float]) -> None:
        """One record as a JSON line (:meth:`StepRecord.line`'s form, formatted here: a step's cost is counted in
        microseconds)."""
        wall = fields["end"] - fields["start"]
        comm = fields["comm_s"] + extra.get("ddp_wait_s", 0.0)
        compute = max(0.0, wall - fields["input_s"] - comm - fields["optim_s"])
        peak, gpu_s = fields["peak_bytes"], fields.get("gpu_s")
        more = ",".join(f'"{k}":{v:.6g}' for k, v in extra.items())
        line = (
            f'{{"v":{FORMAT},"rank":{fields["rank"]},"step":{fields["step"]},"start":{fields["start"]:.6f},'
            f'"end":{fields["end"]:.6f},"input_s":{fields["input_s"]:.6f},"comm_s":{comm:.6f},'
            f'"optim_s":{fields["optim_s"]:.6f},"compute_s":{compute:.6f},'
            f'"peak_bytes":{"null" if peak is None else int(peak)},'
            f'"gpu_s":{"null" if gpu_s is None else f"{gpu_s:.6f}"},"extra":{{{more}}}}}\n'
        )
        self.recent.append((wall, fields["input_s"], compute, comm, fields["optim_s"]))
        try:
            self.out.write(line)
            self.written += len(line)
            if self.written > self.rotate:
                self._rotate()
        except OSError as e:
            self._stop(e)

    def _rotate(self) -> None:
        if self.path is None:
            return
        self.out.close()
        os.replace(self.path, f"{self.path}.1")
        self.out = open(self.path, "w", buffering=1 << 16)  # noqa: SIM115  (open for the rank's life)
        self.written = 0

    def flush(self) -> None:
        try:
            self.out.flush()
        except OSError as e:
            self._stop(e)
        self._flushed = self.clock()

    def _stop(self, e: OSError) -> None:
        """A record that cannot be written (a full disk, a quota): the records stop here, said once on the rank's
        stderr; the rank trains on (its optimizer's hooks never raise)."""
        with contextlib.suppress(OSError, ValueError):
            self.out.close()  # what is buffered cannot be written either
        self.out = _Nowhere()
        where = f" {self.path}" if self.path is not None else ""
        sys.stderr.write(
            f"numarun: WARNING: rank {self.rank}'s step records stop here: cannot write{where}: {e.strerror or e} "
            "(the step report leaves out its later steps)\n"
        )
        sys.stderr.flush()

    def finish(self) -> None:
        """At exit: the open step if an optimizer ended it, the records waiting for their events, the file."""
        if self.last is not None:
            self.close()
        self.write_ready(wait_s=1.0)
        gpu = self.gpu
        while gpu is not None and gpu.pending:  # events that never completed: the records without them
            fields, extra, _, _ = gpu.pending.popleft()
            self.write(fields, extra)
        self.flush()
        if self.end is not None and self.steps:
            ask_last_look(self.end)

    # -- figures read now and then
    def _peak(self, now: float) -> int | None:
        if now - self._peak_read < READ_EVERY_S:
            return self.peak
        self._peak_read = now
        try:
            if self.gpu is not None:
                self.peak = int(self.gpu.torch.cuda.max_memory_allocated())
            else:
                import resource

                self.peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
        except Exception:
            self.peak = None
        return self.peak

    def _gpu_check(self) -> None:
        """Start the GPU path once torch.cuda is initialised (looked at with each flush until then)."""
        if self.gpu is not None:
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is None or not cuda.is_initialized():
                return
        except Exception:
            return
        self.gpu = GpuEvents(torch)
        self.counters.timed = lambda name, entering: self.around(entering)
        self.start = self._mark(self.start.t)  # the next step's span starts with an event

    # -- installing
    def patch_loader(self, module: ModuleType) -> None:
        progress.wrap_once(module._BaseDataLoaderIter, "__next__", self.timed)

    def patch_optimizer(self, module: ModuleType) -> None:
        module.register_optimizer_step_pre_hook(self.before_step)
        module.register_optimizer_step_post_hook(self.after_step)

    def patch_ddp(self, module: ModuleType) -> None:
        attach = self.ddp.attach

        def wrapper(init: Callable[..., None]) -> Callable[..., None]:
            @functools.wraps(init)
            def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
                init(ddp, *args, **kwargs)
                attach(ddp)

            return __init__

        progress.wrap_once(module.DistributedDataParallel, "__init__", wrapper)

    def patch_work(self, module: ModuleType) -> None:
        progress.wrap_once(getattr(module, "Work", None), "wait", self.waited)


class _Nowhere(io.StringIO):
    """Where a rank's records go once they cannot be written: nowhere, and nothing kept."""

    def write(self, text: str) -> int:
        return len(text)


def rotate_bytes(local_ranks: int) -> int:
    """A rank's share of :data:`NODE_BYTES`: two files (the current one and the one moved aside) per rank of its
    node."""
    return max(1 << 16, NODE_BYTES // (2 * max(1, local_ranks)))


def ask_last_look(end: Path, wait_s: float = END_WAIT_S) -> bool:
    """At a rank's exit: say that its last record is out (``end``) and wait, at most ``wait_s``, for the agent to take
    its last look at the rank (the kernel's figures of a process are gone once it is) and remove the file. True when
    the agent did."""
    try:
        end.write_text(str(os.getpid()))
    except OSError:
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not end.exists():
            return True
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        end.unlink()
    return False


class DdpWait:
    """The wait inside DDP's backward, every step (docs/steps.md, "What is measured").

    DDP's gradient sync runs in its C++ reducer: its last gradient hook queues a callback of the autograd engine
    (``finalize_backward``: wait for every bucket's all-reduce), which runs once the whole graph is done. Callbacks
    run first in, first out. A gradient hook of ours (``register_post_accumulate_grad_hook``, which runs before the
    reducer's hook on the same parameter) queues :meth:`_ready` before DDP's; it runs when every gradient of the rank
    is computed and queues :meth:`_synced`, which runs after DDP's. The time between the two is the wait for the
    other ranks plus the last bucket's transfer: on the host clock where it blocks (gloo), and from CUDA events on the
    current stream on a GPU (NCCL returns to the host at once; the stream waits), read with the step's other events.
    Nothing is measured in a backward that does not sync (``no_sync()``, gradient accumulation), nor is a comm hook
    registered: DDP allows one, and the user's own would then raise."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.wait_s = 0.0
        self.syncs = 0
        """Backward passes whose wait was measured."""
        self._queued = False
        self._ready_t = 0.0

    def attach(self, ddp: Any) -> None:
        """Hook a few of ``ddp``'s parameters (:data:`DDP_HOOKED`, spread over the module)."""
        try:
            params = [p for p in ddp.module.parameters() if p.requires_grad]
        except Exception:
            return
        if not params:
            return
        picked = {round(i * (len(params) - 1) / max(1, DDP_HOOKED - 1)) for i in range(DDP_HOOKED)}
        ref = weakref.ref(ddp)

        def hook(_: Any) -> None:
            module = ref()
            if self._queued or module is None or not getattr(module, "require_backward_grad_sync", True):
                return
            self._queued = True
            _queue(self._ready)

        for i in sorted(picked):
            with contextlib.suppress(Exception):
                params[i].register_post_accumulate_grad_hook(hook)

    def _ready(self) -> None:
        self._queued = False
        self.rec.around(True)
        self._ready_t = self.rec.clock()
        _queue(self._synced)

    def _synced(self) -> None:
        self.wait_s += self.rec.clock() - self._ready_t
        self.syncs += 1
        self.rec.around(False)


_engine: Any = None


def _queue(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the autograd graph being run is done (after the callbacks queued before it)."""
    global _engine
    if _engine is None:
        from torch.autograd import Variable

        _engine = Variable._execution_engine
    _engine.queue_callback(callback)


class GpuEvents:
    """CUDA events of the main thread's current stream: one at each step's end, a pair around each wait."""

    def __init__(self, torch: ModuleType) -> None:
        self.torch = torch
        self.waits: list[tuple[Any, Any]] = []
        self.dropped = 0
        """Wait pairs already taken from the front of :attr:`waits` (a mark counts every pair since the start)."""
        self._open: Any = None
        self.pending: collections.deque[tuple[dict[str, Any], dict[str, float], Mark, Mark]] = collections.deque()

    def event(self) -> Any:
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def around(self, entering: bool) -> None:
        if entering:
            self._open = self.event()
        elif self._open is not None:
            self.waits.append((self._open, self.event()))
            self._open = None

    @staticmethod
    def done(mark: Mark) -> bool:
        return mark.gpu is None or bool(mark.gpu.query())

    def span(self, start: Mark, end: Mark) -> tuple[float, float]:
        """(the stream's seconds from ``start`` to ``end``, its seconds in the waits between them); the waits before
        ``end`` are dropped."""
        gpu_s = start.gpu.elapsed_time(end.gpu) / 1e3
        pairs = self.waits[start.waits - self.dropped : end.waits - self.dropped]
        waits = sum(a.elapsed_time(b) for a, b in pairs if b.query()) / 1e3
        del self.waits[: end.waits - self.dropped]
        self.dropped = end.waits
        return gpu_s, waits


_current: Recorder | None = None


def install(environ: Mapping[str, str]) -> Recorder | None:
    """In a rank numarun started with the step report on (``NUMARUN_STEPS=1``, ``NUMARUN_STATE_DIR`` set): the
    recorder, its hooks waiting for torch's modules, its file truncated (a restarted rank starts it again)."""
    global _current
    state = environ.get(envvars.STATE_DIR)
    if environ.get(envvars.STEPS) != "1" or not state or not os.path.isdir(state):
        return None
    who = progress.identity(environ)
    interval = progress.env_seconds(environ, envvars.STEP_INTERVAL, DEFAULT_INTERVAL_S)
    path = Path(state) / RECORDS.format(local_rank=who["local_rank"])
    for old in (path, Path(f"{path}.1")):  # a restarted rank's: its records start over, in a new file
        with contextlib.suppress(OSError):
            old.unlink()
    try:
        out = open(path, "w", buffering=1 << 16)  # noqa: SIM115  (open for the rank's life)
    except OSError as e:
        log.debug("no step records: %s", e)
        return None
    rec = Recorder(
        out,
        rank=who["rank"],
        counters=progress.COUNTERS,
        flush_s=min(1.0, max(DEFAULT_INTERVAL_S if interval is None else interval, 0.1) / 2),
        path=path,
        end=Path(state) / END.format(local_rank=who["local_rank"]),
        rotate=rotate_bytes(who["local_world"]),
    )
    progress.install_counters()
    for module, patch in (
        (progress.C10D, rec.patch_work),
        (progress.OPTIMIZER, rec.patch_optimizer),
        (LOADER, rec.patch_loader),
        (DDP, rec.patch_ddp),
    ):
        progress.after_import(module, patch)
    atexit.register(rec.finish)
    _current = rec
    return rec


def shares(last: int) -> dict[str, float]:
    """Each phase's share of this rank's last ``last`` steps (``{}`` when none was recorded): what the trainer's
    log line shows."""
    rec = _current
    if rec is None or not rec.recent:
        return {}
    rows = list(rec.recent)[-last:]
    wall = sum(r[0] for r in rows)
    if wall <= 0:
        return {}
    return {phase: sum(r[i + 1] for r in rows) / wall for i, phase in enumerate(PHASES)}
