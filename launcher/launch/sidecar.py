"""Per-rank mode's node agent: numarun's agent (:mod:`numarun.launch.agent`) in a process of its own, beside the
ranks a scheduler started one task each (``srun --ntasks-per-node=8``, ``mpirun``), where no torchrun agent runs.

**Started** by the node's first task (local rank 0) before it becomes its rank (:func:`spawn`): a double fork and
``setsid`` (no child of a rank, no member of a rank's session: a rank that forks, execs or dies leaves it be), its
stdin from ``/dev/null``, its stdout and stderr the task's (its lines go where the rank's go). The node's ranks find it
by their private directory, keyed by the job, its step and its rendezvous port (:func:`state_dir`): they write their
heartbeats and step records there and never wait on the sidecar, but for the first task at its exit.

**Its life** (:func:`main`): it waits for the node's ranks' heartbeats, watches them (the hang watchdog, the step
report; ``numarun top`` and ``numarun stacks`` find it by its job record) until each has ended, hands its last view
over, writes the step report's files (the summary on node 0), removes the directory and ends. Slurm ends a step when
its tasks end and kills what is left in the step's cgroup: so the first task, its script done and its last record
written, waits for the sidecar (:func:`numarun.ledger.await_sidecar`, at most
:data:`numarun.ledger.SIDECAR_WAIT_S`) before it exits.

**Across nodes** the sidecars meet in a store numarun starts beside the job: node 0's sidecar serves a TCPStore on
``MASTER_ADDR``'s host at ``NUMARUN_AGENT_PORT`` (default ``MASTER_PORT`` + 1), the others connect to it. Not the
job's own store (torch's, served by rank 0's process at ``MASTER_PORT``): it lives as long as rank 0's process group,
and the last views go over after the ranks have ended (docs/design-notes.md, "The sidecar's store"). Node 0's sidecar
serves until every node's sidecar has left it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from .. import envvars
from ..jsonable import from_jsonable, loads, to_jsonable
from ..topology import procfs
from .agent import AgentPolicy, NodeAgent, say
from .exchange import Exchange, store_client
from .hangs.stacks import write_job_record
from .hangs.verdict import read_beats
from .signals import send
from .steps.watch import rank_runs

log = logging.getLogger(__name__)

STATE_PREFIX = "numarun-rank."
"""The sidecar's private directory in ``$TMPDIR`` (``numarun-*``: ``numarun stacks`` and ``top`` look there)."""
START_WAIT_S = 300.0
"""How long the sidecar waits for every local rank's first heartbeat (the ranks start together; torch's import and
the rendezvous come first)."""
LEAVE_WAIT_S = 30.0
"""How long node 0's sidecar serves its store, once its own last view is in, for the other sidecars to leave it."""
CONNECT_S = 60.0
"""How long a sidecar tries to reach node 0's store (the sidecars start together, node 0's may be a moment late)."""
STOP_GRACE_S = 10.0
"""``--on-hang stop``: SIGTERM to the node's ranks, SIGKILL this long after."""
POLL_S = 0.2


@dataclass(frozen=True)
class SidecarArgs:
    """What the first task tells its sidecar (one JSON argument)."""

    state: str
    first_task: int
    """The pid of the node's first task, which started the sidecar and becomes local rank 0."""
    job_argv: tuple[str, ...]
    """The task's command line: what ``numarun stacks --list`` shows."""
    local_world: int
    node: int
    nodes: int
    store_host: str
    store_port: int
    policy: AgentPolicy

    def text(self) -> str:
        return json.dumps(to_jsonable(self))

    @staticmethod
    def parse(text: str) -> SidecarArgs:
        return from_jsonable(SidecarArgs, loads(text))


def state_dir(job: str, master_port: int, node: int, environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """The private directory of a per-rank job's node: every task of the node computes the same one (the job and step
    the scheduler names, the rendezvous port every rank agreed on, the node's index and name, the user), no two jobs
    of a node share one, nor two nodes of a job whose ``$TMPDIR`` is shared (a network file system, containers or
    namespaced nodes on one host)."""
    key = f"{job or 'job'}.{master_port}.node{node}.{socket.gethostname()}.{os.getuid()}"
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", key)
    base = Path(environ.get("TMPDIR") or tempfile.gettempdir())
    return base / f"{STATE_PREFIX}{key}"


def agent_port(environ: dict[str, str] | os._Environ[str], master_port: int) -> int:
    """``NUMARUN_AGENT_PORT``, else the job's rendezvous port + 1; a bad value is a one-line error."""
    from ..argtypes import PORT

    text = environ.get(envvars.AGENT_PORT, "").strip()
    if not text:
        return master_port + 1 if master_port < 65535 else master_port - 1
    return PORT(text, envvars.AGENT_PORT)


def spawn(args: SidecarArgs) -> int:
    """Start the sidecar (see the module docstring); its pid, 0 when it could not start (said once)."""
    read, write = os.pipe()
    try:
        first = os.fork()
    except OSError as e:
        log.warning("no node agent for this job's ranks (no hang watchdog, no step report): fork: %s", e)
        os.close(read)
        os.close(write)
        return 0
    if first == 0:  # the first child: a session of its own, then the sidecar as its child, then gone
        try:
            os.close(read)
            os.setsid()
            if os.fork() == 0:
                os.write(write, f"{os.getpid()}\n".encode())
                os.close(write)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                # numarun's own process: torch's C++ warnings of its store (a client whose name does not resolve)
                # are not the user's to read; the ranks keep the user's level
                env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
                os.execve(sys.executable, [sys.executable, "-m", "numarun.launch.sidecar", args.text()], env)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read().strip()
    os.waitpid(first, 0)
    return int(text) if text.isdigit() else 0


# ----------------------------------------------------------------------------- the sidecar's process


class Sidecar:
    """The sidecar's life (:func:`main`)."""

    def __init__(self, args: SidecarArgs) -> None:
        self.args = args
        self.state = Path(args.state)
        self.stopping_since: float | None = None
        self.serving: Any = None
        store, client = self._store()
        self.agent = NodeAgent(
            args.policy,
            self.state,
            keep=None,  # what it keeps goes to $TMPDIR
            store=store,
            client=client,
            plan=self.state / "plan.json" if (self.state / "plan.json").exists() else None,
            request_stop=self.stop,
            hold=lambda: None,
            stop_ending="every task ended: SIGTERM, then SIGKILL; the scheduler ends the job",
        )

    def _store(self) -> tuple[tuple[str, int] | None, Any]:
        """Node 0's sidecar serves the store the sidecars meet in; the others connect to it."""
        a = self.args
        if a.nodes <= 1:
            return None, None
        from torch.distributed import TCPStore

        if a.node == 0:
            try:
                self.serving = TCPStore(
                    a.store_host, a.store_port, None, True, timeout=timedelta(seconds=10), wait_for_workers=False
                )
            except Exception as e:
                say(
                    [
                        f"warning: the node agent could not serve its store on port {a.store_port} ({e}): each node "
                        f"reports its own ranks only (set {envvars.AGENT_PORT} to a free port)"
                    ]
                )
                return None, None
            return (a.store_host, a.store_port), lambda host, port: self.serving
        return (a.store_host, a.store_port), functools.partial(store_client, timeout_s=CONNECT_S)

    def stop(self, code: int, message: str) -> None:
        """``--on-hang stop`` (from the agent's thread): the reason said once, every rank but the node's first task sent
        SIGTERM. The first task is the scheduler's hold on the step: it ends last (:meth:`run`), once the sidecar has
        written what it keeps and removed its directory, since the scheduler ends the step, and what is left in it,
        when its tasks have ended."""
        if self.stopping_since is not None:
            return
        self.stopping_since = time.monotonic()
        say([f"error: {message}"])
        ranks = [int(b.get("pid", 0)) for b in read_beats(self.state).values()]
        send([p for p in ranks if p != self.args.first_task], signal.SIGTERM)

    def ranks_done(self, started: float) -> bool:
        """Every local rank has ended (its pid gone), or waits for the sidecar at its exit; before every rank's first
        heartbeat, not done (for at most :data:`START_WAIT_S`), unless the first task is gone (a job that failed as it
        started: nothing will come). At a stop, the other ranks' SIGKILL follows :data:`STOP_GRACE_S` after their
        SIGTERM, and the first task alone does not hold the sidecar past it."""
        beats = read_beats(self.state)
        first_gone = not procfs.alive(self.args.first_task)
        if len(beats) < self.args.local_world and time.monotonic() - started < START_WAIT_S and not first_gone:
            return False
        running = [int(b["pid"]) for lr, b in beats.items() if rank_runs(self.state, lr, int(b.get("pid", 0)))]
        overdue = self.stopping_since is not None and time.monotonic() - self.stopping_since >= STOP_GRACE_S
        if overdue:
            send([p for p in running if p != self.args.first_task], signal.SIGKILL)
            running = [p for p in running if p == self.args.first_task]
        return not running or (overdue and running == [self.args.first_task])

    def run(self) -> None:
        write_job_record(self.state, self.args.job_argv)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.agent.start()
        started = time.monotonic()
        while not self.ranks_done(started):
            time.sleep(POLL_S)
        self.agent.before_exit_barrier(leave=self._leave)
        self.agent.close(succeeded=self.stopping_since is None)
        shutil.rmtree(self.state, ignore_errors=True)
        # the scheduler's hold on the step, last
        if self.stopping_since is not None and procfs.alive(self.args.first_task):
            send([self.args.first_task], signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while procfs.alive(self.args.first_task) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            send([self.args.first_task], signal.SIGKILL)

    def _leave(self, exchange: Exchange) -> None:
        """Every sidecar says it is done with the store; node 0's serves it until all have (at most
        :data:`LEAVE_WAIT_S`), so that none finds it gone."""
        keys = exchange.keys("agent", 0)
        left = keys.add("left", 1)
        deadline = time.monotonic() + LEAVE_WAIT_S
        while self.serving is not None and left is not None and left < self.args.nodes and time.monotonic() < deadline:
            time.sleep(0.05)
            left = keys.add("left", 0)
        if self.serving is not None:
            time.sleep(0.05)  # the last sidecar's answer on its way out

    def _on_signal(self, signum: int, frame: Any) -> None:
        """The scheduler stops the step (scancel, a time limit): where each rank stood is written; the sidecar ends
        with its ranks."""
        self.agent.at_stop(signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = SidecarArgs.parse((argv if argv is not None else sys.argv[1:])[0])
    try:
        Sidecar(args).run()
    finally:
        shutil.rmtree(args.state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
