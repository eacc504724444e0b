"""One numarun's life around torchrun: its private directory and cleaner, where its processes are,
its signals, its deadlines and the environment it hands the workers.

:class:`Supervisor` owns what a launch needs beyond torchrun itself, so that nothing of it lives
in module globals:

* a private directory (0700, ``$TMPDIR/numarun-*``) for the plan file, torchelastic's logs
  (``--log-dir``) and the :mod:`ledger <numarun.ledger>` the workers keep there; removed
  on every exit path, by an atexit handler or, when numarun dies without running it (SIGKILL), by
  a small cleaner process;
* a cage (:mod:`numarun.launch.reaper`): every process the job starts, in whatever session, is
  ended when numarun ends;
* signals, from the moment the run command starts: death signals (SIGTERM, SIGINT, SIGHUP,
  SIGQUIT) end the run, forwarded ones (SIGUSR1, SIGUSR2) reach every worker, whenever they
  arrive (before the workers exist, in their bootstrap, or later);
* deadlines: every rendezvous, the first and each one after a restart, ends by torch's own
  timeout plus a margin, named in the error; a refusal by another node ends this one at once;
* the environment: the variables a job sets are put back afterwards (a sweep runs several).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

from .. import envvars, ledger
from ..errors import NumarunError
from . import reaper
from .spec import FORWARDED_SIGNALS, LaunchSpec

log = logging.getLogger(__name__)

SIGNAL_GRACE_S = 5.0
"""How long a death signal may wait for Python code to see it before numarun ends anyway."""


class RunFailed(NumarunError):
    """A worker failed (its exit code is the run's) or numarun was stopped by a signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def failure_cause(failure: Any) -> str:
    """``ValueError: boom`` from a failed worker's torchelastic error file ('' when it wrote none)."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    if not isinstance(message, str) or not message or message.startswith(("To enable traceback", "Signal ")):
        return ""  # torchelastic's own placeholder: the worker wrote no error file
    return message.splitlines()[0]


def runtime_cause(e: BaseException) -> str:
    """``Type: first line`` of an exception, with the endpoint a network error names."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    # c10d's errors put the cause last: "... The server socket has failed to listen on any local
    # network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    for line in lines:
        if "EADDRINUSE" in line or "address already in use" in line:
            text = f"{text} (address already in use)"
            break
    return f"{type(e).__name__}: {text}"


@contextlib.contextmanager
def scoped_environ(updates: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``updates`` for the block; afterwards every variable is as before (also
    those torchrun sets itself, such as OMP_NUM_THREADS), so the next job of a sweep starts clean."""
    before = dict(os.environ)
    os.environ.update(updates)
    try:
        yield
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


def _names_to_numbers(names: tuple[str, ...]) -> set[int]:
    return {int(getattr(signal, n)) for n in names if isinstance(getattr(signal, n, None), signal.Signals)}


class Supervisor:
    """What one numarun process owns around its launches (see the module docstring)."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._cleaner: subprocess.Popen[bytes] | None = None
        self._cage: reaper.Cage | None = None
        self._pending: list[int] = []
        self._reported = False
        self._death: set[int] = _names_to_numbers(("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"))
        self._forwarded: set[int] = _names_to_numbers(FORWARDED_SIGNALS)
        self._closed = False

    # ----------------------------------------------------------------- signals before the run
    def hold_signals(self, environ: Mapping[str, str] | None = None) -> None:
        """From now on numarun handles its signals: until the workers run, each is held (a death
        signal: the run does not start; a forwarded one: the workers get it when they start).
        Tells a Slurm node task waiting on ``NUMARUN_READY_FD`` that signals are safe to send."""
        env = os.environ if environ is None else environ
        for signum in self._death | self._forwarded:
            signal.signal(signum, self._hold)
        fd = env.get(envvars.READY_FD, "")
        if fd.isdigit():
            try:
                os.write(int(fd), b"1")
                os.close(int(fd))
            except OSError:
                pass

    def release(self) -> None:
        """Hand the signals back to Python's defaults and deliver what was held to this process, as if
        it had come now (per-rank mode: the process becomes the rank, which handles its own)."""
        held, self._pending = self._pending, []
        for signum in self._death | self._forwarded:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        for signum in held:
            os.kill(os.getpid(), signum)

    def _hold(self, signum: int, frame: object) -> None:
        self._pending.append(signum)
        if signum in self._death:
            # nothing has started: stop now, as torchrun would before its workers exist
            self._reported = True
            raise RunFailed(f"stopped by {signal.Signals(signum).name}; no worker was running", 128 + signum)

    # ----------------------------------------------------------------- private directory
    @property
    def state(self) -> Path:
        """The private directory, created (with its cleaner and cage) on first use."""
        if self._dir is None:
            directory = Path(tempfile.mkdtemp(prefix="numarun-"))
            # started before numarun enters its cage: the cleaner must outlive what it ends
            self._cleaner = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", reaper.CLEANER, str(directory), str(os.getpid()), str(reaper.WATCH_S)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
            self._dir = directory
            self._cage = reaper.enter()
            (directory / reaper.CAGE_FILE).write_text(self._cage.record())
            atexit.register(self.close)
        return self._dir

    def write_plan(self, text: str, run_dir: os.PathLike[str] | str | None = None, *, node: str | None = None) -> Path:
        """The plan as a file (mode 0600) for this node's workers; returns its path.

        Always in the private directory: a run dir is shared by every node of a job on a shared
        filesystem, and a plan there would be read by the workers of whichever node wrote it last.
        With ``run_dir`` a copy is kept there as the record of how the job ran:
        ``numarun_plan.json``, or ``numarun_plan.<node>.json`` on a job of several nodes.
        """
        from ..fsutil import write_atomic

        path = self.state / "plan.json"
        path.unlink(missing_ok=True)  # the next job of a sweep
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if run_dir is not None:
            record = Path(run_dir) / ("numarun_plan.json" if node is None else f"numarun_plan.{node}.json")
            write_atomic(record, text, mode=0o600)
        return path

    def close(self) -> None:
        """End what the job left (in its cage), remove the private directory, release the cleaner."""
        if self._closed or self._dir is None:
            return
        self._closed = True
        if self._cage is not None:
            self._cage.end_others(spare=self._spare())
            reaper.leave(self._cage)
        shutil.rmtree(self._dir, ignore_errors=True)  # first: the cleaner then finds nothing to do
        if self._cleaner is not None and self._cleaner.stdin is not None:
            self._cleaner.stdin.close()
            try:
                self._cleaner.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._cleaner.kill()

    def _spare(self) -> frozenset[int]:
        return frozenset({self._cleaner.pid}) if self._cleaner is not None else frozenset()

    def die(self, code: int, message: str) -> NoReturn:
        """From a watcher thread: one line, everything ended, exit ``code`` now."""
        print(f"numarun: error: {message}", file=sys.stderr, flush=True)
        self.close()
        os._exit(code)

    # ----------------------------------------------------------------- workers
    def live_workers(self) -> list[int]:
        """Pids of this numarun's workers (registered in the ledger, still its children)."""
        import psutil

        children = {c.pid for c in psutil.Process().children()}
        return sorted(pid for pid, _ in ledger.workers(self.state).values() if pid in children)

    def _forward(self, signum: int, frame: object) -> None:
        import psutil

        alive = {c.pid for c in psutil.Process().children()}
        sent = ledger.forward(self.state, signum, alive)
        log.warning("got %s: sending it to %d worker(s) (workers yet to start get it when they do)",
                    signal.Signals(signum).name, len(sent))

    def _terminate(self, signum: int, frame: object) -> None:
        from .torch_private import signal_exception

        raise signal_exception(signum)

    # ----------------------------------------------------------------- watchers
    def _watch_death(self, death: set[int]) -> Any:
        """End numarun when a death signal arrives while its main thread is stuck in C++.

        Python runs signal handlers only between bytecodes of the main thread; torch's rendezvous
        waits inside C++ (a TCPStore wait) and would not see SIGTERM until its own timeout. The
        signal module's wakeup fd is written by the C-level handler at once, so a thread reading it
        learns of the signal; if no worker is running and the run has not reported the signal
        within :data:`SIGNAL_GRACE_S`, it prints the same line and exits 128 + N.
        """
        r, w = os.pipe()
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)

        def loop() -> None:
            while True:
                try:
                    data = os.read(r, 64)
                except OSError:
                    return
                if not data:
                    return
                for signum in data:
                    if signum not in death:
                        continue
                    time.sleep(SIGNAL_GRACE_S)
                    if self._reported or self.live_workers():
                        continue
                    self.die(128 + signum, f"stopped by {signal.Signals(signum).name}; no worker was running")

        threading.Thread(target=loop, name="numarun-signals", daemon=True).start()

        def stop() -> None:
            signal.set_wakeup_fd(old)
            os.close(w)

        return stop

    def _watch_rendezvous(self, spec: LaunchSpec) -> Any:
        """A deadline on every rendezvous: the first, and each after a restart. torch's c10d client
        waits without end on an endpoint where another program listens, and a re-rendezvous after a
        rank failed waits for nodes that may be gone. When no worker runs for longer than the
        deadline, numarun prints one line naming it and exits 1."""
        seconds, source = spec.rendezvous_deadline()
        done = threading.Event()

        def wait() -> None:
            idle_since = time.monotonic()
            while not done.wait(1.0):
                if self.live_workers():
                    idle_since = time.monotonic()
                    continue
                if time.monotonic() - idle_since < seconds:
                    continue
                groups = [g for _, g in ledger.workers(self.state).values()]
                which = f"the rendezvous after restart {max(groups) + 1}" if groups else "the rendezvous"
                self.die(1, f"{which} did not complete within {seconds} s ({source}) at {spec.endpoint_text()!r}; "
                            "expected every node to join and the rendezvous store at that endpoint (is another program "
                            "listening on it, or is a node gone?)")

        threading.Thread(target=wait, name="numarun-rendezvous", daemon=True).start()
        return done.set

    def _watch_abort(self, spec: LaunchSpec) -> Any:
        """Stop this node when another node of the job refused to start (:mod:`numarun.launch.abort`)."""
        where = spec.store_address()
        if where is None:
            return lambda: None
        from . import abort

        return abort.watch(where[0], where[1], until=lambda: bool(ledger.workers(self.state)),
                           on_abort=lambda message: self.die(2, f"{message}; this node stops too"))

    # ----------------------------------------------------------------- the run
    def run(self, spec: LaunchSpec, env: Mapping[str, str]) -> None:
        """``torch.distributed.run.main`` on the spec's argv with ``env`` added; failures become
        :class:`RunFailed`.

        A failed run exits with the exit code of the lowest global rank that exited non-zero
        (1 when every failed rank died from a signal). Signals to numarun:

        * SIGTERM, SIGINT, SIGHUP, SIGQUIT (``--signals-to-handle``): sent on to every worker,
          which gets torchrun's 30 s (``--shutdown-timeout``) before SIGKILL. When every worker
          then exits 0 on its own (the trainer's checkpoint-and-stop) the run is a clean stop:
          one line, exit 0. Otherwise one error line and exit 128 + N. During rendezvous: 128 + N.
        * SIGUSR1, SIGUSR2: sent on to every worker; numarun keeps waiting, and the run's result is
          the workers' (the trainer checkpoints and exits 0; a script without a handler dies).
        * SIGKILL: workers die with it (each has a parent-death signal), and the cleaner ends what
          is left in the cage and removes the private directory.
        """
        from . import torch_private

        torch_private.import_torchrun()  # torch's first import, with the collector paused
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous.api import RendezvousError
        from torch.distributed.run import main as torchrun_main

        torch_private.install()
        state = self.state
        ledger.clear(state)
        death = _names_to_numbers(spec.death_signals)
        for signum in self._pending:  # held since the run command started
            if signum in self._forwarded:
                ledger.forward(state, signum, alive=set())
        self._pending.clear()
        previous = {}
        for signum in death | self._forwarded:
            previous[signum] = signal.signal(signum, self._terminate if signum in death else self._forward)
        self._reported = False
        stops = [self._watch_death(death), self._watch_rendezvous(spec), self._watch_abort(spec)]
        updates = {**env, envvars.LAUNCHER_PID: str(os.getpid()), envvars.STATE_DIR: str(state)}
        try:
            with scoped_environ(updates):
                torchrun_main(spec.argv(log_dir=str(state / "logs")))
        except ChildFailedError as e:
            parts = []
            for rank in sorted(e.failures):
                failure = e.failures[rank]
                how = (f"exited with code {failure.exitcode}" if failure.exitcode >= 0
                       else f"was killed by {failure.signal_name()}")
                cause = failure_cause(failure)
                who = f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid})"
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
                f"{spec.endpoint_text()!r} is unreachable); expected every node to stay up and reach it",
                1,
            ) from None
        except torch_private.signal_exception_type() as e:
            self._reported = True
            sig = signal.Signals(getattr(e, "sigval", signal.SIGTERM))
            if ledger.stopped_cleanly(state, spec.nproc_per_node):
                print(f"numarun: stopped by {sig.name}: every worker finished cleanly", file=sys.stderr, flush=True)
                return
            raise RunFailed(f"stopped by {sig.name}; all workers were ended", 128 + int(sig)) from None
        except (RuntimeError, ValueError, OSError) as e:
            # torchrun's own runtime failures (a taken port, a store that cannot be reached...):
            # one line naming the cause instead of its traceback.
            raise RunFailed(f"torchrun failed: {runtime_cause(e)}", 1) from None
        finally:
            for stop in stops:
                stop()
            for signum in previous:
                signal.signal(signum, self._hold)  # held again until the next job of a sweep
            if self._cage is not None:
                self._cage.end_others(spare=self._spare())  # what the workers left behind, in any session
                reaper.reap_zombies()
