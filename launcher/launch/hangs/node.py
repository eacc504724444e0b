"""The roll-call of one node: its ranks' stacks asked for, kept in a file, turned into stands; the roll-call's lines."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...jsonable import from_jsonable, loads, to_jsonable
from ...topology import procfs
from ...topology.procfs import alive
from ...worker.progress import DUMP_SIGNAL, HELPER, HELPER_HEAD, STACKS
from ..signals import send
from . import kernel, rollcall
from .rollcall import Frame, Helper, Stand
from .verdict import exit_code

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
    """The file holding every thread of this node's ranks (``not kept (cannot write ...)`` where it could not be
    written)."""
    source: str
    """Which stacks were used: py-spy (native frames) or in-process Python stacks, and why."""

    def to_json(self) -> str:
        return json.dumps(to_jsonable(self))

    @staticmethod
    def from_json(text: str | bytes) -> NodeCall:
        return from_jsonable(NodeCall, loads(text))


class Dumps:
    """The ranks' faulthandler dumps, and their helpers', asked for at once, read when they have landed
    (:meth:`read`). What the kernel says of each rank and of its descendants is read at the same moment."""

    def __init__(self, state: Path, beats: Mapping[int, Mapping[str, Any]], *, root: Path = kernel.ROOT) -> None:
        self.state = state
        self.offsets: dict[Path, int] = {}
        self.asked_at = time.monotonic()
        self.alive = {local for local, b in beats.items() if alive(int(b.get("pid", 0)))}
        """Local ranks alive when asked (at a stop, they are gone by the time their stands are read)."""
        self.tasks: dict[int, kernel.Task] = {}
        """Local rank -> the kernel's view of it."""
        self.family: dict[int, list[kernel.Task]] = {}
        """Local rank -> its descendants (DataLoader workers, a checkpoint writer, what they started)."""
        stats = procfs.read_all(root)
        for local, b in beats.items():
            if local not in self.alive:
                continue
            pid = int(b.get("pid", 0))
            signum = int(b.get("dump_signal", DUMP_SIGNAL))
            task = kernel.read_task(pid, root)
            if task is not None:
                self.tasks[local] = task
            self.family[local] = kernel.tasks(procfs.descendants(stats, [pid], limit=kernel.MAX_DESCENDANTS), root)
            if task is None or not task.halted:  # a stopped rank would dump only once it runs again
                self._ask(state / STACKS.format(local_rank=local), pid, signum)
            for t in self.family[local]:
                path = state / HELPER.format(local_rank=local, pid=t.pid)
                if not t.halted and path.exists():
                    self._ask(path, t.pid, signum)

    def _ask(self, path: Path, pid: int, signum: int) -> None:
        if procfs.caught_signals(pid) >> (signum - 1) & 1:  # a handler (SigCgt): a dump never kills a rank lacking one
            self.offsets[path] = _size(path)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def read(self, wait_s: float) -> dict[Path, str]:
        """Dump file -> what was dumped in it since the ask, each once its file stopped growing (at most
        ``wait_s`` after the ask)."""
        last = {p: -1 for p in self.offsets}
        done: set[Path] = set()
        deadline = self.asked_at + wait_s
        while len(done) < len(self.offsets) and time.monotonic() < deadline:
            for p, offset in self.offsets.items():
                size = _size(p)
                if size > offset and size == last[p]:
                    done.add(p)
                last[p] = size
            if len(done) < len(self.offsets):
                time.sleep(0.05)
        out = {}
        for p, offset in self.offsets.items():
            try:
                with open(p, "rb") as f:
                    f.seek(offset)
                    out[p] = f.read().decode("utf-8", "replace")
            except OSError:
                continue
        return out


def _py_spy(exe: str, pids: Mapping[int, bool], timeout_s: float) -> tuple[dict[int, str], str]:
    """``py-spy dump`` of every pid, in parallel (pid -> halted: a process stopped or asleep in the kernel is read
    without pausing it, ``--nonblocking``, Python frames only: a pause would wait for a stop that never comes):
    (pid -> output, why it failed for some, '' if none)."""
    procs = {
        pid: subprocess.Popen(
            [
                exe,
                "dump",
                "--pid",
                str(pid),
                *(("--nonblocking", "--json", "--full-filenames") if halted else ("--native",)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for pid, halted in pids.items()
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


def py_spy_json(text: str, pid: int) -> tuple[str, list[Frame]]:
    """``py-spy dump --json`` of a process: (every thread as text, the main thread's frames innermost first, named
    as faulthandler names them: ``__getitem__``, not py-spy's ``Batches.__getitem__``)."""
    try:
        threads = loads(text)
    except ValueError:
        return text, []
    out, main = [], []
    for t in threads if isinstance(threads, list) else []:
        if not isinstance(t, dict):
            continue
        frames = [
            Frame(str(f.get("filename", "")), int(f.get("line") or 0), str(f.get("name", "")).rpartition(".")[2])
            for f in t.get("frames") or ()
            if isinstance(f, dict)
        ]
        out.append(f'Thread {t.get("os_thread_id")} "{t.get("thread_name") or ""}" (py-spy, not paused):')
        out += [f"    {f.function} ({f.file}:{f.line})" for f in frames]
        if t.get("os_thread_id") == pid:
            main = frames
    return "\n".join(out) + "\n", main


def freeze(beats: Mapping[int, Mapping[str, Any]]) -> None:
    """SIGSTOP this node's ranks before a hang stop kills them: none of them reacts (a traceback for each peer
    gone) while the other nodes end theirs. SIGKILL ends a stopped process."""
    send([int(b.get("pid", 0)) for b in beats.values()], signal.SIGSTOP)


def resume(beats: Mapping[int, Mapping[str, Any]], *, root: Path = kernel.ROOT) -> None:
    """SIGCONT this node's ranks that are stopped (state T: SIGSTOP, job control) as they are about to be sent
    SIGTERM: a stopped process holds it pending, and torchrun's agent would SIGKILL it only 30 s later. A rank
    stopped by a debugger (state t) is its tracer's."""
    stopped = [t.pid for b in beats.values() if (t := kernel.read_task(int(b.get("pid", 0)), root)) and t.state == "T"]
    send(stopped, signal.SIGCONT)


def stand_of(
    beat: Mapping[str, Any],
    dump: str | None,
    *,
    state: Path,
    roots: Sequence[str],
    host: str,
    running: bool | None = None,
    task: kernel.Task | None = None,
    helpers: Sequence[Helper] = (),
    halted_frames: Sequence[Frame] | None = None,
) -> Stand:
    """Where one rank stands: its main thread in the dump (else in its last heartbeat), the collective it is in,
    what the kernel says of it (``task``: stopped, asleep in the kernel: then ``halted_frames``, read by py-spy
    without pausing it, stand in for the dump it cannot write) and where its ``helpers`` stand. ``running``:
    whether it ran when asked (default: whether it runs now)."""
    pid = int(beat.get("pid", 0))
    local = int(beat.get("local_rank", 0))
    base: dict[str, Any] = dict(
        rank=int(beat.get("rank", 0)), local_rank=local, pid=pid, node=int(beat.get("node_rank", 0)), host=host
    )
    if not (alive(pid) if running is None else running):
        return Stand(**base, state="exited", exit_code=exit_code(state, local, int(beat.get("group", 0))))
    if task is not None and task.halted:
        base.update(kernel=task.describe(), kernel_stack=task.stack)
    base["helpers"] = tuple(helpers)
    frames = list(halted_frames or [])
    if dump and not frames:
        frames = rollcall.parse_faulthandler(dump).get(int(beat.get("main") or 0), [])
    note = ""
    if not frames:
        frames = [Frame(str(f[0]), int(f[1]), str(f[2])) for f in beat.get("frames", []) if len(f) == 3]
        if frames and "t" in beat:
            note = f"last sampled {time.monotonic() - float(beat['t']):.0f} s ago"
            base["sampled"] = True
    if not frames:
        return Stand(**base, state="running" if "kernel" in base else "silent", note="no dump and no sample")
    where, function, call, package = rollcall.locate(frames, roots, str(beat.get("cwd", "")))
    return Stand(
        **base,
        where=where,
        function=function,
        call=call,
        package=package,
        inside="" if halted_frames else str(beat.get("inside") or ""),  # the heartbeat's is older than py-spy's
        note=note,
    )


def helper_head(path: Path) -> dict[str, Any]:
    """The head line of a helper's dump file (:data:`~numarun.worker.progress.HELPER_HEAD`): label, pid, main
    thread; {} when there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            line = f.readline(4096)
        head = loads(line[len(HELPER_HEAD) :]) if line.startswith(HELPER_HEAD) else {}
    except (OSError, ValueError):
        return {}
    return head if isinstance(head, dict) else {}


def helpers_of(
    beat: Mapping[str, Any],
    dump: str | None,
    family: Sequence[kernel.Task],
    texts: Mapping[Path, str],
    *,
    state: Path,
    roots: Sequence[str],
    halted_threads: Sequence[kernel.Task] = (),
) -> list[Helper]:
    """Where a rank's descendants stand (from their own dumps, else what the kernel says of them), then those of
    its other threads that are in the user's code or asleep in the kernel (state D), from the rank's dump (numarun's
    own and a library's idle threads, a queue's feeder, are left to the stacks file)."""
    local = int(beat.get("local_rank", 0))
    cwd = str(beat.get("cwd", ""))
    out = []
    for t in family:
        path = state / HELPER.format(local_rank=local, pid=t.pid)
        head = helper_head(path)
        threads = rollcall.parse_faulthandler(texts.get(path, ""))
        frames = threads.get(int(head.get("main") or 0)) or (next(iter(threads.values())) if len(threads) == 1 else [])
        where, function, call, package = rollcall.locate_helper(frames, roots, cwd) if frames else ("", "", "", "")
        out.append(
            Helper(
                str(head.get("label") or f"process {t.name!r}"),
                t.pid,
                where,
                function,
                call,
                package,
                t.describe() if t.halted or t.state == "Z" or not (where or call) else "",
            )
        )
    names = {str(k): str(v) for k, v in (beat.get("threads") or {}).items()}
    tids = {str(k): int(v) for k, v in (beat.get("tids") or {}).items() if isinstance(v, int)}
    asleep = {t.pid: t for t in halted_threads}
    main = int(beat.get("main") or 0)
    for ident, frames in rollcall.parse_faulthandler(dump or "").items():
        name = names.get(str(ident), "")
        if ident == main or name.startswith("numarun-"):
            continue
        where, function, call, package = rollcall.locate_helper(frames, roots, cwd)
        task = asleep.pop(tids.get(str(ident), -1), None)
        if not where and task is None:  # a library's thread, not asleep in the kernel (a queue's feeder): the file
            continue
        label = f"thread {name!r}" if name else f"thread {ident:#x}"
        out.append(Helper(label, 0, where, function, call, package, task.describe() if task else ""))
    out += [Helper(f"thread {t.pid} ({t.name})", 0, kernel=t.describe()) for t in asleep.values()]
    return out


def call_node(
    state: Path,
    beats: Mapping[int, Mapping[str, Any]],
    out: Path,
    *,
    py_spy: bool = True,
    dumps: Dumps | None = None,
    dump_wait_s: float = DUMP_WAIT_S,
    root: Path = kernel.ROOT,
) -> NodeCall:
    """Roll-call of this node's ranks: every thread's stacks written to ``out``, a stand per rank."""
    host = socket.gethostname()
    dumps = dumps or Dumps(state, beats, root=root)
    exe = find_py_spy() if py_spy else None
    live = {int(beats[lr]["pid"]): lr in dumps.tasks and dumps.tasks[lr].halted for lr in sorted(dumps.alive)}
    native, why = _py_spy(exe, live, PY_SPY_TIMEOUT_S) if exe and live else ({}, "")
    halted_frames: dict[int, list[Frame]] = {}
    for pid in [p for p, halted in live.items() if halted and p in native]:
        native[pid], halted_frames[pid] = py_spy_json(native[pid], pid)
    texts = dumps.read(dump_wait_s)
    roots = rollcall.library_roots()
    stands, parts = [], []
    for local in sorted(beats):
        b = beats[local]
        dump = texts.get(state / STACKS.format(local_rank=local))
        task = dumps.tasks.get(local)
        family = dumps.family.get(local, [])
        helpers = helpers_of(
            b,
            dump,
            family,
            texts,
            state=state,
            roots=roots,
            halted_threads=kernel.halted_threads(task.pid, root) if task is not None else (),
        )
        stand = stand_of(
            b,
            dump,
            state=state,
            roots=roots,
            host=host,
            running=local in dumps.alive,
            task=task,
            helpers=helpers,
            halted_frames=halted_frames.get(int(b.get("pid", 0))),
        )
        stands.append(stand)
        parts.append(
            _section(
                stand,
                b,
                dump,
                native.get(stand.pid),
                host,
                [(t, texts.get(state / HELPER.format(local_rank=local, pid=t.pid), "")) for t in family],
            )
        )
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
    stacks = str(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# every thread of every rank on {host}; stacks: {source}\n\n" + "\n".join(parts))
    except OSError as e:  # a full or read-only log dir: the roll-call's lines still say where each rank stands
        stacks = f"not kept (cannot write {out}: {e.strerror or e})"
    return NodeCall(
        int(next(iter(beats.values())).get("node_rank", 0)) if beats else 0, host, tuple(stands), stacks, source
    )


def _section(
    stand: Stand,
    beat: Mapping[str, Any],
    dump: str | None,
    native: str | None,
    host: str,
    family: Sequence[tuple[kernel.Task, str]],
) -> str:
    """One rank's part of the stacks file: py-spy's dump, faulthandler's (thread names added), its kernel stack,
    then each of its descendants'."""
    names = {int(k): str(v) for k, v in (beat.get("threads") or {}).items() if str(k).isdigit()}
    head = f"=== rank {stand.rank} (local rank {stand.local_rank}, pid {stand.pid}, {host}): {stand.place()}"
    body = []
    if native:
        body.append(
            "--- py-spy dump (Python and C/C++ frames, or Python frames of a halted rank):\n" + native.rstrip() + "\n"
        )
    if (dump or "").strip():
        body.append(
            "--- faulthandler, every thread's Python stack (in-process):\n"
            + rollcall.name_threads((dump or "").strip("\n"), names)
            + "\n"
        )
    elif beat.get("frames"):
        body.append(
            "--- the main thread at the last sample (in-process):\n"
            + "".join(f'  File "{f[0]}", line {f[1]} in {f[2]}\n' for f in beat["frames"])
        )
    if stand.kernel_stack:
        body.append("--- its kernel stack (/proc/<pid>/stack):\n" + "".join(f"  {f}\n" for f in stand.kernel_stack))
    for task, text in family:
        label = next((h.label for h in stand.helpers if h.pid == task.pid), f"process {task.name!r}")
        what = f"--- {label} (pid {task.pid}, parent {task.ppid}): {task.describe()}"
        body.append(f"{what}\n{text.strip(chr(10))}\n" if text.strip() else f"{what}; no Python stack\n")
    return "\n".join([head, *body]) if body else head + "\n"


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
    out.append(
        "every thread of every rank: "
        + (calls[0].stacks if nodes == 1 else ", ".join(f"node {c.node} ({c.host}) {c.stacks}" for c in calls))
    )
    return out
