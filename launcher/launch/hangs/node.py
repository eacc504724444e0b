"""The roll-call of one node: its ranks' stacks asked for, kept in a file, turned into stands; the roll-call's lines."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...jsonable import loads
from ...worker.progress import DUMP_SIGNAL, STACKS
from . import rollcall
from .rollcall import Frame, Stand
from .verdict import alive, catches, exit_code

DUMP_WAIT_S = 3.0
"""How long the ranks' faulthandler dumps may take to land (they are written from a signal handler: microseconds)."""
PY_SPY_TIMEOUT_S = 60.0


def find_py_spy() -> str | None:
    """py-spy next to this Python (``pip install 'numarun[debug]'``) or on PATH."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return shutil.which("py-spy", path=path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass(frozen=True)
class NodeCall:
    """One node's answer to a roll-call (JSON through the store)."""

    node: int
    host: str
    stands: tuple[Stand, ...]
    stacks: str
    """The file holding every thread of this node's ranks."""
    source: str
    """Which stacks were used: py-spy (native frames) or in-process Python stacks, and why."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> NodeCall:
        d = loads(text)
        return NodeCall(
            int(d["node"]), str(d["host"]), tuple(Stand(**s) for s in d["stands"]), str(d["stacks"]), str(d["source"])
        )


class Dumps:
    """The ranks' faulthandler dumps asked for at once (:meth:`ask`), read when they have landed (:meth:`read`)."""

    def __init__(self, state: Path, beats: Mapping[int, Mapping[str, Any]]) -> None:
        self.state = state
        self.offsets: dict[int, int] = {}
        self.asked_at = time.monotonic()
        self.alive = {local for local, b in beats.items() if alive(int(b.get("pid", 0)))}
        """Local ranks alive when asked (at a stop, they are gone by the time their stands are read)."""
        for local, b in beats.items():
            pid = int(b.get("pid", 0))
            path = state / STACKS.format(local_rank=local)
            if local in self.alive and catches(pid, int(b.get("dump_signal", DUMP_SIGNAL))):
                self.offsets[local] = _size(path)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, int(b.get("dump_signal", DUMP_SIGNAL)))

    def read(self, wait_s: float) -> dict[int, str]:
        """Local rank -> its dump, each once its file stopped growing (at most ``wait_s`` after the ask)."""
        paths = {lr: self.state / STACKS.format(local_rank=lr) for lr in self.offsets}
        last = {lr: -1 for lr in paths}
        done: set[int] = set()
        deadline = self.asked_at + wait_s
        while len(done) < len(paths) and time.monotonic() < deadline:
            for lr, p in paths.items():
                size = _size(p)
                if size > self.offsets[lr] and size == last[lr]:
                    done.add(lr)
                last[lr] = size
            if len(done) < len(paths):
                time.sleep(0.05)
        out = {}
        for lr, p in paths.items():
            try:
                with open(p, "rb") as f:
                    f.seek(self.offsets[lr])
                    out[lr] = f.read().decode("utf-8", "replace")
            except OSError:
                continue
        return out


def _py_spy(exe: str, pids: Iterable[int], timeout_s: float) -> tuple[dict[int, str], str]:
    """``py-spy dump --native`` of every pid, in parallel: (pid -> output, why it failed for some, '' if none)."""
    procs = {
        pid: subprocess.Popen(
            [exe, "dump", "--pid", str(pid), "--native"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for pid in pids
    }
    out, why = {}, ""
    deadline = time.monotonic() + timeout_s
    for pid, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            why = why or f"timed out after {timeout_s:g} s"
            continue
        if p.returncode == 0 and stdout.strip():
            out[pid] = stdout
        else:
            text = [ln.strip() for ln in (stderr or stdout).splitlines() if ln.strip()]
            why = why or (text[-1] if text else f"exit code {p.returncode}")
    return out, why


def freeze(beats: Mapping[int, Mapping[str, Any]]) -> None:
    """SIGSTOP this node's ranks before a hang stop kills them: none of them reacts (a traceback for each peer
    gone) while the other nodes end theirs. SIGKILL ends a stopped process."""
    for b in beats.values():
        pid = int(b.get("pid", 0))
        if pid and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)


def _frames(items: Iterable[Sequence[Any]]) -> list[Frame]:
    return [Frame(str(f[0]), int(f[1]), str(f[2])) for f in items if len(f) == 3]


def stand_of(
    beat: Mapping[str, Any],
    dump: str | None,
    *,
    state: Path,
    roots: Sequence[str],
    host: str,
    running: bool | None = None,
) -> Stand:
    """Where one rank stands: its main thread in the dump (else in its last heartbeat), the collective it is in.
    ``running``: whether it ran when asked (default: whether it runs now)."""
    pid = int(beat.get("pid", 0))
    local = int(beat.get("local_rank", 0))
    base: dict[str, Any] = dict(
        rank=int(beat.get("rank", 0)), local_rank=local, pid=pid, node=int(beat.get("node_rank", 0)), host=host
    )
    if not (alive(pid) if running is None else running):
        return Stand(**base, state="exited", exit_code=exit_code(state, local, int(beat.get("group", 0))))
    frames = []
    if dump:
        threads = rollcall.parse_faulthandler(dump)
        frames = threads.get(int(beat.get("main") or 0), [])
    note = ""
    if not frames:
        frames = _frames(beat.get("frames", []))
        if frames and "t" in beat:
            note = f"last sampled {time.monotonic() - float(beat['t']):.0f} s ago"
    if not frames:
        return Stand(**base, state="silent", note="no dump and no sample")
    where, function, call, package = rollcall.locate(frames, roots, str(beat.get("cwd", "")))
    return Stand(
        **base,
        where=where,
        function=function,
        call=call,
        package=package,
        inside=str(beat.get("inside") or ""),
        note=note,
    )


def call_node(
    state: Path,
    beats: Mapping[int, Mapping[str, Any]],
    out: Path,
    *,
    py_spy: bool = True,
    dumps: Dumps | None = None,
    dump_wait_s: float = DUMP_WAIT_S,
) -> NodeCall:
    """Roll-call of this node's ranks: every thread's stacks written to ``out``, a stand per rank."""
    host = socket.gethostname()
    dumps = dumps or Dumps(state, beats)
    exe = find_py_spy() if py_spy else None
    native: dict[int, str] = {}
    why = ""
    live = [int(beats[lr]["pid"]) for lr in sorted(dumps.alive)]
    if exe and live:
        native, why = _py_spy(exe, live, PY_SPY_TIMEOUT_S)
    texts = dumps.read(dump_wait_s)
    roots = rollcall.library_roots()
    stands, parts = [], []
    for local in sorted(beats):
        b = beats[local]
        stand = stand_of(b, texts.get(local), state=state, roots=roots, host=host, running=local in dumps.alive)
        stands.append(stand)
        names = {int(k): str(v) for k, v in (b.get("threads") or {}).items() if str(k).isdigit()}
        head = f"=== rank {stand.rank} (local rank {local}, pid {stand.pid}, {host}): {stand.place()}"
        body = []
        if stand.pid in native:
            body.append("--- py-spy dump --native (Python and C/C++ frames):\n" + native[stand.pid].rstrip() + "\n")
        if texts.get(local, "").strip():
            body.append(
                "--- faulthandler, every thread's Python stack (in-process):\n"
                + rollcall.name_threads(texts[local].strip("\n"), names)
                + "\n"
            )
        elif b.get("frames"):
            body.append(
                "--- the main thread at the last sample (in-process):\n"
                + "".join(f'  File "{f[0]}", line {f[1]} in {f[2]}\n' for f in b["frames"])
            )
        parts.append("\n".join([head, *body]) if body else head + "\n")
    if not py_spy:
        source = "in-process Python stacks (faulthandler)"
    elif exe is None:
        source = (
            "in-process Python stacks (faulthandler); py-spy is not installed: pip install 'numarun[debug]' "
            "adds native frames"
        )
    elif native and len(native) == len(live):
        source = "py-spy with native frames, and in-process Python stacks"
    else:
        denied = "EPERM" in why or "ermission" in why or "not permitted" in why
        source = (
            "in-process Python stacks (faulthandler); py-spy could not read the ranks"
            + (" (ptrace is not permitted here: CAP_SYS_PTRACE, kernel.yama.ptrace_scope or seccomp)" if denied else "")
            + f": {why}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# every thread of every rank on {host}; stacks: {source}\n\n" + "\n".join(parts))
    return NodeCall(
        int(next(iter(beats.values())).get("node_rank", 0)) if beats else 0, host, tuple(stands), str(out), source
    )


def render(calls: Sequence[NodeCall], *, header: Sequence[str] = ()) -> list[str]:
    """The roll-call's lines (without the ``numarun:`` prefix)."""
    stands = [s for c in calls for s in c.stands]
    nodes = len(calls)
    sources = sorted({c.source for c in calls})
    where = f" on {nodes} nodes" if nodes > 1 else ""
    out = [
        *header,
        f"roll-call of {len(stands)} rank{'s' if len(stands) != 1 else ''}{where} (stacks: {'; '.join(sources)}):",
    ]
    out += [f"  {line}" for line in rollcall.lines(stands, multi_node=nodes > 1)]
    files = [c.stacks for c in calls]
    out.append(
        "every thread of every rank: "
        + (files[0] if len(files) == 1 else ", ".join(f"node {c.node} ({c.host}) {c.stacks}" for c in calls))
    )
    return out
