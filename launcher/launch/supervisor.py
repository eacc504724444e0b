"""One numarun's life around torchrun, in the order a run goes through it:

1. :meth:`Supervisor.hold_signals`, first thing: the process's one signal loop
   (:mod:`numarun.launch.signals` says what each signal does in each phase), with this supervisor as
   its target and its periodic check (:meth:`Supervisor._tick`);
2. :meth:`Supervisor.start`, before the first job: the private directory (0700, ``$TMPDIR/numarun-*``:
   the plan, torchelastic's logs, the :mod:`ledger <numarun.ledger>`), its cleaner (which removes it
   and ends the job's processes when numarun dies, however) and the cage (:mod:`numarun.launch.reaper`);
3. :meth:`Supervisor.run`, each job: torchrun in the main thread, while the loop forwards SIGUSR1/2,
   keeps the rendezvous deadline and listens for another node's refusal, and the hang watchdog's thread
   (:mod:`numarun.launch.hangs`) watches the ranks' progress;
4. :meth:`Supervisor.close` (atexit too): the job's processes ended, the directory removed.

A death signal that stops the ranks goes through :meth:`Supervisor._begin_stop` first, whichever thread sees it:
the hang watchdog's roll-call is written there, before any rank is killed; the watchdog's own stop comes through
the loop's periodic check (:meth:`Supervisor._tick`).
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
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .. import envvars, ledger, torch_private
from ..errors import RunFailed
from ..fsutil import write_atomic
from . import net, oom, reaper, signals
from .abort import AbortWatch
from .agent import AgentPolicy, NodeAgent
from .hangs import write_job_record
from .signals import Phase, reap, say_ready
from .spec import LaunchSpec

log = logging.getLogger(__name__)

SIGNAL_GRACE_S = 5.0
"""How long a death signal may wait for the main thread (stuck in C++) to take it before the loop ends the run."""
TICK_S = 0.5
STOP_HOLD_S = 60.0
"""How long the main thread waits for the loop's exit once a hang stop began (it ends the process long before)."""


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


@dataclass
class _Job:  # what the loop watches while a job runs
    spec: LaunchSpec
    deadline_s: int
    source: str
    abort: AbortWatch | None
    idle_since: float


class Supervisor:
    """What one numarun process owns around its launches (see the module docstring); the target of the
    process's signal loop while no sweep's jobs are (:class:`numarun.launch.signals.SignalTarget`)."""

    def __init__(self) -> None:
        self.private_dir: Path | None = None
        self._cleaner: subprocess.Popen[bytes] | None = None
        self._cage: reaper.Cage | None = None
        self._job: _Job | None = None
        self._loop: signals.Loop | None = None
        self._stopped: tuple[float, int] | None = None  # when a death signal was taken, which (the grace for C++)
        self._closed = False
        self._agent: NodeAgent | None = None
        self._hang_stop: tuple[int, str] | None = None  # the watchdog asks the loop to end the job
        self._hang_hold = threading.Event()  # set: the loop is about to end the job; the main thread waits for it
        self._stderr_fd: int | None = None  # numarun's stderr while its fd 2 is quieted for a hang stop

    @property
    def loop(self) -> signals.Loop:
        assert self._loop is not None, "hold_signals() comes first"
        return self._loop

    # ----------------------------------------------------------------- 1. signals
    def hold_signals(self, environ: dict[str, str] | None = None) -> None:
        """From now on numarun handles its signals (:data:`~numarun.launch.signals.ON_SIGNAL`); tells a relay
        waiting on ``NUMARUN_READY_FD`` that signals are safe to send."""
        self._loop = signals.loop()
        with self.loop.lock:
            self.loop.target, self.loop.phase = self, Phase.STARTING
        self.loop.handle((*signals.DEATH, *signals.FORWARDED))
        self.loop.every(TICK_S, self._tick)
        say_ready(environ)

    def release(self) -> None:
        """Per-rank mode: Python's own dispositions back, the loop ended, and what was held delivered to
        this process as if it came now (the process becomes the rank, which handles its own)."""
        torch_private.users_cpp_logs()  # the process becomes the user's: torch's C++ logs as the user set them
        for signum in self.loop.close():
            if signum in signals.FORWARDED:
                os.kill(os.getpid(), signum)

    # what the loop has the supervisor do (signals.SignalTarget)
    def end(self, signum: int) -> BaseException:
        return RunFailed(f"stopped by {signal.Signals(signum).name}; no worker was running", 128 + signum)

    def stop(self, signum: int, *, again: bool) -> None:
        """A death signal while torchrun runs: torchrun's shutdown, through torch's own signal exception in the
        main thread (a second one changes nothing: torchrun's shutdown goes on)."""
        self._begin_stop(signum)
        if again:
            return
        self._stopped = (time.monotonic(), signum)
        torch_private.quiet_shutdown()  # numarun's one line says it
        self.loop.interrupt(torch_private.signal_exception(signum), signum)

    def _begin_stop(self, signum: int) -> None:
        """The one place the supervisor begins stopping ranks for a death signal (the Slurm time limit's SIGTERM,
        numarun's own stop), before any rank is sent anything: where each rank stood is written (the ranks dump
        their stacks now, racing torchrun's SIGTERM to them; their last samples stand in for those that lose; the
        file follows). Called by the loop and by the main thread, whichever comes first."""
        if self._agent is not None:
            self._agent.at_stop(signum)

    def _hold(self) -> None:
        """A stop is coming from the loop: the main thread, should torchrun return or fail meanwhile (a rank
        killed on another node, the rendezvous store gone with it), waits for the loop's exit code. What torch
        says meanwhile (its agent logging the ranks it loses, the store gone) goes nowhere: numarun's one line
        will say what happened."""
        if self._hang_hold.is_set():
            return
        self._hang_hold.set()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
            self._stderr_fd = os.dup(2)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)

    def _request_stop(self, code: int, message: str) -> None:
        """The hang watchdog's thread (``--on-hang stop``): the loop ends the job (:meth:`_tick`)."""
        self._hold()
        self._hang_stop = (code, message)
        self.loop.poke()

    def forward(self, signum: int) -> None:
        import psutil

        if self.private_dir is None:  # no job started yet: kept, as HOLD keeps it
            with self.loop.lock:
                self.loop.held.append(signum)
            log.warning("got %s: the workers get it when they start", signal.Signals(signum).name)
            return
        sent = ledger.forward(self.private_dir, signum, {c.pid for c in psutil.Process().children()})
        log.warning(
            "got %s: sending it to %d worker(s) (workers yet to start get it when they do)",
            signal.Signals(signum).name,
            len(sent),
        )

    def _tick(self, now: float) -> None:
        """The loop's periodic check: the phase (workers alive or not), the rendezvous deadline (the first, and
        each after a restart), another node's refusal, and a death signal the main thread could not take."""
        if self._hang_stop is not None:  # the hang watchdog's --on-hang stop
            self.die(*self._hang_stop)
        job = self._job
        if job is None or self.private_dir is None:
            return
        alive = bool(self.live_workers())
        with self.loop.lock:
            if self.loop.phase in (Phase.RENDEZVOUS, Phase.RUNNING):
                self.loop.phase = Phase.RUNNING if alive else Phase.RENDEZVOUS
            phase = self.loop.phase
        if phase is Phase.STOPPING:
            taken, signum = self._stopped or (now, 0)
            if signum and not self.loop.interrupted() and not alive and now - taken >= SIGNAL_GRACE_S:
                # the main thread waits in C++ (torch's rendezvous) and cannot take the signal
                self.die(128 + signum, f"stopped by {signal.Signals(signum).name}; no worker was running")
            return
        if alive:
            job.idle_since, job.abort = now, None
            return
        if now - job.idle_since >= job.deadline_s:
            groups = [g for _, g in ledger.workers(self.private_dir).values()]
            which = f"the rendezvous after restart {max(groups) + 1}" if groups else "the rendezvous"
            self.die(
                1,
                f"{which} did not complete within {job.deadline_s} s ({job.source}) at "
                f"{job.spec.endpoint_text()!r}; expected every node to join and the rendezvous store at "
                "that endpoint (is another program listening on it, or is a node gone?)",
            )
        message = job.abort.poll() if job.abort is not None else None
        if message:
            self.die(2, f"{message}; this node stops too")

    def live_workers(self) -> list[int]:
        """Pids of this numarun's workers (registered in the ledger, still its children)."""
        if self.private_dir is None:
            return []
        import psutil

        children = {c.pid for c in psutil.Process().children()}
        return sorted(pid for pid, _ in ledger.workers(self.private_dir).values() if pid in children)

    # ----------------------------------------------------------------- 2. the private directory
    def start(self) -> Path:
        """Make the private directory, start its cleaner, enter the cage; later calls return the directory."""
        if self.private_dir is not None:
            return self.private_dir
        directory = Path(tempfile.mkdtemp(prefix="numarun-"))
        # before numarun enters its cage: the cleaner outlives what it ends
        self._cleaner = subprocess.Popen(
            [sys.executable, "-I", "-S", reaper.CLEANER, str(directory), str(os.getpid()), str(reaper.WATCH_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._cage = reaper.enter()
        (directory / reaper.CAGE_FILE).write_text(self._cage.record())
        write_job_record(directory, sys.argv)
        self.private_dir = directory
        atexit.register(self.close)
        return directory

    def write_plan(self, text: str, run_dir: os.PathLike[str] | str | None = None, *, node: str | None = None) -> Path:
        """The plan for this node's workers, in the private directory (made by :meth:`start` if need be; mode 0600:
        a run dir may be shared by every node); returns its path. ``run_dir`` keeps the record,
        ``numarun_plan[.<node>].json``."""
        path = self.start() / "plan.json"
        write_atomic(path, text, mode=0o600)  # replaces the plan of a sweep's previous job
        if run_dir is not None:
            record = Path(run_dir) / ("numarun_plan.json" if node is None else f"numarun_plan.{node}.json")
            write_atomic(record, text, mode=0o600)
        return path

    # ----------------------------------------------------------------- 3. a job
    def run(
        self,
        spec: LaunchSpec,
        env: Mapping[str, str],
        *,
        agent: AgentPolicy | None = None,
        run_dir: os.PathLike[str] | str | None = None,
    ) -> None:
        """``torch.distributed.run.main`` on the spec's argv with ``env`` added; failures become
        :class:`RunFailed` (docs/reference/exit-codes.md; docs/run.md, "Signals"). ``agent``: the node agent's policy,
        the hang watchdog's (docs/hangs.md) and the step report's (docs/steps.md), whose files are kept in
        ``run_dir``, else the log dir, else ``$TMPDIR``."""
        torch_private.quiet_cpp_logs()
        torch_private.import_torchrun()  # torch's first import, with the collector paused
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous.api import RendezvousError
        from torch.distributed.run import main as torchrun_main

        torch_private.install()
        torch_private.quiet_internals()
        torch_private.route_signals(self.loop.handler)  # torchrun installs the loop's handler, not its own
        keyed = bool(spec.node_key) and spec.backend != "static" and torch_private.order_nodes(spec.node_key)
        directory = self.start()
        ledger.clear(directory)
        deadline_s, source = spec.rendezvous_deadline()
        where = spec.store_address()
        self._job = _Job(spec, deadline_s, source, AbortWatch(*where) if where else None, time.monotonic())
        # --signals-to-handle's names as numbers
        death = {
            int(getattr(signal, n)) for n in spec.death_signals if isinstance(getattr(signal, n, None), signal.Signals)
        }
        self.loop.handle(sorted(death))  # a --signals-to-handle of its own: once, for the process
        with self.loop.lock:
            base_death, self.loop.death = self.loop.death, self.loop.death | death
            self.loop.phase = Phase.RENDEZVOUS
            held = self.loop.take_held()
        for signum in held:  # noted for the workers before any of them can register
            ledger.forward(directory, signum, alive=set())
        agent = agent or AgentPolicy()
        updates = {
            **dict(spec.env),
            **env,
            **agent.worker_env(),
            envvars.LAUNCHER_PID: str(os.getpid()),
            envvars.STATE_DIR: str(directory),
        }
        self._hang_stop = None
        plan = env.get(envvars.PLAN)
        node_agent = self._agent = NodeAgent(
            agent,
            directory,
            keep=run_dir or spec.log_dir,
            store=where,
            plan=Path(plan) if plan else None,
            request_stop=self._request_stop,
            hold=self._hold,
        ).start()
        torch_private.before_exit_barrier(node_agent.before_exit_barrier)
        succeeded = False
        kills = oom.kills()  # a rank killed for memory is told from these counts rising
        try:
            if spec.waits_for_store:  # quietly, instead of torch's C++ client retrying aloud
                net.await_endpoint(*spec.endpoint(), deadline_s - spec.rdzv_margin_s, source.partition(" +")[0])
            with scoped_environ(updates):
                torchrun_main(spec.argv(log_dir=str(directory / "logs")))
            succeeded = True
        except ChildFailedError as e:
            parts = []
            for rank in sorted(e.failures):
                failure = e.failures[rank]
                how = (
                    f"exited with code {failure.exitcode}"
                    if failure.exitcode >= 0
                    else f"was killed by {failure.signal_name()}"
                    + oom.explain(kills, failure.pid, signum=-failure.exitcode)
                )
                cause = torch_private.failure_cause(failure)
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
            sig = signal.Signals(getattr(e, "sigval", signal.SIGTERM))
            self._begin_stop(int(sig))
            if ledger.stopped_cleanly(directory, spec.nproc_per_node):
                print(f"numarun: stopped by {sig.name}: every worker finished cleanly", file=sys.stderr, flush=True)
                return
            raise RunFailed(f"stopped by {sig.name}; all workers were ended", 128 + int(sig)) from None
        except (RuntimeError, ValueError, OSError) as e:
            # torchrun's own runtime failures (a taken port, a store that cannot be reached...):
            # one line naming the cause instead of its traceback.
            raise RunFailed(f"torchrun failed: {torch_private.runtime_cause(e)}", 1) from None
        finally:
            if keyed:
                torch_private.order_nodes(None)  # the next job of a sweep starts as torch's own
            if self._hang_hold.is_set():  # the loop ends the run with the watchdog's code (os._exit): nothing to add
                time.sleep(STOP_HOLD_S)
            torch_private.before_exit_barrier(None)
            self._agent = None
            node_agent.hangs.settle()  # a roll-call begun at a stop is written before the directory goes
            node_agent.close(succeeded=succeeded)  # the step report's summary and files, before the directory goes
            with self.loop.lock:
                if self.loop.phase is not Phase.STOPPING:
                    self.loop.phase = Phase.BETWEEN
                self._job, self.loop.death = None, base_death
            for signum in self.loop.handled:  # torchrun's own handlers, outside the checked torch versions
                if signal.getsignal(signum) != self.loop.handler:
                    signal.signal(signum, self.loop.handler)
            if self._cage is not None:
                self._cage.end_others(spare=self._spare())  # what the workers left behind, in any session
                if self._cage.kind == "subreaper":
                    for _ in reap():  # orphans it inherited (no one else waits for a child now)
                        pass

    # ----------------------------------------------------------------- 4. the end
    def close(self) -> None:
        """End what the job left (in its cage), remove the private directory, release the cleaner."""
        if self._loop is not None:
            self._loop.phase = Phase.STOPPING  # a death signal now changes nothing
        if self._closed or self.private_dir is None:
            return
        self._closed = True
        if self._cage is not None:
            self._cage.end_others(spare=self._spare())
            reaper.leave(self._cage)
        shutil.rmtree(self.private_dir, ignore_errors=True)  # first: the cleaner then finds nothing to do
        if self._cleaner is not None and self._cleaner.stdin is not None:
            self._cleaner.stdin.close()
            try:
                self._cleaner.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._cleaner.kill()

    def _spare(self) -> frozenset[int]:
        return frozenset({self._cleaner.pid}) if self._cleaner is not None else frozenset()

    def die(self, code: int, message: str) -> NoReturn:
        """From the loop: one line, everything ended, exit ``code`` now."""
        line = f"numarun: error: {message}\n"
        if self._stderr_fd is not None:
            os.write(self._stderr_fd, line.encode())
        else:
            print(line, end="", file=sys.stderr, flush=True)
        self.close()
        os._exit(code)
