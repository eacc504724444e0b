"""Signals, one way: handlers only record, one loop acts, and what a signal does is the table below.

A handler may not take a lock, touch a file, log or ask psutil (a signal that comes while the main
thread holds the same lock would deadlock it): the C-level handler writes the signal's number on a
self-pipe (``signal.set_wakeup_fd``) and the loop reading it acts. The one exception is a death signal
in a phase whose act is END or STOP: the handler raises, since only an exception unwinds the main thread.
"""

from __future__ import annotations

import enum
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

from ..envvars import INIT, READY_FD


class Phase(enum.Enum):
    """Where one numarun is when a signal comes."""

    STARTING = "before the plan"
    RENDEZVOUS = "torchrun runs, no worker alive (a rendezvous: the first, or after a restart)"
    RUNNING = "torchrun runs, workers alive"
    STOPPING = "a death signal was taken; torchrun or numarun is ending the run"
    BETWEEN = "between the jobs of a sweep"


class Act(enum.Enum):
    END = "the handler raises RunFailed: one line, exit 128+N (nothing to stop)"
    STOP = "the handler raises torch's SignalException: torchrun stops its workers, as for its own handler"
    HOLD = "the loop keeps it for the next job's workers"
    FORWARD = "the loop sends it to the live workers and notes it in the ledger for those yet to start"
    NOTE = "nothing more"


ON_SIGNAL: Mapping[Phase, tuple[Act, Act]] = {
    # phase:          (a death signal, SIGUSR1/SIGUSR2)
    Phase.STARTING:   (Act.END, Act.HOLD),
    Phase.RENDEZVOUS: (Act.STOP, Act.FORWARD),  # torch may wait in C++: the loop ends the run after a grace
    Phase.RUNNING:    (Act.STOP, Act.FORWARD),  # torchrun's own handler is in place: it stops the workers
    Phase.STOPPING:   (Act.NOTE, Act.FORWARD),
    Phase.BETWEEN:    (Act.END, Act.HOLD),
}

RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""What a relay (Slurm's node task, numarun as PID 1) passes on to its numarun."""


class Wakeup:
    """A self-pipe written by the C-level handler of every signal that has a Python handler."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        for fd in (self.r, self.w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)

    def read(self, timeout: float | None) -> list[int]:
        """The signals that came (0: a wake-up from :meth:`poke`), after waiting up to ``timeout``."""
        if select.select([self.r], [], [], timeout)[0]:
            try:
                return list(os.read(self.r, 4096))
            except BlockingIOError:
                pass
        return []

    def poke(self) -> None:
        os.write(self.w, b"\0")

    def close(self) -> list[int]:
        """Stop writing; returns what was still unread."""
        signal.set_wakeup_fd(-1)
        left = self.read(0)
        os.close(self.r)
        os.close(self.w)
        return left


def _record(signum: int, frame: object) -> None:
    """The wake-up byte is the record."""


def say_ready(environ: dict[str, str] | os._Environ[str] | None = None) -> None:
    """Tell the relay that started this numarun (``NUMARUN_READY_FD``) that its signals are handled now."""
    fd = (os.environ if environ is None else environ).pop(READY_FD, "")
    if fd.isdigit():
        try:
            os.write(int(fd), b"1")
            os.close(int(fd))
        except OSError:
            pass


class Relay:
    """Runs numarun as a child and passes it the signals this process gets (:data:`RELAYED`).

    A signal is held until the child says its handlers are in place (sent at once, it would kill a
    Python still starting). With ``reap_all`` (PID 1) every child that ends is reaped, as init's are.
    Constructed first thing: from then on no signal is lost.
    """

    def __init__(self, *, reap_all: bool = False) -> None:
        self.reap_all = reap_all
        self.forwarded: set[int] = set()
        self.wakeup = Wakeup()
        for signum in (*RELAYED, signal.SIGCHLD):
            signal.signal(signum, _record)

    def run(self, argv: Sequence[str], env: Mapping[str, str], *, foreground: bool = False) -> int:
        """The child's exit code (128+N when killed by signal N). ``foreground``: the child leads a process
        group of its own, the terminal's foreground one (a Ctrl-C reaches it once, not through us again)."""
        r, w = os.pipe()
        child = subprocess.Popen(list(argv), env={**env, READY_FD: str(w)}, pass_fds=(w,),
                                 preexec_fn=os.setpgrp if foreground else None)
        os.close(w)
        if foreground and os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            os.tcsetpgrp(0, child.pid)
        held: list[int] | None = []  # None once the child is ready
        status = None
        while status is None:
            # a signal wakes the loop (SIGCHLD too); the timeout is a safety net, not a poll
            if r >= 0 and r in select.select([r, self.wakeup.r], [], [], 1.0)[0]:
                said = os.read(r, 1)
                os.close(r)
                r = -1
                for signum in held if said and held else []:
                    self._send(child, signum)
                held = None
            for signum in self.wakeup.read(0 if r >= 0 else 1.0):
                if signum in RELAYED:
                    self.forwarded.add(signum)
                    if held is None:
                        self._send(child, signum)
                    else:
                        held.append(signum)
            status = self._reap(child)
        if r >= 0:
            os.close(r)
        return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)

    def _reap(self, child: subprocess.Popen[bytes]) -> int | None:
        """The child's wait status once it ended; with ``reap_all`` every other ended child is collected too."""
        found = None
        for pid, status in reap() if self.reap_all else [os.waitpid(child.pid, os.WNOHANG)]:
            if pid == child.pid:
                child.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
                found = status
        return found

    @staticmethod
    def _send(child: subprocess.Popen[bytes], signum: int) -> None:
        if child.returncode is None:
            try:
                os.kill(child.pid, signum)
            except ProcessLookupError:
                pass


def reap() -> Iterable[tuple[int, int]]:
    """(pid, wait status) of every child of this process that has ended, collected."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def init_main(argv: Sequence[str]) -> int:
    """numarun as PID 1 (a container's command, a pod): init's duties, as tini does them.

    The job runs in a child numarun; this process only passes it the signals it gets and reaps
    every process that ends under it, the orphans it inherits included, then exits with the child's
    exit code. The child's own orphans come here too (it is no subreaper: :data:`envvars.INIT`)."""
    relay = Relay(reap_all=True)
    env = {**os.environ, INIT: "1"}
    return relay.run([sys.executable, "-m", "numarun", *argv], env, foreground=True)
