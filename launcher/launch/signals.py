"""Signals, one way: handlers only record (the C-level handler writes the signal's number on a
self-pipe, ``signal.set_wakeup_fd``), one loop acts, and :data:`ON_SIGNAL` says what (docs/reliability.md,
"Signals to numarun"). A handler only raises, where the act is END or STOP: nothing else unwinds the main thread.
"""

from __future__ import annotations

import contextlib
import enum
import os
import select
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence

from ..envvars import INIT, READY_FD
from .child import numarun_command


class Phase(enum.Enum):
    STARTING = "before the plan"
    RENDEZVOUS = "torchrun runs, no worker alive (a rendezvous: the first, or after a restart)"
    RUNNING = "torchrun runs, workers alive (the loop tells it from RENDEZVOUS)"
    STOPPING = "a death signal was taken; torchrun or numarun is ending the run"
    BETWEEN = "between the jobs of a sweep"


class Act(enum.Enum):
    END = "the handler raises RunFailed: one line, exit 128+N (nothing to stop)"
    STOP = "the handler raises torch's signal exception: torchrun stops its workers, as for its own handler"
    HOLD = "the loop keeps it for the next job's workers"
    FORWARD = "the loop sends it to the live workers and notes it in the ledger for those yet to start"
    NOTE = "nothing more"


ON_SIGNAL: Mapping[Phase, tuple[Act, Act]] = {
    # phase:          (a death signal, SIGUSR1/SIGUSR2)
    Phase.STARTING:   (Act.END, Act.HOLD),
    Phase.RENDEZVOUS: (Act.STOP, Act.FORWARD),  # torch may wait in C++: the loop ends the run after a grace
    Phase.RUNNING:    (Act.STOP, Act.FORWARD),
    Phase.STOPPING:   (Act.NOTE, Act.FORWARD),
    Phase.BETWEEN:    (Act.END, Act.HOLD),
}

RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""What a relay (Slurm's node task, numarun as PID 1) passes on to its numarun."""


NUDGE = 255
"""A wake-up byte that is no signal (signal numbers stay below 65): another thread has news for the loop."""


class Wakeup:
    """The self-pipe the C-level handler of every signal with a Python handler writes to."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        for fd in (self.r, self.w):
            os.set_blocking(fd, False)
        self.previous = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)

    def read(self, timeout: float | None) -> list[int]:
        """The signals that came (0: a wake-up from :meth:`poke`), after waiting up to ``timeout``."""
        with contextlib.suppress(BlockingIOError):
            if select.select([self.r], [], [], timeout)[0]:
                return list(os.read(self.r, 4096))
        return []

    def poke(self) -> None:
        os.write(self.w, b"\0")

    def nudge(self) -> None:
        """Wake the reader for something other than a signal (:data:`NUDGE`)."""
        os.write(self.w, bytes([NUDGE]))

    def close(self) -> list[int]:
        """Stop writing (the wake-up fd before this one is put back); returns what was still unread."""
        signal.set_wakeup_fd(self.previous)
        left = self.read(0)
        os.close(self.r)
        os.close(self.w)
        return left


def _record(signum: int, frame: object) -> None:
    """The wake-up byte is the record."""


@contextlib.contextmanager
def recorded(signums: Sequence[int]) -> Iterator[Wakeup]:
    """For the block, ``signums`` only wake the returned :class:`Wakeup` (whose reader acts on them);
    afterwards the handlers and wake-up fd from before."""
    previous = {signum: signal.getsignal(signum) for signum in signums}
    wakeup = Wakeup()
    for signum in signums:
        signal.signal(signum, _record)
    try:
        yield wakeup
    finally:
        for signum in signums:
            signal.signal(signum, previous[signum])
        wakeup.close()


def say_ready(environ: dict[str, str] | os._Environ[str] | None = None) -> None:
    """Tell the relay that started this numarun (``NUMARUN_READY_FD``) that its signals are handled now."""
    fd = (os.environ if environ is None else environ).pop(READY_FD, "")
    with contextlib.suppress(OSError, ValueError):
        os.write(int(fd), b"1")
        os.close(int(fd))


class Relay:
    """Runs numarun as a child and passes it the signals this process gets (:data:`RELAYED`), each held
    until the child says its handlers are in place (sent at once, it would kill a Python still starting).
    ``reap_all`` (PID 1): every child that ends is reaped, as init's are. Made first thing: nothing is lost."""

    def __init__(self, *, reap_all: bool = False) -> None:
        self.reap_all = reap_all
        self.forwarded: set[int] = set()
        self.wakeup = Wakeup()
        for signum in (*RELAYED, signal.SIGCHLD):
            signal.signal(signum, _record)

    def run(self, argv: Sequence[str], env: Mapping[str, str], *, foreground: bool = False) -> int:
        """The child's exit code (128+N when killed by signal N). ``foreground``: the child leads the
        terminal's foreground process group (a Ctrl-C reaches it once, not again through this process)."""
        r, w = os.pipe()
        child = subprocess.Popen(list(argv), env={**env, READY_FD: str(w)}, pass_fds=(w,),
                                 preexec_fn=os.setpgrp if foreground else None)
        os.close(w)
        if foreground and os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            os.tcsetpgrp(0, child.pid)
        held: list[int] | None = []  # None once the child is ready
        status = None
        while status is None:  # a signal wakes it (SIGCHLD too); the timeout is a safety net
            if r in select.select([self.wakeup.r, *([r] if held is not None else [])], [], [], 1.0)[0]:
                for signum in held if os.read(r, 1) and held else []:
                    _send(child, signum)
                held = None
            for signum in self.wakeup.read(0):
                if signum in RELAYED:
                    self.forwarded.add(signum)
                    _send(child, signum) if held is None else held.append(signum)
            for pid, ended in reap() if self.reap_all else [os.waitpid(child.pid, os.WNOHANG)]:
                if pid == child.pid:
                    child.returncode, status = os.waitstatus_to_exitcode(ended), ended  # Popen must not wait again
        os.close(r)
        return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _send(child: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signum)


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
