"""numarun's node agent: one thread per job and node that watches the ranks for the hang watchdog and the step report.

The ranks write what they do in numarun's private directory (their heartbeats, their step records: the job's
``NUMARUN_STATE_DIR``); the agent reads it, and in a multi-node job meets the other nodes' agents in the job's store
through one :class:`~numarun.launch.exchange.Exchange`. Its two uses:

* the hang watchdog (:class:`~numarun.launch.hangs.watch.HangWatch`), every sample (``--hang-timeout``'s tenth): the
  verdict, the roll-call, ``numarun stacks``'s requests (on :data:`~numarun.launch.hangs.stacks.FIFO`), where each
  rank stood at a stop;
* the step report (:class:`~numarun.launch.steps.watch.StepWatch`), polled every :data:`POLL_S`: a report every
  ``NUMARUN_STEP_INTERVAL``, at the ranks' first records and at each rank's exit.

One thread, so the uses never race for the store: a roll-call that waits for the other nodes (up to a minute and a
half when one does not answer) holds the step report's next look for as long; a hung job's steps stand still anyway.
The same agent runs under torchrun's agent in numarun's process (the supervisor starts it) and, in per-rank mode,
in a sidecar process of its own.

At the end of a job that succeeded, :meth:`NodeAgent.before_exit_barrier` runs in torchrun's exit barrier, before it
waits for the other nodes: this node's last view goes to the judge, and the exchange closes, so that nothing of
numarun's touches the store once its host may have left (torch's client would print C++ frames for it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .exchange import Exchange, Keys
from .hangs.exchange import RollCallKeys
from .hangs.policy import HangPolicy
from .hangs.stacks import FIFO
from .hangs.verdict import read_beats
from .hangs.watch import HangWatch
from .notes import Notes
from .steps.exchange import ViewKeys
from .steps.policy import StepPolicy
from .steps.watch import StepWatch

_K = TypeVar("_K")

POLL_S = 0.1
"""How often the agent looks at the ranks while the step report is on: a rank's exit waits on it."""
KEEP_DIR = "numarun_{kind}.{host}.{pid}"
"""What numarun keeps of a job on each node (the roll-calls: ``hangs``, the steps: ``steps``), in the run dir, the log
dir or ``$TMPDIR``. Not ``numarun-*``: that is the private directory's pattern, removed at exit."""
HANDOVER_FALLBACK_S = 1.0
"""Where torchrun's exit barrier could not be joined (a torch whose private parts numarun does not know), how long the
judge waits at the end for the other nodes' last views."""


def keep_dir(kind: str, base: os.PathLike[str] | str | None) -> Path:
    """Where this numarun keeps what it says of a job: ``<base>/numarun_<kind>.<host>.<pid>`` (base: the run dir, the
    log dir, else ``$TMPDIR``)."""
    root = Path(base).absolute() if base else Path(tempfile.gettempdir())
    return root / KEEP_DIR.format(kind=kind, host=socket.gethostname(), pid=os.getpid())


def say(lines: Iterable[str]) -> None:
    """Lines on numarun's stderr, each ``numarun: ``-prefixed."""
    sys.stderr.write("".join(f"numarun: {line}\n" for line in lines))
    sys.stderr.flush()


@dataclass(frozen=True)
class AgentPolicy:
    """The agent's settings: the hang watchdog's and the step report's."""

    hang: HangPolicy = HangPolicy()
    steps: StepPolicy = StepPolicy()

    @property
    def poll_s(self) -> float:
        """How often the agent's thread wakes: the step report's poll, else the watchdog's sample."""
        return min(POLL_S, self.hang.tick_s) if self.steps.on else self.hang.tick_s

    def worker_env(self) -> dict[str, str]:
        """What the ranks are told of the agent (their recorders' settings)."""
        return {**self.hang.worker_env(), **self.steps.worker_env()}


class NodeAgent:
    """One job's agent on this node (see the module docstring). ``store``: (host, port) of a multi-node job's store;
    ``request_stop(code, message)`` asks the supervisor to end the job (``--on-hang stop``), ``hold()`` says such a
    stop is coming."""

    def __init__(
        self,
        policy: AgentPolicy,
        state: Path,
        *,
        keep: os.PathLike[str] | str | None,
        store: tuple[str, int] | None,
        plan: Path | None,
        request_stop: Callable[[int, str], None],
        hold: Callable[[], None],
        say: Callable[[Iterable[str]], None] = say,
        client: Callable[[str, int], Any] | None = None,
        stop_ending: str | None = None,
    ) -> None:
        self.policy = policy
        self.state = state
        self.notes = Notes(say)
        """Its troubles (a file it cannot write, a use that failed), each said once."""
        self.exchange = (Exchange(*store, client=client) if client else Exchange(*store)) if store else None
        self.hangs = HangWatch(
            policy.hang,
            state,
            keep=keep_dir("hangs", keep),
            keys=functools.partial(self._keys, "hang", RollCallKeys),
            request_stop=request_stop,
            hold=hold,
            say=say,
            notes=self.notes,
            **({"ending": stop_ending} if stop_ending else {}),
        )
        self.steps = (
            StepWatch(
                policy.steps,
                state,
                keep=keep_dir("steps", keep),
                keys=functools.partial(self._keys, "steps", ViewKeys),
                plan=plan,
                say=say,
                notes=self.notes,
            )
            if policy.steps.on
            else None
        )
        self._uses: dict[tuple[str, int], Any] = {}
        self._closed = threading.Event()
        self._lock = threading.Lock()  # the thread's uses and the main thread's (the barrier, the end) take turns
        self._fifo_path = state / FIFO
        self._fifo = -1
        self._thread: threading.Thread | None = None

    def _keys(self, use: str, wrap: Callable[[Keys], _K], restart: int) -> _K | None:
        """The keys of ``use`` (``hang``: the hang watchdog's, ``steps``: the step report's) in restart ``restart``
        (one object a restart: it counts what it has seen); None without a store."""
        if self.exchange is None or self.exchange.gone:
            return None
        if (use, restart) not in self._uses:
            self._uses[use, restart] = wrap(self.exchange.keys(use, restart))
        return self._uses[use, restart]

    # -- the supervisor's side
    def start(self) -> NodeAgent:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self._fifo_path, 0o600)
        self._fifo = os.open(self._fifo_path, os.O_RDWR | os.O_NONBLOCK)  # O_RDWR: never EOF between clients
        self._thread = threading.Thread(target=self._run, name="numarun-agent", daemon=True)
        self._thread.start()
        return self

    def at_stop(self, signum: int) -> None:
        """The supervisor begins stopping the ranks for a death signal: where each stood is written at once."""
        self.hangs.at_stop(signum)
        self._poke()

    def before_exit_barrier(self, *, leave: Callable[[Exchange], None] | None = None) -> None:
        """In torchrun's exit barrier of a job that succeeded, before it waits for the other nodes (or, in per-rank
        mode, when the node's ranks have ended): the step report's last view handed over, ``leave`` (the sidecars
        part from their store), then the store left alone for good."""
        with self._lock:
            if self.steps is not None:
                self._use("the step report", self.steps.hand_over)
            if leave is not None and self.exchange is not None and not self.exchange.gone:
                self._use("the node agent's store", leave, self.exchange)
            if self.exchange is not None:
                self.exchange.close()

    def close(self, *, succeeded: bool = False) -> None:
        """The end of the job: the thread stopped, the step report's files and summary. ``succeeded``: torchrun
        returned without a failure (where its exit barrier could not be joined, the last views are handed over
        here, briefly)."""
        self._closed.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._fifo >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fifo)
            self._fifo = -1
        with contextlib.suppress(OSError):
            self._fifo_path.unlink()
        with self._lock:
            if self.steps is not None:
                if succeeded and self.exchange is not None and not self.exchange.gone:
                    self._use("the step report", self.steps.hand_over, HANDOVER_FALLBACK_S)
                if self.exchange is not None:
                    self.exchange.close()
                self._use("the step report", self.steps.finish)

    def _poke(self) -> None:
        if self._fifo >= 0:
            with contextlib.suppress(OSError):
                os.write(self._fifo, b"poke\n")

    # -- the thread
    def _run(self) -> None:
        pending = b""
        hang_due = 0.0
        while not self._closed.is_set():
            requests: list[str] = []
            with contextlib.suppress(OSError, ValueError):
                if select.select([self._fifo], [], [], self.policy.poll_s)[0]:
                    pending += os.read(self._fifo, 65536)
                    *lines, pending = pending.split(b"\n")
                    requests = [ln.decode("utf-8", "replace").strip() for ln in lines if ln.strip()]
            if self._closed.is_set():
                return
            now = time.monotonic()
            asked = [r for r in requests if r != "poke"]
            with self._lock:
                if now >= hang_due or asked or self.hangs.pending:
                    hang_due = now + self.policy.hang.tick_s
                    self._use("the hang watchdog", self._hang_tick, asked)
                if self.steps is not None:
                    self._use("the step report", self.steps.poll)

    def _hang_tick(self, asked: list[str]) -> None:
        self.hangs.tick(read_beats(self.state), asked)  # the heartbeats read inside the use: a failure is the use's

    def _use(self, name: str, call: Callable[..., None], *args: Any) -> None:
        """``call(*args)``; an exception is one line on numarun's stderr, the first time of its kind only, and the
        job runs on: the agent never takes the job down."""
        try:
            call(*args)
        except Exception as e:
            self.notes.failed(name, e)
