"""The hang watchdog, a use of numarun's node agent (:mod:`numarun.launch.agent`): notices a job that stopped making
progress and prints the roll-call.

Each rank's worker (:mod:`numarun.worker.progress`) rewrites a heartbeat in numarun's private directory: when its
counters (torch.distributed collectives entered and left, optimizer steps) last moved, when its main thread's stack
last changed, and that stack. The agent's thread reads them every sample (:class:`HangWatch`) and:

* **judges** (on the node whose ranks have group rank 0): the job hangs when, for ``--hang-timeout`` seconds, no
  live rank's counters moved and at least one live rank's stack stood still (:func:`judge`). A healthy loop sitting
  at one line keeps its counters moving; a long step of pure computation keeps its stack moving;
* **calls the roll**: every node sends its ranks :data:`~numarun.worker.progress.DUMP_SIGNAL` (every thread's Python
  stack, written in-process by faulthandler; py-spy adds native frames where it is installed and ptrace is
  allowed), turns each rank's main thread into a :class:`.rollcall.Stand`, writes every thread of its
  ranks to a file it keeps, and in a multi-node job hands its stands to the judge through the rendezvous store;
  the judge prints one roll-call for the whole job and keeps it (``numarun_hangs.<host>.<pid>/`` in the run dir, the
  log dir or ``$TMPDIR``: :func:`numarun.launch.agent.keep_dir`);
* **acts**: ``--on-hang report`` (the default) leaves the job running; ``stop`` ends it on every node with
  :data:`EXIT_HANG`;
* answers ``numarun stacks`` (a request on :data:`FIFO`) and, when the supervisor begins stopping ranks on a death
  signal, writes where each rank stood (:meth:`HangWatch.at_stop`).

Store keys (multi-node): :mod:`.exchange`. Per node O(1) keys per sample, the judge O(nodes).
"""

from .node import NodeCall, find_py_spy, render
from .policy import DEFAULT_TIMEOUT_S, EXIT_HANG, HangPolicy, OnHang, parse_hang_timeout, policy_from
from .stacks import RunningJob, ask_stacks, choose_job, describe, job_of, running_jobs, write_job_record
from .verdict import HangSummary, judge, read_beats, summarize
from .watch import HangWatch

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EXIT_HANG",
    "HangPolicy",
    "HangSummary",
    "HangWatch",
    "NodeCall",
    "OnHang",
    "RunningJob",
    "ask_stacks",
    "choose_job",
    "describe",
    "find_py_spy",
    "job_of",
    "judge",
    "parse_hang_timeout",
    "policy_from",
    "read_beats",
    "render",
    "running_jobs",
    "summarize",
    "write_job_record",
]
