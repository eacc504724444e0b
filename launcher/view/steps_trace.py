"""The step report as a trace in the Chrome trace event format, for ui.perfetto.dev and chrome://tracing (pure;
docs/steps.md).

One process per node (``pid`` = node rank, named by its host), one thread per rank (``tid`` = rank, named by its
place's label). Each step is a complete event (``ph: "X"``) named ``step N``, its args holding the step's phase
seconds, wall time, peak memory and GPU time; inside it, its phases are complete events too, in
:data:`~numarun.worker.steps.PHASES` order, back to back from the step's start. A record holds each phase's total
for the step, not when it happened: the layout shows how much, never in what order (each step's args say so). Phase
totals above the step's wall time (rounding) are scaled down to fit, so that a phase always lies within its step.
A rank's peak memory is a counter track (``ph: "C"``), with a point only where it changed.

Times: ``ts``/``dur`` in whole microseconds. ``time.monotonic()`` is one host's clock: each
node's events start at 0 at its first step; nodes line up at their starts, never by their clocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..worker.steps import PHASES, RankPlace, StepRecord

ORDER_NOTE = "phase totals of the step laid back to back in this order; the record keeps no order"


def by_node(records: Sequence[StepRecord], places: Mapping[int, RankPlace]) -> dict[int, dict[int, list[StepRecord]]]:
    """Node rank -> rank -> its records of finite times by (start, step), nodes and ranks in order; a rank without a
    place is on node 0."""
    out: dict[int, dict[int, list[StepRecord]]] = {}
    for r in sorted(records, key=lambda r: (r.rank, r.start, r.step)):
        if math.isfinite(r.start) and math.isfinite(r.end):
            place = places.get(r.rank)
            out.setdefault(place.node_rank if place else 0, {}).setdefault(r.rank, []).append(r)
    return dict(sorted(out.items()))


def node_hosts(ranks: Iterable[int], places: Mapping[int, RankPlace]) -> str:
    """The hosts of ``ranks``, as their places name them: ``host1,host2`` ('' when none does)."""
    return ",".join(sorted({places[rank].host for rank in ranks if rank in places and places[rank].host}))


def _us(seconds: float) -> int:
    """Whole microseconds: integers, so that a phase's end and its step's compare exactly in any reader."""
    return round(seconds * 1e6) if math.isfinite(seconds) else 0


def _meta(name: str, pid: int, args: dict[str, Any], tid: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def _step_events(r: StepRecord, pid: int, *, start: int, end: int) -> list[dict[str, Any]]:
    """The step's event and its phases' in ``[start, end]`` (microseconds on its node's axis)."""
    wall = max(end - start, 0)
    secs = {p: max(r.phase_s(p), 0.0) if math.isfinite(r.phase_s(p)) else 0.0 for p in PHASES}
    args: dict[str, Any] = {
        "step": r.step,
        "wall_s": round(r.wall_s, 9),
        **{f"{p}_s": round(s, 9) for p, s in secs.items()},
        "phase_order": f"{', '.join(PHASES)}: {ORDER_NOTE}",
    }
    if r.peak_bytes is not None:
        args["peak_bytes"] = r.peak_bytes
    if r.gpu_s is not None:
        args["gpu_s"] = r.gpu_s
    args.update({k: v for k, v in r.extra.items() if k not in args})
    step = {"name": f"step {r.step}", "cat": "step", "ph": "X", "pid": pid, "tid": r.rank}
    events = [{**step, "ts": start, "dur": wall, "args": args}]
    total = sum(secs.values()) * 1e6
    fit = wall / total if total > wall else 1.0
    at = start
    for p, s in secs.items():
        dur = min(round(s * 1e6 * fit), start + wall - at)  # never past the step's end
        if dur > 0:
            events.append({"name": p, "cat": "phase", "ph": "X", "pid": pid, "tid": r.rank, "ts": at, "dur": dur})
            at += dur
    return events


def chrome_trace(records: Sequence[StepRecord], places: Mapping[int, RankPlace]) -> dict[str, Any]:
    """``records`` as a trace: ``{"traceEvents": [...], "displayTimeUnit": "ms"}`` (JSON-able; ``json.dump`` it).

    ``places`` names each rank's thread and puts it on its node's process; a rank without one is ``rank N`` on
    node 0.
    """
    events: list[dict[str, Any]] = []
    for pid, ranks in by_node(records, places).items():
        origin = min(steps[0].start for steps in ranks.values())
        hosts = node_hosts(ranks, places)
        events.append(_meta("process_name", pid, {"name": f"node {pid}" + (f" ({hosts})" if hosts else "")}))
        events.append(_meta("process_sort_index", pid, {"sort_index": pid}))
        for rank in ranks:
            place = places.get(rank)
            events.append(_meta("thread_name", pid, {"name": place.label() if place else f"rank {rank}"}, tid=rank))
            events.append(_meta("thread_sort_index", pid, {"sort_index": rank}, tid=rank))
        for steps in ranks.values():
            peak, end = None, 0
            for r in steps:
                # from the node's origin, so that a step's end and the next one's start (the same clock reading) round
                # alike; a step overlapping its predecessor (a clock that stepped) starts at its end: siblings never
                # overlap
                start = max(_us(r.start - origin), end)
                end = max(_us(r.end - origin), start)
                events += _step_events(r, pid, start=start, end=end)
                if r.peak_bytes is not None and peak != r.peak_bytes:
                    peak = r.peak_bytes
                    events.append(
                        {
                            "name": f"rank {r.rank} peak memory",
                            "ph": "C",
                            "pid": pid,
                            "ts": _us(r.end - origin),
                            "args": {"bytes": r.peak_bytes},
                        }
                    )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
