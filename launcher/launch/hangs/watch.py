"""The hang watchdog, one use of the node agent (:mod:`numarun.launch.agent`, whose thread calls :meth:`HangWatch.tick`
every sample): judges, calls the roll, acts, answers ``numarun stacks``."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ...fsutil import write_atomic
from ..notes import Notes
from .exchange import ANSWER_WAIT_S, RollCallKeys
from .node import Dumps, NodeCall, call_node, freeze, render, resume
from .policy import EXIT_HANG, HangPolicy, OnHang
from .verdict import HangSummary, HangVerdict, exit_code, judge, read_beats, summarize

log = logging.getLogger(__name__)

STOP_ACK_WAIT_S = 15.0
STOP_DUMP_WAIT_S = 1.0

Beats = Mapping[int, Mapping[str, Any]]


class HangWatch:
    """One job's hang watchdog on this node (see the module docstring). ``hold()`` says a stop is coming (the
    supervisor's main thread must not end the run its own way meanwhile), ``request_stop(code, message)`` asks the
    supervisor's loop to end the job; ``keys(restart)``: the roll-call's keys in the job's store (None on one node, or
    once the store is gone); ``say`` prints lines on numarun's stderr."""

    def __init__(
        self,
        policy: HangPolicy,
        state: Path,
        *,
        keep: Path,
        keys: Callable[[int], RollCallKeys | None],
        request_stop: Callable[[int, str], None],
        hold: Callable[[], None],
        say: Callable[[Iterable[str]], None],
        notes: Notes | None = None,
        ending: str = f"exit code {EXIT_HANG}",
    ) -> None:
        self.policy = policy
        self.ending = ending
        """How ``--on-hang stop`` ends the job, as its lines say: numarun's exit code, or (per-rank mode) the tasks'
        end."""
        self.state = state
        self.keep = keep
        self._keys = keys
        self.request_stop = request_stop
        self.hold = hold
        self.say = say
        self.notes = notes or Notes(say)
        """A roll-call's file that cannot be written is said here, once; the roll-call goes to stderr anyway."""
        self._armed = True
        self._count = 0
        self.done = False
        """The watchdog stopped the job (or another node's did): it has nothing more to do."""
        self._stop_asked: tuple[str, Dumps] | None = None
        self.stop_written = threading.Event()
        self._stop_taken = False
        self._stop_lock = threading.Lock()
        self._reports = 0

    @property
    def pending(self) -> bool:
        """A roll-call at a stop waits to be written (the agent's thread writes it at once)."""
        return self._stop_asked is not None

    def at_stop(self, signum: int) -> None:
        """The supervisor begins stopping the ranks (a death signal): each rank dumps its stacks now, before
        torchrun's SIGTERM reaches it; the thread writes where they stood and says where, once. A rank stopped by
        SIGSTOP (a debugger, job control) is continued: the SIGTERM then ends it."""
        with self._stop_lock:  # the loop and the main thread may both call, whichever sees the signal first
            if self._stop_taken:
                return
            self._stop_taken = True
        beats = read_beats(self.state)
        dumps = Dumps(self.state, beats) if beats and signum != signal.SIGINT else None
        resume(beats)  # a stopped rank would hold the coming SIGTERM pending until torchrun's SIGKILL, 30 s on
        if dumps is None:  # no rank started yet, or Ctrl-C: it reaches the ranks themselves, from the terminal
            self.stop_written.set()
            return
        self._stop_asked = (signal.Signals(signum).name, dumps)

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait for the roll-call at a stop, if one was begun."""
        if self._stop_taken:
            self.stop_written.wait(timeout_s)

    def tick(self, beats: Beats, requests: list[str]) -> None:
        """One sample: the roll-call at a stop if one was asked, another node's stop, the other nodes' roll-calls and
        ``numarun stacks``'s requests answered, the verdict."""
        if self.done:
            return
        if self._stop_asked is not None:
            name, dumps = self._stop_asked
            self._stop_asked = None
            try:
                self._at_stop(name, dumps)
            finally:
                self.stop_written.set()
            return
        summary = summarize(beats, time.monotonic())
        if summary is None:
            for r in requests:
                self._answer_request(r, None)
            return
        ex = self._keys(int(next(iter(beats.values()), {}).get("group", 0))) if summary.nodes > 1 else None
        if ex is not None:
            ex.publish(summary)
            stop = ex.stopping()
            if stop is not None and int(str(stop["by"])) != summary.node:
                self._stop(beats, str(stop["message"]), ex, summary.nodes, RollCallKeys.ack)
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

    def _answer_asks(self, ex: RollCallKeys, beats: Mapping[int, Mapping[str, Any]], node: int) -> None:
        for k, why, by in ex.asks():
            if by == node:
                continue  # this node's own: answered as it asked
            ex.answer(k, call_node(self.state, beats, self.keep / f"stacks.{k}.txt", py_spy=why != "stop"))

    def _call(self, why: str, beats: Beats, summary: HangSummary, ex: RollCallKeys | None) -> list[NodeCall]:
        """Every node's answer to one roll-call (this node's own first); nodes that do not answer are named."""
        if ex is None:
            self._count += 1
            return [call_node(self.state, beats, self.keep / f"stacks.{self._count}.txt")]
        k = ex.ask(why, summary.node)
        if k is None:  # the store has gone: this node's own stands
            return self._call(why, beats, summary, None)
        own = call_node(self.state, beats, self.keep / f"stacks.{k}.txt")
        ex.answer(k, own)
        deadline = time.monotonic() + ANSWER_WAIT_S
        got: dict[int, NodeCall] = {}
        while time.monotonic() < deadline:
            got = ex.answers(k, summary.nodes)
            if len(got) >= summary.nodes or ex.keys.gone:
                break
            self._answer_asks(ex, beats, summary.node)  # another node may be calling the roll meanwhile
            time.sleep(0.2)
        return [got[n] for n in sorted(got)] + [
            NodeCall(n, "", (), "(no answer)", f"node {n} did not answer within {ANSWER_WAIT_S:g} s")
            for n in range(summary.nodes)
            if n not in got
        ]

    def _report(self, verdict: HangVerdict, beats: Beats, summary: HangSummary, ex: RollCallKeys | None) -> None:
        calls = self._call("hang", beats, summary, ex)
        p = self.policy
        first = (
            f"hang: for {verdict.quiet_s:.0f} s no rank entered or left a torch.distributed collective or took "
            f"an optimizer step ({p.source} {p.timeout_s:g})"
        )
        text = render(calls, header=[first])
        self._reports += 1
        kept = self.keep / f"rollcall.{self._reports}.txt"
        if self.notes.write(kept, "".join(f"{line}\n" for line in text), what="the roll-call is on stderr only"):
            text.append(f"this roll-call: {kept}")
        if p.action is not OnHang.STOP:
            text.append(
                "the job keeps running (--on-hang report): 'numarun stacks' shows where the ranks are now, "
                f"--on-hang stop would end it ({self.ending})"
            )
        self.say(text)
        if p.action is OnHang.STOP:
            self._stop(
                beats,
                f"the job made no progress for {verdict.quiet_s:.0f} s ({p.source} {p.timeout_s:g}): "
                f"stopped it (--on-hang stop, {self.ending})",
                ex,
                summary.nodes,
                lambda keys: keys.stop(
                    f"node {summary.node} found the job hung ({p.source} {p.timeout_s:g}; the roll-call is on its "
                    f"stderr): stopped it (--on-hang stop, {self.ending})",
                    summary.node,
                ),
            )

    def _stop(
        self, beats: Beats, message: str, ex: RollCallKeys | None, nodes: int, mark: Callable[[RollCallKeys], object]
    ) -> None:
        """``--on-hang stop`` on this node: the supervisor told a stop is coming, the ranks frozen, the store marked
        (``mark``: this node's stop, or its acknowledgement of another's) and kept up until every node knows, then
        the job ended with ``message``."""
        self.hold()
        freeze(beats)
        if ex is not None:
            mark(ex)
            deadline = time.monotonic() + STOP_ACK_WAIT_S
            while time.monotonic() < deadline:
                acks = ex.acks()
                if acks is None or acks >= nodes - 1:  # None: a node that already ended took the store with it
                    break
                time.sleep(0.2)
        self.request_stop(EXIT_HANG, message)
        self.done = True

    def _answer_request(self, request: str, view: tuple[Any, HangSummary, RollCallKeys | None] | None) -> None:
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
        path = self.state / f"stacks.{rid}.txt"
        try:
            write_atomic(path, "".join(f"{line}\n" for line in text), mode=0o600)
        except OSError as e:
            self.notes.cannot_write(path, e, what="numarun stacks gets no answer")

    def _at_stop(self, name: str, dumps: Dumps) -> None:
        beats = read_beats(self.state)
        # torchrun's own SIGTERM may have ended a rank before its dump: one that recorded no exit of its own
        # was running when the signal came, where its last sample has it
        dumps.alive |= {lr for lr, b in beats.items() if exit_code(self.state, lr, int(b.get("group", 0))) is None}
        call = call_node(
            self.state, beats, self.keep / "stacks.stop.txt", py_spy=False, dumps=dumps, dump_wait_s=STOP_DUMP_WAIT_S
        )
        text = render([call], header=[f"where each rank of this node stood when numarun got {name}:"])
        kept = self.keep / "rollcall.stop.txt"
        if self.notes.write(kept, "".join(f"{line}\n" for line in text), what="it is said here instead"):
            self.say([f"where each rank stood at {name}: {kept}"])
        else:
            self.say(text)
