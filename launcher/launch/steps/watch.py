"""The step report's thread of one job (``numarun-steps``): reads the ranks' records, samples the kernel's figures,
meets the other nodes in the store, keeps the live table, and at the end prints the summary and writes the files."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import SchemaError
from ...fsutil import write_atomic
from ...jsonable import from_jsonable, loads, to_jsonable
from ...plan.model import BindingMode, LaunchPlan
from ...worker.steps import END, LIVE, RECORDS, LiveTable, RankPlace, RankRow, StepRecord, read_records
from ..hangs.exchange import store_client
from ..hangs.verdict import alive, read_beats
from .cause import Cause, explain
from .evidence import Evidence, RankProc, Sampler, cpus_of, nic_note, read_environ
from .judge import WINDOW, Judgement, Point, judge
from .policy import StepPolicy
from .report import place_of, point, recent, row_of, steps_per_s, summary_lines, verdict_lines

log = logging.getLogger(__name__)

KEEP_DIR = "numarun_steps.{host}.{pid}"
"""Where a node keeps its ranks' records, the picture and the trace (in the run dir, the log dir or ``$TMPDIR``)."""
KEPT = 2 * WINDOW
"""Records kept in memory per rank (the files hold them all)."""
PICTURE_STEPS = 2000
"""The picture and the trace show each rank's latest steps, at most this many."""
EXIT_POLL_S = 0.1
"""How often the thread looks whether its node's ranks have all ended: then its last view goes to the judge at once,
while the agents still wait for each other (torchrun's exit barrier) and the store is still up."""
STORE_TIMEOUT_S = 3.0
"""A store operation's limit: the report's store is the job's, on the rendezvous host, which answers in
milliseconds while the job runs; one that does not answer in this long has gone (its node left at the end)."""
FINAL_WAIT_S = 1.0
"""How long the judge waits at the end for the other nodes' last views (it shows a late one as of its last report)."""


def keep_dir(base: os.PathLike[str] | str | None) -> Path:
    root = Path(base).absolute() if base else Path(tempfile.gettempdir())
    return root / KEEP_DIR.format(host=socket.gethostname(), pid=os.getpid())


class Tail:
    """A rank's records file, read as it grows; a new file (a restarted rank, a rotation) starts over."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode = -1
        self.partial = ""

    def read(self) -> tuple[list[StepRecord], bool]:
        """(the records written since the last read, whether the file was started anew: a restarted rank's)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return [], False
        out: list[StepRecord] = []
        anew = False
        if st.st_ino != self.inode:
            rotated = Path(f"{self.path}.1")
            with contextlib.suppress(OSError):
                if self.inode >= 0 and os.stat(rotated).st_ino == self.inode:  # moved aside: its end first
                    out += self._lines(rotated, os.stat(rotated).st_size)
            anew = self.inode >= 0 and not out and not rotated.exists()
            self.offset, self.inode, self.partial = 0, st.st_ino, ""
        elif st.st_size < self.offset:
            self.offset, self.partial, anew = 0, "", True
        out += self._lines(self.path, st.st_size)
        return out, anew

    def _lines(self, path: Path, size: int) -> list[StepRecord]:
        if size <= self.offset:
            return []
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        text = self.partial + data.decode("utf-8", "replace")
        *lines, self.partial = text.split("\n")
        return list(read_records(lines))


@dataclass
class _Rank:
    local: int
    rank: int
    pid: int
    node_rank: int
    group: int
    place: RankPlace
    proc: RankProc
    tail: Tail
    records: deque[StepRecord]


@dataclass(frozen=True)
class RankView:
    """One rank as its node tells the judge (JSON through the store)."""

    row: RankRow
    window: tuple[tuple[float | None, ...], ...]
    """Its latest steps as :meth:`Point.row` lists."""
    evidence: Evidence | None = None
    workers: int = -1
    """Its DataLoader workers as its records say (-1: unknown)."""


@dataclass(frozen=True)
class NodeView:
    node: int
    host: str
    bound: bool
    ranks: tuple[RankView, ...]
    final: bool = False
    """Every rank of the node had ended when it was made."""


class Exchange:
    """The step report's keys of one restart (``numarun/steps/<restart>/``): ``node/<n>`` each node's view, rewritten
    every report, and ``table`` the judge's live table of the whole job, which every other node reads back."""

    def __init__(self, host: str, port: int, group: int) -> None:
        self.host, self.port = host, port
        self.prefix = f"numarun/steps/{group}/"
        self._store: Any = None
        self.broken = False
        """A store operation failed: the store is gone (its node left at the end) or unreachable; never asked again,
        since each try costs a connect timeout. The last views stand."""

    def store(self) -> Any:
        if self.broken:
            raise ConnectionError("the store failed before")
        if self._store is None:
            try:
                self._store = store_client(self.host, self.port, timeout_s=STORE_TIMEOUT_S)
            except Exception:
                self.broken = True
                raise
        return self._store

    def _call(self, op: str, *args: Any) -> Any:
        try:
            return getattr(self.store(), op)(*args)
        except Exception:
            self.broken = True
            raise

    def _get(self, key: str) -> bytes | None:
        return self._call("get", self.prefix + key) if self._call("check", [self.prefix + key]) else None

    def publish(self, view: NodeView) -> None:
        self._call("set", self.prefix + f"node/{view.node}", json.dumps(to_jsonable(view), separators=(",", ":")))

    def views(self, nodes: int) -> dict[int, NodeView]:
        out = {}
        for n in range(nodes):
            raw = self._get(f"node/{n}")
            with contextlib.suppress(ValueError):
                if raw is not None:
                    out[n] = from_jsonable(NodeView, loads(raw))
        return out

    def publish_table(self, table: LiveTable) -> None:
        self._call("set", self.prefix + "table", table.text())

    def table(self) -> LiveTable | None:
        raw = self._get("table")
        try:
            return LiveTable.parse(raw.decode()) if raw is not None else None
        except (ValueError, SchemaError):
            return None


class StepWatch:
    """One job's step report (see the package docstring). ``say`` prints lines on numarun's stderr."""

    def __init__(
        self,
        policy: StepPolicy,
        state: Path,
        *,
        keep: Path,
        store: tuple[str, int] | None,
        plan: Path | None,
        root: Path = Path("/"),
        say: Callable[[Iterable[str]], None] | None = None,
    ) -> None:
        self.policy = policy
        self.state = state
        self.keep = keep
        self.store_address = store
        self.plan_path = plan
        self._plan: LaunchPlan | None = None
        self.sampler = Sampler(root, exclude={os.getpid()})
        self.say = say or _say
        self.ranks: dict[int, _Rank] = {}
        self.views: dict[int, NodeView] = {}
        self.judgement: Judgement | None = None
        self.cause: Cause | None = None
        self.table: LiveTable | None = None
        self.node = 0
        self.nodes = 1
        self._exchange: Exchange | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- the supervisor's side
    def start(self) -> StepWatch:
        self._thread = threading.Thread(target=self._run, name="numarun-steps", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """The end of the job: a last report from what the ranks wrote, the summary (on the judging node), the
        files."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.tick(final=True)
            deadline = time.monotonic() + FINAL_WAIT_S
            while self.node == 0 and self._exchange_for() is not None and time.monotonic() < deadline:
                if len(self.views) >= self.nodes and all(v.final for v in self.views.values()):
                    break
                time.sleep(0.1)
                self.tick(final=True)
            self._finish()
        except Exception as e:  # the report never takes the job's end down
            log.debug("step report: %s", e, exc_info=True)

    # -- the thread
    def _run(self) -> None:
        due = time.monotonic() + self.policy.interval_s
        sent_final = first = False
        while not self._stop.wait(EXIT_POLL_S):
            try:
                ended = bool(self.ranks) and not any(alive(r.pid) for r in self.ranks.values())
                last_looks = sorted(self.state.glob(END.format(local_rank="*")))
                started = not first and any(_has_records(self.state, lr) for lr in self._locals())
                if time.monotonic() >= due or (ended and not sent_final) or last_looks or started:
                    self.tick(final=ended)
                    due = time.monotonic() + self.policy.interval_s
                    sent_final, first = ended, first or started
                    for path in last_looks:  # the ranks waiting at their exit go on
                        with contextlib.suppress(OSError):
                            path.unlink()
            except Exception as e:
                log.debug("step report: %s", e, exc_info=True)

    def _locals(self) -> list[int]:
        return sorted(self.ranks) or sorted(read_beats(self.state))

    def plan(self) -> LaunchPlan | None:
        if self._plan is None and self.plan_path is not None:
            with contextlib.suppress(Exception):
                self._plan = LaunchPlan.from_json(self.plan_path.read_text(), origin=str(self.plan_path))
        return self._plan

    def _ranks_from(self, beats: Mapping[int, Mapping[str, Any]]) -> None:
        """The ranks of the latest worker group, as their heartbeats say (a restart starts them over)."""
        host = socket.gethostname()
        plan = self.plan()
        all_cpus = range(os.cpu_count() or 1)
        for local, b in beats.items():
            group, pid = int(b.get("group", 0)), int(b.get("pid", 0))
            known = self.ranks.get(local)
            if known is not None and known.group == group and known.pid == pid:
                continue
            rank, node_rank = int(b.get("rank", local)), int(b.get("node_rank", 0))
            place = place_of(plan, local, rank=rank, node_rank=node_rank, host=host)
            binding = next((r for r in plan.ranks if r.local_rank == local), None) if plan else None
            cpus = cpus_of(place.cpus, binding.cpus if binding else all_cpus)
            numa = binding.mems[0] if binding and len(binding.mems) == 1 else place.numa
            nic = nic_note(binding.env, read_environ(self.sampler.root, pid)) if binding else ""
            self.ranks[local] = _Rank(
                local,
                rank,
                pid,
                node_rank,
                group,
                place,
                RankProc(rank, pid, cpus, numa, nic),
                Tail(self.state / RECORDS.format(local_rank=local)),  # a restarted rank truncated it: from the top
                deque(maxlen=KEPT),
            )
            self.node, self.nodes = node_rank, int(b.get("nodes", 1))

    def tick(self, *, final: bool = False) -> None:
        """One report: records read, figures sampled (while the ranks run), views exchanged, the table written."""
        with self._lock:
            beats = read_beats(self.state)
            if not beats:
                return
            self._ranks_from(beats)
            for r in self.ranks.values():
                new, anew = r.tail.read()
                if anew:
                    r.records.clear()
                r.records.extend(new)
            now = time.monotonic()
            live = {lr: alive(r.pid) for lr, r in self.ranks.items()}
            if not final:
                suspects = {self.table.slowest} if self.table is not None and self.table.slowest is not None else set()
                self.sampler.sample([r.proc for lr, r in self.ranks.items() if live[lr]], now, suspects=suspects)
            view = self._view(live)
            ex = self._exchange_for()
            views = {self.node: view}
            if ex is not None:
                with contextlib.suppress(Exception):  # a store gone at the end: the last views stand
                    ex.publish(view)
                    if self.node == 0:
                        views = {**ex.views(self.nodes), self.node: view}
            self.views = {**self.views, **views}
            if self.node == 0:
                table = self._judge()
                if ex is not None:
                    with contextlib.suppress(Exception):
                        ex.publish_table(table)
            else:
                shared = None
                if ex is not None:
                    with contextlib.suppress(Exception):
                        shared = ex.table()
                mine = {row.place.rank: row for row in (rv.row for rv in view.ranks)}
                rows = tuple(mine.pop(row.place.rank, row) for row in (shared.rows if shared else ())) + tuple(
                    mine.values()
                )
                table = LiveTable(
                    time.time(),
                    tuple(sorted(rows, key=lambda row: row.place.rank)),
                    shared.steps_per_s if shared else steps_per_s(rows),
                    shared.verdict if shared else None,
                    shared.nodes if shared else 1,
                    self.nodes,
                    shared.slowest if shared else None,
                )
            self.table = table
            write_atomic(self.state / LIVE, table.text())

    def _exchange_for(self) -> Exchange | None:
        """The store's keys of this restart; None on one node, before this node's ranks took a step (nothing to
        share yet: a job without optimizer steps never asks the store), or once the store has failed."""
        if self.store_address is None or self.nodes <= 1 or not any(r.records for r in self.ranks.values()):
            return None
        group = next(iter(self.ranks.values())).group if self.ranks else 0
        if self._exchange is None or self._exchange.prefix != f"numarun/steps/{group}/":
            self._exchange = Exchange(*self.store_address, group)
        return None if self._exchange.broken else self._exchange

    def _view(self, live: Mapping[int, bool]) -> NodeView:
        plan = self.plan()
        out = []
        for lr in sorted(self.ranks):
            r = self.ranks[lr]
            records = list(r.records)
            win = recent(records)
            row = row_of(r.place, r.pid, records, state="running" if live[lr] else "exited")
            ev = self.sampler.evidence(r.proc, win[0].start, win[-1].end) if win else None
            workers = int(records[-1].extra.get("loader_workers", -1)) if records else -1
            out.append(RankView(row, tuple(tuple(point(x).row()) for x in win), ev, workers))
        bound = plan is not None and plan.binding is not BindingMode.NONE
        final = bool(live) and not any(live.values())
        return NodeView(self.node, socket.gethostname(), bound, tuple(out), final)

    def _judge(self) -> LiveTable:
        ranks = [rv for v in self.views.values() for rv in v.ranks]
        points = {rv.row.place.rank: [Point.of_row(p) for p in rv.window] for rv in ranks}
        j = judge(points)
        cause = None
        if j.culprit is not None:
            evidence = {rv.row.place.rank: rv.evidence for rv in ranks if rv.evidence is not None}
            workers = {rv.row.place.rank: rv.workers for rv in ranks}
            bound = all(v.bound for v in self.views.values())
            cause = explain(j, evidence, workers=workers, bound=bound)
        self.judgement, self.cause = j, cause
        rows = tuple(sorted((rv.row for rv in ranks), key=lambda row: row.place.rank))
        places = {row.place.rank: row.place for row in rows}
        verdict = verdict_lines(j, cause, places, multi_node=self.nodes > 1)[0] if j.steps else None
        return LiveTable(
            time.time(), rows, steps_per_s(rows), verdict, len(self.views), self.nodes, j.slowest if j.steps else None
        )

    # -- the end
    def _finish(self) -> None:
        records = {r.rank: self._all_records(r.local) for r in self.ranks.values()}
        if not any(records.values()):
            return  # no optimizer step anywhere on this node: nothing to report
        self.keep.mkdir(parents=True, exist_ok=True)
        lines = [rec.line() for rank in sorted(records) for rec in records[rank]]
        (self.keep / "steps.jsonl").write_text("".join(lines))
        places = {r.rank: r.place for r in self.ranks.values()}
        shown = [rec for rank in sorted(records) for rec in records[rank][-PICTURE_STEPS:]]
        from .picture import picture
        from .trace import chrome_trace

        (self.keep / "steps.svg").write_text(picture(shown, places))
        (self.keep / "steps.trace.json").write_text(json.dumps(chrome_trace(shown, places)))
        files = f"{self.keep}/ (steps.jsonl, steps.svg, steps.trace.json)"
        if self.node != 0 or self.judgement is None or self.table is None:
            self.say([f"step report of this node's ranks: {files}"])
            return
        all_places = {row.place.rank: row.place for row in self.table.rows}
        pace = _pace(records) if self.nodes == 1 else self.table.steps_per_s
        text = summary_lines(
            self.judgement,
            self.cause,
            self.table.rows,
            places=all_places,
            pace=pace,
            nodes=len(self.views),
        )
        text.append(f"the steps of every rank{' of this node' if self.nodes > 1 else ''}: {files}")
        (self.keep / "summary.txt").write_text("".join(f"{line}\n" for line in text))
        self.say(text)

    def _all_records(self, local: int) -> list[StepRecord]:
        out: list[StepRecord] = []
        base = self.state / RECORDS.format(local_rank=local)
        for path in (Path(f"{base}.1"), base):
            with contextlib.suppress(OSError):
                out += read_records(path.read_text().splitlines())
        return out


def _has_records(state: Path, local_rank: int) -> bool:
    try:
        return (state / RECORDS.format(local_rank=local_rank)).stat().st_size > 0
    except OSError:
        return False


def _pace(records: Mapping[int, Sequence[StepRecord]]) -> float | None:
    """Steps per second of the whole job after each rank's first step: its slowest rank's."""
    rates = []
    for recs in records.values():
        after = [r for r in recs if r.step > 1]
        if len(after) >= 1 and after[-1].end > after[0].start:
            rates.append(len(after) / (after[-1].end - after[0].start))
    return min(rates) if rates else None


def _say(lines: Iterable[str]) -> None:
    sys.stderr.write("".join(f"numarun: {line}\n" for line in lines))
    sys.stderr.flush()
