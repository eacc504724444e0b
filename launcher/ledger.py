"""What numarun and its workers tell each other, as small files in numarun's private directory.

* ``pid.<local rank>``: ``<pid> <restart>``, written by a worker's bootstrap when it starts;
* ``exit.<local rank>``: ``<restart> <code>``, written when its script ends (a clean stop is every
  rank of the latest group exiting 0);
* ``signals.json``: the signals numarun forwarded (SIGUSR1/SIGUSR2), each with the worker group
  it is for and the local ranks that got it.

numarun sends a forwarded signal to the workers it knows; a worker that starts later sends itself what
its group has not had (:func:`register`). Both hold ``lock`` meanwhile (numarun's signal loop, never a
handler): each worker gets each signal exactly once, whenever it came.

No torch, no psutil: the bootstrap imports this before the user's script.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from . import envvars


@contextmanager
def _locked(state: Path) -> Iterator[None]:
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _signals(state: Path) -> list[dict]:
    try:
        data = json.loads((state / "signals.json").read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def register(environ: Mapping[str, str]) -> list[int]:
    """A worker starts: record its pid, and send it the forwarded signals its group has not had.

    Returns the signals delivered (each by ``os.kill`` to this process: a signal without a handler
    ends it, as it would have ended it had it come a moment later)."""
    state = environ.get(envvars.STATE_DIR)
    if not state:
        return []
    rank = environ.get("LOCAL_RANK", "0")
    group = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    path = Path(state)
    owed: list[int] = []
    try:
        with _locked(path):
            _write(path / f"pid.{rank}", f"{os.getpid()} {group}\n")
            entries = _signals(path)
            for e in entries:
                if e.get("group") in (None, group) and rank not in e.get("done", []):
                    e["group"] = group
                    e.setdefault("done", []).append(rank)
                    owed.append(int(e["signal"]))
            if owed:
                _write(path / "signals.json", json.dumps(entries))
    except OSError:  # the launcher is gone and took its directory: nothing to tell it
        return []
    for signum in owed:
        os.kill(os.getpid(), signum)
    return owed


def record_exit(environ: Mapping[str, str], status: int) -> None:
    """A worker's script ended with ``status``: read by numarun after a SIGTERM (a clean stop)."""
    state = environ.get(envvars.STATE_DIR)
    if not state:
        return
    rank = environ.get("LOCAL_RANK", "0")
    with contextlib.suppress(OSError):
        _write(Path(state) / f"exit.{rank}", f"{environ.get('TORCHELASTIC_RESTART_COUNT', '0')} {status & 0xFF}\n")


def workers(state: Path) -> dict[str, tuple[int, int]]:
    """Local rank -> (pid, group) of every worker that registered (alive or not)."""
    out = {}
    for f in state.glob("pid.*"):
        try:
            pid, _, group = f.read_text().strip().partition(" ")
            out[f.name.split(".", 1)[1]] = (int(pid), int(group or 0))
        except (OSError, ValueError):
            continue
    return out


def forward(state: Path, signum: int, alive: set[int]) -> list[int]:
    """numarun got ``signum`` to forward: send it to the latest group's live workers (``alive``: pids
    that are still numarun's children) and note it for that group's ranks yet to start; with no live
    worker, for the next group. Returns the pids signalled."""
    sent: list[int] = []
    with _locked(state):
        known = {rank: pg for rank, pg in workers(state).items() if pg[0] in alive}
        group = max((g for _, g in known.values()), default=None)
        done = []
        for rank, (pid, g) in known.items():
            if g != group:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
                sent.append(pid)
                done.append(rank)
        entries = _signals(state)
        entries.append({"signal": int(signum), "group": group, "done": done})
        _write(state / "signals.json", json.dumps(entries))
    return sent


def stopped_cleanly(state: Path, nproc: int) -> bool:
    """Whether every local rank of the latest worker group recorded exit code 0."""
    records = []
    for f in state.glob("exit.*"):
        try:
            restart, code = (int(x) for x in f.read_text().split())
        except (OSError, ValueError):
            return False
        records.append((restart, code))
    if not records:
        return False
    latest = max(r for r, _ in records)
    return sum(1 for r, c in records if r == latest and c == 0) == nproc


def clear(state: Path) -> None:
    """Forget the previous job of a sweep (its workers, exits, signals, heartbeats and stack dumps)."""
    for f in [
        *state.glob("exit.*"),
        *state.glob("pid.*"),
        *state.glob("progress.*"),
        *state.glob("stacks.*"),
        state / "signals.json",
    ]:
        f.unlink(missing_ok=True)


SIDECAR_WAIT_S = 60.0
"""How long the first task waits at its exit for its sidecar to end (its last view handed over: the judge waits up to
30 s for the other nodes')."""
WAITING = "waiting.{local_rank}"
"""Per-rank mode: written by the node's first task at its exit, its last record out, before it waits for the node's
agent (the sidecar), which then counts it as ended."""


def await_sidecar(environ: Mapping[str, str], wait_s: float) -> bool:
    """Per-rank mode, the node's first task at its exit: say so (:data:`WAITING`) and wait, at most ``wait_s``, for its
    sidecar (``NUMARUN_SIDECAR``) to end, which removes the private directory last: Slurm kills what is left in a
    step's cgroup once its tasks have ended. True when it ended in time (or there is none)."""
    import time

    pid, state = environ.get(envvars.SIDECAR, ""), environ.get(envvars.STATE_DIR, "")
    if not pid.isdigit() or not state:
        return True
    with contextlib.suppress(OSError):
        _write(Path(state) / WAITING.format(local_rank=environ.get("LOCAL_RANK", "0")), f"{os.getpid()}\n")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
        if not os.path.isdir(state):
            return True
        time.sleep(0.05)
    return False
