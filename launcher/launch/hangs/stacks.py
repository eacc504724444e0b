"""``numarun stacks``, the asking side: the jobs running here, a request on their numarun's FIFO, its answer."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shlex
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ... import envvars
from ...errors import StacksUnavailable, UsageError
from ...jsonable import loads
from ...topology.procfs import alive, read_environ

FIFO = "stacks.fifo"
"""In numarun's private directory: ``numarun stacks`` writes ``<id> <full>`` lines to it; the answer is
``stacks.<id>.txt``."""
JOB_FILE = "job.json"
"""In numarun's private directory: which numarun runs there (``numarun stacks`` lists these)."""


def write_job_record(directory: Path, argv: Sequence[str]) -> None:
    """``job.json`` in numarun's private directory: which numarun runs there, for ``numarun stacks``."""
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "cwd": os.getcwd(),
        "argv": list(argv),
    }
    (directory / JOB_FILE).write_text(json.dumps(record))


@dataclass(frozen=True)
class RunningJob:
    pid: int
    state: Path
    started: float
    argv: tuple[str, ...]


def _read_job(record: Path) -> RunningJob:
    d = loads(record.read_text())
    return RunningJob(int(d["pid"]), record.parent, float(d["started"]), tuple(str(a) for a in d.get("argv", [])))


def running_jobs() -> list[RunningJob]:
    """This user's numarun jobs on this node (their private directories under ``$TMPDIR``), the latest first."""
    jobs = []
    for record in Path(tempfile.gettempdir()).glob(f"numarun-*/{JOB_FILE}"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if alive((job := _read_job(record)).pid):
                jobs.append(job)
    return sorted(jobs, key=lambda j: -j.started)


def job_of(pid: int) -> RunningJob:
    """The job of ``pid``: a numarun's own, or that of a rank it started (found through the rank's environment)."""
    for job in running_jobs():
        if job.pid == pid:
            return job
    import psutil

    candidates = [pid]
    with contextlib.suppress(psutil.Error):
        candidates += [c.pid for c in psutil.Process(pid).children()]
    for p in candidates:
        state = read_environ(p).get(envvars.STATE_DIR)
        if state and (record := Path(state) / JOB_FILE).is_file():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                job = _read_job(record)
                # a child counts only as a rank of pid's own job: pid 1's children include any orphaned rank
                if p == pid or job.pid == pid:
                    return job
    raise UsageError(
        f"bad --pid {pid}: no numarun job of this user has that pid, nor a rank of one; expected the pid of "
        "a running numarun or of one of its ranks (numarun stacks --list)"
    )


def describe(job: RunningJob) -> str:
    """``pid 4242, started 2026-01-01 12:00:00: numarun train.py``."""
    when = _dt.datetime.fromtimestamp(job.started).strftime("%Y-%m-%d %H:%M:%S")
    return f"pid {job.pid}, started {when}: {shlex.join(job.argv) if job.argv else '?'}"


def choose_job(pid: int | None) -> tuple[RunningJob, str]:
    """The job ``--pid`` names (:func:`job_of`), else the latest started of this user's here, and a note for stderr
    when several run (``""`` else). :class:`StacksUnavailable` when none runs."""
    if pid is not None:
        return job_of(pid), ""
    jobs = running_jobs()
    if not jobs:
        raise StacksUnavailable(
            "no numarun job of yours runs on this node (none in $TMPDIR/numarun-*); expected a "
            "running 'numarun SCRIPT' (or --pid PID)"
        )
    if len(jobs) == 1:
        return jobs[0], ""
    note = (
        f"numarun: {len(jobs)} jobs run here; showing the latest, {describe(jobs[0])} (choose with --pid; "
        "'numarun stacks --list' lists them)"
    )
    return jobs[0], note


def ask_stacks(job: RunningJob, *, full: bool = False, timeout_s: float = 180.0) -> str:
    """The roll-call of ``job``, asked of its numarun (the agent that watches its ranks): harmless to the job."""
    fifo = job.state / FIFO
    rid = f"{os.getpid()}x{time.monotonic_ns() % 10**9}"
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        raise StacksUnavailable(
            f"numarun {job.pid} takes no stacks request now ({fifo}: {e.strerror}); expected a job whose ranks run"
        ) from None
    with os.fdopen(fd, "wb") as f:
        f.write(f"{rid} {1 if full else 0}\n".encode())
    answer = job.state / f"stacks.{rid}.txt"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if answer.exists():
            text = answer.read_text()
            answer.unlink(missing_ok=True)
            return text
        if not alive(job.pid):
            break
        time.sleep(0.1)
    raise StacksUnavailable(
        f"numarun {job.pid} did not answer within {timeout_s:g} s" + ("" if alive(job.pid) else ": it ended meanwhile")
    )
