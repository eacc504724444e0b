"""The hang watchdog of numarun's agent: notices a job that stopped making progress and prints the roll-call.

Each rank's worker (:mod:`numarun.worker.progress`) rewrites a heartbeat in numarun's private directory: when its
counters (torch.distributed collectives entered and left, optimizer steps) last moved, when its main thread's stack
last changed, and that stack. A thread of the agent (``numarun-hangs``, one per job) reads them every sample and:

* **judges** (on the node whose ranks have group rank 0): the job hangs when, for ``--hang-timeout`` seconds, no
  live rank's counters moved and at least one live rank's stack stood still (:func:`judge`). A healthy loop sitting
  at one line keeps its counters moving; a long step of pure computation keeps its stack moving;
* **calls the roll**: every node sends its ranks :data:`~numarun.worker.progress.DUMP_SIGNAL` (every thread's Python
  stack, written in-process by faulthandler; py-spy adds native frames where it is installed and ptrace is
  allowed), turns each rank's main thread into a :class:`~numarun.launch.rollcall.Stand`, writes every thread of its
  ranks to a file it keeps, and in a multi-node job hands its stands to the judge through the rendezvous store;
  the judge prints one roll-call for the whole job and keeps it (:data:`KEEP_DIR` in the run dir, the log dir or
  ``$TMPDIR``);
* **acts**: ``--on-hang report`` (the default) leaves the job running; ``stop`` ends it on every node with
  :data:`EXIT_HANG`;
* answers ``numarun stacks`` (a request on :data:`FIFO`) and, when the supervisor begins stopping ranks on a death
  signal, writes where each rank stood (:meth:`HangWatch.at_stop`).

Store keys (multi-node, under ``numarun/hang/<restart>/``): ``node/<n>`` each node's summary, rewritten every
sample; ``ask`` a counter of roll-calls and ``ask/<k>`` who asked; ``answer/<k>/<n>`` each node's stands; ``stop``
and ``stopped`` for ``--on-hang stop``. Per node O(1) keys per sample, the judge O(nodes).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import envvars
from ..argtypes import seconds
from ..errors import NumarunError, UsageError
from ..jsonable import loads
from ..worker.progress import DUMP_SIGNAL, HEARTBEAT, STACKS
from . import rollcall
from .rollcall import Frame, Stand

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
"""``--hang-timeout``'s default (docs/hangs.md, "The default"): half of NCCL's own collective timeout (10 min), so
the roll-call comes while every rank still stands where it hangs, before NCCL's watchdog tears the ranks down; far
longer than a healthy job goes without a collective or an optimizer step; minutes, not a queue's time limit."""
EXIT_HANG = 75
"""The exit code of a job ended by ``--on-hang stop``: sysexits.h's EX_TEMPFAIL (a temporary failure, worth a
retry), apart from a failed rank's code, 2 (a usage mistake) and 128+N (a signal)."""
FIFO = "stacks.fifo"
"""In numarun's private directory: ``numarun stacks`` writes ``<id> <full>`` lines to it; the answer is ``stacks.<id>.txt``."""
JOB_FILE = "job.json"
"""In numarun's private directory: which numarun runs there (``numarun stacks`` lists these)."""
KEEP_DIR = "numarun_hangs.{host}.{pid}"
"""Not ``numarun-*``: that is the private directory's pattern, removed at exit; this one is kept."""
DUMP_WAIT_S = 3.0
"""How long the ranks' faulthandler dumps may take to land (they are written from a signal handler: microseconds)."""
STOP_DUMP_WAIT_S = 1.0
PY_SPY_TIMEOUT_S = 60.0
ANSWER_WAIT_S = 90.0
"""How long the judge waits for the other nodes' stands (a sample, the dumps, py-spy's native unwinding)."""
STOP_ACK_WAIT_S = 15.0


class StacksUnavailable(NumarunError):
    """A job's roll-call could not be had: no job runs, or its numarun did not answer (exit 1)."""

    exit_code = 1
    page = "hangs.md"


class OnHang(str, enum.Enum):
    """What numarun does once it has printed the roll-call of a hung job."""

    REPORT = "report"
    """Nothing more: the job keeps running (a debugger can still attach; a long step may still finish)."""
    STOP = "stop"
    """End the job on every node, nothing left running, with exit code :data:`EXIT_HANG`."""


def parse_on_hang(text: str) -> OnHang:
    try:
        return OnHang(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad --on-hang {text!r}: expected one of {', '.join(m.value for m in OnHang)}") from None


parse_hang_timeout = seconds("--hang-timeout", above=False)
HANG_OPTIONS = ("hang_timeout", "on_hang")
"""The watchdog's launch options (``--hang-timeout``/``NUMARUN_HANG_TIMEOUT``/``launcher.hang_timeout``, and
``--on-hang``/``NUMARUN_ON_HANG``/``launcher.on_hang``): declared here, resolved with the others by
:mod:`numarun.launch.options`."""


def add_hang_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("hangs (docs/hangs.md)")
    group.add_argument(
        "--hang-timeout", type=parse_hang_timeout, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help=f"print the roll-call of every rank when no rank entered or left a torch.distributed collective or took "
             f"an optimizer step for this long while a rank's stack stood still (default {DEFAULT_TIMEOUT_S:g}; 0: off; "
             f"also {envvars.HANG_TIMEOUT})")
    group.add_argument(
        "--on-hang", type=parse_on_hang, default=OnHang.REPORT, metavar="ACTION",
        help=f"after the roll-call: report (keep running, default) or stop (end the job, exit code {EXIT_HANG}; "
             f"also {envvars.ON_HANG})")


@dataclass(frozen=True)
class HangPolicy:
    timeout_s: float = DEFAULT_TIMEOUT_S
    action: OnHang = OnHang.REPORT
    source: str = "--hang-timeout"
    """Where the timeout came from, for the roll-call's first line."""

    @property
    def on(self) -> bool:
        return self.timeout_s > 0

    @property
    def sample_s(self) -> float:
        """A tenth of the timeout, from 0.5 to 5 s: the verdict is at most a tenth late, and a sample costs
        tens of microseconds (scripts/bench_launch.py --watchdog)."""
        return min(5.0, max(0.5, self.timeout_s / 10)) if self.on else 0.0

    @property
    def tick_s(self) -> float:
        return self.sample_s or 5.0

    def worker_env(self) -> dict[str, str]:
        return {envvars.HANG_SAMPLE: f"{self.sample_s:g}"}


def policy_from(options: Any) -> HangPolicy:
    """The policy of resolved launch options (:class:`numarun.launch.options.Options`)."""
    timeout = options.setting("hang_timeout")
    action = options.on_hang
    return HangPolicy(float(timeout.value), OnHang(action), timeout.where)


# ----------------------------------------------------------------------------- what the ranks wrote


def read_beats(state: Path) -> dict[int, dict[str, Any]]:
    """Local rank -> heartbeat of the latest worker group."""
    beats: dict[int, dict[str, Any]] = {}
    for f in state.glob(HEARTBEAT.format(local_rank="*")):
        try:
            beat = loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(beat, dict) and isinstance(beat.get("local_rank"), int):
            beats[beat["local_rank"]] = beat
    latest = max((b.get("group", 0) for b in beats.values()), default=0)
    return {k: b for k, b in beats.items() if b.get("group", 0) == latest}


def process_state(pid: int) -> str:
    """The kernel's state letter of ``pid`` ('' when gone; ``Z`` a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def alive(pid: int) -> bool:
    return process_state(pid) not in ("", "Z", "X")


def catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (SigCgt): a dump signal never kills a rank that lacks one."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def exit_code(state: Path, local_rank: int, group: int) -> int | None:
    """The code a rank's script ended with (the ledger's ``exit.<local rank>``), if it recorded one."""
    try:
        restart, code = (int(x) for x in (state / f"exit.{local_rank}").read_text().split())
    except (OSError, ValueError):
        return None
    return code if restart == group else None


@dataclass(frozen=True)
class Summary:
    """One node's view, for the judge (JSON through the store)."""

    node: int
    nodes: int
    world: int
    ranks: int
    """Ranks of this node that wrote a heartbeat."""
    local_world: int
    live: int
    quiet_s: float
    """Since the counters of any live rank of this node last moved (-1: no live rank)."""
    still_s: float
    """The longest any live rank's stack and counters both stood still (-1: no live rank)."""
    sampling: bool = True


def summarize(beats: Mapping[int, Mapping[str, Any]], now: float, live: Callable[[int], bool] = alive) -> Summary | None:
    """This node's summary from its heartbeats (None before the first)."""
    if not beats:
        return None
    first = next(iter(beats.values()))
    quiet, still, n_live = [], [], 0
    for b in beats.values():
        if not live(int(b.get("pid", 0))) or "moved" not in b:
            continue
        n_live += 1
        quiet.append(now - float(b["moved"]))
        still.append(now - max(float(b["moved"]), float(b.get("changed", b["moved"]))))
    return Summary(node=int(first.get("node_rank", 0)), nodes=int(first.get("nodes", 1)), world=int(first.get("world", 1)),
                   ranks=len(beats), local_world=int(first.get("local_world", len(beats))), live=n_live,
                   quiet_s=min(quiet) if quiet else -1.0, still_s=max(still) if still else -1.0,
                   sampling=all(b.get("sampling", True) for b in beats.values()))


@dataclass(frozen=True)
class Verdict:
    hung: bool
    quiet_s: float
    still_s: float
    reason: str = ""


def judge(summaries: Sequence[Summary], timeout_s: float) -> Verdict:
    """The job hangs when every node reported all its ranks, some rank lives, and for ``timeout_s`` no live
    rank's counters moved while some live rank's stack stood still too."""
    if not summaries or timeout_s <= 0:
        return Verdict(False, 0.0, 0.0, "no summary")
    nodes = summaries[0].nodes
    if len({s.node for s in summaries}) < nodes or any(s.ranks < s.local_world for s in summaries):
        return Verdict(False, 0.0, 0.0, "not every rank reported yet")
    if not all(s.sampling for s in summaries):
        return Verdict(False, 0.0, 0.0, "a rank does not sample")
    live = [s for s in summaries if s.live]
    if not live:
        return Verdict(False, 0.0, 0.0, "no live rank")
    quiet = min(s.quiet_s for s in live)
    still = max(s.still_s for s in live)
    return Verdict(quiet >= timeout_s and still >= timeout_s, quiet, still)


# ----------------------------------------------------------------------------- the roll-call of a node


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
        return NodeCall(int(d["node"]), str(d["host"]), tuple(Stand(**s) for s in d["stands"]), str(d["stacks"]),
                        str(d["source"]))


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
    procs = {pid: subprocess.Popen([exe, "dump", "--pid", str(pid), "--native"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) for pid in pids}
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


def stand_of(beat: Mapping[str, Any], dump: str | None, *, state: Path, roots: Sequence[str], host: str,
             running: bool | None = None) -> Stand:
    """Where one rank stands: its main thread in the dump (else in its last heartbeat), the collective it is in.
    ``running``: whether it ran when asked (default: whether it runs now)."""
    pid = int(beat.get("pid", 0))
    local = int(beat.get("local_rank", 0))
    base: dict[str, Any] = dict(rank=int(beat.get("rank", 0)), local_rank=local, pid=pid,
                                node=int(beat.get("node_rank", 0)), host=host)
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
    return Stand(**base, where=where, function=function, call=call, package=package,
                 inside=str(beat.get("inside") or ""), note=note)


def call_node(state: Path, beats: Mapping[int, Mapping[str, Any]], out: Path, *, py_spy: bool = True,
              dumps: Dumps | None = None, dump_wait_s: float = DUMP_WAIT_S) -> NodeCall:
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
            body.append("--- faulthandler, every thread's Python stack (in-process):\n"
                        + rollcall.name_threads(texts[local].strip("\n"), names) + "\n")
        elif b.get("frames"):
            body.append("--- the main thread at the last sample (in-process):\n" + "".join(
                f'  File "{f[0]}", line {f[1]} in {f[2]}\n' for f in b["frames"]))
        parts.append("\n".join([head, *body]) if body else head + "\n")
    if not py_spy:
        source = "in-process Python stacks (faulthandler)"
    elif exe is None:
        source = ("in-process Python stacks (faulthandler); py-spy is not installed: pip install 'numarun[debug]' "
                  "adds native frames")
    elif native and len(native) == len(live):
        source = "py-spy with native frames, and in-process Python stacks"
    else:
        denied = "EPERM" in why or "ermission" in why or "not permitted" in why
        source = ("in-process Python stacks (faulthandler); py-spy could not read the ranks"
                  + (" (ptrace is not permitted here: CAP_SYS_PTRACE, kernel.yama.ptrace_scope or seccomp)" if denied else "")
                  + f": {why}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# every thread of every rank on {host}; stacks: {source}\n\n" + "\n".join(parts))
    return NodeCall(int(next(iter(beats.values())).get("node_rank", 0)) if beats else 0, host, tuple(stands), str(out),
                    source)


def render(calls: Sequence[NodeCall], *, header: Sequence[str] = ()) -> list[str]:
    """The roll-call's lines (without the ``numarun:`` prefix)."""
    stands = [s for c in calls for s in c.stands]
    nodes = len(calls)
    sources = sorted({c.source for c in calls})
    where = f" on {nodes} nodes" if nodes > 1 else ""
    out = [*header, f"roll-call of {len(stands)} rank{'s' if len(stands) != 1 else ''}{where} (stacks: {'; '.join(sources)}):"]
    out += [f"  {line}" for line in rollcall.lines(stands, multi_node=nodes > 1)]
    files = [c.stacks for c in calls]
    out.append("every thread of every rank: " + (files[0] if len(files) == 1 else
                                                  ", ".join(f"node {c.node} ({c.host}) {c.stacks}" for c in calls)))
    return out


# ----------------------------------------------------------------------------- nodes meet in the store


class Exchange:
    """The roll-call's keys in the rendezvous store (see the module docstring); one client, one thread."""

    def __init__(self, host: str, port: int, group: int, *, timeout_s: float = 10.0) -> None:
        self.host, self.port = host, port
        self.prefix = f"numarun/hang/{group}/"
        self.timeout_s = timeout_s
        self._store: Any = None
        self.seen = 0

    def store(self) -> Any:
        if self._store is None:
            from datetime import timedelta

            from torch.distributed import TCPStore

            self._store = TCPStore(self.host, self.port, None, False, timeout=timedelta(seconds=self.timeout_s),
                                   wait_for_workers=False)
        return self._store

    def _get(self, key: str) -> bytes | None:
        s = self.store()
        return s.get(self.prefix + key) if s.check([self.prefix + key]) else None

    def publish(self, summary: Summary) -> None:
        self.store().set(self.prefix + f"node/{summary.node}", json.dumps(dataclasses.asdict(summary)))

    def summaries(self, nodes: int) -> list[Summary]:
        out = []
        for n in range(nodes):
            raw = self._get(f"node/{n}")
            if raw is not None:
                out.append(Summary(**loads(raw)))
        return out

    def ask(self, why: str, by: int) -> int:
        k = int(self.store().add(self.prefix + "ask", 1))
        self.store().set(self.prefix + f"ask/{k}", json.dumps({"why": why, "by": by}))
        return k

    def asks(self) -> list[tuple[int, str, int]]:
        """Roll-calls asked since the last look: (id, why, by node)."""
        cur = int(self.store().add(self.prefix + "ask", 0))
        out = []
        while self.seen < cur:
            raw = self._get(f"ask/{self.seen + 1}")
            if raw is None:
                break  # counted, not yet described: the next look
            self.seen += 1
            d = loads(raw)
            out.append((self.seen, str(d["why"]), int(d["by"])))
        return out

    def answer(self, k: int, call: NodeCall) -> None:
        self.store().set(self.prefix + f"answer/{k}/{call.node}", call.to_json())

    def answers(self, k: int, nodes: int) -> dict[int, NodeCall]:
        out = {}
        for n in range(nodes):
            raw = self._get(f"answer/{k}/{n}")
            if raw is not None:
                out[n] = NodeCall.from_json(raw)
        return out

    def stop(self, message: str, by: int) -> None:
        self.store().set(self.prefix + "stop", json.dumps({"message": message, "by": by}))

    def stopping(self) -> dict[str, Any] | None:
        raw = self._get("stop")
        return loads(raw) if raw is not None else None

    def ack(self) -> int:
        return int(self.store().add(self.prefix + "stopped", 1))

    def acks(self) -> int:
        return int(self.store().add(self.prefix + "stopped", 0))


# ----------------------------------------------------------------------------- the watchdog


def keep_dir(base: os.PathLike[str] | str | None) -> Path:
    """Where this numarun keeps its roll-calls: ``<base>/numarun_hangs.<host>.<pid>`` (base: the run dir, the log
    dir, else ``$TMPDIR``)."""
    root = Path(base).absolute() if base else Path(tempfile.gettempdir())
    return root / KEEP_DIR.format(host=socket.gethostname(), pid=os.getpid())


class HangWatch:
    """One job's watchdog thread (see the module docstring). ``hold()`` says a stop is coming (the supervisor's main
    thread must not end the run its own way meanwhile), ``request_stop(code, message)`` asks the supervisor's loop
    to end the job; ``store``: (host, port) of the rendezvous store of a multi-node job."""

    def __init__(self, policy: HangPolicy, state: Path, *, keep: Path, store: tuple[str, int] | None,
                 request_stop: Callable[[int, str], None], hold: Callable[[], None] = lambda: None,
                 stderr: Any = None) -> None:
        self.policy = policy
        self.state = state
        self.keep = keep
        self.store_address = store
        self.request_stop = request_stop
        self.hold = hold
        self.stderr = stderr
        self._exchange: Exchange | None = None
        self._armed = True
        self._count = 0
        self._closed = threading.Event()
        self._stop_asked: tuple[str, Dumps] | None = None
        self.stop_written = threading.Event()
        self._stop_taken = False
        self._stop_lock = threading.Lock()
        self._fifo_path = state / FIFO
        self._fifo = -1
        self._thread: threading.Thread | None = None
        self.reports: list[list[str]] = []

    # -- the supervisor's side
    def start(self) -> HangWatch:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self._fifo_path, 0o600)
        self._fifo = os.open(self._fifo_path, os.O_RDWR | os.O_NONBLOCK)  # O_RDWR: never EOF between clients
        self._thread = threading.Thread(target=self._run, name="numarun-hangs", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._fifo >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fifo)
            self._fifo = -1
        with contextlib.suppress(OSError):
            self._fifo_path.unlink()

    def at_stop(self, signum: int) -> None:
        """The supervisor begins stopping the ranks (a death signal): each rank dumps its stacks now, before
        torchrun's SIGTERM reaches it; the thread writes where they stood and says where, once."""
        with self._stop_lock:  # the loop and the main thread may both call, whichever sees the signal first
            if self._stop_taken or signum == signal.SIGINT:  # Ctrl-C reaches the ranks themselves, from the terminal
                return
            self._stop_taken = True
        beats = read_beats(self.state)
        if not beats:  # no rank started yet: nothing stood anywhere
            self.stop_written.set()
            return
        self._stop_asked = (signal.Signals(signum).name, Dumps(self.state, beats))
        self._poke()

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait for the roll-call at a stop, if one was begun."""
        if self._stop_taken:
            self.stop_written.wait(timeout_s)

    def _poke(self) -> None:
        if self._fifo >= 0:
            with contextlib.suppress(OSError):
                os.write(self._fifo, b"poke\n")

    # -- the thread
    def _run(self) -> None:
        pending = b""
        while not self._closed.is_set():
            requests: list[str] = []
            try:
                if select.select([self._fifo], [], [], self.policy.tick_s)[0]:
                    pending += os.read(self._fifo, 65536)
                    *lines, pending = pending.split(b"\n")
                    requests = [ln.decode("utf-8", "replace").strip() for ln in lines if ln.strip()]
            except (OSError, ValueError):
                pass
            if self._closed.is_set():
                return
            try:
                self._tick([r for r in requests if r != "poke"])
            except Exception as e:  # the watchdog never takes the job down
                log.debug("hang watchdog: %s", e, exc_info=True)

    def _say(self, lines: Iterable[str]) -> None:
        stream = self.stderr or sys.stderr
        for line in lines:
            print(f"numarun: {line}", file=stream)
        stream.flush()

    def _tick(self, requests: list[str]) -> None:
        if self._stop_asked is not None:
            name, dumps = self._stop_asked
            self._stop_asked = None
            try:
                self._at_stop(name, dumps)
            finally:
                self.stop_written.set()
            return
        beats = read_beats(self.state)
        summary = summarize(beats, time.monotonic())
        if summary is None:
            for r in requests:
                self._answer_request(r, None)
            return
        ex = self._exchange_for(summary)
        if ex is not None:
            ex.publish(summary)
            stop = ex.stopping()
            if stop is not None and int(stop["by"]) != summary.node:
                self.hold()
                freeze(beats)
                ex.ack()
                self._await_acks(ex, summary.nodes)  # the store (on any node) stays up until every node knows
                self.request_stop(EXIT_HANG, str(stop["message"]))
                self._closed.set()
                return
            self._answer_asks(ex, beats, summary.node)
        for r in requests:
            self._answer_request(r, (beats, summary, ex))
        if self.policy.on and summary.node == 0:
            summaries = [summary] if ex is None else ex.summaries(summary.nodes)
            verdict = judge(summaries, self.policy.timeout_s)
            if verdict.quiet_s < self.policy.timeout_s:
                self._armed = True  # something moved since the last report: the next hang is reported too
            if verdict.hung and self._armed:
                self._armed = False
                self._report(verdict, beats, summary, ex)

    def _exchange_for(self, summary: Summary) -> Exchange | None:
        if self.store_address is None or summary.nodes <= 1:
            return None
        group = next(iter(read_beats(self.state).values()), {}).get("group", 0)
        if self._exchange is None or self._exchange.prefix != f"numarun/hang/{group}/":
            self._exchange = Exchange(*self.store_address, int(group))
        return self._exchange

    def _answer_asks(self, ex: Exchange, beats: Mapping[int, Mapping[str, Any]], node: int) -> None:
        for k, why, by in ex.asks():
            if by == node:
                continue  # this node's own: answered as it asked
            ex.answer(k, call_node(self.state, beats, self.keep / f"stacks.{k}.txt", py_spy=why != "stop"))

    def _call(self, why: str, beats: Mapping[int, Mapping[str, Any]], summary: Summary,
              ex: Exchange | None) -> list[NodeCall]:
        """Every node's answer to one roll-call (this node's own first); nodes that do not answer are named."""
        if ex is None:
            self._count += 1
            return [call_node(self.state, beats, self.keep / f"stacks.{self._count}.txt")]
        k = ex.ask(why, summary.node)
        own = call_node(self.state, beats, self.keep / f"stacks.{k}.txt")
        ex.answer(k, own)
        deadline = time.monotonic() + ANSWER_WAIT_S
        got: dict[int, NodeCall] = {}
        while time.monotonic() < deadline:
            got = ex.answers(k, summary.nodes)
            if len(got) >= summary.nodes:
                break
            self._answer_asks(ex, beats, summary.node)  # another node may be calling the roll meanwhile
            time.sleep(0.2)
        missing = [n for n in range(summary.nodes) if n not in got]
        calls = [got[n] for n in sorted(got)]
        for n in missing:
            calls.append(NodeCall(n, "", (), "(no answer)", f"node {n} did not answer within {ANSWER_WAIT_S:g} s"))
        return calls

    def _report(self, verdict: Verdict, beats: Mapping[int, Mapping[str, Any]], summary: Summary,
                ex: Exchange | None) -> None:
        calls = self._call("hang", beats, summary, ex)
        p = self.policy
        first = (f"hang: for {verdict.quiet_s:.0f} s no rank entered or left a torch.distributed collective or took "
                 f"an optimizer step ({p.source} {p.timeout_s:g})")
        text = render(calls, header=[first])
        n = len(self.reports) + 1
        kept = self.keep / f"rollcall.{n}.txt"
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text("".join(f"{line}\n" for line in text))
        text.append(f"this roll-call: {kept}")
        if p.action is OnHang.STOP:
            self.reports.append(text)
            self._say(text)
            self.hold()
            freeze(beats)
            message = (f"the job made no progress for {verdict.quiet_s:.0f} s ({p.source} {p.timeout_s:g}): "
                       f"stopped it (--on-hang stop, exit code {EXIT_HANG})")
            if ex is not None:
                ex.stop(f"node {summary.node} found the job hung ({p.source} {p.timeout_s:g}; the roll-call is on its "
                        f"stderr): stopped it (--on-hang stop, exit code {EXIT_HANG})", summary.node)
                self._await_acks(ex, summary.nodes)
            self.request_stop(EXIT_HANG, message)
            self._closed.set()
            return
        text.append("the job keeps running (--on-hang report): 'numarun stacks' shows where the ranks are now, "
                    f"--on-hang stop would end it (exit code {EXIT_HANG})")
        self.reports.append(text)
        self._say(text)

    @staticmethod
    def _await_acks(ex: Exchange, nodes: int) -> None:
        deadline = time.monotonic() + STOP_ACK_WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a node that already ended took the store with it: go on
                if ex.acks() >= nodes - 1:
                    return
                time.sleep(0.2)
                continue
            return

    def _answer_request(self, request: str, view: tuple[Any, Summary, Exchange | None] | None) -> None:
        """A ``numarun stacks`` request ``<id> <full>``: the roll-call in ``stacks.<id>.txt``."""
        rid, _, full = request.partition(" ")
        if not rid.isalnum():
            return
        if view is None:
            text = ["no rank of this job runs yet (none has written its heartbeat)"]
        else:
            beats, summary, ex = view
            calls = self._call("stacks", beats, summary, ex)
            text = render(calls)
            if full.strip() == "1":
                for c in calls:
                    with contextlib.suppress(OSError):
                        text += ["", *Path(c.stacks).read_text().splitlines()]
        answer = self.state / f"stacks.{rid}.txt"
        tmp = answer.with_name(f".{answer.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{line}\n" for line in text))
        os.replace(tmp, answer)

    def _at_stop(self, name: str, dumps: Dumps) -> None:
        beats = read_beats(self.state)
        # torchrun's own SIGTERM may have ended a rank before its dump: one that recorded no exit of its own
        # was running when the signal came, where its last sample has it
        dumps.alive |= {lr for lr, b in beats.items() if exit_code(self.state, lr, int(b.get("group", 0))) is None}
        call = call_node(self.state, beats, self.keep / "stacks.stop.txt", py_spy=False, dumps=dumps,
                         dump_wait_s=STOP_DUMP_WAIT_S)
        text = render([call], header=[f"where each rank of this node stood when numarun got {name}:"])
        kept = self.keep / "rollcall.stop.txt"
        kept.write_text("".join(f"{line}\n" for line in text))
        self._say([f"where each rank stood at {name}: {kept}"])


# ----------------------------------------------------------------------------- numarun stacks, the asking side


def write_job_record(directory: Path, argv: Sequence[str]) -> None:
    """``job.json`` in numarun's private directory: which numarun runs there, for ``numarun stacks``."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "cwd": os.getcwd(),
              "argv": list(argv)}
    (directory / JOB_FILE).write_text(json.dumps(record))


@dataclass(frozen=True)
class Job:
    pid: int
    state: Path
    started: float
    argv: tuple[str, ...]


def running_jobs(tmp: Path | None = None) -> list[Job]:
    """This user's numarun jobs on this node (their private directories under ``$TMPDIR``), the latest first."""
    root = Path(tmp) if tmp else Path(tempfile.gettempdir())
    jobs = []
    for record in root.glob(f"numarun-*/{JOB_FILE}"):
        try:
            d = loads(record.read_text())
            job = Job(int(d["pid"]), record.parent, float(d["started"]), tuple(str(a) for a in d.get("argv", [])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive(job.pid):
            jobs.append(job)
    return sorted(jobs, key=lambda j: -j.started)


def _environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode("utf-8", "replace").split("\0") if "=" in kv)


def job_of(pid: int) -> Job:
    """The job of ``pid``: a numarun's own, or that of a rank it started (found through the rank's environment)."""
    for job in running_jobs():
        if job.pid == pid:
            return job
    import psutil

    candidates = [pid]
    with contextlib.suppress(psutil.Error):
        candidates += [c.pid for c in psutil.Process(pid).children()]
    for p in candidates:
        env = _environ_of(p)
        state = env.get(envvars.STATE_DIR)
        if state and (Path(state) / JOB_FILE).is_file():
            d = loads((Path(state) / JOB_FILE).read_text())
            return Job(int(d["pid"]), Path(state), float(d["started"]), tuple(d.get("argv", [])))
    raise UsageError(f"bad --pid {pid}: no numarun job of this user has that pid, nor a rank of one; expected the pid of "
                     "a running numarun or of one of its ranks (numarun stacks --list)")


def ask_stacks(job: Job, *, full: bool = False, timeout_s: float = 180.0) -> str:
    """The roll-call of ``job``, asked of its numarun (the agent that watches its ranks): harmless to the job."""
    fifo = job.state / FIFO
    rid = f"{os.getpid()}x{time.monotonic_ns() % 10**9}"
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        raise StacksUnavailable(f"numarun {job.pid} takes no stacks request now ({fifo}: {e.strerror}); expected a job "
                                "whose ranks run") from None
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
    raise StacksUnavailable(f"numarun {job.pid} did not answer within {timeout_s:g} s"
                            + ("" if alive(job.pid) else ": it ended meanwhile"))
