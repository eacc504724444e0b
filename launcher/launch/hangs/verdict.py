"""What the ranks wrote (their heartbeats, read from numarun's private directory) and the verdict on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...jsonable import loads
from ...topology import procfs
from ...worker.progress import HEARTBEAT


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


def exit_code(state: Path, local_rank: int, group: int) -> int | None:
    """The code a rank's script ended with (the ledger's ``exit.<local rank>``), if it recorded one."""
    try:
        restart, code = (int(x) for x in (state / f"exit.{local_rank}").read_text().split())
    except (OSError, ValueError):
        return None
    return code if restart == group else None


@dataclass(frozen=True)
class HangSummary:
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


def summarize(
    beats: Mapping[int, Mapping[str, Any]], now: float, live: Callable[[int], bool] = procfs.alive
) -> HangSummary | None:
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
    return HangSummary(
        node=int(first.get("node_rank", 0)),
        nodes=int(first.get("nodes", 1)),
        world=int(first.get("world", 1)),
        ranks=len(beats),
        local_world=int(first.get("local_world", len(beats))),
        live=n_live,
        quiet_s=min(quiet) if quiet else -1.0,
        still_s=max(still) if still else -1.0,
        sampling=all(b.get("sampling", True) for b in beats.values()),
    )


@dataclass(frozen=True)
class HangVerdict:
    hung: bool
    quiet_s: float
    still_s: float
    reason: str = ""


def judge(summaries: Sequence[HangSummary], timeout_s: float) -> HangVerdict:
    """The job hangs when every node reported all its ranks, some rank lives, and for ``timeout_s`` no live
    rank's counters moved while some live rank's stack stood still too."""
    if not summaries or timeout_s <= 0:
        return HangVerdict(False, 0.0, 0.0, "no summary")
    nodes = summaries[0].nodes
    if len({s.node for s in summaries}) < nodes or any(s.ranks < s.local_world for s in summaries):
        return HangVerdict(False, 0.0, 0.0, "not every rank reported yet")
    if not all(s.sampling for s in summaries):
        return HangVerdict(False, 0.0, 0.0, "a rank does not sample")
    live = [s for s in summaries if s.live]
    if not live:
        return HangVerdict(False, 0.0, 0.0, "no live rank")
    quiet = min(s.quiet_s for s in live)
    still = max(s.still_s for s in live)
    return HangVerdict(quiet >= timeout_s and still >= timeout_s, quiet, still)
