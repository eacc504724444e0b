"""Signals, one way: one loop per process acts on them (:func:`loop`), and every handler only records.

The C-level handler of each signal with a Python handler writes the signal's number on the loop's self-pipe
(``signal.set_wakeup_fd``): that byte is the record. The loop, a thread of its own (``numarun-signals``),
reads it, looks up what the signal does in the phase the process is in (:data:`ON_SIGNAL`) and has its
:class:`SignalTarget` do it: the supervisor of a run, a sweep's queue of jobs, a relay. It also runs the periodic
checks registered with it (:meth:`Loop.every`: a rendezvous deadline, a sweep's kill after its grace).
Only the main thread can be made to unwind: where the act needs it (END, and the supervisor's STOP), the loop
asks the main thread to raise (:meth:`Loop.interrupt`), and the Python-level handler raises what it was asked
to, nothing else (docs/reliability.md, "Signals to numarun").
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ..envvars import INIT, READY_FD
from .child import numarun_command

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    STARTING = "before the plan"
    RENDEZVOUS = "torchrun runs, no worker alive (a rendezvous: the first, or after a restart)"
    RUNNING = "torchrun runs, workers alive"
    STOPPING = "a death signal was taken; torchrun, a sweep or numarun is ending the run"
    JOBS = "a sweep's jobs run, each a process of its own"
    BETWEEN = "between the jobs of a sweep (or its batches)"
    RELAYING = "a relay: its child numarun runs the job"


class Act(enum.Enum):
    END = "the main thread raises the target's error: one line, exit 128+N (nothing to stop)"
    STOP = (
        "the target stops what runs: torchrun's shutdown (torch's signal exception in the main thread, as "
        "torchrun's own handler raises it), or SIGTERM to a sweep's jobs and SIGKILL after a grace"
    )
    AGAIN = (
        "a death signal after the first: the target's stop again (a sweep kills its jobs at once; torchrun's "
        "shutdown goes on)"
    )
    HOLD = "kept for the workers of the next job (the supervisor notes them in the ledger)"
    FORWARD = (
        "the target passes it on: to the live workers (and the ledger, for those yet to start), the jobs, the child"
    )


ON_SIGNAL: Mapping[Phase, tuple[Act, Act]] = {
    # phase:          (a death signal, SIGUSR1/SIGUSR2)
    Phase.STARTING: (Act.END, Act.HOLD),
    Phase.RENDEZVOUS: (Act.STOP, Act.FORWARD),  # torch may wait in C++: the supervisor ends the run after a grace
    Phase.RUNNING: (Act.STOP, Act.FORWARD),
    Phase.STOPPING: (Act.AGAIN, Act.FORWARD),
    Phase.JOBS: (Act.STOP, Act.FORWARD),
    Phase.BETWEEN: (Act.END, Act.HOLD),
    Phase.RELAYING: (Act.FORWARD, Act.FORWARD),
}

DEATH = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""torchrun's ``--signals-to-handle`` default: what ends a run (a job's own list may add more)."""
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)
"""Passed on to every worker (the trainer checkpoints and exits 0); numarun keeps waiting."""
RELAYED = (*DEATH, *FORWARDED)
"""What a relay (Slurm's node task, numarun as PID 1) passes on to its numarun."""


class SignalTarget(Protocol):
    """Who does the acts of :data:`ON_SIGNAL` (HOLD the loop does itself); ``end``: what the main thread raises."""

    def forward(self, signum: int) -> None: ...

    def stop(self, signum: int, *, again: bool) -> None: ...

    def end(self, signum: int) -> BaseException: ...


class Loop:
    """The one loop of this process. Made once (:func:`loop`), in the main thread."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        for fd in (self.r, self.w):
            os.set_blocking(fd, False)
        self._previous_fd = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        self.phase = Phase.STARTING
        self.target: SignalTarget | None = None
        self.held: list[int] = []
        self.death: set[int] = set(DEATH)
        self.handled: set[int] = set()
        self.lock = threading.Lock()  # the loop's and the main thread's, never a handler's
        self._pending: BaseException | None = None
        self._echoes: dict[int, int] = {}
        self._checks: list[list[Any]] = []  # [due, seconds, check]
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="numarun-signals", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- the main thread's side
    def handle(self, signums: Sequence[int]) -> None:
        """Record ``signums`` from now on (main thread); each handler is installed once for the process."""
        for signum in signums:
            if signum not in self.handled:
                signal.signal(signum, self.handler)
                self.handled.add(signum)

    def handler(self, signum: int, frame: object) -> None:
        """Every signal's handler: the wake-up byte the C-level handler wrote is the record; raises only
        what the loop asked the main thread to (:meth:`interrupt`)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            raise pending

    def every(self, seconds: float, check: Callable[[float], None]) -> Callable[[], None]:
        """Run ``check(now)`` in the loop every ``seconds`` (a periodic check: a deadline, a watchdog); returns
        its cancel. A check that raises is logged at debug level and kept."""
        entry = [time.monotonic() + seconds, seconds, check]
        with self.lock:
            self._checks.append(entry)
        self.poke()

        def cancel() -> None:
            with self.lock:
                if entry in self._checks:
                    self._checks.remove(entry)

        return cancel

    def take_held(self) -> list[int]:
        """The signals HOLD kept, now handed over (call with :attr:`lock` held, with the phase change)."""
        held, self.held = self.held, []
        return held

    @contextlib.contextmanager
    def serving(self, target: SignalTarget, phase: Phase) -> Iterator[None]:
        """``target`` acts in ``phase`` for the block (a sweep's jobs); then BETWEEN, and the target before
        (where there was one) acts again."""
        with self.lock:
            previous, self.target, self.phase = self.target, target, phase
        try:
            yield
        finally:
            with self.lock:
                if self.phase is not Phase.STOPPING:
                    self.phase = Phase.BETWEEN
                self.target = previous or target

    def close(self) -> list[int]:
        """Per-rank mode: the loop ended, Python's own dispositions back; returns what was held or still unread."""
        for signum in self.handled:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        self._closed = True
        self.poke()
        self._thread.join()
        signal.set_wakeup_fd(self._previous_fd)
        left = [s for s in _read(self.r, 0) if s]
        os.close(self.r)
        os.close(self.w)
        global _LOOP
        _LOOP = None
        return [*self.held, *left]

    def poke(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.w, b"\0")

    # ----------------------------------------------------------------- the loop's side
    def interrupt(self, error: BaseException, signum: int) -> None:
        """Have the main thread raise ``error``: the handler of ``signum``, sent to it again, raises it (unless
        another handler, torchrun's own outside the checked torch versions, is in place and raises by itself)."""
        if signal.getsignal(signum) != self.handler:
            return
        self._pending = error
        self._echoes[signum] = self._echoes.get(signum, 0) + 1
        signal.pthread_kill(threading.main_thread().ident or 0, signum)

    def interrupted(self) -> bool:
        """Whether the main thread took what :meth:`interrupt` asked (False while it waits in C code)."""
        return self._pending is None

    def _run(self) -> None:
        while not self._closed:
            with self.lock:
                due = min((c[0] for c in self._checks), default=time.monotonic() + 1.0)
            got = _read(self.r, max(0.0, due - time.monotonic()))
            try:  # the loop outlives any one failure (the private directory removed under it at exit...)
                for signum in got:
                    if self._echoes.get(signum, 0) > 0:  # the record of the loop's own interrupt
                        self._echoes[signum] -= 1
                    elif signum:
                        self._act(signum)
                now = time.monotonic()
                with self.lock:
                    ready = [c for c in self._checks if c[0] <= now]
                for c in ready:
                    c[0] = now + c[1]
                    c[2](now)
            except Exception as e:
                log.debug("signal loop: %s", e)

    def _act(self, signum: int) -> None:
        with self.lock:
            death = signum in self.death
            if signum not in self.handled or (not death and signum not in FORWARDED):
                return
            act, target = ON_SIGNAL[self.phase][0 if death else 1], self.target
            if act is Act.HOLD or target is None:
                self.held.append(signum)
                log.warning("got %s: the workers get it when they start", signal.Signals(signum).name)
                return
            if act in (Act.END, Act.STOP):
                self.phase = Phase.STOPPING
        if act is Act.END:
            self.interrupt(target.end(signum), signum)
        elif act in (Act.STOP, Act.AGAIN):
            target.stop(signum, again=act is Act.AGAIN)
        else:
            target.forward(signum)


def _read(fd: int, timeout: float | None) -> list[int]:
    """The records on ``fd`` (0: a wake-up), after waiting up to ``timeout``."""
    with contextlib.suppress(BlockingIOError, InterruptedError):
        if select.select([fd], [], [], timeout)[0]:
            return list(os.read(fd, 4096))
    return []


_LOOP: Loop | None = None


def loop() -> Loop:
    """This process's loop, made on the first call (in the main thread)."""
    global _LOOP
    if _LOOP is None:
        _LOOP = Loop()
    return _LOOP


def say_ready(environ: dict[str, str] | os._Environ[str] | None = None) -> None:
    """Tell the relay that started this numarun (``NUMARUN_READY_FD``) that its signals are handled now."""
    fd = (os.environ if environ is None else environ).pop(READY_FD, "")
    with contextlib.suppress(OSError, ValueError):
        os.write(int(fd), b"1")
        os.close(int(fd))


class Requests:
    """Signals a process takes as requests, not as its end (the trainer's SIGUSR1, SIGUSR2, SIGTERM: finish the
    step, save, exit 0). The handler only records; the process's own loop reads them (:meth:`first`: the
    training loop, after each step)."""

    def __init__(self, signums: Sequence[int]) -> None:
        self._got: list[int] = []
        for signum in signums:
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: object) -> None:
        self._got.append(signum)

    def first(self) -> int:
        """The first signal that came (0: none)."""
        return self._got[0] if self._got else 0


class Relay:
    """A relay's target: runs numarun as a child and passes it the signals this process gets (:data:`RELAYED`),
    each held until the child says its handlers are in place (sent at once, it would kill a Python still
    starting). ``reap_all`` (PID 1): every child that ends is reaped, as init's are. Made first thing: nothing is
    lost."""

    def __init__(self, *, reap_all: bool = False) -> None:
        self.reap_all = reap_all
        self.forwarded: set[int] = set()
        self._child: subprocess.Popen[bytes] | None = None
        self._early: list[int] | None = []  # None once the child is ready
        self._lock = threading.Lock()
        self.loop = loop()
        with self.loop.lock:
            self.loop.target, self.loop.phase = self, Phase.RELAYING
        self.loop.handle(RELAYED)

    def forward(self, signum: int) -> None:
        self.forwarded.add(signum)
        with self._lock:
            if self._early is not None:
                self._early.append(signum)
                return
            child = self._child
        if child is not None:
            send([child.pid], signum)

    def stop(self, signum: int, *, again: bool) -> None:  # no phase of a relay's: RELAYING passes death signals on
        self.forward(signum)

    def end(self, signum: int) -> BaseException:  # not reached either
        return SystemExit(128 + signum)

    def run(self, argv: Sequence[str], env: Mapping[str, str], *, foreground: bool = False) -> int:
        """The child's exit code (128+N when killed by signal N). ``foreground``: the child leads the
        terminal's foreground process group (a Ctrl-C reaches it once, not again through this process)."""
        r, w = os.pipe()
        child = subprocess.Popen(
            list(argv), env={**env, READY_FD: str(w)}, pass_fds=(w,), preexec_fn=os.setpgrp if foreground else None
        )
        os.close(w)
        with self._lock:
            self._child = child
        if foreground and os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            os.tcsetpgrp(0, child.pid)
        os.read(r, 1)  # the child is ready, or gone (its end of the pipe closed)
        os.close(r)
        with self._lock:
            early, self._early = self._early or [], None
        for signum in early:
            send([child.pid], signum)
        while True:  # this thread only waits; the loop passes the signals on
            pid, status = os.waitpid(-1 if self.reap_all else child.pid, 0)
            if pid == child.pid:
                child.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait again
                return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def send(pids: Iterable[int], signum: int) -> None:
    """``signum`` to each of ``pids`` (0 and below, never a process group, are left out) that is still there."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if pid > 0:
                os.kill(pid, signum)


def reap() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of every child of this process that has ended, collected."""
    with contextlib.suppress(ChildProcessError):
        while (ended := os.waitpid(-1, os.WNOHANG))[0]:
            yield ended


def init_main(argv: Sequence[str]) -> int:
    """numarun as PID 1 (a container's command, a pod) does init's duties, as tini does: the job runs in
    a child numarun (no subreaper: its orphans come here too); this process passes it its signals, reaps
    every process that ends under it and exits with the child's exit code."""
    relay = Relay(reap_all=True)
    return relay.run(numarun_command(*argv), {**os.environ, INIT: "1"}, foreground=True)
