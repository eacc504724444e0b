"""The step report, one use of the node agent (:mod:`numarun.launch.agent`, whose thread calls :meth:`StepWatch.poll`
every tenth of a second): reads the ranks' records, samples the kernel's figures, meets the other nodes in the
store, keeps the live table, and at the end hands its last view to the judge, which prints the summary."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ledger import WAITING
from ...plan.model import BindingMode, LaunchPlan
from ...topology import procfs
from ...worker.steps import END, LIVE, RECORDS, LiveTable, RankPlace, StepRecord
from ..hangs.verdict import read_beats
from ..notes import Notes
from .device import rank_device
from .evidence import RankProc, Sampler, cpus_of, nic_note
from .exchange import ViewKeys
from .files import keep_files, pace
from .judge import WINDOW
from .live import place_of, point, recent, row_of
from .policy import StepPolicy
from .tail import Tail, all_records, has_records
from .views import NodeView, RankView, Verdict, judge_views, merge_table, missing_nodes

KEPT = 2 * WINDOW
"""Records kept in memory per rank (the files hold them all)."""
FINAL_WAIT_S = 30.0
"""How long the judge waits, at the end of a job, for every node's last view (nodes of a synchronous job end within
seconds of each other; torchrun's exit barrier waits for them anyway). A node whose last view has not come by then is
named, and no rank is."""


@dataclass
class _Rank:
    group: int
    place: RankPlace
    proc: RankProc
    tail: Tail
    records: deque[StepRecord]
    first: StepRecord | None = None
    """Its first record after its start (step 2 or the earliest read): with its latest, the whole run's pace, whatever
    its files kept."""


def rank_runs(state: Path, local_rank: int, pid: int) -> bool:
    """A rank runs: its process lives and is not the first task of per-rank mode waiting at its exit for the node's
    agent, its script done and its last record written (:data:`numarun.ledger.WAITING`)."""
    return procfs.alive(pid) and not (state / WAITING.format(local_rank=local_rank)).exists()


class StepWatch:
    """One job's step report on this node (see the module docstring). ``keys(restart)``: the report's keys in the
    job's store (None on one node, or once the store is gone); ``say`` prints lines on numarun's stderr."""

    def __init__(
        self,
        policy: StepPolicy,
        state: Path,
        *,
        keep: Path,
        keys: Callable[[int], ViewKeys | None],
        plan: Path | None,
        say: Callable[[Iterable[str]], None],
        root: Path = procfs.ROOT,
        notes: Notes | None = None,
    ) -> None:
        self.policy = policy
        self.state = state
        self.keep = keep
        self._keys = keys
        self.plan: LaunchPlan | None = None
        if plan is not None:
            with contextlib.suppress(Exception):  # no plan: the ranks are shown unbound
                self.plan = LaunchPlan.from_json(plan.read_text(), origin=str(plan))
        self.bound = self.plan is not None and self.plan.binding is not BindingMode.NONE
        self.sampler = Sampler(root, exclude={os.getpid()})
        self.say = say
        self.notes = notes or Notes(say)
        """A file the report cannot write, a view it cannot draw: said here, once."""
        self.ranks: dict[int, _Rank] = {}
        self.views: dict[int, NodeView] = {}
        self.verdict: Verdict | None = None
        self.table: LiveTable | None = None
        self.node = 0
        self.nodes = 1
        self.missing: list[str] = []
        """At the end: the nodes whose last view did not come (the judge names them)."""
        self.handed_over = False
        """This node's last view went to the judge (and, on the judge, every node's came or the wait ended)."""
        self._due = time.monotonic() + policy.interval_s
        self._sent_final = self._first = False
        self._lock = threading.Lock()

    # -- the agent's thread
    def poll(self) -> None:
        """A report when one is due: every interval, at the ranks' first records (the kernel's figures from their
        first steps), when a rank waits for its last look at its exit, and when the node's ranks have all ended."""
        ended = bool(self.ranks) and not any(
            rank_runs(self.state, r.place.local_rank, r.proc.pid) for r in self.ranks.values()
        )
        last_looks = sorted(self.state.glob(END.format(local_rank="*")))
        started = not self._first and any(has_records(self.state, lr) for lr in self.ranks or read_beats(self.state))
        if time.monotonic() >= self._due or (ended and not self._sent_final) or last_looks or started:
            self.tick(final=ended)
            self._due = time.monotonic() + self.policy.interval_s
            self._sent_final, self._first = ended, self._first or started
            for path in last_looks:  # the ranks waiting at their exit go on
                with contextlib.suppress(OSError):
                    path.unlink()

    def _ranks_from(self, beats: Mapping[int, Mapping[str, Any]]) -> None:
        """The ranks of the latest worker group, as their heartbeats say (a restart starts them over)."""
        host = socket.gethostname()
        all_cpus = range(os.cpu_count() or 1)
        for local, b in beats.items():
            group, pid = int(b.get("group", 0)), int(b.get("pid", 0))
            known = self.ranks.get(local)
            if known is not None and known.group == group and known.proc.pid == pid:
                continue
            rank, node_rank = int(b.get("rank", local)), int(b.get("node_rank", 0))
            binding = next((r for r in self.plan.ranks if r.local_rank == local), None) if self.plan else None
            place = place_of(binding, local, bound=self.bound, rank=rank, node_rank=node_rank, host=host)
            cpus = cpus_of(place.cpus, binding.cpus if binding else all_cpus)
            numa = binding.mems[0] if binding and len(binding.mems) == 1 else place.numa
            nic = nic_note(binding.env, procfs.read_environ(pid, self.sampler.root)) if binding else ""
            self.ranks[local] = _Rank(
                group,
                place,
                RankProc(rank, pid, cpus, numa, nic, rank_device(binding)),
                Tail(self.state / RECORDS.format(local_rank=local)),  # a restarted rank truncated it: from the top
                deque(maxlen=KEPT),
            )
            self.node, self.nodes = node_rank, int(b.get("nodes", 1))

    def _exchange(self) -> ViewKeys | None:
        """The store's keys of this restart; None on one node, before this node's ranks took a step (nothing to
        share yet: a job without optimizer steps never asks the store), or once the store is gone."""
        if self.nodes <= 1 or not any(r.records for r in self.ranks.values()):
            return None
        keys = self._keys(next(iter(self.ranks.values())).group)
        return None if keys is None or keys.gone else keys

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
                    r.first = None
                r.records.extend(new)
                if r.first is None:
                    r.first = next((x for x in new if x.step > 1), None)
            live = {lr: rank_runs(self.state, r.place.local_rank, r.proc.pid) for lr, r in self.ranks.items()}
            if not final:
                suspects = {self.table.slowest} if self.table is not None and self.table.slowest is not None else set()
                procs = [r.proc for lr, r in self.ranks.items() if live[lr]]
                self.sampler.sample(procs, time.monotonic(), suspects=suspects)
            view = self._view(live)
            ex = self._exchange()
            views = {self.node: view}
            if ex is not None:
                ex.publish(view)
                if self.node == 0:
                    views = {**ex.views(self.nodes), self.node: view}
            self.views = {**self.views, **views}
            now = time.time()
            if self.node == 0:
                self.verdict = judge_views(self.views, nodes=self.nodes, now=now, missing=self.missing)
                table = self.verdict.table
                if ex is not None:
                    ex.publish_table(table)
            else:
                table = merge_table(
                    ex.table() if ex is not None else None, [rv.row for rv in view.ranks], nodes=self.nodes, now=now
                )
            self.table = table
            self.notes.write(self.state / LIVE, table.text(), what="numarun top shows nothing newer")

    def _view(self, live: Mapping[int, bool]) -> NodeView:
        out = []
        for lr in sorted(self.ranks):
            r = self.ranks[lr]
            records = list(r.records)
            win = recent(records)
            row = row_of(r.place, r.proc.pid, records, state="running" if live[lr] else "exited")
            ev = self.sampler.evidence(r.proc, win[0].start, win[-1].end) if win else None
            workers = int(records[-1].extra.get("loader_workers", -1)) if records else -1
            out.append(RankView(row, tuple(tuple(point(x).row()) for x in win), ev, workers))
        final = bool(live) and not any(live.values())
        return NodeView(self.node, socket.gethostname(), self.bound, tuple(out), final, self._pace())

    def _pace(self) -> float | None:
        """Steps per second of this node's slowest rank over its whole run (after its first step)."""
        rates = [pace(r.first, r.records[-1]) for r in self.ranks.values() if r.first is not None and r.records]
        return min((x for x in rates if x), default=None)

    # -- the end
    def hand_over(self, wait_s: float = FINAL_WAIT_S) -> None:
        """The end of a job that succeeded, before torchrun's exit barrier (past it, the store's host may leave): this
        node's last view goes to the judge; the judge waits, at most ``wait_s``, for every node's and names those
        whose last view did not come."""
        if self.handed_over:
            return
        self.handed_over = True
        self.tick(final=True)
        ex = self._exchange()
        if self.node != 0 or ex is None:
            return
        deadline = time.monotonic() + wait_s
        while missing_nodes(self.views, self.nodes) and time.monotonic() < deadline and not ex.gone:
            time.sleep(0.1)
            self.tick(final=True)
        self.missing = missing_nodes(self.views, self.nodes)

    def finish(self) -> None:
        """The end of the job: a last report from what the ranks wrote, the files, and on the judging node the
        summary (a job whose nodes did not all hand their last views over names the missing ones)."""
        if self.nodes > 1 and not self.handed_over:
            self.missing = missing_nodes(self.views, self.nodes)  # the job failed, or its store went first
        try:
            self.tick(final=True)
        except Exception as e:  # the summary still comes, from the last report that was made
            self.notes.failed("the step report", e)
        records = {r.place.rank: all_records(self.state, r.place.local_rank) for r in self.ranks.values()}
        if not any(records.values()):
            return  # no optimizer step anywhere on this node: nothing to report
        places = {r.place.rank: r.place for r in self.ranks.values()}
        paces = [v.pace for v in self.views.values() if v.pace]
        lines = keep_files(
            self.keep,
            records,
            places,
            verdict=self.verdict if self.node == 0 else None,
            table=self.table,
            nodes=self.nodes,
            pace=min(paces) if len(paces) == len(self.views) else None,
            notes=self.notes,
            restart=max((r.group for r in self.ranks.values()), default=0),
        )
        self.say(lines)
